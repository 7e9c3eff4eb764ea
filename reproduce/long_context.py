#!/usr/bin/env python
"""Loss by position and attention distance per layer of one run's final weights past its
training length, under each RoPE scaling choice (docs/evaluation.md, "Beyond the training
context").

    python reproduce/long_context.py --checkpoint runs/124m/prism/seed0/model.safetensors \\
        --out results/124m/long_context/prism/seed0.json long_context.lengths=[1x,2x,4x,8x]

The command is prism.cli.long_context; `--help` shows every option.
"""

import sys

from prism.cli.long_context import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
