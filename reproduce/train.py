#!/usr/bin/env python
"""Train one run: python reproduce/train.py --scale S --schedule uniform|prism|NAME|TEXT --seed K
[--resume] [--overwrite] [key=value ...]

Writes runs/<scale>/<schedule>/seed<K>/ (config.yaml, checkpoints/, tb/, milestones.json,
train_summary.json, model.safetensors + model_config.json). Rerunning the same command after an
interruption continues from checkpoints/last.ckpt; a finished run is left alone.
Multi-GPU: train.devices=8 (DDP); several nodes: train.num_nodes=N under SLURM or torchrun.
Exit codes: 0 done, 1 run refused or NaN loss, 2 bad input, 75 stopped with a checkpoint
(preempted or data stalled: the same command resumes).
"""

from __future__ import annotations

import argparse
import sys

from prism import training
from prism.callbacks import EXIT_PREEMPTED, NonFiniteLossError, Preempted
from prism.config import ConfigError, load_config
from prism.data import DataError
from prism.resume import RunExistsError


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="train.py", description="Train one Prism/uniform run.")
    p.add_argument("--scale", required=True, help="tiny, 124m, 354m, 757m")
    p.add_argument(
        "--schedule",
        default=None,
        help="uniform, prism, a named schedule (e.g. config-6) or a head list such as 3x2,6x2,8x2,12x6",
    )
    p.add_argument("--seed", type=int, default=None, help="train.seed (default from the config)")
    p.add_argument("--resume", action="store_true", help="require checkpoints/last.ckpt and continue it")
    p.add_argument("--overwrite", action="store_true", help="delete the run directory and start again")
    p.add_argument("overrides", nargs="*", help="config overrides key=value, e.g. train.devices=8")
    args = p.parse_args(argv)
    if args.resume and args.overwrite:
        p.error("--resume and --overwrite contradict each other; give one.")
    return args


def main(argv: list[str] | None = None) -> int:
    """Parse, train, and turn expected failures into one sentence."""
    args = parse_args(argv)
    overrides = list(args.overrides)
    if args.schedule is not None:
        overrides.append(f"schedule={args.schedule}")
    if args.seed is not None:
        overrides.append(f"train.seed={args.seed}")
    try:
        cfg = load_config(args.scale, overrides)
        if not args.overwrite and training.finished_summary(cfg) is not None:
            print(
                f"{training.run_dir(cfg)} already holds this finished run; nothing to do "
                f"(--overwrite trains it again)."
            )
            return 0
        out = training.train(cfg, overwrite=args.overwrite, resume=True if args.resume else None)
    except Preempted as exc:  # a signal, or a stalled data stream (StreamStopped)
        sys.stderr.write(f"{exc.label}: {exc}\n")  # one write: ranks' lines never interleave
        return EXIT_PREEMPTED
    except (ConfigError, DataError, RunExistsError, NonFiniteLossError) as exc:
        sys.stderr.write(f"error: {exc}\n")  # one write: ranks' lines never interleave
        return 2 if isinstance(exc, (ConfigError, DataError)) else 1
    print(f"finished: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
