"""Every config value is checked before anything is written, and overrides are values.

In-process: a bad value of each kind gets one sentence naming its key, its value and what is
valid; overrides keep their text (spaces, `#`, quotes). Real processes: `train.py` refuses
train.lr=nan with exit 2 and an empty runs folder, and a runs_dir holding spaces and ` #` is
where the run lands. In-process as well (its import is what a process would cost): train.py's
main refuses train.devices=0 and --seed -1 the same way, run_all.py's main --seeds -1 in its
dry run.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import lightning as L
import pytest
import yaml
from conftest import load_script

from prism.config.overrides import parse_override
from prism.config.schema import ConfigError, load_config
from prism.config.values import PRECISIONS, SEED_MAX
from prism.pipeline import SCRIPTS_DIR, load_run_config
from prism.pipeline.plan import build_plan, default_scripts
from prism.runs.identity import RUN_CONFIG_NAME
from prism.train.batch import batch_plan
from prism.train.plan import plan_run

ROOT = Path(__file__).resolve().parents[1]
# 4 optimizer steps of 4 sequences x 32 tokens (the shrunken tiny of test_train.py)
SMALL = [
    "model.seq_len=32",
    "train.global_batch_tokens=128",
    "train.micro_batch=2",
    "train.tokens=512",
    "data.val_tokens=256",
    "train.milestones=[10.0]",
]
DEVICES = "use auto (every visible GPU, else one CPU process), a positive count such as 8, or a list"


def refusal(*overrides: str) -> str:
    with pytest.raises(ConfigError) as err:
        load_config("tiny", list(overrides))
    message = str(err.value)
    assert "\n" not in message and message.endswith("."), message
    return message


@pytest.mark.parametrize(
    "override, sentence",
    [
        ("train.lr=nan", "train.lr=nan is invalid: it must be positive and finite, e.g. train.lr=6e-4."),
        ("train.lr=inf", "train.lr=inf is invalid: it must be positive and finite"),
        ("train.lr=-.inf", "train.lr=-inf is invalid: it must be positive and finite"),
        ("train.beta1=1", "train.beta1=1.0 is invalid: use a value in [0, 1)."),
        ("train.beta2=-0.1", "train.beta2=-0.1 is invalid: use a value in [0, 1)."),
        ("train.eps=0", "train.eps=0.0 is invalid: it must be positive and finite."),
        ("train.weight_decay=-1", "train.weight_decay=-1.0 is invalid: use 0 (off) or a positive finite"),
        ("train.grad_clip=nan", "train.grad_clip=nan is invalid: use 0 (no clipping) or a positive finite"),
        ("train.warmup_frac=nan", "train.warmup_frac=nan is invalid: use a fraction in [0, 1)."),
        ("train.min_lr_ratio=inf", "train.min_lr_ratio=inf is invalid: use a value in [0, 1]."),
        ("data.hub_retry_interval_s=nan", "data.hub_retry_interval_s=nan is invalid: use 0 or a finite"),
        ("data.stall_timeout_s=inf", "data.stall_timeout_s=inf is invalid: use a positive, finite number"),
        ("model.norm_eps=nan", "model.norm_eps=nan is invalid: it must be positive and finite."),
        ("model.dropout=1", "model.dropout=1.0 is invalid: use a value in [0, 1)."),
        ("train.seed=-1", f"train.seed=-1 is invalid: use an integer from 0 to {SEED_MAX}."),
        (f"train.seed={SEED_MAX + 1}", f"train.seed={SEED_MAX + 1} is invalid: use an integer from 0 to"),
        ("data.seed=-5", "data.seed=-5 is invalid: use an integer from 0 to"),
        ("seeds=[-1]", "seeds=[-1] is invalid: give one or more distinct integers from 0 to"),
        ("seeds=[0,0]", "seeds=[0, 0] is invalid: give one or more distinct integers"),
        ("seeds=[]", "seeds=[] is invalid"),
        ("train.devices=0", f"train.devices=0 is invalid: {DEVICES}"),
        ("train.devices=-2", "train.devices=-2 is invalid"),
        ("train.devices=[]", "train.devices=[] is invalid"),
        ("train.devices=[0,0]", "train.devices=[0, 0] is invalid"),
        ("train.devices=true", "train.devices=True is invalid"),
        ("train.devices=two", "train.devices='two' is invalid"),
        ("train.num_nodes=0", "train.num_nodes=0 is invalid: it must be positive."),
        ("train.precision=fp8", f"train.precision='fp8' is invalid: use one of {', '.join(PRECISIONS)}."),
        ("train.accelerator=nope", "train.accelerator='nope' is invalid: use one of auto, gpu, cpu"),
        (
            "train.strategy=bogus_strategy",
            "train.strategy='bogus_strategy' is invalid: use auto, ddp or fsdp (the kit's FSDP2; "
            "docs/cluster.md), or another of Lightning's strategy names: ddp_fork, ddp_notebook, ddp_spawn, "
            "deepspeed,",
        ),
        ("train.strategy=DDP", "train.strategy='DDP' is invalid: use auto, ddp or fsdp"),
        (
            "train.milestones=[a]",
            "train.milestones=['a'] is invalid: give positive, finite validation-loss thresholds",
        ),
        ("train.milestones=[3.5,-1]", "train.milestones=[3.5, -1] is invalid"),
        ("train.tokens=0", "train.tokens=0 is invalid: it must be positive."),
        ("train.global_batch_tokens=-256", "train.global_batch_tokens=-256 is invalid: it must be positive."),
        ("train.keep_checkpoints=-2", "train.keep_checkpoints=-2 is invalid: use -1 (keep all)"),
        ("train.loss_chunk_tokens=-1", "train.loss_chunk_tokens=-1 is invalid: use 0 (off)"),
        ("data.val_tokens=0", "data.val_tokens=0 is invalid: it must be positive."),
        ("data.num_workers=-1", "data.num_workers=-1 is invalid: use 0 (in the training process) or more."),
        ("eval.tasks=piqa", "eval.tasks must be a list, e.g. eval.tasks=[piqa,hellaswag]."),
        ("eval.batch_size=0", "eval.batch_size=0 is invalid: it must be positive."),
        ("eval.limit=0", "eval.limit=0 is invalid: use null (every example), a whole number of documents"),
        ("bench.steps=0", "bench.steps=0 is invalid: it must be positive."),
        ("bench.warmup=-1", "bench.warmup=-1 is invalid: use 0 or more."),
        ("analysis.sequences=0", "analysis.sequences=0 is invalid: it must be positive."),
        ("run_all.stages=train", "run_all.stages must be a list, e.g. run_all.stages=[train,eval]."),
        (
            "train.profile_steps=abc",
            "train.profile_steps must be a list, e.g. train.profile_steps=[10,12].",
        ),
        ("run_schedules=[]", "run_schedules=[] is invalid"),
        ('results_dir=""', "results_dir='' is invalid: it must not be empty."),
        ('run_all.launcher.train=srun "x', "run_all.launcher.train='srun \"x' is invalid: it must split"),
        ("schedules=3x2", "schedules is a mapping: set one of its keys (schedules.NAME=value)"),
        (
            "train.milestones=[a,b",
            "override train.milestones=[a,b is not a well-formed list: write it as train.milestones=[a,b]",
        ),
        ("schedules={a: [", "override schedules={a: [ is not a well-formed mapping"),
        ("=3", "override '=3' names no key"),
    ],
)
@pytest.mark.slow
def test_a_bad_value_is_one_sentence_naming_key_value_and_what_is_valid(override, sentence):
    assert sentence in refusal(*SMALL, override)


@pytest.mark.parametrize(
    "override, sentence",
    [
        ("eval.tasks=[nope]", "eval.tasks=['nope'] is invalid: unknown task 'nope'; valid tasks are"),
        ("eval.tasks=[]", "eval.tasks=[] is invalid: no task given"),
        ("train.eval_tasks=[nope]", "train.eval_tasks=['nope'] is invalid: unknown task 'nope'"),
    ],
)
def test_a_task_list_naming_no_known_task_is_refused_before_any_step(override, sentence):
    # the config holds only a list of names; prism.eval.tasks knows which exist (the run plan)
    cfg = load_config("tiny", [*SMALL, override])
    with pytest.raises(ConfigError) as err:
        plan_run(cfg, launch=False, reach_data=False)
    message = str(err.value)
    assert sentence in message and "\n" not in message and message.endswith("."), message


@pytest.mark.parametrize(
    "override, key, value",
    [
        ("runs_dir=/x/runs a #2", "runs_dir", "/x/runs a #2"),  # a path keeps its spaces and `#`
        ("results_dir= /x/res  ", "results_dir", " /x/res  "),  # the text exactly as given
        ('data.revision="0123456"', "data.revision", "0123456"),  # quotes keep text as text
        ("data.revision=0123abc", "data.revision", "0123abc"),  # a leading zero is no octal number
        ("data.revision='true'", "data.revision", "true"),
        ("data.revision=1234e56", "data.revision", "1234e56"),  # a text field: no float, no inf
        ("results_dir=1e3", "results_dir", "1e3"),
        ("run_all.launcher.train=srun --ntasks=2 x: y", "run_all.launcher.train", "srun --ntasks=2 x: y"),
        ("train.lr=1e-3", "train.lr", 1e-3),  # YAML's float spellings, as before
        ("train.tokens=4_096", "train.tokens", 4096),
        ("train.compile=auto", "train.compile", None),
        ("train.fused=AUTO", "train.fused", None),
        ("train.compile=false", "train.compile", False),
        ("train.devices=[0,1]", "train.devices", [0, 1]),
        ("train.devices=-1", "train.devices", -1),
        ("eval.tasks=[piqa, 'hellaswag']", "eval.tasks", ["piqa", "hellaswag"]),
        ("eval.limit=null", "eval.limit", None),
        ("train.milestones=[9.0, 8]", "train.milestones", [9.0, 8]),
        ("train.seed=4294967295", "train.seed", SEED_MAX),
    ],
)
def test_an_override_is_a_value_not_a_yaml_document(override, key, value):
    cfg = load_config("tiny", [override])
    got = cfg
    for part in key.split("."):
        got = getattr(got, part)
    assert got == value and type(got) is type(value), (got, value)


def test_a_mapping_override_adds_a_named_schedule():
    cfg = load_config("tiny", ['schedules={wide: "2x4,4x4"}', "schedule=wide"])
    assert cfg.head_schedule().heads == (2,) * 4 + (4,) * 4
    assert parse_override("schedules={a: 1, b: [2, 3]}") == ("schedules", {"a": 1, "b": [2, 3]})


def test_every_precision_offered_is_one_lightning_accepts():
    for name in PRECISIONS:
        load_config("tiny", [f"train.precision={name}"])
        if name != "auto":  # the kit's own: resolved by prism.train.strategy before the Trainer
            L.Trainer(precision=name, accelerator="cpu", devices=1, logger=False, enable_checkpointing=False)
    with pytest.raises(ValueError):
        L.Trainer(precision="fp8", accelerator="cpu", devices=1, logger=False)


def test_a_missing_or_empty_config_folder_is_named(tmp_path):
    with pytest.raises(ConfigError) as err:
        load_config("tiny", config_dir=tmp_path / "nonexistent")
    assert f"config folder {tmp_path / 'nonexistent'}" in str(err.value)
    assert "does not exist" in str(err.value) and "valid scales are" not in str(err.value)
    (tmp_path / "empty" / "scale").mkdir(parents=True)
    with pytest.raises(ConfigError, match=r"holds no scale/<scale>\.yaml file; point PRISM_CONFIG_DIR"):
        load_config("tiny", config_dir=tmp_path / "empty")


def test_a_scale_file_without_its_model_shape_is_refused(tmp_path, monkeypatch, capsys):
    """Without `model:` the schema's defaults (12 x 768, the 124M shape) would train in silence."""
    d = tmp_path / "configs"
    shutil.copytree(ROOT / "configs", d)
    (d / "scale" / "mine.yaml").write_text("train: {tokens: 4096, global_batch_tokens: 2048, lr: 1e-3}\n")
    (d / "scale" / "half.yaml").write_text(
        "model: {n_layer: 2, d_model: 64}\ntrain: {tokens: 4096, global_batch_tokens: 2048, lr: 1e-3}\n"
    )
    monkeypatch.setenv("PRISM_CONFIG_DIR", str(d))
    monkeypatch.chdir(tmp_path)
    for scale, missing in (("mine", "model.n_layer, model.d_model, model.h_base"), ("half", "model.h_base")):
        assert load_script("train").main(["--scale", scale, f"runs_dir={tmp_path / 'runs'}"]) == 2
        err = capsys.readouterr().err.strip()
        assert err == (
            f"error: scale file {d / 'scale' / scale}.yaml does not set {missing}; a scale names its "
            f"shape, e.g. `model: {{n_layer: 8, d_model: 128, h_base: 4}}` (docs/scales.md)."
        )
    assert not (tmp_path / "runs").exists()


def test_a_refused_split_lists_every_device_count_that_divides_the_batch():
    with pytest.raises(ConfigError) as err:
        batch_plan(load_config("757m"), 3 * 8)
    assert str(err.value).endswith(
        "use a device count that divides 512: 1, 2, 4, 8, 16, 32, 64, 128, 256, 512."
    )


def test_a_spaced_path_reaches_the_stage_script_unchanged(tmp_path):
    runs = f"runs_dir={tmp_path / 'r a #2'}"
    cfg = load_run_config("tiny", [runs], [0], ["prism"])
    plan = build_plan(cfg, [runs], ["train"], default_scripts(SCRIPTS_DIR), sys.executable)
    (argv,) = [job.argv() for job in plan.jobs if job.stage.name == "train"]
    assert runs in argv  # one word of the child's argv, as given
    assert not any(tmp_path.iterdir())


# ----- real processes ---------------------------------------------------------------------------
def command(script: str, *args: str) -> list[str]:
    return [sys.executable, str(ROOT / "reproduce" / script), *args]


ENV = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
REFUSED = {  # name: (script and arguments, the sentence)
    "lr=nan": (
        ["train.py", "train.lr=nan"],
        "error: train.lr=nan is invalid: it must be positive and finite",
    ),
    "devices=0": (["train.py", "train.devices=0"], "error: train.devices=0 is invalid: use auto"),
    # fewer embedding rows than the tokenizer's ids: training would end in an IndexError
    "vocab_size=1000": (
        ["train.py", "model.vocab_size=1000"],
        "error: model.vocab_size=1000 is invalid: use at least 50257, the GPT-2 tokenizer's vocabulary",
    ),
    "describe vocab_size=1000": (
        ["describe.py", "model.vocab_size=1000"],
        "error: model.vocab_size=1000 is invalid: use at least 50257, the GPT-2 tokenizer's vocabulary",
    ),
    "seed -1": (
        ["train.py", "--seed", "-1"],
        f"error: train.seed=-1 is invalid: use an integer from 0 to {SEED_MAX}.",
    ),
}


# one refusal in a real process, as a user meets it (interpreter start-up and imports included:
# nothing else may reach stderr); the others call the same main() in this process
REAL_PROCESS_CASE = "lr=nan"


def refused_argv(case: str, cwd: Path) -> tuple[str, list[str]]:
    script, *args = REFUSED[case][0]
    return script, ["--scale", "tiny", *SMALL, f"runs_dir={cwd / 'runs'}", *args]


@pytest.mark.parametrize("case", REFUSED)
def test_a_bad_value_on_the_command_line_exits_2_and_writes_nothing(case, tmp_path, capfd, monkeypatch):
    cwd = tmp_path / "empty"
    cwd.mkdir()
    script, argv = refused_argv(case, cwd)
    if case == REAL_PROCESS_CASE:
        pipes = {"capture_output": True, "text": True}
        proc = subprocess.run(command(script, *argv), env=ENV, cwd=cwd, timeout=600, **pipes)
        returncode, said = proc.returncode, proc.stderr.strip()
    else:
        monkeypatch.chdir(cwd)
        capfd.readouterr()  # only what the script writes
        returncode = load_script(script.removesuffix(".py")).main(argv)
        said = capfd.readouterr().err.strip()  # every write to fd 2, as a process's stderr
    assert returncode == 2, said
    assert said.splitlines() == [said] and said.startswith(REFUSED[case][1].split(" is invalid")[0]), said
    assert REFUSED[case][1] in said
    assert not any(cwd.iterdir())  # no run folder, no runs/ at all


def test_train_refuses_a_malformed_list_in_process(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    main = load_script("train").main
    assert main(["--scale", "tiny", f"runs_dir={tmp_path / 'runs'}", "train.milestones=[a,b"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        "error: override train.milestones=[a,b is not a well-formed list: write it as "
        "train.milestones=[a,b], quoting an item that holds a comma, bracket or #."
    )
    assert not any(tmp_path.iterdir())


def test_run_all_dry_run_refuses_a_negative_seed(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    main = load_script("run_all").main
    assert main(["--scale", "tiny", "--seeds", "-1", "--dry-run"]) == 2
    said = capsys.readouterr().out.strip()
    assert said == f"error: seeds=[-1] is invalid: give one or more distinct integers from 0 to {SEED_MAX}."
    assert not any(tmp_path.iterdir())


@pytest.mark.slow
def test_a_run_lands_in_a_runs_dir_with_spaces_and_a_hash(tmp_path):
    runs = tmp_path / "a b #2"
    results = tmp_path / "res #3"
    args = ["--scale", "tiny", "--seed", "0", *SMALL, f"runs_dir={runs}", f"results_dir={results}"]
    proc = subprocess.run(
        command("train.py", *args), env=ENV, cwd=tmp_path, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    run_dir = runs / "tiny" / "prism" / "seed0"
    assert (run_dir / "train_summary.json").is_file()
    saved = yaml.safe_load((run_dir / RUN_CONFIG_NAME).read_text())
    assert saved["runs_dir"] == str(runs) and saved["results_dir"] == str(results)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a b #2"]  # nothing at the cut-off path
