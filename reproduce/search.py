#!/usr/bin/env python
"""Search head schedules of a scale: successive halving over validation loss at token rungs, on
Optuna with journal file storage, every trial a normal kit training run (docs/search.md).

    python reproduce/search.py --scale 124m --space table5 --rungs 1%,3%,9% --workers 8 --dry-run

The command is prism.cli.search; `--help` shows every option, more examples and the exit codes.
"""

import sys

from prism.cli.search import main, main_leaving_code  # noqa: F401 (main: what an in-process caller runs)

if __name__ == "__main__":
    sys.exit(main_leaving_code())
