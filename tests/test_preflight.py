"""The pre-flight check: its table and the sentences that name a slow rank or node, on numbers;
two real gloo ranks under torchrun; a rank alone refused with exit 2. Both nodes of the Slurm
cluster in its table: tests/test_slurm.py (training runs it before its first step)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from prism.train.preflight import RankResult, far_below, table

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}


def results(*per_node: list[float]) -> list[RankResult]:
    out, rank = [], 0
    for i, tflops in enumerate(per_node):
        for t in tflops:
            out.append(RankResult(rank, f"node{i + 1}", t, 300.0))
            rank += 1
    return out


def test_the_table_has_a_row_per_node_and_names_a_rank_far_below_the_median():
    text = table(results([700, 700], [700, 300]))
    assert "node1                0,1" in text and "node2                2,3" in text
    assert "pre-flight: rank 3 on node2 reaches 300 TFLOP/s, under half the median of 700" in text
    assert far_below(results([700, 700], [700, 400])) == []  # within half: not named


def test_a_slow_node_is_named_with_the_flag_that_leaves_it_out():
    said = far_below(results([700, 700], [700, 700], [200, 200]))
    assert any("node node3 reaches 200 TFLOP/s per rank" in s and "--exclude=node3" in s for s in said)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_torchrun_ranks_get_a_table_and_a_rank_alone_is_refused_with_exit_2(tmp_path):
    script = str(ROOT / "reproduce" / "preflight.py")
    port = free_port()
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "--nproc-per-node=2",
         f"--master-port={port}", script],
        env=ENV, capture_output=True, text=True, timeout=180, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "pre-flight check" in proc.stdout and "0,1" in proc.stdout
    # rank 0 of two, whose peer never starts: refused in one sentence
    alone = {**ENV, "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2", "TORCHELASTIC_RUN_ID": "alone",
             "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}  # fmt: skip
    proc = subprocess.run(
        [sys.executable, script, "--timeout-s", "3"], env=alone, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert (
        proc.stderr.startswith("error: rank 0 on ") and "could not reach the other 1 rank(s)" in proc.stderr
    )
    assert "Traceback" not in proc.stderr
