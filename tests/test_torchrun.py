"""Multi-node launch as docs/cluster.md describes it: two torchrun agents on localhost (as on two
nodes, one process each, c10d rendezvous, gloo on CPU) train the shrunken tiny run of
test_train.py to the same validation losses as one process with gradient accumulation 2."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from test_train import SMALL  # 12 optimizer steps of 4 x 32 tokens, validation at 0, 6, 12

from prism.config.schema import load_config
from prism.runs.layout import run_dir
from prism.train.batch import batch_plan

ROOT = Path(__file__).resolve().parents[1]
RUN = ["--scale", "tiny", "--schedule", "prism", "--seed", "0", *SMALL, "train.accelerator=cpu"]
TIMEOUT_S = 300  # both agents together; a normal run takes ~20 s on 2 CPU cores


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def clean_env() -> dict:
    """This process's environment minus anything that would make the children think they are
    already inside a launcher (torchrun, SLURM), with one OpenMP thread per process."""
    launcher = {
        "RANK",
        "LOCAL_RANK",
        "WORLD_SIZE",
        "LOCAL_WORLD_SIZE",
        "GROUP_RANK",
        "NODE_RANK",
        "MASTER_ADDR",
        "MASTER_PORT",
    }
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in launcher and not k.startswith(("TORCHELASTIC_", "SLURM_"))
    }
    return {**env, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT / "src")}


def descendants(pid: int) -> list[int]:
    """All live descendants of `pid` (Linux /proc). torchrun starts each worker in a session of
    its own, so killing the agent's process group would not reach them."""
    parent = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # exited meanwhile
        parent[int(stat.parent.name)] = int(fields[1])
    found, todo = [], [pid]
    while todo:
        here = todo.pop()
        kids = [c for c, p in parent.items() if p == here]
        found += kids
        todo += kids
    return found


def stop(agents: list[subprocess.Popen]) -> None:
    """Make sure no agent or worker outlives the test: SIGTERM lets torchrun stop its workers;
    whatever is left after 10 s is killed."""
    live = [a for a in agents if a.poll() is None]
    if not live:
        return
    try:
        workers = [d for a in live for d in descendants(a.pid)]
    except Exception:  # never let the bookkeeping keep the agents alive
        workers = []
    for a in live:
        a.terminate()
    for a in live:
        try:
            a.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
    for pid in [*workers, *(a.pid for a in live if a.poll() is None)]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for a in live:
        a.wait()


def summary_and_layout(runs: Path) -> tuple[dict, dict]:
    out = run_dir(load_config("tiny", [*SMALL, "schedule=prism", "train.seed=0", f"runs_dir={runs}"]))
    assert out == runs / "tiny" / "prism" / "seed0"
    summary = json.loads((out / "train_summary.json").read_text())
    ckpt = torch.load(out / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True, mmap=True)
    return summary, ckpt["TokenStreamDataModule"]


@pytest.mark.slow  # ~20-30 s on 2 CPU cores: two torchrun agents, one rank each
def test_torchrun_two_nodes_matches_single_process_with_accumulation(reference, tmp_path):
    # The split the kit must choose: 4 sequences per step = 1 device x 2 x 2 = 2 devices x 2 x 1.
    cfg = load_config("tiny", [*SMALL, f"runs_dir={tmp_path}"])
    one, two = batch_plan(cfg, 1), batch_plan(cfg, 2)
    assert (one.micro_batch, one.accumulation, one.global_batch_tokens) == (2, 2, 128)
    assert (two.micro_batch, two.accumulation, two.global_batch_tokens) == (2, 1, 128)

    # Two torchrun agents, each standing for one node with one process. c10d assigns node ranks
    # in the order the agents join, so --node-rank is not passed.
    port, runs = free_port(), tmp_path / "nodes"
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes=2",
        "--nproc-per-node=1",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint=127.0.0.1:{port}",
        f"--rdzv-id=prism-test-{os.getpid()}",
        "--max-restarts=0",
        str(ROOT / "reproduce" / "train.py"),
        *RUN,
        "train.devices=1",
        "train.num_nodes=2",
        f"runs_dir={runs}",
    ]
    agents, logs = [], [tmp_path / f"agent{k}.log" for k in range(2)]
    try:
        for log in logs:
            with open(log, "w") as f:  # the child keeps its own descriptor
                agents.append(
                    subprocess.Popen(
                        cmd,
                        env=clean_env(),
                        cwd=tmp_path,
                        stdout=f,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                )
        deadline = time.monotonic() + TIMEOUT_S
        try:
            codes = [a.wait(timeout=max(1.0, deadline - time.monotonic())) for a in agents]
        except subprocess.TimeoutExpired:
            codes = None
    finally:
        stop(agents)
    tails = "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in logs)
    if codes is None:
        pytest.fail(f"torchrun agents still running after {TIMEOUT_S} s (killed)\n{tails}")
    assert codes == [0, 0], tails
    # Each agent ran one rank of one world of 2 (Lightning's line on every rank).
    ranks = sorted(
        line.split("GLOBAL_RANK: ")[1].split(",")[0]
        for p in logs
        for line in p.read_text().splitlines()
        if "Initializing distributed:" in line
    )
    assert ranks == ["0", "1"], tails
    nodes, nodes_data = summary_and_layout(runs)

    # The reference: the same run as one process, with the same runs_dir layout (conftest.py's
    # session run, which test_train.py checks in detail).
    ref, ref_data = summary_and_layout(reference["runs"])

    # Structure: the torchrun run really was 2 processes x micro_batch 2 x no accumulation
    # (12 micro-batches per rank), the reference 1 x 2 x accumulation 2 (24), the same recipe.
    assert nodes["throughput"]["num_devices"] == 2 and ref["throughput"]["num_devices"] == 1
    assert (nodes_data["world_size"], nodes_data["micro_batch"], nodes_data["rank_batches"]) == (2, 2, 12)
    assert (ref_data["world_size"], ref_data["micro_batch"], ref_data["rank_batches"]) == (1, 2, 24)
    assert nodes_data["windows_consumed"] == ref_data["windows_consumed"] == 48
    assert nodes["finished"] is ref["finished"] is True
    assert nodes["steps"] == ref["steps"] == 12 and nodes["tokens_seen"] == ref["tokens_seen"] == 1536
    assert nodes["config_hash"] == ref["config_hash"]

    # Same tolerance as test_train's DDP test: identical math in another float32 summation order
    # (gradient all-reduce vs accumulation) differs by ~1e-6; 1e-4 leaves 100x margin, while a
    # rank reading the wrong windows or a wrongly averaged gradient moves the loss far more.
    assert [p["step"] for p in nodes["val_curve"]] == [p["step"] for p in ref["val_curve"]] == [0, 6, 12]
    for a, b in zip(nodes["val_curve"], ref["val_curve"]):
        assert abs(a["val_loss"] - b["val_loss"]) < 1e-4, (a, b)
    assert abs(nodes["final_val_loss"] - ref["final_val_loss"]) < 1e-4, (
        nodes["final_val_loss"],
        ref["final_val_loss"],
    )
    print(
        f"final val loss: torchrun 2 nodes {nodes['final_val_loss']!r}, 1 process "
        f"{ref['final_val_loss']!r}, |diff| {abs(nodes['final_val_loss'] - ref['final_val_loss']):.3g}"
    )
