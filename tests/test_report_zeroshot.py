"""The report's zero-shot-vs-tokens part: hand-written `zeroshot.json` files of 2 schedules x 2
seeds at 3 token milestones (prism seed 1 stopped before the third) -> the tables' means, s.d.s
and Δ, the rule for a milestone some seeds lack, runs that evaluated differently, byte-stable
plots, and no such part at all for runs without in-loop scores."""

from __future__ import annotations

import json
import shutil
import statistics
from pathlib import Path

import pytest

from prism.report import build_report, write_report
from prism.report.collect import collect
from prism.report.zeroshot_curve import curves, schedule_points

ROOT = Path(__file__).resolve().parents[1]
FIX = ROOT / "tests" / "fixtures" / "report_zeroshot"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
HEADING = "#### Zero-shot scores vs tokens (in-loop evaluation)"
PLOTS = ["tiny-zeroshot-hellaswag.png", "tiny-zeroshot-piqa.png", "tiny-zeroshot-wikitext.png"]

# The fixture's scores, written out again by hand: schedule -> seed -> one value per milestone
# (10,240 / 20,480 / 30,720 tokens), accuracies in %.
PIQA_ACC = {
    "uniform": {0: [52, 56, 60], 1: [50, 62, 62]},
    "prism": {0: [54, 60, 64], 1: [56, 62]},
}
HELLASWAG_ACC_NORM = {
    "uniform": {0: [24, 30, 32], 1: [26, 28, 30]},
    "prism": {0: [28, 32, 36], 1: [26, 34]},
}
WIKITEXT_WORD_PPL = {
    "uniform": {0: [41000.0, 30500.0, 24100.0], 1: [40000.0, 31500.0, 23900.0]},
    "prism": {0: [39000.0, 29000.0, 22000.0], 1: [38000.0, 28000.0]},
}


def _cell(values: list[float], digits: int) -> str:
    """mean ± sample s.d., as the report prints it (statistics.stdev divides by n - 1)."""
    m = statistics.mean(values)
    return f"{m:.{digits}f}" if len(values) < 2 else f"{m:.{digits}f} ± {statistics.stdev(values):.{digits}f}"


def _signed(x: float, digits: int) -> str:
    return f"{x:+.{digits}f}".replace("-", "−")


def _expected_rows(scores: dict, digits: int) -> list[str]:
    rows = []
    for i, (tokens, step) in enumerate([("10,240", 5), ("20,480", 10), ("30,720", 15)]):
        u = [v[i] for v in scores["uniform"].values() if i < len(v)]
        p = [v[i] for v in scores["prism"].values() if i < len(v)]
        full = len(u) == 2 and len(p) == 2
        p_cell = _cell(p, digits) if len(p) == 2 else f"{len(p)} of 2 seeds"
        delta = _signed(statistics.mean(p) - statistics.mean(u), digits) if full else "n/a"
        rows.append(f"| {tokens} | {step} | {_cell(u, digits)} | {p_cell} | {delta} |")
    return rows


@pytest.fixture(scope="module")
def report() -> str:
    text, _ = build_report(["tiny"], FIX / "runs", FIX / "no-results")
    return text


def test_tables_hold_the_mean_sd_and_delta_of_every_milestone(report):
    header = "| Tokens seen | step | uniform (2 seeds) | prism (2 seeds) | Δ prism − uniform |"
    for title, scores, digits in (
        ("**PIQA** (acc, %)", PIQA_ACC, 1),
        ("**HellaSwag** (acc_norm, %)", HELLASWAG_ACC_NORM, 1),
        ("**WikiText** (word_perplexity, lower is better)", WIKITEXT_WORD_PPL, 1),
    ):
        block = "\n".join([title, "", header, "|---|---:|---:|---:|---:|", *_expected_rows(scores, digits)])
        assert block in report
    # spelled out once, so a wrong formula in the helpers above cannot hide one in the report
    assert "| 20,480 | 10 | 59.0 ± 4.2 | 61.0 ± 1.4 | +2.0 |" in report
    assert "| 10,240 | 5 | 40500.0 ± 707.1 | 38500.0 ± 707.1 | −2000.0 |" in report
    assert "![tiny PIQA acc vs tokens](plots/tiny-zeroshot-piqa.png)" in report
    assert "![tiny WikiText word_perplexity vs tokens](plots/tiny-zeroshot-wikitext.png)" in report
    # the part sits in the scale's training-dynamics subsection, after Figure 3a's Δ loss
    dyn = report.index("## Training dynamics")
    assert dyn < report.index(HEADING) < report.index("## Attention distance")


def test_a_milestone_some_seeds_lack_is_not_averaged_over_the_others():
    c = curves(collect("tiny", FIX / "runs", FIX / "no-results"), ["uniform", "prism"])
    assert c.milestones() == [10240, 20480, 30720]
    prism = schedule_points(c, "prism", "piqa", "acc")
    assert prism[30720] == 1  # one seed of two has it: a count, no value
    assert [p.seeds for t, p in prism.items() if t != 30720] == [2, 2]
    uniform = schedule_points(c, "uniform", "piqa", "acc")
    assert uniform[30720].mean == pytest.approx(61.0) and uniform[30720].seeds == 2


def test_the_settings_line_names_limit_tasks_and_data_and_says_the_milestones_match(report):
    assert (
        "Scored every 10,240 tokens (`train.eval_every_tokens`) on the first 50 documents of each of "
        "piqa, hellaswag, wikitext (`train.eval_limit`, `train.eval_tasks`); data local files, sha256 "
        "0123456789abcdef; scoring lm-evaluation-harness 0.4.x. The milestones are the same for every "
        "schedule and seed by construction" in report
    )
    # (3 runs x (2 + 3 + 4) s + 2 + 3 s) / 11 milestones
    assert "Scoring one milestone took 2.9 s on average (all its tasks, on the runs' own hardware)." in report
    assert "Runs disagree" not in report and "without in-loop scores" not in report


def _copy_runs(tmp_path: Path) -> Path:
    runs = tmp_path / "runs"
    shutil.copytree(FIX / "runs", runs)
    return runs


def _edit(runs: Path, sched: str, seed: int, **changes) -> None:
    f = runs / "tiny" / sched / f"seed{seed}" / "zeroshot.json"
    doc = json.loads(f.read_text())
    doc.update(changes)
    f.write_text(json.dumps(doc))


def test_runs_that_evaluated_differently_are_named_in_one_line_and_never_mixed(tmp_path):
    runs = _copy_runs(tmp_path)
    _edit(runs, "uniform", 1, limit=100)
    _edit(runs, "prism", 0, data_source="hub")
    shutil.copytree(runs / "tiny" / "prism" / "seed1", runs / "tiny" / "config-6" / "seed1")
    summary = runs / "tiny" / "config-6" / "seed1" / "train_summary.json"
    summary.write_text(json.dumps({**json.loads(summary.read_text()), "schedule": "config-6"}))
    text, _ = build_report(["tiny"], runs, tmp_path / "results")
    assert "The ablation schedules' in-loop scores (config-6) are not tabulated here." in text
    assert "config-6 (1 seed)" not in text
    lines = [line for line in text.splitlines() if line.startswith("Runs disagree")]
    assert lines == [
        "Runs disagree on the in-loop evaluation settings; only the comparable runs are shown. Left out: "
        "uniform seed 1 (limit 100, data local files, sha256 0123456789abcdef); prism seed 0 (limit 50, "
        "data hub)."
    ]
    # what is left: uniform seed 0 and prism seed 1, one seed each, so no s.d.; prism seed 1 has
    # no third milestone, which is therefore shown for uniform only
    assert "| Tokens seen | step | uniform (1 seed) | prism (1 seed) | Δ prism − uniform |" in text
    assert "| 10,240 | 5 | 52.0 | 56.0 | +4.0 |" in text
    assert "| 20,480 | 10 | 56.0 | 62.0 | +6.0 |" in text
    assert "| 30,720 | 15 | 60.0 | 0 of 1 seed | n/a |" in text


@pytest.mark.slow
def test_regenerating_gives_the_same_bytes_and_touches_nothing(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    _, changed = write_report(["tiny"], FIX / "runs", tmp_path / "results", a / "RESULTS.md")
    # and the "Across scales" files, which the paper's Table 2 alone gives (test_across_scales.py)
    across = ["across-scales-delta-paper.png", "across-scales-multiplier-paper.png"]
    assert sorted(p.name for p in changed) == sorted(
        ["RESULTS.md", "report.json", "scaling.json", *across, *PLOTS]
    )
    assert sorted(p.name for p in (a / "plots").iterdir()) == sorted([*across, *PLOTS])
    for png in (a / "plots").iterdir():
        data = png.read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 10_000
        assert b"Software" not in data and b"matplotlib" not in data.lower()
    first = {p.relative_to(a): p.read_bytes() for p in a.rglob("*") if p.is_file()}
    mtimes = {p: p.stat().st_mtime_ns for p in a.rglob("*") if p.is_file()}
    _, changed = write_report(["tiny"], FIX / "runs", tmp_path / "results", a / "RESULTS.md")
    assert changed == []
    assert {p: p.stat().st_mtime_ns for p in a.rglob("*") if p.is_file()} == mtimes
    write_report(["tiny"], FIX / "runs", tmp_path / "results", b / "RESULTS.md")
    assert {p.relative_to(b): p.read_bytes() for p in b.rglob("*") if p.is_file()} == first


def test_runs_without_in_loop_scores_get_no_such_part_and_bad_files_are_named(tmp_path):
    runs = _copy_runs(tmp_path)
    for f in runs.rglob("zeroshot.json"):
        f.unlink()
    text, plots = build_report(["tiny"], runs, tmp_path / "results")
    assert "Zero-shot scores vs tokens" not in text and "zeroshot" not in text
    assert not [n for n in plots if "zeroshot" in n]

    runs = _copy_runs(tmp_path / "again")
    (runs / "tiny" / "uniform" / "seed1" / "zeroshot.json").write_text("{ not json")
    _edit(runs, "prism", 1, milestones=[{"step": 5, "tasks": {}}])
    (runs / "tiny" / "prism" / "seed2").mkdir()  # a run in progress: its scores do not count yet
    (runs / "tiny" / "prism" / "seed2" / "train_summary.json").write_text('{"finished": false}')
    shutil.copy(runs / "tiny" / "prism" / "seed0" / "zeroshot.json", runs / "tiny" / "prism" / "seed2")
    text, _ = build_report(["tiny"], runs, tmp_path / "results")
    bad = f"`{runs}/tiny/uniform/seed1/zeroshot.json` could not be read (JSONDecodeError); it is left out."
    assert bad in text
    assert (
        f"`{runs}/tiny/prism/seed1/zeroshot.json` lacks `tokens` in `milestones[0]`; it is left out." in text
    )
    assert "Finished runs without in-loop scores: uniform seed 1, prism seed 1." in text
    assert "| 10,240 | 5 | 52.0 | 54.0 | +2.0 |" in text  # uniform seed 0 vs prism seed 0 only


def test_scores_of_runs_trained_differently_are_not_averaged_or_compared(tmp_path):
    """One prism seed at another budget: its scores are no mean, and no Δ is taken against uniform,
    as in Tables 2 and 3 (prism.report.recipes); the sentence above says why."""
    from test_report import _save_configs

    runs = _copy_runs(tmp_path)
    _save_configs(runs, "tiny", prism_1=["train.tokens=81920"])
    text, plots = build_report(["tiny"], runs, tmp_path / "no-results")
    dynamics = text.split("## Training dynamics")[1].split("## Attention distance")[0]
    assert "tiny prism: not averaged, because `train.tokens` is " in dynamics
    assert "| 20,480 | 10 | 59.0 ± 4.2 | not averaged (see above) | not compared (see above) |" in dynamics
    assert "tiny-zeroshot-piqa.png" in plots  # uniform's line is still drawn
