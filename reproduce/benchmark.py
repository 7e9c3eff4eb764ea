"""Throughput benchmark of head schedules (paper Table 2, Table 5's tok/s column).

    python reproduce/benchmark.py --scale 124m --schedules uniform,prism --out results/124m/bench.json
    python reproduce/benchmark.py --scale tiny --steps 6 model.seq_len=128

Two subcommands hand over to other modules:
    python reproduce/benchmark.py data ...       data-pipeline throughput (prism.data.benchmark)
    python reproduce/benchmark.py overhead ...   per-step overhead checks (prism.overhead)
"""

from __future__ import annotations

import importlib
import sys

SUBCOMMANDS = {"data": "prism.data.benchmark", "overhead": "prism.overhead"}


def main(argv: list[str]) -> int:
    if argv and argv[0] in SUBCOMMANDS:
        module_name = SUBCOMMANDS[argv[0]]
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name and module_name.startswith(exc.name):
                print(
                    f"error: `benchmark.py {argv[0]}` needs {module_name}, which this checkout does "
                    f"not have yet.",
                    file=sys.stderr,
                )
                return 2
            raise
        return int(module.main(argv[1:]) or 0)
    from prism.bench import main as bench_main

    return bench_main(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
