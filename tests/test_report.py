"""The report stage: hand-written result files -> the expected RESULTS.md, byte-stable output,
the statistics behind the p-values, and the paper tables' internal consistency."""

from __future__ import annotations

import importlib.util
import json
import math
import shutil
from pathlib import Path

import pytest

from prism.config.schema import available_scales, load_config
from prism.core.schedule import parse_heads
from prism.report import build_report, load_paper_tables, write_report
from prism.stats import betainc, sample_sd, t_two_sided_p, welch_from_summary, welch_test

ROOT = Path(__file__).resolve().parents[1]
FIX = ROOT / "tests" / "fixtures" / "report"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_report_from_fixtures_equals_the_hand_written_expectation(tmp_path):
    out, changed = write_report(["124m", "757m"], FIX / "runs", FIX / "results", tmp_path / "RESULTS.md")
    expected = (FIX / "expected_RESULTS.md").read_text()
    assert out.read_text() == expected
    assert sorted(p.name for p in changed) == [
        "124m-delta-distance.png",
        "124m-delta-loss.png",
        "124m-val-loss-gpu-hours.png",
        "124m-val-loss.png",
        "RESULTS.md",
        "across-scales-delta-paper.png",
        "across-scales-delta-reproduced.png",
        "across-scales-multiplier-paper.png",
        "report.json",
        "scaling.json",
    ]
    for png in (tmp_path / "plots").iterdir():
        data = png.read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 10_000
        assert b"Software" not in data and b"matplotlib" not in data.lower()


@pytest.mark.slow
def test_regenerating_is_byte_identical_and_touches_nothing(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    write_report(["124m"], FIX / "runs", FIX / "results", a / "RESULTS.md")
    first = {p.relative_to(a): p.read_bytes() for p in a.rglob("*") if p.is_file()}
    mtimes = {p: p.stat().st_mtime_ns for p in a.rglob("*") if p.is_file()}
    _, changed = write_report(["124m"], FIX / "runs", FIX / "results", a / "RESULTS.md")
    assert changed == []
    assert {p: p.stat().st_mtime_ns for p in a.rglob("*") if p.is_file()} == mtimes
    # a fresh render in another folder gives the same bytes (PNGs included), not just a skipped write
    write_report(["124m"], FIX / "runs", FIX / "results", b / "RESULTS.md")
    assert {p.relative_to(b): p.read_bytes() for p in b.rglob("*") if p.is_file()} == first


def test_missing_and_broken_results_are_marked_never_zero(tmp_path):
    runs, results = tmp_path / "runs", tmp_path / "results"
    shutil.copytree(FIX / "runs", runs)
    (runs / "124m" / "uniform" / "seed2" / "train_summary.json").write_text("{ not json")
    text, _ = build_report(["124m"], runs, results)
    assert "| 124m | uniform | 3.3748 ± 0.0027 | 3.3780 ± 0.0028 | 2 |" in text  # seeds 0 and 1 only
    assert f"`{runs}/124m/uniform/seed2/train_summary.json` could not be read" in text  # where it is
    # no eval, bench or analysis files at all
    assert "| 124m | prism | reproduced | 0 | not run | not run |" in text
    assert "### 124m\n\nNot run." in text
    assert " 0.0000 " not in text and "| 0.0 |" not in text


@pytest.mark.slow
def test_table1_shows_what_the_runs_were_trained_with(tmp_path):
    from omegaconf import OmegaConf

    from prism.config.schema import to_dict

    runs = tmp_path / "runs"
    shutil.copytree(FIX / "runs", runs)
    saved = to_dict(load_config("124m", ["train.lr=1e-3", "train.tokens=262144000"]))
    OmegaConf.save(OmegaConf.create(saved), runs / "124m" / "prism" / "seed0" / "config.yaml")
    text, _ = build_report(["124m"], runs, tmp_path / "results")
    assert (
        "| 124m | kit | 123,587,328 (measured) | 12 | 768 | 12 | 262,144 | 1.0e-03 | 1,000 | 262,144,000 |"
        in text
    )
    (runs / "124m" / "prism" / "seed0" / "config.yaml").write_text("model: [unclosed")
    text, _ = build_report(["124m"], runs, tmp_path / "results")
    assert f"`{runs}/124m/prism/seed0/config.yaml` could not be read" in text


def _save_configs(runs: Path, scale: str = "124m", **by_run: list[str]) -> None:
    """A config.yaml in every run folder of `scale`, as training saves it; `by_run["prism_1"]`
    holds overrides for prism's seed 1."""
    from omegaconf import OmegaConf

    from prism.config.schema import to_dict

    for seed_dir in sorted((runs / scale).glob("*/seed*")):
        sched, seed = seed_dir.parent.name, int(seed_dir.name[4:])
        extra = by_run.get(f"{sched.replace('-', '_')}_{seed}", by_run.get(sched.replace("-", "_"), []))
        saved = to_dict(load_config(scale, [f"schedule={sched}", f"train.seed={seed}", *extra]))
        OmegaConf.save(OmegaConf.create(saved), seed_dir / "config.yaml")


def _row(text: str, start: str) -> str:
    return next(line for line in text.splitlines() if line.startswith(start))


@pytest.mark.slow
def test_runs_of_one_schedule_with_different_budgets_are_never_averaged(tmp_path):
    runs = tmp_path / "runs"
    shutil.copytree(FIX / "runs", runs)
    _save_configs(runs, prism_1=["train.tokens=262144000"])
    text, _ = build_report(["124m"], runs, tmp_path / "results")
    why = (
        "124m prism: not averaged, because `train.tokens` is 2883584000 in 124m/prism/seed0 but "
        "262144000 in 124m/prism/seed1."
    )
    table2, table3, table5 = (text.split(f"## Table {n}")[1] for n in (2, 3, 5))
    assert why in table2 and why in table3 and why in table5
    # Table 2: no mean, tokens/s or wall-clock of prism, no Δ; uniform's runs agree and are averaged
    assert _row(table2, "| 124m | prism |").count("not averaged (see above)") == 3
    assert _row(table2, "| 124m | uniform |").startswith(
        "| 124m | uniform | 3.3748 ± 0.0027 | 3.3760 ± 0.0040 | 3 |"
    )
    delta = _row(table2, "| 124m | −0.0144 |")
    assert delta.endswith("| not compared (see above) | 3 / 3 | not compared (see above) |")
    assert "| 124m | prism | reproduced | 0 | not averaged (see above) |" in table3
    prism5 = next(line for line in table5.splitlines() if "`prism`" in line)
    assert "| not averaged (see above) | not compared (see above) | 3 |" in prism5
    # nor in the training dynamics (milestones, the Δ curve) or the GPU-hours at equal compute
    dynamics = text.split("## Training dynamics")[1].split("## Attention distance")[0]
    assert why in dynamics
    assert (
        _row(dynamics, "| ≤ 3.6 |")
        == "| ≤ 3.6 | 1.44B | not averaged (see above) | not compared (see above) |"
    )
    assert "minimum val loss | 2.88B (loss 3.3760) | not averaged (see above) |" in dynamics
    assert "Δ reproduced" not in dynamics  # no Δ curve of unlike runs (and no paper points at 124m)
    equal = text.split("### At equal compute")[1]
    assert why in equal
    assert (
        _row(equal, "| 124m | prism | not averaged")
        == "| 124m | prism" + " | not averaged (see above)" * 3 + " |"
    )
    # the same runs, trained alike, are averaged as before
    _save_configs(runs)
    text, _ = build_report(["124m"], runs, tmp_path / "results")
    assert "not averaged" not in text and "not compared" not in text


@pytest.mark.slow
def test_schedules_trained_differently_get_no_delta_but_their_own_means(tmp_path):
    runs = tmp_path / "runs"
    shutil.copytree(FIX / "runs", runs)
    _save_configs(runs, prism=["train.lr=1e-3"], config_6=["train.lr=1e-3"])
    text, _ = build_report(["124m"], runs, tmp_path / "results")
    table2 = text.split("## Table 2")[1].split("## Table 3")[0]
    assert (
        "124m prism vs uniform: no Δ, because `train.lr` is 0.0006 in 124m/uniform/seed0 but 0.001 in "
        in table2
    )
    assert "not averaged" not in table2
    assert _row(table2, "| 124m | −0.0144 |").endswith("| not compared (see above) |")
    across = text.split("## Across scales")[1].split("### Paper")[0]
    assert "withheld: its runs differ in recipe" in across
    # each schedule's milestones are its own means; their ratio compares unlike runs and is not shown
    dynamics = text.split("## Training dynamics")[1].split("## Attention distance")[0]
    assert "124m prism vs uniform: no Δ, because `train.lr`" in dynamics
    assert _row(dynamics, "| ≤ 3.6 |") == "| ≤ 3.6 | 1.44B | 721M | not compared (see above) |"


def test_single_seed_has_no_sd_and_no_p_value(tmp_path):
    runs = tmp_path / "runs"
    for sched in ("uniform", "prism"):
        shutil.copytree(FIX / "runs" / "124m" / sched / "seed0", runs / "124m" / sched / "seed0")
    text, _ = build_report(["124m"], runs, tmp_path / "results")
    assert "| 124m | uniform | 3.3748 ± 0.0027 | 3.3800 | 1 |" in text
    assert "| 124m | −0.0144 | 0.0060 | −0.0150 | 1 / 1 | n/a |" in text


def test_report_cli_rejects_an_unknown_scale_and_a_missing_results_dir(capsys, tmp_path):
    spec = importlib.util.spec_from_file_location("report_cli", ROOT / "reproduce" / "report.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main(["--scales", "9b"]) == 2
    valid = ", ".join(available_scales())  # every configs/scale/*.yaml, whatever its name
    assert f"unknown scale '9b': valid scales are {valid}." in capsys.readouterr().err
    assert {"124m", "tiny", "cpu-s"} <= set(available_scales())
    missing = tmp_path / "resutls"  # a mistyped results folder gets no empty report
    assert mod.main(["--results-dir", str(missing)]) == 2
    assert f"--results-dir {missing} is not a folder" in capsys.readouterr().err
    assert not missing.exists()


@pytest.mark.slow
def test_report_cli_names_unusable_result_files_where_they_are_and_exits_1(capsys, tmp_path):
    """A corrupt bench.json or zeroshot.json under the folders given: each is named by its real
    path on the console and in RESULTS.md, and the exit code is 1 unless --allow-problems."""
    spec = importlib.util.spec_from_file_location("report_cli", ROOT / "reproduce" / "report.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    runs, results = tmp_path / "my runs", tmp_path / "my results"
    run = runs / "tiny" / "prism" / "seed0"
    run.mkdir(parents=True)
    (run / "train_summary.json").write_text('{"finished": true}')
    (run / "zeroshot.json").write_text("[1")
    (results / "tiny").mkdir(parents=True)
    (results / "tiny" / "bench.json").write_text("{ not json")
    argv = ["--scales", "tiny", "--runs-dir", str(runs), "--results-dir", str(results)]
    assert mod.main(argv) == 1
    bad = [run / "zeroshot.json", results / "tiny" / "bench.json"]
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        *(f"warning: {f} could not be read (JSONDecodeError); it is left out." for f in bad),
        f"error: {results / 'RESULTS.md'} leaves out the 2 file(s) named above; fix or move them and run "
        f"again, or pass --allow-problems to accept the report without them.",
    ]
    text = (results / "RESULTS.md").read_text()
    assert all(f"- `{f}` could not be read (JSONDecodeError); it is left out." in text for f in bad)
    assert mod.main([*argv, "--allow-problems"]) == 0
    assert capsys.readouterr().err.strip().splitlines() == [
        f"warning: {f} could not be read (JSONDecodeError); it is left out." for f in bad
    ]


# ----- statistics -------------------------------------------------------------------------------
def test_t_distribution_matches_closed_forms():
    assert t_two_sided_p(1.0, 1) == pytest.approx(0.5, abs=1e-12)  # Cauchy: 1 - 2/pi*atan(1)
    assert t_two_sided_p(3.0, 1) == pytest.approx(1 - 2 / math.pi * math.atan(3.0), abs=1e-12)
    for t in (0.1, 0.7, 2.0, 9.0):  # df=2: 1 - t/sqrt(2+t^2)
        assert t_two_sided_p(t, 2) == pytest.approx(1 - t / math.sqrt(2 + t * t), rel=1e-10)
    assert t_two_sided_p(1.959964, 1e7) == pytest.approx(0.05, abs=1e-6)  # large df -> normal
    assert t_two_sided_p(2.776445, 4) == pytest.approx(0.05, abs=1e-6)  # t table, df=4
    assert betainc(2.0, 3.0, 0.4) == pytest.approx(0.5248, abs=1e-12)  # sum of binomial terms
    assert t_two_sided_p(0.0, 3.5) == pytest.approx(1.0)


def test_welch_by_hand():
    # two groups with s.d. 0.004 and 0.002, n=3: se^2 = (16e-6 + 4e-6)/3, df = 50/17
    w = welch_test([3.3800, 3.3760, 3.3720], [3.3650, 3.3630, 3.3610])
    assert w.delta == pytest.approx(-0.013)
    assert w.t == pytest.approx(-0.013 / math.sqrt(20e-6 / 3))
    assert w.df == pytest.approx(50 / 17)
    assert 0.0155 < w.p < 0.0162
    assert sample_sd([1.0, 3.0]) == pytest.approx(math.sqrt(2))
    assert welch_test([1.0], [2.0, 3.0]) is None
    assert welch_test([1.0, 1.0], [2.0, 2.0]) is None  # no spread, no test
    paper = welch_from_summary(3.3748, 0.0027, 3, 3.3604, 0.0010, 3)
    assert paper.p == pytest.approx(0.005981, abs=2e-6)


# ----- the paper's tables -----------------------------------------------------------------------
def test_paper_tables_agree_with_each_other_and_with_the_configs():
    t = load_paper_tables()
    for scale in ("124m", "354m", "757m"):
        c = t.config(scale)
        assert c["steps"] * c["batch_tokens"] == c["tokens"]
        assert f"{c['tokens'] / 1e9:.2f}B" == c["tokens_text"]
        cfg = load_config(scale)
        assert (cfg.model.n_layer, cfg.model.d_model, cfg.model.h_base) == (
            c["layers"],
            c["d_model"],
            c["h_base"],
        )
        assert (cfg.train.tokens, cfg.train.global_batch_tokens, cfg.train.lr) == (
            c["tokens"],
            c["batch_tokens"],
            c["peak_lr"],
        )
        assert list(cfg.head_schedule("prism").heads) == parse_heads(t.t4["schedules"][scale]["heads"])
        dims = [cfg.model.d_model // h for h in cfg.head_schedule("prism").heads]
        assert dims == parse_heads(t.t4["schedules"][scale]["head_dims"])
        assert t.tokens_per_s_per_gpu(scale) == t.val_loss(scale, "uniform")["tokens_per_s"] / 8
    rows = {r["kit"]: r for r in t.ablation()}
    assert rows["uniform"]["val_loss"] == t.val_loss("124m", "uniform")["val_loss"]
    assert rows["prism"]["val_loss"] == t.val_loss("124m", "prism")["val_loss"]
    small = load_config("124m")
    for name, r in rows.items():
        assert list(small.head_schedule(name).heads) == parse_heads(r["schedule"]), name
        if r["delta"] is not None:  # printed from unrounded means: within one last digit
            assert abs(rows["uniform"]["val_loss"] - r["val_loss"] - r["delta"]) <= 0.00011, name
    assert t.delta_distance("124m")[6]["delta_D"] == 48 and t.baseline_d0("354m") == 300
    assert [p["delta"] for p in t.delta_loss_points("757m")] == [-0.0035, -0.005, -0.008]


def test_committed_results_carry_no_machine_path():
    """A committed result names its data and checkpoints by identity or by paths relative to the
    kit, never by where a file sat on the machine that produced it."""
    import re

    results = Path(__file__).resolve().parents[1] / "results"
    absolute = re.compile(r"(?<![\w.~$])/(?:root|home|tmp|work|Users|mnt|scratch|data|opt|var)/")
    for path in results.rglob("*"):
        if path.is_file() and path.suffix in (".json", ".md", ".log", ".txt"):
            if path.name.endswith(".stage.json") or "logs" in path.parts:
                continue  # run_all's own bookkeeping, not committed (.gitignore)
            hits = absolute.findall(path.read_text(errors="replace"))
            assert not hits, f"{path.relative_to(results)} holds a machine path ({hits[0]}...)"


def test_software_section_names_runs_without_an_environment_and_an_empty_scale():
    from prism.report.collect import RunResults, ScaleResults
    from prism.report.software import software_lines
    from prism.runs.records import TrainSummary

    empty = ScaleResults("124m")
    assert software_lines([empty]) == ["No finished run yet."]
    summary = TrainSummary.check({"finished": True})
    old = ScaleResults("124m", runs={"uniform": {0: RunResults("uniform", 0, summary, None)}})
    assert software_lines([old]) == [
        "- Environment not recorded (trained by a kit that did not record it): 124m/uniform/seed0."
    ]


@pytest.mark.slow
def test_attention_distances_of_runs_trained_differently_are_not_averaged(tmp_path):
    """analysis.json's D_l and ΔD_l per schedule average seeds (and pair them with uniform's):
    refused as Table 2 refuses them, with the sentence above the table."""
    runs, results = tmp_path / "runs", tmp_path / "results"
    shutil.copytree(FIX / "runs", runs)
    _save_configs(runs, prism_1=["train.tokens=262144000"])
    layers = 12
    checkpoints = [
        {"schedule": s, "seed": k, "D": [100.0 + 10 * (s == "prism") + k] * layers}
        for s in ("uniform", "prism")
        for k in (0, 1, 2)
    ]
    delta = {"prism": {"mean": [10.0] * layers, "std": [0.0] * layers, "seeds": [0, 1, 2]}}
    (results / "124m").mkdir(parents=True)
    analysis = {"checkpoints": checkpoints, "delta": delta, "sequences": 4, "seq_len": 1024}
    (results / "124m" / "analysis.json").write_text(json.dumps(analysis))
    text, plots = build_report(["124m"], runs, results)
    distance = text.split("## Attention distance")[1].split("\n## ")[0]
    assert "124m prism: not averaged, because `train.tokens` is 2883584000" in distance
    row = _row(distance, "| 0 |")
    assert row.startswith("| 0 | 101.0 (") and row.count("not averaged (see above)") == 1, row
    assert "not compared (see above)" in row and "+10.0" not in row, row
    assert "124m-delta-distance.png" not in plots
    _save_configs(runs)  # trained alike: averaged and compared
    text, plots = build_report(["124m"], runs, results)
    distance = text.split("## Attention distance")[1].split("\n## ")[0]
    assert "not averaged" not in distance and "+10.0 ± 0.0 (3)" in _row(distance, "| 0 |")
    assert "124m-delta-distance.png" in plots
