#!/usr/bin/env python
"""Reproduce the paper at one scale: train, evaluate, benchmark, analyse, report.

    python reproduce/run_all.py --scale tiny                       # CPU, minutes
    python reproduce/run_all.py --scale 354m --dry-run             # plan, GPU-hours, disk

The command is prism.cli.run_all; `--help` shows every option, more examples and the exit codes.
"""

import sys

try:  # the imports take seconds: a Ctrl-C during them is still one line
    from prism.cli.run_all import main
except KeyboardInterrupt:
    sys.stderr.write("interrupted: nothing was started.\n")
    sys.exit(130)

if __name__ == "__main__":
    sys.exit(main())
