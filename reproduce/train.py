#!/usr/bin/env python
"""Train one run: python reproduce/train.py --scale S --schedule uniform|prism|NAME|TEXT --seed K
[--resume] [--overwrite] [key=value ...]

The command is prism.cli.train; `--help` shows what it writes, how it resumes and its exit codes.
"""

import gc
import sys

try:  # the imports take a moment: a Ctrl-C during them is still one line
    from prism.cli.train import main
except KeyboardInterrupt:
    sys.stderr.write(
        "interrupted: stopped at once outside the training steps, so no step was lost; run the same "
        "command again to continue.\n"
    )
    sys.exit(130)

if __name__ == "__main__":
    code = main(sys.argv[1:])
    # Everything is written and closed by now. Without this, the interpreter's last collection
    # scans the millions of objects torch and Lightning imported: seconds for every process.
    gc.freeze()
    sys.exit(code)
