"""One writer per run (prism.runs.lock): while a real `reproduce/train.py` or `run_all.py` process
trains a run, a second train.py (its main(), run in the test process to spare an interpreter
start-up) or run_all.py for that run stops with exit code 1 and one sentence naming the holder,
and leaves the folder as it was; run_all.py's own training stage (which runs under run_all's
lock) is not refused, and the lock file goes when its holder is done.

The holder is frozen (SIGSTOP) while the second one tries: it keeps its lock, writes nothing
meanwhile, and the second start cannot race the end of a training that takes seconds."""

import io
import json
import os
import signal
import socket
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pytest
from conftest import load_script, train_py
from rich.console import Console
from test_faults import RUN_TIMEOUT, launched, wait_for_file
from test_train import SMALL

from prism.pipeline import run_all
from prism.runs.lock import RunLock, describe_holder, lock_path

ROOT = Path(__file__).resolve().parents[1]


def train_cmd(runs):
    return train_py(runs, SMALL)


def snapshot(folder: Path) -> dict:
    """Every file under `folder` with its size and modification time."""
    return {
        str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def group_stopped(pgid: int) -> bool:
    """Whether every thread of every process in group `pgid` has stopped. A thread stops when it
    leaves its system call, so a checkpoint write in flight when SIGSTOP came still lands first."""

    def fields(stat: Path) -> list[str]:  # state, ppid, pgrp, ... (after the command's parentheses)
        return stat.read_text().rsplit(")", 1)[1].split()

    for proc in Path("/proc").iterdir():
        try:
            if int(fields(proc / "stat")[2]) != pgid:
                continue
            if any(fields(t / "stat")[0] not in "tTZX" for t in (proc / "task").iterdir()):
                return False
        except (OSError, ValueError):  # not a process, or one that ended meanwhile
            continue
    return True


@contextmanager
def frozen(holder):
    """The holder's process group stopped (SIGSTOP) for the block, every thread of it: it keeps its
    lock and writes nothing meanwhile."""
    os.killpg(holder.pid, signal.SIGSTOP)
    try:
        deadline = time.monotonic() + 60
        while not group_stopped(holder.pid):
            assert time.monotonic() < deadline, "the holder did not stop within 60 s of SIGSTOP"
            time.sleep(0.01)
        yield
    finally:
        os.killpg(holder.pid, signal.SIGCONT)


@pytest.mark.slow
def test_a_second_train_py_is_refused_naming_the_first_which_finishes(tmp_path, capsys):
    runs = tmp_path / "runs"
    out = runs / "tiny" / "prism" / "seed0"
    lock = lock_path(out)
    log = tmp_path / "first"
    with launched(train_cmd(runs), tmp_path, log) as first:
        wait_for_file(out / "checkpoints" / "step-000003.ckpt", first, log)
        with frozen(first):
            before = snapshot(out)
            # the second train.py: its main() in this process (no second interpreter start-up)
            rc = load_script("train").main(train_cmd(runs)[2:])
            err = capsys.readouterr().err
            # and run_all.py, the other entry point, in this process: its job for the run is held
            console = io.StringIO()
            held = run_all(
                "tiny",
                [*SMALL, f"runs_dir={runs}", f"results_dir={tmp_path / 'results'}"],
                seeds=[0],
                schedules=["prism"],
                stages=["train"],
                console=Console(file=console, width=400),
            )
            after = snapshot(out)
        first_rc = first.wait(timeout=RUN_TIMEOUT)
    assert rc == 1, err[-3000:]
    host = socket.gethostname()
    sentence = (
        f"error: {out} is already being trained by another process (train.py, pid {first.pid} on "
        f"{host}; lock {lock}); nothing was started or changed here."
    )
    assert [line for line in err.splitlines() if line.startswith("error:")] == [sentence], err[-3000:]
    assert "Traceback" not in err
    assert held == 1, console.getvalue()
    assert (
        f"train prism seed0 is being run by another process (train.py, pid {first.pid} on {host}; "
        f"lock {lock}); not started here." in " ".join(console.getvalue().split())
    ), console.getvalue()
    assert after == before  # not a byte: config.yaml, tb/, checkpoints/ as the first left them
    assert len(list((out / "tb").glob("events.out.tfevents.*"))) == 1
    assert first_rc == 0, Path(f"{log}.err").read_text()[-3000:]
    assert json.loads((out / "train_summary.json").read_text())["finished"] is True
    assert not lock.exists()  # released and removed with its holder


@pytest.mark.slow
def test_run_all_trains_under_its_lock_and_a_train_py_meanwhile_is_refused(tmp_path, capsys):
    runs, results = tmp_path / "runs", tmp_path / "results"
    out = runs / "tiny" / "prism" / "seed0"
    lock = lock_path(out)
    cmd = [
        sys.executable,
        str(ROOT / "reproduce" / "run_all.py"),
        "--scale",
        "tiny",
        "--seeds",
        "0",
        "--schedules",
        "prism",
        "--stages",
        "train",
        *SMALL,
        f"runs_dir={runs}",
        f"results_dir={results}",
    ]
    log = tmp_path / "run_all"
    with launched(cmd, tmp_path, log) as orchestrator:
        wait_for_file(out / "checkpoints" / "step-000003.ckpt", orchestrator, log)
        holder = describe_holder(lock.read_text())
        with frozen(orchestrator):
            before = snapshot(out)
            # the second train.py: its main() in this process (no second interpreter start-up)
            rc = load_script("train").main(train_cmd(runs)[2:])
            err = capsys.readouterr().err
            after = snapshot(out)
        run_all_rc = orchestrator.wait(timeout=RUN_TIMEOUT)
    assert holder == f"run_all.py, pid {orchestrator.pid} on {socket.gethostname()}"
    assert rc == 1, err[-3000:]
    sentence = (
        f"error: {out} is already being trained by another process ({holder}; lock {lock}); "
        f"nothing was started or changed here."
    )
    assert [line for line in err.splitlines() if line.startswith("error:")] == [sentence], err[-3000:]
    assert after == before
    # run_all's own stage trained to the end under run_all's lock: its child was not refused
    train_log = (results / "tiny" / "logs" / "train-prism-seed0.log").read_text()
    assert run_all_rc == 0, Path(f"{log}.out").read_text()[-3000:] + train_log[-3000:]
    assert "already being trained" not in train_log and f"finished: {out}" in train_log
    assert json.loads((out / "train_summary.json").read_text())["finished"] is True
    assert json.loads((runs / "tiny" / "prism" / "seed0.stage.json").read_text())["status"] == "done"
    assert not lock.exists()


def test_the_lock_names_its_holder_and_a_passed_token_is_no_second_holder(tmp_path):
    """What run_all's child relies on, in one process: a lock held with token T is refused to
    everyone, except (prism.runs.lock.hold) to a holder of T; a refused start leaves no folder."""
    from prism.runs import lock as runlock

    path = tmp_path / "a" / "b" / ".seed0.lock"
    held = RunLock.acquire(path)
    try:
        doc = json.loads(path.read_text())
        assert doc["pid"] == os.getpid() and doc["token"] == held.token
        with pytest.raises(runlock.LockHeld) as refused:
            with runlock.hold(path):
                pass
        assert refused.value.holder == describe_holder(path.read_text())
        assert f"pid {os.getpid()} on {socket.gethostname()}" in refused.value.holder
        with runlock.hold(path, token=held.token) as inner:
            assert inner is None  # held for us: nothing taken, nothing released
        assert path.exists()
    finally:
        held.release()
    assert not (tmp_path / "a").exists()  # the folders made for the lock went with it
