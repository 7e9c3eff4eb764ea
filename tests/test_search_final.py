"""The full-budget stage of reproduce/search.py (--final) and its report, on the tiny scale: once
the study is complete, the best --top-k schedules besides uniform, and uniform, are trained at
the full budget with the scale's seeds through the reproduction pipeline (stage records, logs,
RESULTS.md), and SEARCH.md ranks them with mean ± s.d., Δ and Welch p against uniform; its plots
exist; the same command again does nothing; RESULTS.md links SEARCH.md.

One search of three 2-step trials (one rung), then 2 schedules x 2 seeds of 4 steps through the
pipeline: the cost is the five stage processes' start-up. The search's schedules are head lists,
so the final set always holds one: their commas go through run_all's --schedules and plan."""

import json
import math
import sys
from pathlib import Path

import optuna
import pytest
from conftest import SEARCH_TINY, file_stamps, load_script, search_py

from prism.runs.layout import SEARCH_LOSS_PLOT, SEARCH_RANK_PLOT
from prism.search import stability
from prism.search.report import collect, render
from prism.stats import mean, sample_sd, spearman, welch_test

ROOT = Path(__file__).resolve().parents[1]
TINY = [
    *SEARCH_TINY,
    "train.ckpt_every_steps=4",  # the final checkpoint only
    "train.tokens=256",  # the full budget: 4 steps
    "seeds=[0,1]",  # the scale's seeds for the full-budget runs
]
SEARCH = ["--scale", "tiny", "--space", "2x2,4x6", "--space", "2x4,4x4", "--rungs", "128"]
FINAL = ["--final", "--top-k", "1", "--final-stages", "train,report"]


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("final")
    args = [*SEARCH, *FINAL, *TINY, f"runs_dir={tmp / 'runs'}", f"results_dir={tmp / 'results'}"]
    return tmp, args, search_py(*args)


@pytest.mark.slow
def test_the_final_stage_trains_the_best_and_uniform_at_the_full_budget_through_the_pipeline(finished):
    tmp, _, done = finished
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])
    study = tmp / "results" / "tiny" / "search"
    doc = json.loads((study / "search.json").read_text())
    best = next(r["schedule"] for r in doc["ranking"] if r["schedule"] != "uniform")
    fb = doc["full_budget"]
    assert fb["schedules"] == ["uniform", best] and fb["top_k"] == 1
    assert fb["tokens"] == 256 and fb["seeds"] == [0, 1] and fb["missing"] == []
    assert (
        f"the full-budget stage (uniform, {best} with seeds 0, 1 at train.tokens=256) is done" in done.stdout
    )
    losses = {}
    for schedule in fb["schedules"]:
        for seed in (0, 1):  # normal run folders of the pipeline, under the normal runs_dir
            run = tmp / "runs" / "tiny" / schedule.replace(",", "-") / f"seed{seed}"
            summary = json.loads((run / "train_summary.json").read_text())
            assert summary["finished"] is True and summary["tokens_seen"] == 256
            record = json.loads(run.with_name(f"seed{seed}.stage.json").read_text())
            assert record["stage"] == "train" and record["status"] == "done"
            losses.setdefault(schedule, []).append(summary["final_val_loss"])
    rows = {r["schedule"]: r for r in fb["ranking"]}
    assert set(rows) == {"uniform", best}
    report = (study / "SEARCH.md").read_text()
    full = report.split("## Full budget")[1].split("## Rank stability")[0]
    for schedule, values in losses.items():
        row = rows[schedule]
        assert row["values"] == values and row["n"] == 2
        m, sd = mean(values), sample_sd(values)
        assert row["mean"] == m and row["sd"] == sd
        line = next(x for x in full.splitlines() if x.startswith("| ") and f"| {schedule} |" in x)
        assert f"| {m:.4f} ± {sd:.4f} |" in line
        if schedule != "uniform":
            w = welch_test(losses["uniform"], values)
            assert row["delta_vs_uniform"] == m - mean(losses["uniform"]) and row["p_vs_uniform"] == w.p
            assert f"| {m - mean(losses['uniform']):+.4f} | {w.p:.3g} |" in line
        else:
            assert "| baseline | baseline |" in line
    above, second = fb["ranking"]
    w = welch_test(above["values"], second["values"])
    line = next(x for x in full.splitlines() if x.startswith("| 2 |"))
    assert line.endswith("| ~ |" if w.p >= 0.05 else "| distinct |")


@pytest.mark.slow
def test_the_plots_exist_and_search_md_links_them(finished):
    tmp, _, done = finished
    assert done.returncode == 0
    study = tmp / "results" / "tiny" / "search"
    report = (study / "SEARCH.md").read_text()
    for name in (SEARCH_LOSS_PLOT, SEARCH_RANK_PLOT):
        assert (study / name).read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
        assert f"]({name})" in report
    # the last rung against the full budget, over the two schedules run there: too few for ρ
    assert "| 128 | full budget | schedules | 2 | n/a |" in report


@pytest.mark.slow
def test_results_md_links_search_md(finished):
    tmp, _, done = finished
    assert done.returncode == 0
    results = (tmp / "results" / "RESULTS.md").read_text()
    assert "## Schedule searches" in results
    assert "- [tiny/search/SEARCH.md](tiny/search/SEARCH.md)" in results


@pytest.mark.slow
def test_the_same_command_again_does_nothing_and_says_so(finished):
    tmp, args, done = finished
    assert done.returncode == 0
    before = file_stamps(tmp)
    again = search_py(*args)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "is done; nothing to do" in again.stdout and "start train" not in again.stdout
    assert file_stamps(tmp) == before


def test_bad_final_arguments_get_one_sentence_and_nothing_is_written(tmp_path, capsys):
    for extra, sentence in (
        (["--top-k", "0"], "search.top_k=0 is invalid: use a positive count"),
        (
            ["--final", "--final-stages", "train,nope"],
            "run_all.stages 'nope' is invalid: give some of train,",
        ),
    ):
        code = load_script("search").main([*SEARCH, *extra, *TINY, "--study-dir", str(tmp_path / "s")])
        err = capsys.readouterr().err
        assert code == 2 and err.startswith("error: ") and sentence in err and err.count("\n") == 1
        assert list(tmp_path.iterdir()) == []


def test_a_head_list_keeps_its_commas_through_run_all_and_its_plan(tmp_path):
    from prism.core.schedule import split_schedules
    from prism.pipeline import SCRIPTS_DIR, build_plan, load_run_config
    from prism.pipeline.plan import default_scripts

    names = split_schedules("uniform;2x2,4x6;2x4,4x4")  # ';' between two head lists
    assert names == ["uniform", "2x2,4x6", "2x4,4x4"]
    names = split_schedules("uniform,2x2,4x6,prism")
    assert names == ["uniform", "2x2,4x6", "prism"]
    overrides = [f"runs_dir={tmp_path / 'runs'}", f"results_dir={tmp_path / 'results'}"]
    cfg = load_run_config("tiny", overrides, [0], names)
    assert cfg.run_schedules == names
    plan = build_plan(
        cfg, overrides, ["train", "eval", "bench"], default_scripts(SCRIPTS_DIR), sys.executable
    )
    job = {j.label: j for j in plan.jobs}
    assert job["train 2x2,4x6 seed0"].run_dir == tmp_path / "runs" / "tiny" / "2x2-4x6" / "seed0"
    assert (
        job["eval 2x2,4x6 seed0"].output == tmp_path / "results" / "tiny" / "eval" / "2x2-4x6" / "seed0.json"
    )
    argv = job["bench"].argv()
    assert split_schedules(argv[argv.index("--schedules") + 1]) == names
    assert list(tmp_path.iterdir()) == []  # planning writes nothing


# ----- the statistics of rank stability, on a study of known losses -------------------------------
def test_spearman_against_hand_computed_values():
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == 1.0
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == -1.0
    # ranks (1, 2.5, 2.5, 4) and (1, 2, 3, 4): r = 4.5 / sqrt(4.5 * 5)
    assert math.isclose(spearman([1, 2, 2, 3], [1, 2, 3, 4]), 4.5 / math.sqrt(4.5 * 5), rel_tol=1e-12)
    assert spearman([1, 2], [2, 1]) is None and spearman([1, 1, 1], [1, 2, 3]) is None


def study_of(trials: list[tuple[str, dict[int, float], str, dict]]) -> optuna.Study:
    """A real in-memory Optuna study holding finished trials: (schedule, rung losses, state, attrs)."""
    study = optuna.create_study(direction="minimize")
    dist = optuna.distributions.CategoricalDistribution(["uniform", "a", "b", "c"])
    for slot, (schedule, rungs, state, attrs) in enumerate(trials):
        last = rungs[max(rungs)] if rungs else None
        study.add_trial(
            optuna.trial.create_trial(
                params={"schedule": schedule, "seed": 0},
                distributions={"schedule": dist, "seed": optuna.distributions.CategoricalDistribution([0])},
                value=last if state == "complete" else None,
                state={
                    "complete": optuna.trial.TrialState.COMPLETE,
                    "pruned": optuna.trial.TrialState.PRUNED,
                }.get(state, optuna.trial.TrialState.FAIL),
                intermediate_values=rungs,
                user_attrs={"slot": attrs.pop("slot", slot), **attrs},
            )
        )
    return study


def test_rank_stability_and_the_resumed_step_of_a_restarted_attempt():
    trials = [
        ("uniform", {100: 5.0, 200: 4.0}, "complete", {}),
        ("a", {100: 4.0, 200: 3.5}, "complete", {}),
        ("b", {100: 6.0, 200: 3.0}, "complete", {}),
        ("c", {}, "fail", {"slot": 3, "attempt": 1}),  # its worker died during attempt 1
        ("c", {100: 7.0}, "pruned", {"slot": 3, "attempt": 2, "retry_of": 3, "resumed_from_step": 1234}),
    ]
    candidates = [{"key": k, "text": k, "marks": []} for k in ("uniform", "a", "b", "c")]
    study = study_of(trials)
    doc = {"definition": {"scale": "tiny", "space": list("uabc"), "seeds": [0], "rungs": [100, 200]}}
    doc["definition"].update({"trials": 4, "study_seed": 0, "factor": 2, "candidates": candidates})
    doc.update(collect(study, candidates, 0.05))
    reached = [t for t in doc["trials"] if t["state"] in ("complete", "stopped")]
    table = stability.rank_table(reached, [100, 200], {})
    assert table == {"uniform": {100: 2, 200: 3}, "a": {100: 1, 200: 2}, "b": {100: 3, 200: 1}, "c": {100: 4}}
    # over the three trials that reached both rungs: ranks (2, 1, 3) then (3, 2, 1)
    (corr,) = stability.correlations(reached, [100, 200], {}, {})
    assert corr["n"] == 3 and math.isclose(corr["rho"], -0.5, rel_tol=1e-12)
    png = stability.rank_plot(table, [100, 200], ["b", "a", "uniform"], "uniform", "tiny")
    assert png.startswith(b"\x89PNG") and png == stability.rank_plot(
        table, [100, 200], ["b", "a", "uniform"], "uniform", "tiny"
    )  # the same data, the same bytes
    assert stability.loss_plot(reached, ["b", "a", "uniform"], "uniform", "tiny").startswith(b"\x89PNG")
    doc["full_budget"] = None
    doc["settings"] = {"alpha": 0.05, "top_k": 3}
    doc["rank_stability"] = {"correlations": [corr], "ranks": {}}
    text = render(doc)
    restarted = text.split("## Attempts started again")[1]
    assert "| 3 | c | 0 | 1 | no reason recorded | 4 | 1,234 |" in restarted
    assert "| 100 | 200 | trials | 3 | -0.50 |" in text
    assert "Not run yet. The same command with `--final`" in text
