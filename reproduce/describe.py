#!/usr/bin/env python
"""Describe the variants of a scale: per-layer heads and d_h, parameters, training FLOPs per
token (6N + 12·L·d·T) and the design-rule diagnostics.

    python reproduce/describe.py --scale 124m
    python reproduce/describe.py --scale 124m --enumerate --smooth --max-head-dim 256 --limit 20

The command is prism.cli.describe; `--help` shows every option.
"""

import sys

from prism.cli.describe import main

if __name__ == "__main__":
    sys.exit(main())
