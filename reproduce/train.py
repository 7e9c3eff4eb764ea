#!/usr/bin/env python
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
import gc
import signal
import sys
import threading
import traceback

AT_ONCE = (
    "stopped at once outside the training steps, so no step was lost; run the same command again to continue"
)

try:  # the light modules only: a value the config refuses never waits for Lightning's import
    from prism import cluster
    from prism.cluster import (
        EXIT_CRASHED,
        EXIT_INTERRUPTED,
        EXIT_PREEMPTED,
        Interrupted,
        InterruptedAtOnce,
        Preempted,
        exception_chain,
    )
    from prism.config.schema import ConfigError, load_config, repeated_keys
    from prism.data import DataError
    from prism.io import PLACE_ERRNOS, os_error_message
except KeyboardInterrupt:
    sys.stderr.write(f"interrupted: {AT_ONCE}.\n")
    sys.exit(130)


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
    args = p.parse_intermixed_args(argv)  # options and key=value overrides in any order
    if args.resume and args.overwrite:
        p.error("--resume and --overwrite contradict each other; give one.")
    return args


def _stop_at_once(_signum, _frame) -> None:
    raise InterruptedAtOnce(AT_ONCE)


def main(argv: list[str] | None = None) -> int:
    """Parse, train, and turn every way of ending into its exit code, with one sentence.

    Outside the training steps a Ctrl-C stops at once (InterruptedAtOnce, never Lightning's
    KeyboardInterrupt handling); during them prism.train.callbacks.Preemption handles it."""
    args = parse_args(argv)
    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGINT, _stop_at_once)
    try:
        return _train(args)
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)


def _train(args: argparse.Namespace) -> int:
    overrides = list(args.overrides)
    if args.schedule is not None:
        overrides.append(f"schedule={args.schedule}")
    if args.seed is not None:
        overrides.append(f"train.seed={args.seed}")
    try:
        for warning in repeated_keys(args.overrides):
            sys.stderr.write(f"warning: {warning}\n")
        cfg = load_config(args.scale, overrides)
        cluster.check_accelerator_visible(cfg.train.accelerator)
        # Lightning and the rest take seconds, so they are imported after the config is accepted
        from prism.runs.layout import run_dir
        from prism.train import trainer as training

        if not args.overwrite and training.finished_summary(cfg) is not None:
            print(
                f"{run_dir(cfg)} already holds this finished run; nothing to do "
                f"(--overwrite trains it again)."
            )
            return 0
        out = training.train(cfg, overwrite=args.overwrite, resume=True if args.resume else None)
    except BaseException as exc:
        return _exit_code(exc)
    print(f"finished: {out}")
    return 0


def _exit_code(exc: BaseException) -> int:
    """The exit code of a training that raised `exc`, after its sentence (one write each: the
    lines of several ranks never interleave)."""
    # A Ctrl-C that stopped a call halfway can surface as that call's own error (torch.save cut
    # short raises "unexpected pos"): it was the interrupt all the same. One that came while a
    # stop with a checkpoint was unwinding leaves that stop's account standing.
    chain = exception_chain(exc)
    if any(isinstance(e, (InterruptedAtOnce, KeyboardInterrupt)) for e in chain):
        stop = next((e for e in chain if isinstance(e, Preempted)), None)
        if stop is not None:
            exc = stop
        else:
            first = next(e for e in chain if isinstance(e, (InterruptedAtOnce, KeyboardInterrupt)))
            text = str(first) if isinstance(first, InterruptedAtOnce) else AT_ONCE
            sys.stderr.write(f"interrupted: {text.rstrip('.')}.\n")
            return EXIT_INTERRUPTED
    if isinstance(exc, SystemExit):
        from lightning.pytorch.utilities.exceptions import SIGTERMException

        if isinstance(exc, SIGTERMException):
            # a SIGTERM before prism's Preemption took over (sanity validation, the first batch):
            # Lightning's handler stops the run before its first step, a stop and not a success
            sys.stderr.write(
                "preempted: stopped by SIGTERM before the first step of this session, so no "
                "checkpoint was written for it; the same command resumes from the newest one.\n"
            )
            return EXIT_PREEMPTED
    if not isinstance(exc, Exception):  # SystemExit and the like
        raise exc
    if isinstance(exc, Preempted):  # a signal (Ctrl-C included), or a stalled data stream
        sys.stderr.write(f"{exc.label}: {exc}\n")
        return EXIT_INTERRUPTED if isinstance(exc, Interrupted) else EXIT_PREEMPTED
    if isinstance(exc, (ConfigError, DataError)):
        sys.stderr.write(f"error: {exc}\n")
        return 2
    from prism.train.callbacks.guards import NonFiniteLossError  # imported already once training started
    from prism.train.resume import RunExistsError

    if isinstance(exc, (RunExistsError, NonFiniteLossError)):
        sys.stderr.write(f"error: {exc}\n")
        return 1
    if isinstance(exc, OSError) and exc.errno in PLACE_ERRNOS:
        sys.stderr.write(f"error: {os_error_message(exc)}\n")  # a write that failed: full, read-only
        return 1
    # anything else crashed (a lost peer, a collective error, a bug): run_all.py retries it
    text = "".join(traceback.format_exception(exc))
    first = (str(exc).splitlines() or [""])[0][:300]
    sys.stderr.write(
        f"{text}crashed: {type(exc).__name__}: {first}; the same command resumes from the newest "
        f"checkpoint.\n"
    )
    return EXIT_CRASHED


if __name__ == "__main__":
    code = main(sys.argv[1:])
    # Everything is written and closed by now. Without this, the interpreter's last collection
    # scans the millions of objects torch and Lightning imported: seconds for every process.
    gc.freeze()
    sys.exit(code)
