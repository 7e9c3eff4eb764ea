"""reproduce/search.py on the tiny scale: a search over 6 schedules with 2 rungs and 2 local
worker processes completes and writes SEARCH.md; the same command again does nothing and says
so; the same study seed gives the same trials in the same order; other arguments on the same
study folder, and bad input, get one sentence, exit 2, and nothing written.

Each trial is a real kit training run of 4 steps (2 per rung) of 64 tokens: the cost is the
workers' start-up and the runs' checkpoints, not the steps."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import SEARCH_TIMEOUT as TIMEOUT
from conftest import SEARCH_TINY, file_stamps, load_script, search_args, search_py

ROOT = Path(__file__).resolve().parents[1]
TINY = [
    *SEARCH_TINY,
    "train.ckpt_every_steps=4",  # the final checkpoint only: 95 MB less to write per trial
]
SPACE = ["--space", "rules", "--smooth", "--baseline-preservation"]  # 8 schedules at tiny
ARGS = ["--scale", "tiny", *SPACE, "--trials", "6", "--rungs", "128,256", *TINY]


def dry_run_order(capsys, *args: str) -> list[str]:
    assert load_script("search").main([*args, "--dry-run"]) == 0
    out = capsys.readouterr().out
    lines = out.split("trial order")[1].splitlines()[1:]
    rows = [line.strip() for line in lines if line.strip() and not line.strip().startswith("...")]
    return [row.split(" ", 1)[1] for row in rows]


@pytest.fixture(scope="module")
def searched(tmp_path_factory):
    study = tmp_path_factory.mktemp("search") / "study"
    done = search_py(*ARGS, "--workers", "2", "--study-dir", str(study))
    return study, done


@pytest.mark.slow
def test_a_search_with_two_workers_completes_every_trial_once_and_writes_its_report(searched):
    study, done = searched
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"the search in {study} is complete" in done.stdout
    doc = json.loads((study / "search.json").read_text())
    trials = doc["trials"]
    assert sorted(t["slot"] for t in trials) == list(range(6))  # every trial exactly once
    assert all(t["state"] in ("complete", "stopped") for t in trials), trials
    ranked = {r["schedule"] for r in doc["ranking"]}
    assert "uniform" in ranked  # the baseline is never stopped
    for t in trials:  # a normal run folder under the study's own directory, per trial
        run = study / "runs" / "tiny" / t["schedule"].replace(",", "-") / "seed0"
        assert (run / "config.yaml").is_file()
        finished = (run / "train_summary.json").is_file()
        assert finished == (t["state"] == "complete")
        if t["state"] == "stopped":  # stopped at the first rung: its checkpoints are deleted
            assert list(t["rungs"]) == ["128"] and not (run / "checkpoints").exists()
        else:
            assert list(t["rungs"]) == ["128", "256"]
            summary = json.loads((run / "train_summary.json").read_text())
            assert summary["tokens_seen"] == 256 and summary["final_val_loss"] == t["value"]
    report = (study / "SEARCH.md").read_text()
    assert "| 1 |" in report and "uniform" in report and "Table 4 prism" in report


@pytest.mark.slow
def test_the_same_command_again_does_nothing_and_says_so(searched):
    study, _ = searched
    before = file_stamps(study)
    again = search_py(*ARGS, "--workers", "2", "--study-dir", str(study))
    assert again.returncode == 0, again.stderr[-2000:]
    assert "is complete" in again.stdout and "nothing to do" in again.stdout
    assert file_stamps(study) == before


@pytest.mark.slow
def test_the_same_study_seed_gives_the_same_trials_in_the_same_order(searched, capsys):
    study, _ = searched
    order = dry_run_order(capsys, *ARGS)
    assert order == dry_run_order(capsys, *ARGS)
    assert order[0] == "uniform seed 0" and len(order) == 6
    other = dry_run_order(capsys, *ARGS, "--seed", "1")
    assert other[0] == "uniform seed 0" and other[1:] != order[1:]  # another seed, another order
    trials = json.loads((study / "search.json").read_text())["trials"]
    ran = [f"{t['schedule']} seed {t['seed']}" for t in sorted(trials, key=lambda t: t["number"])]
    assert ran == order  # what the workers trained is the order the dry run showed


@pytest.mark.slow
def test_other_arguments_on_the_same_study_are_refused_naming_the_change(searched, capsys):
    study, _ = searched
    before = file_stamps(study)
    code = load_script("search").main([*ARGS, "--seed", "3", "--study-dir", str(study)])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("error: --seed changed: the study was made with 0, not 3;") and err.count("\n") == 1
    assert file_stamps(study) == before


@pytest.mark.slow
def test_search_settings_may_change_between_invocations_and_only_the_report_follows(searched, capsys):
    """search.* overrides set how the study runs and reports, not what it trains: another alpha is
    not a change of the study, and the report's `~` level follows it."""
    study, _ = searched
    report = study / "SEARCH.md"
    assert "(Welch p >= 0.05)" in report.read_text()
    runs = file_stamps(study / "runs")
    try:
        code = load_script("search").main([*ARGS, "--study-dir", str(study), "search.alpha=0.5"])
        out = capsys.readouterr().out
        assert code == 0 and "is complete" in out and "nothing to do" in out
        assert "(Welch p >= 0.5)" in report.read_text()
        assert file_stamps(study / "runs") == runs
    finally:  # the module's other tests read the report of the default settings
        assert load_script("search").main([*ARGS, "--study-dir", str(study)]) == 0
    assert "(Welch p >= 0.05)" in report.read_text()


@pytest.mark.slow
def test_sigterm_to_the_parent_of_local_workers_stops_them_with_checkpoints_and_the_rerun_finishes(tmp_path):
    """The parent passes SIGTERM on to its workers, which checkpoint their trials and stop; it
    exits 75 naming their codes, and the same command resumes those trials and completes."""
    import signal
    import time

    study = tmp_path / "study"
    args = ["--scale", "tiny", *SPACE, "--trials", "3", "--rungs", "128,256", *TINY]
    args += ["--study-dir", str(study)]
    log = tmp_path / "first.log"
    with log.open("w") as out:
        parent = subprocess.Popen(
            [sys.executable, str(ROOT / "reproduce" / "search.py"), *args, "--workers", "2"],
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
        )
        deadline = time.monotonic() + TIMEOUT
        while not list(study.glob("runs/tiny/*/seed0/config.yaml")):  # a trial is starting
            assert parent.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.2)
        parent.send_signal(signal.SIGTERM)
        code = parent.wait(timeout=TIMEOUT)
    text = log.read_text()
    assert code == 75, text[-3000:]
    assert f"the search in {study} is not complete" in text and "worker exit codes [75" in text
    assert "run the same command to continue the search" in text
    again = search_py(*args)
    assert again.returncode == 0, again.stderr[-3000:]
    doc = json.loads((study / "search.json").read_text())
    assert sorted(t["slot"] for t in doc["trials"]) == [0, 1, 2]  # every trial once
    stopped = [t for t in doc["restarted"] if "on a signal)" in (t["reason"] or "")]
    assert stopped, doc["restarted"]  # stopped on the signal, not counted as a death
    # a trial stopped at a step boundary resumes from that checkpoint; one stopped before its first
    # step (the signal came while it was being taken or starting) has none and starts afresh
    resumed = [t for t in stopped if t["next_resumed_from_step"] is not None]
    assert resumed and all(t["next_resumed_from_step"] >= 1 for t in resumed), stopped


@pytest.mark.parametrize(
    "args, sentence",
    [
        (["--space", "table5", "--rungs", "128,256"], "--space table5 holds schedules for n_layer=12"),
        (["--space", "3x2,6x2,12x8", "--rungs", "128,256"], "has 12 layers but the model has n_layer=8"),
        ([*SPACE, "--rungs", "128,256", "--tokens", "64"], "--tokens 64 is smaller than one rung of 128"),
        ([*SPACE, "--rungs", "128,320"], "is not a geometric series"),
        (["--space", "", "--rungs", "128,256"], "--space '' is empty: give table5, rules, a schedule name"),
        (["--space", "prism", "--space", " ", "--rungs", "128,256"], "--space ' ' is empty"),
        ([*SPACE, "--rungs", "128,256", "--seed", "-5"], "--seed=-5 is invalid: use an integer from 0 to"),
        ([*SPACE, "--seeds", "0", "-1", "--rungs", "128,256"], "--seeds=0 -1 is invalid"),
        (
            [*SPACE, "--rungs", "128,256", "train.eval_every_tokens=100"],
            "train.eval_every_tokens=100 is not a multiple of train.global_batch_tokens=64;",
        ),
        ([*SPACE, "--rungs", "128,256", "--gpu-hours", "-1"], "--gpu-hours=-1.0 is invalid: give a positive"),
        ([*SPACE, "--rungs", "128,256", "--gpu-hours", "0"], "--gpu-hours=0.0 is invalid: give a positive"),
        ([*SPACE, "--rungs", "128,256", "--tokens", "-5"], "--tokens -5 is invalid: give a positive token"),
        ([*SPACE, "--rungs", "128,256", "--tokens", "0"], "--tokens 0 is invalid: give a positive token"),
        ([*SPACE, "--rungs", "128,256", "--trials", "0"], "--trials 0 is smaller than one trial; give 1 or"),
        ([*SPACE, "--rungs", "100"], "train.global_batch_tokens=64; use a positive multiple, e.g. 64."),
        ([*SPACE, "--rungs", "100000"], "use a positive multiple, e.g. 40960."),  # train.tokens: 40,960
    ],
    ids=[
        "empty-space",
        "invalid-schedule",
        "budget-below-one-rung",
        "rungs-not-geometric",
        "blank-space",
        "blank-part-of-space",
        "negative-study-seed",
        "negative-train-seed",
        "override-every-trial-refuses",
        "negative-gpu-hours",
        "zero-gpu-hours",
        "negative-tokens",
        "zero-tokens",
        "zero-trials",
        "rung-not-whole-steps",
        "rung-above-the-budget",
    ],
)
def test_bad_input_gets_one_sentence_and_nothing_is_written(tmp_path, capsys, args, sentence):
    study = tmp_path / "study"
    code = load_script("search").main(["--scale", "tiny", *args, *TINY, "--study-dir", str(study)])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("error: ") and sentence in err and err.count("\n") == 1
    assert list(tmp_path.iterdir()) == []


def test_a_rung_suggestion_is_within_the_budget_and_reads_back_as_rungs(tmp_path, capsys):
    """A series whose factor-3 completion would pass train.tokens (40,960 at tiny) gets one within
    it, without thousands separators, which --rungs would read as several counts."""
    search = load_script("search")
    args = ["--scale", "tiny", "--space", "prism", *TINY, "--study-dir", str(tmp_path / "study")]
    assert search.main([*args, "--rungs", "8192,16384,24576"]) == 2
    err = capsys.readouterr().err
    suggested = err.split("use e.g. ")[1].rstrip(".\n")
    assert suggested == "4544,13632,40896" and max(map(int, suggested.split(","))) <= 40960
    assert search.main([*args, "--rungs", suggested, "--dry-run"]) == 0
    assert "rung " in capsys.readouterr().out and list(tmp_path.iterdir()) == []


def test_a_rules_space_too_large_to_list_is_counted_and_refused_at_once(capsys):
    """757m's unfiltered rules space holds 2,035,800 schedules: listing them took minutes; they
    are counted (prism.core.schedule.count_schedules) and refused with the count, dry run or not."""
    import time

    search = load_script("search")
    start = time.monotonic()
    code = search.main(["--scale", "757m", "--space", "rules", "--rungs", "1%,3%,9%", "--dry-run"])
    err = capsys.readouterr().err
    assert code == 2 and time.monotonic() - start < 60
    assert err == (
        "error: --space rules holds 2,035,800 schedules of L=24, d_model=1536, h_base=16 under these "
        "filters, more than the 100,000 a search can list; add --smooth, --baseline-preservation, "
        "--power-of-two or --max-head-dim, or name the candidates.\n"
    )


@pytest.mark.parametrize("damage", ["cut-short", "not-utf8", "not-json"])
def test_a_damaged_journal_is_refused_naming_it_and_left_as_it_is(tmp_path, capsys, damage):
    """A journal made as search.py makes it (open_study), then cut in the middle of its last
    record, given a byte that is not UTF-8, or a line that is not JSON: Optuna raised on the last
    two and read past the first (to glue its next record onto the cut one)."""
    from prism.search.plan import Search
    from prism.search.study import open_study

    search = load_script("search")
    args = ["--scale", "tiny", "--space", "prism", "--rungs", "128,256", *TINY]
    args += ["--study-dir", str(tmp_path / "study")]
    plan = Search(search_args(args))
    open_study(plan.study_dir, plan.definition, plan.rungs, plan.order)
    journal = plan.study_dir / "study.journal"
    whole = journal.read_bytes()
    first = whole.index(b"\n") + 1  # line 2 starts here
    bad, line = {
        "cut-short": (whole[:-10], whole.count(b"\n")),
        "not-utf8": (whole[: first + 5] + b"\xff" + whole[first + 6 :], 2),
        "not-json": (whole[:first] + b"{oops\n" + whole[first:], 2),
    }[damage]
    journal.write_bytes(bad)
    capsys.readouterr()  # Optuna's word on the study it made
    assert search.main(args) == 2
    if damage == "cut-short":  # whole records up to the cut: the study as its workers last saw it
        said = (
            f"ends in a record cut short (line {line}: the file was cut, or its disk filled while the "
            f"record was written); delete that last line to continue the study as its workers last saw "
            f"it, or restore the file from a copy."
        )
    else:
        said = (
            f"is damaged at line {line} (not a whole record of the study: changed outside the search); "
            f"restore it from a copy, or move it aside to make the study again."
        )
    assert capsys.readouterr().err == f"error: {journal} {said}\n"
    assert journal.read_bytes() == bad and [p.name for p in plan.study_dir.iterdir()] == ["study.journal"]
    if damage == "cut-short":  # what the sentence says to do continues the study
        journal.write_bytes(bad[: bad.rindex(b"\n") + 1])
        assert search.main([*args, "--dry-run"]) == 0
        assert f"study: {plan.study_dir} (exists)" in capsys.readouterr().out


NOLOCK_C = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
/* flock(2) as a filesystem without a lock service answers it, for files under $NOLOCK_PREFIX */
int flock(int fd, int op) {
    static int (*real)(int, int);
    if (!real) real = (int (*)(int, int))dlsym(RTLD_NEXT, "flock");
    const char *prefix = getenv("NOLOCK_PREFIX");
    char link[64], path[4096];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, path, sizeof path - 1);
    if (prefix && n > 0) {
        path[n] = 0;
        if (strncmp(path, prefix, strlen(prefix)) == 0) { errno = ENOLCK; return -1; }
    }
    return real(fd, op);
}
"""


@pytest.mark.slow
def test_a_study_dir_on_a_filesystem_without_locks_is_refused(tmp_path):
    """No filesystem here refuses flock, so a preloaded flock() refuses it the way one does
    (ENOLCK) for the files of one folder; everything else in the process is real."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to build the lockless-filesystem shim")
    shim = tmp_path / "nolock.so"
    (tmp_path / "nolock.c").write_text(NOLOCK_C)
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(shim), str(tmp_path / "nolock.c"), "-ldl"], check=True)
    nolock = tmp_path / "nolock"
    nolock.mkdir()
    study = nolock / "study"
    done = search_py(
        *ARGS, "--study-dir", str(study), env={"LD_PRELOAD": str(shim), "NOLOCK_PREFIX": str(nolock)}
    )
    assert done.returncode == 2, (done.stdout[-2000:], done.stderr[-2000:])
    assert done.stderr.startswith(f"error: --study-dir {study} is on a filesystem without file locks (")
    assert done.stderr.count("\n") == 1
    assert list(nolock.iterdir()) == []
