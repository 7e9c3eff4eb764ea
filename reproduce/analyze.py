#!/usr/bin/env python
"""Attention distance per layer (paper §4.1, Eq. 1, Figure 4) of trained checkpoints.

    python reproduce/analyze.py --checkpoints runs/124m/uniform/seed0/model.safetensors \\
        runs/124m/prism/seed0/model.safetensors --sequences 64 --out results/124m/analysis.json

The command is prism.cli.analyze; `--help` shows every option.
"""

import sys

from prism.cli.analyze import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
