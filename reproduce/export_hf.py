#!/usr/bin/env python
"""Export one checkpoint as a Hugging Face transformers model folder with a model card.

    python reproduce/export_hf.py --checkpoint runs/124m/prism/seed0 --out hf/prism-124m-seed0 \\
        [--eval results/124m/eval/prism/seed0.json] [--overwrite]

The command is prism.cli.export_hf; `--help` shows what it takes and how the folder loads.
"""

import sys

from prism.cli.export_hf import main

if __name__ == "__main__":
    sys.exit(main())
