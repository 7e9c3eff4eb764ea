#!/usr/bin/env python
"""Throughput benchmark of head schedules (paper Table 2, Table 5's tok/s column).

    python reproduce/benchmark.py --scale 124m --schedules uniform,prism --out results/124m/bench.json
    python reproduce/benchmark.py --scale tiny --steps 6 model.seq_len=128

The command is prism.cli.benchmark (the measurement: prism.measure.bench); `--help` shows every
option.
"""

import sys

from prism.cli.benchmark import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
