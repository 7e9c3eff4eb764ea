#!/usr/bin/env python
"""Regenerate results/RESULTS.md (and results/plots/*.png) from the result files.

    python reproduce/report.py                      # every scale
    python reproduce/report.py --scales tiny 124m

The command is prism.cli.report; `--help` shows every option (docs/report.md: what it reads).
"""

import sys

from prism.cli.report import main

if __name__ == "__main__":
    sys.exit(main())
