"""Train one run: python reproduce/train.py --scale S --schedule uniform|prism|NAME|TEXT --seed K
[--resume] [--overwrite] [key=value ...]

Writes runs/<scale>/<schedule>/seed<K>/ (config.yaml, checkpoints/, tb/ and the other trackers'
files, milestones.json, zeroshot.json with train.eval_every_tokens, train_summary.json,
model.safetensors + model_config.json; docs/outputs.md). Rerunning the same command after an
interruption continues from checkpoints/last.ckpt; a finished run is left alone. One process
trains a run at a time: it holds the run's lock (runs/<scale>/<schedule>/.seed<K>.lock), and a
second one is refused, naming the holder.
Multi-GPU: train.devices=8 (DDP); several nodes: train.num_nodes=N under SLURM or torchrun.

Ctrl-C stops at the next optimizer step with checkpoints/last.ckpt; a second Ctrl-C stops at
once, losing the steps since the last checkpoint.

Exit codes (docs/training.md):
   0  finished, or already finished
   1  refused: the run exists, is locked by another process, or cannot be written (a full disk,
      a read-only folder); or the loss became NaN
   2  bad input: a setting or the data
  70  crashed: an unexpected error (its traceback is printed); the same command resumes
  75  stopped with a checkpoint on SIGTERM or Slurm's warning signal, or a stalled data stream:
      the same command resumes
 130  interrupted by Ctrl-C: the same command resumes (from the newest checkpoint)
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading

# the light modules only: a value the config refuses never waits for Lightning's import
from prism.cli.exits import run_command
from prism.cluster import InterruptedAtOnce
from prism.config.schema import load_config, repeated_keys
from prism.runs.layout import CHECKPOINTS_DIR, LAST_CHECKPOINT_NAME

AT_ONCE = (
    "stopped at once outside the training steps, so no step was lost; run the same command again to continue"
)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="train.py",
        description="Train one Prism/uniform run.",
        epilog=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--scale", required=True, help="any configs/scale/<scale>.yaml, e.g. tiny or 124m")
    p.add_argument(
        "--schedule",
        default=None,
        help="uniform, prism, a named schedule (e.g. config-6) or a head list such as 3x2,6x2,8x2,12x6",
    )
    p.add_argument("--seed", type=int, default=None, help="train.seed (default from the config)")
    p.add_argument(
        "--resume",
        action="store_true",
        help=f"require {CHECKPOINTS_DIR}/{LAST_CHECKPOINT_NAME} and continue it",
    )
    p.add_argument("--overwrite", action="store_true", help="delete the run directory and start again")
    p.add_argument("overrides", nargs="*", help="config overrides key=value, e.g. train.devices=8")
    args = p.parse_intermixed_args(argv)  # options and key=value overrides in any order
    if args.resume and args.overwrite:
        p.error("--resume and --overwrite contradict each other; give one.")
    return args


def _stop_at_once(_signum, _frame) -> None:
    _STOPPED_AT_ONCE.append(InterruptedAtOnce(AT_ONCE))
    raise _STOPPED_AT_ONCE[-1]


# A Ctrl-C in the middle of an import can be swallowed by the library importing (a bare `except:`)
# and leave a module half set up, whose next use fails with an error that no longer carries it (a
# RecursionError in numpy's __getattr__): such an error is the interrupt's doing, not a crash.
_STOPPED_AT_ONCE: list[InterruptedAtOnce] = []


def _train_or_stop(args: argparse.Namespace) -> int:
    _STOPPED_AT_ONCE.clear()
    try:
        return _train(args)
    except Exception as exc:
        if _STOPPED_AT_ONCE:
            raise _STOPPED_AT_ONCE[-1] from exc
        raise


def main(argv: list[str] | None = None) -> int:
    """Parse, train, and turn every way of ending into its exit code, with one sentence
    (prism.cli.exits; an unexpected exception is a crash, which run_all.py retries).

    Outside the training steps a Ctrl-C stops at once (InterruptedAtOnce, never Lightning's
    KeyboardInterrupt handling); during them prism.train.callbacks.Preemption handles it."""
    args = parse_args(argv)
    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGINT, _stop_at_once)
    try:
        return run_command(lambda: _train_or_stop(args), interrupted=AT_ONCE, crashes=True)
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)


def _train(args: argparse.Namespace) -> int:
    overrides = list(args.overrides)
    if args.schedule is not None:
        overrides.append(f"schedule={args.schedule}")
    if args.seed is not None:
        overrides.append(f"train.seed={args.seed}")
    for warning in repeated_keys(args.overrides):
        sys.stderr.write(f"warning: {warning}\n")
    cfg = load_config(args.scale, overrides)
    from prism.train.plan import plan_run  # torch only: Lightning once the light checks have passed

    plan = plan_run(cfg, overwrite=args.overwrite, resume=True if args.resume else None)
    from prism.train import trainer as training

    # the imports are done: an interrupt swallowed by one of them has surfaced by now, so a later
    # failure (a lost peer hours in) is judged on its own
    _STOPPED_AT_ONCE.clear()
    out = training.run(plan)  # a finished run says so, and is left alone
    if plan.finished:
        return 0
    print(f"finished: {out}")
    return 0
