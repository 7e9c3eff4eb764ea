"""A crashed training is retried within the same run_all.py invocation; a deterministic failure is
not; a hung peer fails the process group after train.ddp_timeout_s.

- Real training: reproduce/run_all.py trains with Lightning's own DDP (train.devices=2 on CPU)
  and rank 1 is SIGKILLed after the first step checkpoint; the run is retried and finishes. A data
  file that is empty fails train.py with its sentence and is not retried.
- Every exit the retry decides on (train.py's codes, a signal, a refusal under a launcher's
  crash code, the retry count, the node named after repeated crashes) through a stand-in
  training program that ends each attempt as told and trains like tests/fixtures' fake train.py
  when told "ok".
- The timeout: two real processes in one gloo group, built by prism.train.strategy as training builds
  it; rank 1 stalls, rank 0's collective fails after the 5 s asked for.

Stage programs run as real subprocesses; shared data is not needed (data.source=offline)."""

from __future__ import annotations

import io
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rich.console import Console

from prism.pipeline import run_all

ROOT = Path(__file__).resolve().parents[1]
FAKE_TRAIN = ROOT / "tests" / "fixtures" / "report" / "fake_stages" / "train.py"
ENV = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
ENV = {k: v for k, v in ENV.items() if not k.startswith("SLURM_")}

# A training program whose attempts end as RETRY_ENDS says, one word per attempt (the last one
# repeats): ok (the fake training, which writes a finished run), kill9 (SIGKILLs itself), a number
# (exits with it after train.py's crash: its traceback and line, and the ending it leaves for the
# runner, through prism.cli.exits), refused137 (a refusal through the same wrapper, then 137, as
# srun reports a refusing rank whose peer it killed).
STAND_IN = f"""
import os, runpy, signal, sys
from pathlib import Path
count = Path(os.environ["RETRY_COUNT"])
attempt = int(count.read_text()) if count.is_file() else 0
count.write_text(str(attempt + 1))
ends = os.environ["RETRY_ENDS"].split(",")
end = ends[min(attempt, len(ends) - 1)]
if end == "ok":
    sys.path.insert(0, {str(FAKE_TRAIN.parent)!r})
    sys.argv[0] = {str(FAKE_TRAIN)!r}
    runpy.run_path(sys.argv[0], run_name="__main__")
elif end == "kill9":
    os.kill(os.getpid(), signal.SIGKILL)
elif end == "refused137":
    from prism.cli.exits import run_command
    from prism.data import DataError

    def refuse():
        raise DataError("data file /data/a.jsonl is empty (0 bytes); fix or remove it.")

    run_command(refuse, interrupted="")
    sys.exit(137)
else:
    from prism.cli.exits import run_command

    def crash():
        raise RuntimeError("NCCL communicator was aborted")

    run_command(crash, interrupted="", crashes=True)
    sys.exit(int(end))
"""


def run_scripted(tmp_path, monkeypatch, ends: str, *overrides: str) -> tuple[int, str, int]:
    """run_all over one training job with the stand-in; (exit code, console, attempts)."""
    script = tmp_path / "train_stand_in.py"
    script.write_text(STAND_IN)
    monkeypatch.setenv("RETRY_COUNT", str(tmp_path / "attempts"))
    monkeypatch.setenv("RETRY_ENDS", ends)
    out = io.StringIO()
    rc = run_all(
        "tiny",
        [
            f"runs_dir={tmp_path / 'runs'}",
            f"results_dir={tmp_path / 'results'}",
            "run_all.retry_pause_s=0",
            *overrides,
        ],
        seeds=[0],
        schedules=["prism"],
        stages=["train"],
        scripts={"train": str(script)},
        console=Console(file=out, width=1000),
    )
    return rc, out.getvalue(), int((tmp_path / "attempts").read_text())


CRASH = "crashed: RuntimeError: NCCL communicator was aborted"
HOST = socket.gethostname()


@pytest.mark.parametrize(
    "ends, retry_lines",
    [
        ("kill9,ok", ["(exit code -9: killed by SIGKILL); retry 1 of 2 in 0 s"]),
        (
            "70,70,ok",
            [
                f"(exit code 70: {CRASH}); retry 1 of 2 in 0 s",
                f"(exit code 70: {CRASH}); retry 2 of 2 in 0 s; it crashed on {HOST} 2 times",
            ],
        ),
        ("139,ok", [f"(exit code 139: {CRASH}); retry 1 of 2 in 0 s"]),  # srun: a segfaulted task
    ],
)
def test_a_crash_is_retried_and_the_run_finishes(tmp_path, monkeypatch, ends, retry_lines):
    rc, out, attempts = run_scripted(tmp_path, monkeypatch, ends)
    assert rc == 0, out
    assert attempts == len(retry_lines) + 1
    log = (tmp_path / "results" / "tiny" / "logs" / "train-prism-seed0.log").read_text()
    for n, line in enumerate(retry_lines, 1):
        assert f"train prism seed0 crashed {line}" in out, out
        assert f"===== train prism seed0 crashed {line}" in log
        assert f"===== train prism seed0 (retry {n} of 2): " in log
    retried = len(retry_lines)
    assert f"after {retried} retr{'y' if retried == 1 else 'ies'}" in out
    record = json.loads((tmp_path / "runs" / "tiny" / "prism" / "seed0.stage.json").read_text())
    assert record["status"] == "done" and record["returncode"] == 0


@pytest.mark.parametrize(
    "ends, code",
    [
        ("1", 1),  # refused, NaN loss, a failed write
        ("2", 2),  # bad input
        ("130", 130),  # interrupted
        ("refused137", 137),  # a rank refused: its sentence decides, not the launcher's code
    ],
)
def test_a_deterministic_failure_is_not_retried(tmp_path, monkeypatch, ends, code):
    rc, out, attempts = run_scripted(tmp_path, monkeypatch, ends)
    assert rc == 1 and attempts == 1, out
    assert f"train prism seed0 failed (exit code {code}); its log is" in out
    assert "retry" not in out
    record = json.loads((tmp_path / "runs" / "tiny" / "prism" / "seed0.stage.json").read_text())
    assert record["status"] == "failed" and record["returncode"] == code


def test_crashes_on_every_attempt_name_the_node_and_the_count_is_the_configs(tmp_path, monkeypatch):
    rc, out, attempts = run_scripted(tmp_path, monkeypatch, "kill9", "run_all.train_retries=1")
    host = socket.gethostname()
    assert rc == 1 and attempts == 2, out
    assert "retry 1 of 1 in 0 s" in out and "retry 2" not in out
    assert (
        f"train prism seed0 failed (exit code -9); all 2 attempts crashed (run_all.train_retries=1), "
        f"the last: killed by SIGKILL; every attempt crashed on {host}, which may be faulty: check it; "
        f"its log is"
    ) in out


def test_a_retry_that_fails_deterministically_ends_the_job(tmp_path, monkeypatch):
    rc, out, attempts = run_scripted(tmp_path, monkeypatch, "70,2")
    assert rc == 1 and attempts == 2, out
    assert "retry 1 of 2 in 0 s" in out and "retry 2 of 2" not in out
    assert "train prism seed0 failed (exit code 2) on retry 1 of 2; its log is" in out


def test_no_retry_when_the_count_is_zero(tmp_path, monkeypatch):
    rc, out, attempts = run_scripted(tmp_path, monkeypatch, "70,ok", "run_all.train_retries=0")
    assert rc == 1 and attempts == 1, out
    assert (
        f"train prism seed0 failed (exit code 70); it crashed ({CRASH}) and run_all.train_retries=0 "
        f"allows no retry; its log is"
    ) in out


# what srun printed on the test cluster when task 1 of a two-node training step was SIGKILLed
# (--kill-on-bad-exit=1 then stops task 0, whose gloo collective lost its peer); srun exited 137.
# Task 0 also left its ending (CRASHED_RANK) for the runner.
SRUN_KILLED_TASK = """\
crashed: RuntimeError: [pair.cc:553] Connection closed by peer [127.0.0.1]:41156. This is typically caused by a remote worker crashing.; the same command resumes from the newest checkpoint.
srun: error: node2: task 1: Killed
srun: launch/slurm: _step_signal: Terminating StepId=4.0
slurmstepd-node1: error: *** STEP 4.0 ON node1 CANCELLED AT 2026-12-01T14:20:30 ***
srun: error: node1: task 0: Exited with exit code 70
"""  # noqa: E501


def test_srun_names_the_task_that_failed_first_and_its_node(tmp_path, monkeypatch):
    from prism.cluster import ENDINGS_DIR_ENV, leave_ending
    from prism.pipeline.crashes import Said, read_ending, read_said, repeated_node

    crashed_rank = [Said("crashed", 70, "RuntimeError: [pair.cc:553] Connection closed by peer.")]
    ending = read_ending(137, SRUN_KILLED_TASK, launched_by_srun=True, said=crashed_rank)
    assert ending.crashed and ending.node == "node2" and ending.srun
    assert ending.describe() == "exit code 137: srun: error: node2: task 1: Killed"
    assert repeated_node([ending, ending]) == "node2"
    other = read_ending(137, SRUN_KILLED_TASK.replace("node2", "node3"), launched_by_srun=True)
    assert repeated_node([ending]) is None and repeated_node([ending, other]) is None
    # on a loaded node srun may name the peer that exited first: the killed task is still the cause
    lines = SRUN_KILLED_TASK.splitlines()
    peer_first = "\n".join([lines[0], lines[4], lines[2], lines[3], lines[1]])
    assert read_ending(137, peer_first, launched_by_srun=True).describe() == ending.describe()
    # a refusal on any rank makes the same launcher code a deterministic failure
    # (the endings come from the folder each process wrote, never from the log's lines)
    monkeypatch.setenv(ENDINGS_DIR_ENV, str(tmp_path))
    leave_ending("crashed", 70, "RuntimeError: Connection closed by peer")
    assert read_said(tmp_path) == [Said("crashed", 70, "RuntimeError: Connection closed by peer")]
    said = [*crashed_rank, Said("error", 2, "data file /d/a.jsonl is empty.")]
    refused = read_ending(137, "error: data file /d/a.jsonl is empty.\n" + SRUN_KILLED_TASK, True, said)
    assert not refused.crashed and refused.cause == "error: data file /d/a.jsonl is empty."
    # a sentence in the log that no process left as its ending is no refusal
    assert read_ending(137, "error: something a library printed\n" + SRUN_KILLED_TASK, True).crashed
    # srun could not start the step: no node to blame
    no_step = read_ending(1, "srun: error: Unable to create step for job 7: Invalid generic resource", True)
    assert not no_step.crashed and no_step.node is None


def run_all_cli(tmp_path, *overrides) -> subprocess.Popen:
    log = open(tmp_path / "run_all.out", "w")
    return subprocess.Popen(
        [
            sys.executable,
            str(ROOT / "reproduce" / "run_all.py"),
            "--scale",
            "tiny",
            "--stages=train",
            "--schedules=prism",
            "--seeds=0",
            "train.accelerator=cpu",
            "model.seq_len=32",
            "train.global_batch_tokens=128",
            "train.micro_batch=2",
            "data.val_tokens=256",
            f"runs_dir={tmp_path / 'runs'}",
            f"results_dir={tmp_path / 'results'}",
            "run_all.retry_pause_s=1",
            *overrides,
        ],
        env=ENV,
        cwd=tmp_path,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def local_rank_1(run_all_pid: int) -> int | None:
    """The pid of the train.py rank Lightning started as LOCAL_RANK=1 under `run_all_pid`."""
    for proc in Path("/proc").iterdir():
        try:
            if os.getsid(int(proc.name)) != run_all_pid:  # run_all.py leads its own session
                continue
            cmdline = (proc / "cmdline").read_bytes()
            env = (proc / "environ").read_bytes().split(b"\0")
        except (OSError, ValueError):
            continue
        if b"reproduce/train.py" in cmdline and b"LOCAL_RANK=1" in env:
            return int(proc.name)
    return None


def stop(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


@pytest.mark.slow
def test_a_ddp_rank_killed_mid_run_is_retried_and_the_run_finishes(tmp_path):
    # 12 steps on 2 ranks, a step checkpoint every 3; rank 1 is killed once step 3's exists
    steps = ["train.tokens=1536", "train.ckpt_every_steps=3", "train.val_every_steps=6"]
    proc = run_all_cli(tmp_path, "train.devices=2", *steps)
    run = tmp_path / "runs" / "tiny" / "prism" / "seed0"
    try:
        deadline = time.monotonic() + 300
        while not (run / "checkpoints" / "step-000003.ckpt").is_file():
            assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "run_all.out").read_text()
            time.sleep(0.05)
        victim = local_rank_1(proc.pid)
        assert victim is not None
        os.kill(victim, signal.SIGKILL)
        rc = proc.wait(timeout=300)
    finally:
        stop(proc)
    out = (tmp_path / "run_all.out").read_text()
    assert rc == 0, out[-4000:]
    # rank 0 sees the lost peer in its next collective (gloo: connection closed or reset; 70)
    # or, outside one, Lightning's launcher sees the dead child and SIGKILLs every rank (-9)
    crashed = re.compile(
        r"train prism seed0 crashed \(exit code (70|-9): (crashed: RuntimeError: .*(Connection closed by "
        r"peer|Connection reset).*|\[rank: 1\] Child process with PID " + str(victim) + r" terminated with "
        r"code -9)\); "
        r"retry 1 of 2 in 1 s"
    )
    log = (tmp_path / "results" / "tiny" / "logs" / "train-prism-seed0.log").read_text()
    assert crashed.search(log), log[-4000:]
    assert crashed.search(" ".join(out.split())), out[-4000:]  # the console wraps long lines
    assert "done train prism seed0" in out and "after 1 retry" in out
    retried = log.split("===== train prism seed0 (retry 1 of 2): ", 1)[1]
    resumed = re.search(r"resuming from \S+ \(step (\d+)\)", retried)
    assert resumed and int(resumed.group(1)) >= 3, retried[-3000:]
    summary = json.loads((run / "train_summary.json").read_text())
    assert summary["finished"] and summary["steps"] == 12 and summary["throughput"]["num_devices"] == 2


# Rank 0 and rank 1 of one gloo group, launched as torchrun would, with the Trainer and strategy
# training builds (prism.train.strategy.strategy_arg) and the group joined as training joins it before
# fit (prism.train.strategy.join_process_group). Rank 1 then stalls; rank 0's all-reduce must fail.
STALL = """
import json, os, sys, time
import torch, torch.distributed as dist
from lightning.pytorch import Trainer
from prism.config.schema import load_config
from prism.train.strategy import join_process_group, strategy_arg
strategy, out = sys.argv[1], sys.argv[2]
cfg = load_config("tiny", [f"train.strategy={strategy}", "train.ddp_timeout_s=5", "train.accelerator=cpu",
                           "train.devices=1", "train.num_nodes=2"])
trainer = Trainer(strategy=strategy_arg(cfg), accelerator="cpu", devices=1, num_nodes=2, logger=False,
                  enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False)
join_process_group(trainer.strategy)
if dist.get_rank() == 1:
    time.sleep(600)  # a hung peer: alive, never in the collective
start = time.monotonic()
try:
    dist.all_reduce(torch.ones(1))
    result = {"error": None}
except Exception as exc:
    result = {"error": f"{type(exc).__name__}: {exc}"}
result["seconds"] = time.monotonic() - start
open(out, "w").write(json.dumps(result))
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_a_hung_peer_fails_the_collective_after_ddp_timeout_s(tmp_path):
    """DDP (Lightning starts the group) and FSDP (join_process_group starts it), side by side."""
    script = tmp_path / "stall.py"
    script.write_text(STALL)
    procs = {}
    try:
        for strategy in ("ddp", "fsdp"):
            port = free_port()
            for rank in (0, 1):
                env = {
                    **ENV,
                    "MASTER_ADDR": "127.0.0.1",
                    "MASTER_PORT": str(port),
                    "WORLD_SIZE": "2",
                    "RANK": str(rank),
                    "GROUP_RANK": str(rank),
                    "LOCAL_RANK": "0",
                    "LOCAL_WORLD_SIZE": "1",
                    "TORCHELASTIC_RUN_ID": f"stall-{strategy}",
                }
                procs[strategy, rank] = subprocess.Popen(
                    [sys.executable, str(script), strategy, str(tmp_path / f"{strategy}{rank}.json")],
                    env=env,
                    cwd=tmp_path,
                    stdout=subprocess.DEVNULL,
                    stderr=open(tmp_path / f"{strategy}{rank}.err", "w"),
                    start_new_session=True,
                )
        # start-up (imports, the Trainer) takes seconds; the timeout then bounds the wait: with
        # Lightning's default of 30 minutes rank 0 would still be waiting when this gives up
        for strategy in ("ddp", "fsdp"):
            procs[strategy, 0].wait(timeout=240)
    finally:
        for proc in procs.values():
            stop(proc)
    for strategy in ("ddp", "fsdp"):
        result = json.loads((tmp_path / f"{strategy}0.json").read_text())
        assert result["error"] is not None and "Timed out waiting 5000ms" in result["error"], result
        # gloo counts the 5 s from the collective's start; 25 s of slack for a loaded machine
        assert 5 <= result["seconds"] < 30, (strategy, result)
