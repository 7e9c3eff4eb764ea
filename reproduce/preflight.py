#!/usr/bin/env python
"""The pre-flight check of an allocation: python reproduce/preflight.py as srun or torchrun tasks.

The command is prism.cli.preflight; `--help` shows what it measures and its exit codes.
"""

import sys

from prism.cli.preflight import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
