"""The pre-flight check on its own, before a long run on an allocation: a matrix multiply per rank
and an all-reduce across all ranks, a table per node, a slow rank or node named.

    srun --nodes=4 --ntasks-per-node=8 --gpus-per-node=8 python reproduce/preflight.py
    torchrun --nnodes=2 --nproc-per-node=8 --rdzv-backend=c10d --rdzv-endpoint=HOST:29500 \
        reproduce/preflight.py

Exit codes: 0 checked; 2 a rank could not reach the others (one sentence). What it measures:
docs/cluster.md, "When a run hangs or crawls".
"""

from __future__ import annotations

from typing import Annotated

from prism.cli.command import run
from prism.config.values import positive


def preflight(
    timeout_s: Annotated[float, positive("use a positive number of seconds, e.g. 120")] = 120.0,
) -> int:
    """Time a matrix multiply per rank and an all-reduce across all ranks; name a slow rank or node.

    Args:
        timeout_s: how long a rank waits for the others
    """
    from prism.train.preflight import run as check

    check(timeout_s)
    return 0


def main(argv: list[str] | None = None) -> int:
    return run(preflight, argv)
