"""The typed records of result files (prism.runs.records) and collect() reading them: a record
refuses what it can tell is impossible from itself, and a file that cannot be used, or a result
that is not where it claims to be, is named, never dropped without a word.

The trees are the golden report's fixtures (tests/fixtures/report), copied and damaged; collect()
alone reads them, so each test takes milliseconds."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from prism.report.collect import collect
from prism.runs import records as R

FIXTURES = Path(__file__).parent / "fixtures" / "report"
SCALE = "124m"


@pytest.fixture
def tree(tmp_path) -> tuple[Path, Path]:
    shutil.copytree(FIXTURES / "runs", tmp_path / "runs")
    shutil.copytree(FIXTURES / "results", tmp_path / "results")
    return tmp_path / "runs", tmp_path / "results"


def _summary(runs: Path, schedule: str = "prism", seed: int = 0) -> Path:
    return runs / SCALE / schedule / f"seed{seed}" / "train_summary.json"


def _edit(path: Path, **changes) -> None:
    doc = json.loads(path.read_text())
    doc.update(changes)
    path.write_text(json.dumps(doc))


def _problems(runs: Path, results: Path) -> list[str]:
    return collect(SCALE, runs, results).problems


def test_the_fixtures_are_read_whole(tree):
    runs, results = tree
    res = collect(SCALE, runs, results)
    assert res.problems == []
    assert sorted(res.runs["prism"]) == [0, 1, 2] and sorted(res.evals["prism"]) == [0, 1]


# ----- a record checks itself ---------------------------------------------------------------------
def _good() -> dict:
    return json.loads(_summary(FIXTURES / "runs").read_text())


@pytest.mark.parametrize(
    "change, said",
    [
        ({"final_val_loss": 0}, "has `final_val_loss` = 0, where its curve ends at 3.365"),
        ({"min_val_loss": 1.0}, "has `min_val_loss` = 1.0, where its curve's lowest is 3.365"),
        (
            {"wall_clock_s": 1e300},
            "has `wall_clock_s` = 1e+300, where its curve's last validation ran at 1116.0",
        ),
        (
            {"throughput": {"tokens_per_s": 1e-300}},
            "has `throughput.tokens_per_s` = 1e-300, at which its 2,883,584,000 tokens would take over a",
        ),
        ({"finished": "true"}, "has `finished` = 'true', where True belongs"),
        ({"finished": 1}, "has `finished` = 1, where True belongs"),
        ({"heads": []}, "has an empty list `heads`"),
    ],
)
def test_a_summary_refuses_what_contradicts_itself(change, said):
    """Before: a loss of 0 under a curve ending at 3.365, a throughput of 1e-300 and a wall clock
    of 1e300 passed the range checks and were averaged into Table 2."""
    with pytest.raises(R.Unusable) as exc:
        R.TrainSummary.check({**_good(), **change})
    assert str(exc.value).startswith(said)


def test_what_the_writer_wrote_is_what_the_reader_reads(tmp_path):
    doc = _good()
    summary = R.TrainSummary.check(doc)
    summary.write(tmp_path / "s.json")
    assert json.loads((tmp_path / "s.json").read_text()) == doc  # unknown keys kept, none added
    assert summary.val_curve[-1].val_loss == summary.final_val_loss == 3.365


def test_an_older_summary_without_the_newer_fields_is_read():
    old = {"finished": True, "final_val_loss": 3.2}
    s = R.TrainSummary.check(old)
    assert (s.final_val_loss, s.throughput, s.seed, s.val_curve) == (3.2, None, None, None)


def test_a_long_context_result_has_one_layer_count():
    unit = {"length": 8, "rope_scaling": "none", "loss": 1.0, "bucket_loss": [1.0], "bucket_edges": [0, 8]}
    unit |= {"documents": {"sha256": "a", "count": 1, "where": "x"}}
    doc = {"complete": True, "seq_len": 4, "results": [{**unit, "D": [1.0, 2.0]}, {**unit, "D": [1.0]}]}
    with pytest.raises(R.Unusable, match=r"has `results` with \[1, 2\] layers' distances"):
        R.LongContext.check(doc)


# ----- collect names what it leaves out -----------------------------------------------------------
def test_a_copied_seed_is_not_a_third_seed(tree):
    """Before: seed0 copied to seed7 (its summary still says seed 0) counted as another seed."""
    runs, results = tree
    shutil.copytree(runs / SCALE / "prism" / "seed0", runs / SCALE / "prism" / "seed7")
    res = collect(SCALE, runs, results)
    assert sorted(res.runs["prism"]) == [0, 1, 2]
    assert res.problems == [
        f"`{_summary(runs, seed=7)}` says `seed` = 0, but lies in the folder of seed 7; it is left out."
    ]


@pytest.mark.parametrize("key, value", [("schedule", "uniform"), ("scale", "354m")])
def test_a_summary_of_another_folder_is_named(tree, key, value):
    runs, results = tree
    _edit(_summary(runs, seed=1), **{key: value})
    res = collect(SCALE, runs, results)
    assert sorted(res.runs["prism"]) == [0, 2] and sorted(res.runs["uniform"]) == [0, 1, 2]
    [p] = res.problems
    assert p.startswith(f"`{_summary(runs, seed=1)}` says `{key}` = {value!r}, but lies in the folder of")


@pytest.mark.parametrize("value", ["true", 1, None])
def test_a_finished_marker_that_is_not_true_is_named(tree, value):
    runs, results = tree
    _edit(_summary(runs), finished=value)
    [p] = _problems(runs, results)
    assert p == f"`{_summary(runs)}` has `finished` = {value!r}, where True belongs; it is left out."


def test_a_run_in_progress_is_no_problem(tree):
    runs, results = tree
    _edit(_summary(runs), finished=False)
    assert _problems(runs, results) == []


def test_a_summary_that_is_a_folder_or_a_loop_is_named(tree):
    runs, results = tree
    folder, loop = _summary(runs, seed=1), _summary(runs, seed=2)
    folder.unlink()
    folder.mkdir()
    loop.unlink()
    os.symlink(loop.name, loop)  # a link to itself
    problems = _problems(runs, results)
    assert f"`{folder}` is a folder, not a file; it is left out." in problems
    assert any(p.startswith(f"`{loop}` could not be read (") for p in problems), problems
    assert len(problems) == 2


def test_a_seed_folder_linked_to_itself_is_named(tree):
    runs, results = tree
    seed = runs / SCALE / "prism" / "seed5"
    os.symlink(seed.name, seed)
    assert _problems(runs, results) == [
        f"`{seed}` is a link that leads nowhere (or to itself); it is left out."
    ]


def test_an_evaluation_named_for_no_seed_is_named(tree):
    """Before: seed01.json was read as seed 1, and seed1.json's scores replaced by it (or it theirs)."""
    runs, results = tree
    bad = results / SCALE / "eval" / "prism" / "seed01.json"
    shutil.copy(bad.with_name("seed1.json"), bad)
    res = collect(SCALE, runs, results)
    assert res.problems == [f"`{bad}` is not named seed<k>.json for a seed k; it is left out."]
    assert sorted(res.evals["prism"]) == [0, 1]


def test_an_attention_distance_beyond_its_window_is_refused():
    """Before: a ΔD_l s.d. of 1e308 passed the range checks and ended the report in matplotlib's
    LinAlgError while drawing the ΔD_l plot."""
    doc = json.loads((FIXTURES / "results" / SCALE / "analysis.json").read_text())
    R.Analysis.check(doc)
    doc["delta"]["prism"]["std"][0] = 1e308
    with pytest.raises(
        R.Unusable, match=r"has `delta.prism.std` with 1e\+308, more than the 1024-token window"
    ):
        R.Analysis.check(doc)
