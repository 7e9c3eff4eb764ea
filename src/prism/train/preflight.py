"""The pre-flight check (train.preflight, reproduce/preflight.py): a matmul per rank and an all-reduce
find a slow GPU or node, or an unreachable rank, in seconds (docs/cluster.md, "When a run hangs")."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from datetime import timedelta

import torch

from prism import cluster
from prism.errors import PrismError

FAR_BELOW = 0.5  # a rank or node under half the median is named


class Unreachable(PrismError):
    """A rank could not join the others (exit 2, as every PrismError)."""


@dataclass(frozen=True)
class RankResult:
    rank: int
    node: str
    tflops: float  # achieved by a square matmul
    bus_gbps: float  # all-reduce bus bandwidth (GB/s), the same on every rank of one collective


def _seconds(device: torch.device, work, repeats: int) -> float:
    """Seconds that `repeats` calls of `work` take on `device`, after one warm-up call."""
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    work()
    sync()
    start = time.perf_counter()
    for _ in range(repeats):
        work()
    sync()
    return time.perf_counter() - start


def check(device: torch.device) -> list[RankResult]:
    """Every rank's TFLOP/s of 10 n x n matmuls and bus bandwidth in GB/s (nccl-tests': bytes x
    2(n-1)/n per second) of 5 all-reduces, each after a warm-up, on every rank of the process group."""
    import torch.distributed as dist

    # matmul side and all-reduce elements, a second or less on an H100 or a CPU alike: on CUDA bf16
    # 8192^3 x 10 ~ 11 PFLOP and 256 MB of float32, elsewhere 1 MB
    n, elements = (8192, 64 * 2**20) if device.type == "cuda" else (256, 2**18)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    a, b = torch.randn(2, n, n, device=device, dtype=dtype)
    tflops = 2 * n**3 * 10 / _seconds(device, lambda: a @ b, 10) / 1e12
    x, world = torch.ones(elements, device=device), dist.get_world_size()
    seconds = _seconds(device, lambda: dist.all_reduce(x), 5) / 5
    bus_gbps = x.numel() * x.element_size() * 2 * (world - 1) / world / seconds / 1e9
    results: list = [None] * world
    dist.all_gather_object(results, RankResult(dist.get_rank(), cluster.node_name(), tflops, bus_gbps))
    return results


def table(results: list[RankResult]) -> str:
    """One row per node: its ranks, their lowest and median TFLOP/s, the all-reduce bus bandwidth;
    then a sentence naming a rank or node far below the median, if any."""
    lines = [
        "pre-flight check (a matmul per rank, an all-reduce across all ranks):",
        f"{'node':<20} {'ranks':<12} {'TFLOP/s min':>12} {'TFLOP/s median':>15} {'bus GB/s':>9}",
    ]
    for node, rs in by_node(results).items():
        ranks = ",".join(str(r.rank) for r in rs)
        t = [r.tflops for r in rs]
        lines.append(
            f"{node:<20} {ranks:<12} {min(t):>12.3g} {statistics.median(t):>15.3g} "
            f"{statistics.median(r.bus_gbps for r in rs):>9.3g}"
        )
    lines.extend(far_below(results))
    return "\n".join(lines)


def far_below(results: list[RankResult]) -> list[str]:
    """A sentence for each rank, and each node, under FAR_BELOW x the median TFLOP/s."""
    median = statistics.median(r.tflops for r in results)
    said = [
        f"pre-flight: rank {r.rank} on {r.node} reaches {r.tflops:.3g} TFLOP/s, under half the "
        f"median of {median:.3g}: check that device before the run spends its hours"
        for r in results
        if r.tflops < FAR_BELOW * median
    ]
    per_node = {node: statistics.median(r.tflops for r in rs) for node, rs in by_node(results).items()}
    if len(per_node) > 2:  # of two, neither is the odd one out
        node_median = statistics.median(per_node.values())
        said += [
            f"pre-flight: node {node} reaches {t:.3g} TFLOP/s per rank, under half the median "
            f"node's {node_median:.3g}: leave it out (sbatch --exclude={node})"
            for node, t in per_node.items()
            if t < FAR_BELOW * node_median
        ]
    return said


def by_node(results: list[RankResult]) -> dict[str, list[RankResult]]:
    nodes: dict[str, list[RankResult]] = {}
    for r in results:
        nodes.setdefault(r.node, []).append(r)
    return nodes


def join(timeout_s: float) -> torch.device:
    """Join this launch's ranks as training would; refused in one sentence after `timeout_s`."""
    import torch.distributed as dist

    launch = cluster.this_launch()
    env = cluster.lightning_environment()
    if env is None or launch.world_size < 2:
        raise Unreachable(
            "the pre-flight check runs as the tasks of a multi-process launch (srun with one task "
            "per GPU, or torchrun); this is one process."
        )
    device = torch.device("cpu")
    if torch.cuda.is_available():
        device = torch.device("cuda", launch.local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
    address, port = env.main_address, env.main_port
    try:
        dist.init_process_group(
            "nccl" if device.type == "cuda" else "gloo",
            init_method=f"tcp://{address}:{port}",
            rank=launch.rank,
            world_size=launch.world_size,
            timeout=timedelta(seconds=timeout_s),
        )
        dist.barrier()
    except (RuntimeError, OSError) as exc:  # a store that never answers, a peer that never came
        raise Unreachable(
            f"rank {launch.rank} on {cluster.node_name()} could not reach the other "
            f"{launch.world_size - 1} rank(s) through {address}:{port} within {timeout_s:g} s "
            f"({type(exc).__name__}); check the network between the nodes and that every task started."
        ) from None
    return device


def run(timeout_s: float) -> list[RankResult]:
    """The standalone check: join, check, leave. Rank 0 prints the table."""
    import torch.distributed as dist

    device = join(timeout_s)
    try:
        results = check(device)
        if dist.get_rank() == 0:
            print(table(results), flush=True)
        return results
    finally:
        dist.destroy_process_group()
