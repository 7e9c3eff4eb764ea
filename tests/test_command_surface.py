"""One command surface: a command's flags come from its typed function, `--config FILE` takes the
same keys as `key=value` (which wins), and `--print_config` prints the resolved settings and what
the run derives from them, touching no run folder; the printed YAML read back is the same run."""

from __future__ import annotations

import re

import pytest

from prism.cli import train
from prism.cli.command import parse


def printed(capsys, argv: list[str]) -> str:
    assert train.main([*argv, "--print_config"]) == 0
    return capsys.readouterr().out


def test_train_print_config_round_trips_to_the_same_identity(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    first = printed(capsys, ["--scale", "tiny", "--schedule", "uniform", "train.lr=1e-3"])
    for derived in ("steps", "world_size", "micro_batch", "accumulation", "precision", "strategy", "run_dir"):
        assert f"#   {derived}: " in first
    digest = re.search(r"#   config_hash: (\w+)", first).group(1)
    (tmp_path / "run.yaml").write_text(first)
    again = printed(capsys, ["--config", str(tmp_path / "run.yaml")])
    assert re.search(r"#   config_hash: (\w+)", again).group(1) == digest
    # key=value wins over the file
    other = printed(capsys, ["--config", str(tmp_path / "run.yaml"), "train.lr=2e-3"])
    assert re.search(r"#   config_hash: (\w+)", other).group(1) != digest
    assert "config_hash: cd053005c4d02873" in printed(capsys, ["--scale", "tiny"])
    assert list(tmp_path.iterdir()) == [tmp_path / "run.yaml"]  # no run folder


CONFIG_KEYS = ("nope: 1", "train: {tokens: many}", "train: {lr: -1}")
SENTENCES = (
    "config key 'nope' is invalid",
    "config key 'train.tokens' is invalid",
    "train.lr=-1.0 is invalid",
)
# every command: its required flags, and a YAML of an unknown key, a wrong type and a value out of range
COMMANDS = {
    "train": (["--scale", "tiny"], CONFIG_KEYS, SENTENCES),
    "run_all": (["--scale", "tiny"], CONFIG_KEYS, SENTENCES),
    "search": (["--scale", "tiny", "--rungs", "128,256"], CONFIG_KEYS, SENTENCES),
    "describe": (["--scale", "tiny"], CONFIG_KEYS, SENTENCES),
    "benchmark": (["--scale", "tiny"], CONFIG_KEYS, SENTENCES),
    "analyze": (["--checkpoints", "x.ckpt", "--out", "a.json"], CONFIG_KEYS, SENTENCES),
    "long_context": (["--checkpoint", "x.ckpt", "--out", "l.json"], CONFIG_KEYS, SENTENCES),
    "evaluate": (
        ["--checkpoint", "x.ckpt", "--out", "e.json"],
        ("nope: 1", "batch_size: many", "batch_size: 0"),
        (
            "config key 'nope' is invalid",  # its eval.* keys are the config's: any other key is too
            "batch_size: many is invalid",
            "eval.batch_size=0 is invalid",
        ),
    ),
    "export_hf": (
        ["--checkpoint", "x.ckpt"],
        ("nope: 1", "overwrite: maybe", "out: ' '"),
        ("config file key 'nope' is not a setting", "overwrite: maybe is invalid", "--out=  is invalid"),
    ),
    "report": (
        [],
        ("nope: 1", "scales: 5", "scales: []"),
        ("config file key 'nope' is not a setting", "scales: 5 is invalid", "--scales= is invalid"),
    ),
    "prepare_fineweb": (
        ["--source", "hub", "--out", "d"],
        ("nope: 1", "max_tokens: many", "max_tokens: 0"),
        (
            "config key 'nope' is invalid",  # its data.* keys are the config's: any other key is too
            "max_tokens: many is invalid",
            "--max-tokens=0 is invalid",
        ),
    ),
    "preflight": (
        [],
        ("nope: 1", "timeout_s: many", "timeout_s: 0"),
        (
            "config file key 'nope' is not a setting",
            "timeout_s: many is invalid",
            "--timeout-s=0.0 is invalid",
        ),
    ),
}


def test_every_command_is_in_the_bad_config_table():
    from tests.conftest import ROOT

    assert sorted(COMMANDS) == sorted(p.stem for p in (ROOT / "reproduce").glob("*.py"))


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_command_refuses_a_bad_config_file_in_one_sentence(name, tmp_path, capsys, monkeypatch):
    """An unknown key, a wrong type, a value out of range: one sentence each, exit 2, before any
    work (and before Lightning is imported where the command can tell without it)."""
    from tests.conftest import load_script

    monkeypatch.chdir(tmp_path)
    required, texts, sentences = COMMANDS[name]
    for text, sentence in zip(texts, sentences):
        (tmp_path / "bad.yaml").write_text(text)
        assert load_script(name).main([*required, "--config", "bad.yaml", "--print_config"]) == 2, text
        said = capsys.readouterr()
        err = said.err or said.out  # run_all.py says it on its console
        assert err.startswith(f"error: {sentence}") and err.count("\n") == 1 and "Traceback" not in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.yaml"]


@pytest.mark.parametrize(
    "name, words",
    [
        ("analyze", ["--checkpoints", "x.ckpt", "--out", "a.json", "--batch-size", "0"]),
        ("analyze", ["--checkpoints", "x.ckpt", "--out", "a.json", "--sequences", "0"]),
        ("long_context", ["--checkpoint", "x.ckpt", "--out", "l.json", "--query-block", "0"]),
    ],
)
def test_a_count_flag_below_1_is_refused_by_its_rule(name, words, tmp_path, capsys, monkeypatch):
    """The measurements keep no range check of their own: the flag's rule is the one refusal."""
    from tests.conftest import load_script

    monkeypatch.chdir(tmp_path)
    assert load_script(name).main(words) == 2
    assert capsys.readouterr().err == f"error: {words[-2]}=0 is invalid: it must be at least 1.\n"
    assert not any(tmp_path.iterdir())


def test_search_print_config_round_trips_to_the_same_identity(tmp_path, capsys, monkeypatch):
    from tests.conftest import load_script

    search = load_script("search")
    monkeypatch.chdir(tmp_path)
    args = ["--scale", "tiny", "--space", "uniform", "--space", "prism", "--rungs", "128,256", "--top-k", "1"]
    assert search.main([*args, "--print_config", "model.seq_len=32", "train.global_batch_tokens=128"]) == 0
    first = capsys.readouterr().out
    for derived in (
        "trials",
        "rungs",
        "world_size",
        "micro_batch",
        "accumulation",
        "precision",
        "config_hash",
    ):
        assert f"#   {derived}: " in first, first
    assert "top_k: 1" in first and "space: [uniform, prism]" in first
    (tmp_path / "search.yaml").write_text(first)
    assert search.main(["--config", "search.yaml", "--print_config"]) == 0
    digest = re.compile(r"#   config_hash: (\w+)")
    assert digest.search(capsys.readouterr().out).group(1) == digest.search(first).group(1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["search.yaml"]


def test_run_all_print_config_round_trips_to_the_same_identity(tmp_path, capsys, monkeypatch):
    from prism.cli import run_all

    monkeypatch.chdir(tmp_path)
    assert run_all.main(["--scale", "tiny", "--seeds", "0,1", "--print_config", "train.lr=1e-3"]) == 0
    first = capsys.readouterr().out
    assert "seeds: [0, 1]" in first and "#   world_size: " in first
    (tmp_path / "run.yaml").write_text(first)
    assert run_all.main(["--config", str(tmp_path / "run.yaml"), "--print_config"]) == 0
    digest = re.compile(r"#   config_hash: (\w+)")
    assert digest.search(capsys.readouterr().out).group(1) == digest.search(first).group(1)
    assert list(tmp_path.iterdir()) == [tmp_path / "run.yaml"]


def test_run_all_schedules_is_the_run_schedules_key(capsys):
    """--schedules is a short name of run_schedules, as --seeds is of seeds: one setting, one name."""
    from tests.conftest import load_script

    run_all = load_script("run_all")
    argv = ["--scale", "tiny", "--schedules", "uniform,2x2,4x6;prism", "seeds=[0]"]
    args = parse(run_all.run_all_command, argv, None, run_all.EXCLUSIVE)
    assert args["schedules"] is None and args["overrides"] == [
        'run_schedules=[uniform,"2x2,4x6",prism]',
        "seeds=[0]",
    ]
    from prism.pipeline import load_run_config

    assert load_run_config("tiny", args["overrides"], None, None).run_schedules == [
        "uniform",
        "2x2,4x6",
        "prism",
    ]
    assert (
        run_all.main(["--scale", "tiny", "--schedules", "uniform", "run_schedules=[prism]", "--print_config"])
        == 0
    )
    said = capsys.readouterr()
    assert (
        "config key run_schedules is given twice" in said.err + said.out
        and "run_schedules: [prism]" in said.out
    )


def test_a_config_file_sets_a_flag_of_fixed_choices(tmp_path, capsys):
    """A --config file's value of a flag of choices is one of them, read as the flag reads it."""
    from tests.conftest import load_script

    benchmark = load_script("benchmark")
    argv = ["--scale", "tiny", "--config", str(tmp_path / "b.yaml"), "--print_config"]
    (tmp_path / "b.yaml").write_text("compile_mode: regional\n")
    assert benchmark.main(argv) == 0 and "compile_mode: regional\n" in capsys.readouterr().out
    (tmp_path / "b.yaml").write_text("compile_mode: nope\n")
    assert benchmark.main(argv) == 2
    assert capsys.readouterr().err == "error: compile_mode: nope is invalid: give one of full, regional.\n"


def test_a_config_file_value_a_flags_own_reader_refuses_gets_that_readers_sentence(tmp_path, capsys):
    """A flag read by a function of the kit (evaluate's --limit, read as a config word is, run_all's
    --seeds) refuses a bad file value with the sentence of its key's rule or of that function, never
    with the function's repr."""
    from tests.conftest import load_script

    (tmp_path / "e.yaml").write_text("limit: abc\n")
    argv = ["--checkpoint", "c", "--out", str(tmp_path / "o.json"), "--config", str(tmp_path / "e.yaml")]
    assert load_script("evaluate").main(argv) == 2
    assert capsys.readouterr().err == (
        "error: eval.limit='abc' is invalid: use null (every example), a whole number of documents (>= 1) "
        "or a fraction between 0 and 1.\n"
    )
    (tmp_path / "r.yaml").write_text("seeds: 5\n")
    assert load_script("run_all").main(["--scale", "tiny", "--config", str(tmp_path / "r.yaml")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: seeds: 5 is invalid: give a list") and "function" not in err


@pytest.mark.parametrize(
    "script, yaml, said",
    [
        ("run_all", "stages: [train, eval]\n", 'error: stages: ["train", "eval"] is invalid: give a text.\n'),
        ("run_all", "dry_run: null\n", "error: dry_run: null is invalid: give true or false.\n"),
        ("benchmark", "scale: null\n", "error: scale: null is invalid: give a text.\n"),
    ],
)
def test_a_config_file_value_is_read_as_the_flags_words_are(tmp_path, capsys, script, yaml, said):
    """A list for a one-word flag, or null for a flag that is not optional, is refused in one
    sentence rather than taken as Python's text of it, or as no value."""
    from tests.conftest import load_script

    (tmp_path / "r.yaml").write_text(yaml)
    argv = ["--config", str(tmp_path / "r.yaml"), "--print_config"]
    assert load_script(script).main(argv if script == "benchmark" else ["--scale", "tiny", *argv]) == 2
    assert capsys.readouterr().err == said


# prepare_fineweb.py's flags that are short names of config keys: a value each, and one the key's rule refuses
PREPARE_KEYS = {
    "--path": ("data.path", "/data/fw", None),
    "--hub-name": ("data.hub_name", "me/web", "''"),
    "--subset": ("data.subset", "sample-100BT", "''"),
    "--revision": ("data.revision", "1e3", "''"),
    "--seq-len": ("model.seq_len", "128", "0"),
    "--val-tokens": ("data.val_tokens", "4096", "-1"),
    "--doc-batch": ("data.doc_batch", "64", "0"),
}


@pytest.mark.parametrize("flag", sorted(PREPARE_KEYS))
def test_a_prepare_fineweb_flag_is_its_config_key(flag, tmp_path, capsys, monkeypatch):
    """--seq-len is model.seq_len, --subset data.subset...: the flag and the key word (and a --config
    file's key) give the same options; a bad value of either is refused by the key's one rule."""
    from tests.conftest import load_script, prepare_options

    prepare = load_script("prepare_fineweb")
    monkeypatch.chdir(tmp_path)
    key, value, bad = PREPARE_KEYS[flag]
    base = ["--source", "hub", "--scale", "tiny", "--out", "out"]
    options = prepare_options([*base, flag, value])
    assert options == prepare_options([*base, f"{key}={value}"]) != prepare_options(base)
    (tmp_path / "p.yaml").write_text(f"{flag[2:].replace('-', '_')}: '{value}'\n")
    assert prepare_options([*base, "--config", "p.yaml"]) == options  # revision 1e3 stays a text
    for words in [] if bad is None else [[flag, bad.strip("'")], [f"{key}={bad}"]]:
        assert prepare.main([*base, *words]) == 2, words
        err = capsys.readouterr().err
        assert err.startswith(f"error: {key}={bad} is invalid: ") and err.count("\n") == 1, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.yaml"]


@pytest.mark.parametrize(
    "flag, key, value, bad",
    [
        ("--tasks", "eval.tasks", "piqa,winogrande", None),  # names: prism.eval.tasks' (test_eval_cli)
        ("--data-dir", "eval.data_dir", "/data/eval", None),
        ("--limit", "eval.limit", "0.25", "1.5"),
        ("--limit", "eval.limit", "10", "'abc'"),
        ("--batch-size", "eval.batch_size", "8", "0"),
    ],
)
def test_an_evaluate_flag_is_its_eval_key(flag, key, value, bad, tmp_path, capsys, monkeypatch):
    """--limit is eval.limit, the key run_all's eval stage passes on as --limit: the flag and the key
    word give the same job; a bad value of either is refused by the key's one rule, exit 2."""
    from tests.conftest import eval_job, load_script

    evaluate = load_script("evaluate")
    monkeypatch.chdir(tmp_path)
    base = ["--checkpoint", "x.ckpt", "--out", "e.json"]
    job = eval_job([*base, flag, value])
    word = f"{key}=[{value}]" if key == "eval.tasks" else f"{key}={value}"
    assert job == eval_job([*base, word]) != eval_job(base)
    for words in [] if bad is None else [[flag, bad], [f"{key}={bad}"]]:
        assert evaluate.main([*base, *words]) == 2, words
        err = capsys.readouterr().err
        assert err.startswith(f"error: {key}={bad} is invalid: ") and err.count("\n") == 1, err
    assert evaluate.main([*base, "train.lr=1"]) == 2  # the checkpoint holds its run's other settings
    assert capsys.readouterr().err.startswith("error: train.lr=1 is not an eval.* key")
    assert not any(tmp_path.iterdir())


def test_a_fraction_of_eval_limit_reaches_evaluate_through_run_all(tmp_path):
    """eval.limit below 1 (a fraction of each task, as lm_eval's --limit) is one rule for
    run_all's eval stage and evaluate.py: the stage's command line reads back as the same limit."""
    import sys

    from prism.config.schema import load_config
    from prism.pipeline.plan import build_plan, default_scripts
    from tests.conftest import ROOT, eval_job, load_script

    for limit, read in (("0.25", 0.25), ("10", 10), ("null", None)):
        cfg = load_config(
            "tiny", [f"runs_dir={tmp_path}/r", f"results_dir={tmp_path}/s", f"eval.limit={limit}"]
        )
        plan = build_plan(cfg, [], ["train", "eval"], default_scripts(ROOT / "reproduce"), sys.executable)
        job = next(j for j in plan.jobs if j.stage.name == "eval")
        argv = job.argv()
        assert job.config["eval"]["limit"] == read and ("--limit" in argv) == (read is not None)
        assert eval_job(argv[2:]).limit == read
    assert not any(tmp_path.iterdir())
