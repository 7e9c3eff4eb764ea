"""run_all.py --ladder (prism.pipeline.ladder, docs/scales.md): the paper ladder's dry run, the
rungs run in order with the report once, a failing rung stops the ladder, and every refusal is
one sentence, exit code 2, nothing written."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import pytest
from conftest import load_script
from rich.console import Console

from prism.pipeline.ladder import run_ladder
from prism.runs.identity import SCALE_KEYS, recipe_differences, recipe_of

ROOT = Path(__file__).resolve().parents[1]
FAKE = ROOT / "tests" / "fixtures" / "report" / "fake_stages"


def _dry_run(tmp_path, monkeypatch, capsys, *argv) -> tuple[int, str, str]:
    monkeypatch.chdir(tmp_path)
    rc = load_script("run_all").main(
        [*argv, "--dry-run", f"results_dir={tmp_path}/results", f"runs_dir={tmp_path}/runs"]
    )
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


@pytest.mark.slow
def test_the_paper_ladders_dry_run_prints_six_rungs_with_their_gpu_hours(tmp_path, monkeypatch, capsys):
    # the real scales read the hub, which CI switches off: plan with shards instead
    shards = ["data.source=shards", f"data.path={tmp_path}/shards"]
    rc, out, err = _dry_run(tmp_path, monkeypatch, capsys, "--ladder", "paper", *shards)
    assert rc == 0, err
    for scale in ("30m", "51m", "82m", "124m", "354m", "757m"):
        assert f"Prism reproduction plan: scale {scale}" in out
    summary = out[out.index("ladder paper: every rung") :]
    lines = [line for line in summary.splitlines() if line.startswith("│")]
    cells = [[c.strip() for c in line.split("│")[1:-1]] for line in lines]
    rows = {c[0]: c[1:] for c in cells}
    assert list(rows) == ["30m", "51m", "82m", "124m", "354m", "757m"]
    assert all(23 <= float(r[2]) <= 30 for r in rows.values())  # tokens per parameter
    assert rows["82m"][:5] == ["81.8M", "2,044,198,912", "25.0", "7.4e-04", "5x2,8x2,10x6"]
    assert rows["757m"][5:] == ["6", "426.3", "53.28", "181.6 GB"]  # the paper's rate: 71.04 GPU-h x 6
    assert all(rows[s][6].endswith("*") and rows[s][7].endswith("*") for s in ("30m", "51m", "82m"))
    assert "* 30m: estimated from FLOPs: 207,942,912 FLOPs/token at 31% MFU (the paper's 124m" in out
    assert out.count("regenerated every time") == 1  # the report stage once, after the last rung
    assert not (tmp_path / "runs").exists() and not (tmp_path / "results").exists()


def _config_dir(tmp_path: Path, monkeypatch) -> Path:
    d = tmp_path / "configs"
    shutil.copytree(ROOT / "configs", d)
    monkeypatch.setenv("PRISM_CONFIG_DIR", str(d))
    return d


def _refused(tmp_path, monkeypatch, capsys, *argv) -> str:
    rc, out, err = _dry_run(tmp_path, monkeypatch, capsys, *argv)
    assert rc == 2, out + err
    assert "Prism reproduction plan" not in out  # refused before any rung was planned
    assert not (tmp_path / "runs").exists() and not (tmp_path / "results").exists()
    # the one sentence, as run_all's console printed it (wrapped at its width: joined again)
    text = " ".join((out + err).split())
    assert text.count("error: ") == 1, text
    return text[text.index("error: ") :]


def test_an_unknown_ladder_is_refused_naming_the_valid_ones(tmp_path, monkeypatch, capsys):
    sentence = _refused(tmp_path, monkeypatch, capsys, "--ladder", "nosuch")
    assert sentence == "error: unknown ladder 'nosuch': valid ladders are cpu, paper."


def test_a_ladder_of_one_scale_is_refused(tmp_path, monkeypatch, capsys):
    d = _config_dir(tmp_path, monkeypatch)
    (d / "ladder" / "one.yaml").write_text("scales: [124m]\n")
    sentence = _refused(tmp_path, monkeypatch, capsys, "--ladder", "one")
    assert sentence == (
        "error: ladder 'one' has 1 scale(s) (124m); a fit of E, A and α needs at least three scales."
    )


def test_a_rung_without_a_scale_file_is_refused(tmp_path, monkeypatch, capsys):
    d = _config_dir(tmp_path, monkeypatch)
    (d / "ladder" / "gap.yaml").write_text("scales: [30m, 51m, 90m]\n")
    sentence = _refused(tmp_path, monkeypatch, capsys, "--ladder", "gap")
    no_file = f"error: ladder 'gap' has rung '90m', which has no file {d / 'scale'}/90m.yaml;"
    assert sentence.startswith(no_file)


def test_a_ladder_out_of_size_order_is_refused(tmp_path, monkeypatch, capsys):
    d = _config_dir(tmp_path, monkeypatch)
    (d / "ladder" / "mixed.yaml").write_text("scales: [51m, 30m, 82m]\n")
    sentence = _refused(tmp_path, monkeypatch, capsys, "--ladder", "mixed")
    assert sentence == "error: ladder 'mixed' lists 51m, 30m, 82m; list them smallest first: 30m, 51m, 82m."


@pytest.mark.parametrize(
    "ladder,rung,patch,named",
    [
        ("paper", "51m", "  warmup_frac: 0.05\n", "rung 51m has train.warmup_frac=0.05 where 30m has 0.025"),
        ("cpu", "cpu-l", None, "rung cpu-l has data.source='hub' where cpu-s has 'offline'"),
    ],
)
def test_rungs_of_different_recipes_are_refused(tmp_path, monkeypatch, capsys, ladder, rung, patch, named):
    d = _config_dir(tmp_path, monkeypatch)
    path = d / "scale" / f"{rung}.yaml"
    text = path.read_text()
    if patch:  # a line into the train section
        text = text.replace("train:\n", "train:\n" + patch, 1)
    else:
        text = text.replace("  source: offline\n", "  source: hub\n", 1)
    path.write_text(text)
    sentence = _refused(tmp_path, monkeypatch, capsys, "--ladder", ladder)
    assert sentence.startswith(f"error: ladder {ladder!r} mixes recipes: {named}; rungs may differ only in ")


def test_scale_and_ladder_exclude_each_other(capsys):
    with pytest.raises(SystemExit) as exc:
        load_script("run_all").main(["--scale", "tiny", "--ladder", "cpu", "--dry-run"])
    assert exc.value.code == 2 and "not allowed with argument" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        load_script("run_all").main(["--dry-run"])
    assert exc.value.code == 2
    assert "one of the arguments --scale --ladder is required" in capsys.readouterr().err


def test_the_recipe_leaves_out_only_what_changes_with_scale():
    model = {"seq_len": 1024}
    a = {"scale": "30m", "heads": [3], "model": {"n_layer": 6, **model}, "train": {"lr": 1e-3, "eps": 1e-8}}
    b = {"scale": "51m", "heads": [2], "model": {"n_layer": 8, **model}, "train": {"lr": 9e-4, "eps": 1e-6}}
    assert recipe_of(a) == {"model": {"seq_len": 1024}, "train": {"eps": 1e-8}}
    assert recipe_differences(recipe_of(a), recipe_of(b)) == ["train.eps"]
    assert "train.lr" in SCALE_KEYS and "train.warmup_frac" not in SCALE_KEYS


def _wrapper(tmp_path: Path, fail_scale: str) -> str:
    """A train stage that fails for one scale and is the fake training for the others."""
    script = tmp_path / "train_or_fail.py"
    script.write_text(
        "import runpy, sys\n"
        f"if sys.argv[sys.argv.index('--scale') + 1] == {fail_scale!r}:\n"
        "    sys.exit(3)\n"
        f"sys.path.insert(0, {str(FAKE)!r})\n"
        f"runpy.run_path({str(FAKE / 'train.py')!r}, run_name='__main__')\n"
    )
    return str(script)


def _ladder_run(tmp_path, monkeypatch, scripts: dict) -> tuple[int, str, list[dict]]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    calls = tmp_path / "calls.jsonl"
    monkeypatch.setenv("FAKE_STAGE_CALLS", str(calls))
    out = io.StringIO()
    rc = run_ladder(
        "cpu",
        [f"runs_dir={tmp_path / 'runs'}", f"results_dir={tmp_path / 'results'}", "run_all.train_retries=0"],
        seeds=[0],
        stages=["train", "bench"],
        console=Console(file=out, width=200),
        scripts=scripts,
    )
    log = [json.loads(line) for line in calls.read_text().splitlines()] if calls.is_file() else []
    return rc, out.getvalue(), log


@pytest.mark.slow
def test_the_rungs_run_in_order_and_the_first_failure_stops_the_ladder(tmp_path, monkeypatch):
    fake = {"train": str(FAKE / "train.py"), "bench": str(FAKE / "benchmark.py")}
    rc, out, log = _ladder_run(tmp_path / "ok", monkeypatch, fake)
    assert rc == 0, out
    scales = [c["argv"][c["argv"].index("--scale") + 1] for c in log if c["stage"] == "train"]
    assert scales == ["cpu-s", "cpu-s", "cpu-m", "cpu-m", "cpu-l", "cpu-l"]  # uniform and prism, seed 0

    rc, out, log = _ladder_run(tmp_path / "fail", monkeypatch, {**fake, "train": _wrapper(tmp_path, "cpu-m")})
    assert rc == 1, out
    assert "ladder cpu stopped at rung cpu-m (exit code 1)" in out
    scales = {c["argv"][c["argv"].index("--scale") + 1] for c in log if c["stage"] == "train"}
    assert scales == {"cpu-s"}  # cpu-l never started


def test_a_ladder_file_that_is_a_bare_list_is_refused(tmp_path, monkeypatch, capsys):
    d = _config_dir(tmp_path, monkeypatch)
    (d / "ladder" / "bare.yaml").write_text("- cpu-s\n- cpu-m\n- cpu-l\n")
    sentence = _refused(tmp_path, monkeypatch, capsys, "--ladder", "bare")
    assert sentence == (
        f"error: ladder file {d / 'ladder' / 'bare.yaml'} needs `scales: [...]`, a list of scale names, "
        f"smallest first."
    )


def test_rungs_of_equal_size_are_refused_naming_the_rung(tmp_path, monkeypatch, capsys):
    """A copy of a scale file is a rung as large as the one before it: the fit would refuse it only
    after every rung had trained."""
    d = _config_dir(tmp_path, monkeypatch)
    shutil.copy(d / "scale" / "cpu-s.yaml", d / "scale" / "cpu-s2.yaml")
    (d / "ladder" / "same.yaml").write_text("scales: [cpu-s, cpu-s2, cpu-m]\n")
    sentence = _refused(tmp_path, monkeypatch, capsys, "--ladder", "same")
    assert sentence.startswith(
        "error: ladder 'same' has rung cpu-s2 no larger than the rung before it (cpu-s 4 x 64 = "
        "3,433,024 parameters, cpu-s2 4 x 64 = 3,433,024 parameters); every rung must be larger"
    )


def test_size_overrides_that_make_rungs_equal_are_refused(tmp_path, monkeypatch, capsys):
    """Sizes are compared after the command's overrides, which apply to every rung: cpu-s and
    cpu-m both 4 layers x 384 are one size, though their files differ."""
    sentence = _refused(tmp_path, monkeypatch, capsys, "--ladder", "cpu", "model.d_model=384")
    assert sentence.startswith(
        "error: ladder 'cpu' has rung cpu-m no larger than the rung before it (cpu-s 4 x 384"
    )
