#!/usr/bin/env python
"""Train one run: python reproduce/train.py --scale S --schedule uniform|prism|NAME|TEXT --seed K
[--resume] [--overwrite] [key=value ...]

Writes runs/<scale>/<schedule>/seed<K>/ (config.yaml, checkpoints/, tb/, milestones.json,
train_summary.json, model.safetensors + model_config.json). Rerunning the same command after an
interruption continues from checkpoints/last.ckpt; a finished run is left alone.
Multi-GPU: train.devices=8 (DDP); several nodes: train.num_nodes=N under SLURM or torchrun.
"""

import sys

from prism.training import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
