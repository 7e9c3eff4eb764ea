#!/usr/bin/env python
"""Zero-shot evaluation of one checkpoint (paper Table 3), with lm-evaluation-harness semantics.

    python reproduce/evaluate.py --checkpoint runs/124m/prism/seed0/model.safetensors \\
        --tasks hellaswag,piqa,arc_easy,winogrande,blimp,wikitext --out results/124m/eval/prism/seed0.json

The command is prism.cli.evaluate; `--help` shows every option and how to run it on several GPUs.
"""

import sys

from prism.cli.evaluate import main

if __name__ == "__main__":
    sys.exit(main())
