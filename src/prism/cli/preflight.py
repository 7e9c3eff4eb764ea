"""The pre-flight check on its own, before a long run on an allocation: a matrix multiply per rank
and an all-reduce across all ranks, a table per node, a slow rank or node named.

    srun --nodes=4 --ntasks-per-node=8 --gpus-per-node=8 python reproduce/preflight.py
    torchrun --nnodes=2 --nproc-per-node=8 --rdzv-backend=c10d --rdzv-endpoint=HOST:29500 \
        reproduce/preflight.py

Exit codes: 0 checked; 2 a rank could not reach the others (one sentence). What it measures:
docs/cluster.md, "When a run hangs or crawls".
"""

from __future__ import annotations

import argparse

from prism.cli.exits import run_main


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--timeout-s", type=float, default=120.0, help="how long a rank waits for the others (default 120)"
    )
    return parser.parse_args(argv)


def work(args: argparse.Namespace) -> int:
    from prism.train.preflight import run

    run(args.timeout_s)
    return 0


def main(argv: list[str] | None = None) -> int:
    return run_main(argv, parse_args, work, interrupted="interrupted: nothing was written.")
