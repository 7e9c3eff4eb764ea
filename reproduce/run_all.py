#!/usr/bin/env python
"""Reproduce the paper at one scale: train, evaluate, benchmark, analyse, report.

    python reproduce/run_all.py --scale tiny                       # CPU, minutes
    python reproduce/run_all.py --scale 354m --dry-run             # plan, GPU-hours, disk
    python reproduce/run_all.py --scale 124m --schedules table5    # the Table 5 ablation
    python reproduce/run_all.py --scale 757m train.devices=8 train.num_nodes=4 \\
        run_all.launcher.train="srun --ntasks-per-node=8"          # see reproduce/slurm/

Rerunning the same command skips finished stages and resumes training from its last checkpoint;
a stage whose settings changed is reported instead of mixed in. Planning and running live in
`prism.pipeline`; this file only reads the command line.
"""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))  # this checkout's library

from rich.console import Console

from prism.config import ConfigError
from prism.pipeline import STAGES, run_all


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def _csv(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--scale", required=True, help="tiny, 124m, 354m or 757m")
    ap.add_argument("--seeds", nargs="+", default=None,
                    help="seeds, e.g. --seeds 0 1 2 or --seeds 0,1,2 (default: the config's)")
    ap.add_argument("--schedules", default=None,
                    help="comma-separated names (uniform,prism,config-1) or a group such as table5 "
                         "(default: the config's run_schedules)")
    ap.add_argument("--stages", default=None, help=f"comma-separated subset of {','.join(STAGES)}")
    ap.add_argument("--dry-run", action="store_true", help="print the plan and its cost, run nothing")
    ap.add_argument("--redo-changed", action="store_true",
                    help="when a run was trained with other settings, move it aside and train again")
    ap.add_argument("overrides", nargs="*", help="config overrides key=value, e.g. train.devices=8")
    args = ap.parse_intermixed_args(argv)  # options and key=value overrides in any order
    # A scheduler's SIGTERM (time limit, scancel) becomes an interrupt, so the running stage is
    # stopped with us and its record stays "running": the next invocation resumes it.
    signal.signal(signal.SIGTERM, _interrupt)
    console = Console() if sys.stdout.isatty() else Console(width=160)
    try:
        seeds = None
        if args.seeds:
            seeds = [int(s) for item in args.seeds for s in _csv(item)]
        return run_all(args.scale, args.overrides, seeds=seeds,
                       schedules=_csv(args.schedules) if args.schedules else None,
                       stages=_csv(args.stages) if args.stages else None,
                       dry_run=args.dry_run, redo_changed=args.redo_changed, console=console)
    except ValueError as exc:  # ConfigError, ScheduleError and bad --seeds are ValueErrors
        msg = str(exc) if isinstance(exc, ConfigError) or "invalid literal" not in str(exc) else \
            f"--seeds {' '.join(args.seeds)} is invalid: give integers, e.g. --seeds 0 1 2."
        console.print(f"[bold red]error:[/] {msg}", highlight=False)
        return 2
    except KeyboardInterrupt:
        console.print("interrupted: run the same command again to resume.")
        return 130


if __name__ == "__main__":
    sys.exit(main())
