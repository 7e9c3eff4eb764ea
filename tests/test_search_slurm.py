"""reproduce/search.py as a Slurm job array on the real two-node test cluster (dev/slurm-cluster.sh):
two array tasks of reproduce/slurm/search.sbatch share one study of 6 tiny schedules with 2 rungs.
One task is killed with SIGKILL in the middle of a trial, once that trial has written its
first-rung checkpoint; the other task completes the study, every trial exactly once, and trains
the killed trial on from that checkpoint (the step it resumed from is shown and checked) to the
same result as an uninterrupted run of the same schedule and seed. Skipped without the cluster."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import SEARCH_TINY
from test_slurm import _env, job_state, slurm_cluster

from prism.config.schema import load_config
from prism.runs.checkpoint import open_ckpt
from prism.search.budget import parse_rungs
from prism.search.trial_config import trial_overrides

ROOT = Path(__file__).resolve().parents[1]
SBATCH = ROOT / "reproduce" / "slurm" / "search.sbatch"
# one task, one fake GPU and one CPU per worker: the test cluster runs several such jobs at once
WORKER = ["--ntasks=1", "--gpus-per-task=1", "--cpus-per-task=1"]
# every trial: 4 steps of 64 tokens, validation and a checkpoint (last.ckpt) at each rung (step 2, 4)
TINY = [
    *SEARCH_TINY,
    "train.accelerator=cpu",
]
RUNGS = "128,256"
FIRST_RUNG_STEP = 2
SEARCH = ["--space", "rules", "--smooth", "--baseline-preservation", "--trials", "6", "--rungs", RUNGS, *TINY]
# uniform is trial 0 and never stopped at a rung: it always trains on past its first checkpoint
KILLED = Path("runs") / "tiny" / "uniform" / "seed0"
TIMEOUT = 600

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("slurm_cluster")]


def submit_array(workdir: Path, study: Path) -> str:
    proc = subprocess.run(
        [
            "sbatch",
            "--parsable",
            "--array=0-1",
            *WORKER,
            f"--chdir={workdir}",
            f"--output={workdir}/slurm-%A_%a.out",
            str(SBATCH),
            "tiny",
            *SEARCH,
            "--study-dir",
            str(study),
        ],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=60,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip().split(";")[0]


def reference_run(runs_dir: Path) -> subprocess.Popen:
    """reproduce/train.py of the killed trial's exact config (the search's overrides, then the
    trial's: uniform, seed 0, the rungs' budget, validation and checkpoints), uninterrupted, one
    CPU thread like the array tasks (their --cpus-per-task=1)."""
    rungs = parse_rungs(RUNGS, load_config("tiny", TINY))
    overrides = trial_overrides(TINY, rungs, runs_dir, "uniform", 0)
    return subprocess.Popen(
        [sys.executable, str(ROOT / "reproduce" / "train.py"), "--scale", "tiny", *overrides],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=_env(),
    )


def done(task: str) -> bool:
    return job_state(task).get("JobState") not in ("PENDING", "RUNNING", "REQUEUED", "COMPLETING", None)


def kill_after_first_checkpoint(run: Path, array: str) -> dict:
    """Wait for the run's first checkpoint, freeze its worker (SIGSTOP: the trial goes no further
    while the checkpoint's step is read), then SIGKILL it, as the OOM killer or a lost node ends a
    process: nothing more runs in it. (`scancel --signal=KILL` is a cancel to Slurm, which sends
    SIGTERM first: that is preemption, and the worker would checkpoint and stop cleanly.) The
    worker is the process that holds the run's lock; the lock file names its pid and Slurm job,
    and both test nodes are this machine."""
    last = run / "checkpoints" / "last.ckpt"
    deadline = time.monotonic() + TIMEOUT
    while not last.is_file():
        assert time.monotonic() < deadline, "no first-rung checkpoint"
        assert not all(done(f"{array}_{i}") for i in (0, 1)), "the array ended before the first checkpoint"
        time.sleep(0.01)
    holder = json.loads(run.with_name(f".{run.name}.lock").read_text())
    pid, job = int(holder["pid"]), holder["slurm_job"]
    os.kill(pid, signal.SIGSTOP)
    step = int(open_ckpt(last, mmap=True)["global_step"])
    finished = (run / "train_summary.json").exists()
    os.kill(pid, signal.SIGKILL)
    while Path(f"/proc/{pid}").exists():
        assert time.monotonic() < deadline, f"worker {pid} outlived SIGKILL"
        time.sleep(0.05)
    return {"pid": pid, "job": job, "step": step, "finished": finished}


def test_a_search_array_completes_after_a_worker_is_killed_and_resumes_the_killed_trial(tmp_path):
    study = tmp_path / "study"
    started = time.monotonic()
    reference = reference_run(tmp_path / "reference")
    array = submit_array(tmp_path, study)
    run = study / KILLED
    killed = kill_after_first_checkpoint(run, array)
    killed_at = time.monotonic() - started
    assert killed["step"] == FIRST_RUNG_STEP and not killed["finished"], killed

    deadline = time.monotonic() + TIMEOUT
    while not all(done(f"{array}_{i}") for i in (0, 1)):
        assert time.monotonic() < deadline, [job_state(f"{array}_{i}") for i in (0, 1)]
        time.sleep(0.5)
    elapsed = time.monotonic() - started
    states = {i: job_state(f"{array}_{i}") for i in (0, 1)}
    logs = {i: (tmp_path / f"slurm-{array}_{i}.out").read_text(errors="replace") for i in (0, 1)}
    dead = next(i for i in (0, 1) if states[i]["JobId"] == killed["job"])
    alive = 1 - dead
    assert states[dead]["JobState"] == "FAILED" and states[dead]["ExitCode"] == "0:9", states[dead]
    log = logs[alive]
    assert states[alive]["JobState"] == "COMPLETED" and states[alive]["ExitCode"] == "0:0", log[-4000:]
    assert f"the search in {study} is complete" in log, log[-4000:]

    # the surviving worker took the killed trial and trained it on from its first-rung checkpoint
    resumed = re.search(rf"resuming from {re.escape(str(run))}/checkpoints/last\.ckpt \(step (\d+)\)", log)
    assert resumed, log[-4000:]
    print(f"killed task {array}_{dead} (pid {killed['pid']}) at step {killed['step']}, {killed_at:.0f} s in;")
    print(f"task {array}_{alive}: {resumed.group(0)}; the array took {elapsed:.0f} s")
    assert int(resumed.group(1)) == FIRST_RUNG_STEP

    doc = json.loads((study / "search.json").read_text())
    trials = doc["trials"]
    assert sorted(t["slot"] for t in trials) == list(range(6)), trials  # every trial exactly once
    assert all(t["state"] in ("complete", "stopped") for t in trials), trials
    uniform = next(t for t in trials if t["slot"] == 0)
    assert uniform["schedule"] == "uniform" and uniform["state"] == "complete" and uniform["attempt"] == 2
    assert uniform["resumed_from_step"] == FIRST_RUNG_STEP
    assert all(t.get("resumed_from_step") is None for t in trials if t["slot"] != 0), trials
    [first] = doc["restarted"]  # the killed attempt, replaced, and why
    assert first["slot"] == 0 and first["attempt"] == 1
    assert first["reason"] == "its worker stopped during attempt 1; started again from its run's checkpoints"
    report = (study / "SEARCH.md").read_text()  # the killed attempt, its next one, and where that resumed
    then = rf"\| {uniform['number']} \| {FIRST_RUNG_STEP} \|"
    row = rf"^\| 0 \| uniform \| 0 \| 1 \| its worker stopped [^|]+ {then}$"
    assert re.search(row, report, re.M), report
    # nothing of the killed worker is left behind: its lock files went when the others reaped it
    assert not list(study.rglob(".*.tmp")) and not list(study.rglob(".*.lock"))
    assert not (study / "workers").exists()

    # the resumed trial ends exactly where an uninterrupted run of it ends: a resume restores
    # weights, AdamW moments, the LR schedule, RNG and the data position, on the same machine,
    # batch shape and one thread, so the gap is 0.0; 1e-4 (test_faults' bound) lets no lost or
    # replayed step through: at lr 3e-3 one step moves this 4-step run's val loss by > 1e-2
    out, _ = reference.communicate(timeout=TIMEOUT)
    assert reference.returncode == 0, out[-3000:]
    ref = json.loads((tmp_path / "reference" / KILLED.relative_to("runs") / "train_summary.json").read_text())
    got = json.loads((run / "train_summary.json").read_text())
    assert got["config_hash"] == ref["config_hash"]
    assert [p["step"] for p in got["val_curve"]] == [p["step"] for p in ref["val_curve"]] == [0, 2, 4]
    for a, b in zip(got["val_curve"], ref["val_curve"]):
        assert abs(a["val_loss"] - b["val_loss"]) < 1e-4, (a, b)
    assert abs(got["final_val_loss"] - ref["final_val_loss"]) < 1e-4
    assert uniform["value"] == got["final_val_loss"]
