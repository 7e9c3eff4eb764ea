"""Reproduce the paper at one scale or along a ladder: train, evaluate, benchmark, analyse, report.

    python reproduce/run_all.py --scale tiny                       # CPU, minutes
    python reproduce/run_all.py --scale 354m --dry-run             # plan, GPU-hours, disk
    python reproduce/run_all.py --scale 124m --schedules table5    # the Table 5 ablation
    python reproduce/run_all.py --ladder paper --dry-run           # six scales, 30m to 757m
    python reproduce/run_all.py --ladder cpu                       # three CPU scales, minutes
    python reproduce/run_all.py --scale 354m --dry-run --nodes 4   # the plan on 4 nodes x 8 GPUs
    sbatch --nodes=4 reproduce/slurm/run_scale.sbatch 354m         # Slurm: see reproduce/slurm/

Rerunning the same command skips finished stages and resumes training from its last checkpoint;
a stage whose settings changed is reported instead of mixed in. Planning and running live in
`prism.pipeline`; this file only reads the command line.

Exit codes: 0 every selected stage done; 1 a stage failed or is held by another process; 2 bad
input, or a run trained with other settings (a conflict: nothing ran); 75 a training stopped on
the scheduler's signal with a checkpoint (the requeued job, or the same command, resumes it);
130 interrupted (Ctrl-C, or SIGTERM to run_all.py itself): the running stage was stopped first,
and the same command resumes it.
"""

from __future__ import annotations

import argparse
import signal
import sys
from typing import Optional

from rich.console import Console

from prism.cli.command import parse, show_config
from prism.cli.exits import run_command
from prism.config.schema import to_dict
from prism.core.schedule import split_schedules
from prism.errors import ConfigError
from prism.pipeline import run_all
from prism.pipeline.ladder import run_ladder


class Interrupted(KeyboardInterrupt):
    """A signal that stops the orchestrator; the running stage is sent the same signal."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _interrupt(signum, frame):
    raise Interrupted(signum)


def _csv(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def seed_list(text: str) -> list[int] | str:
    """One word after --seeds: seeds ("0" or "0,1,2"), or an override that follows them
    (`--seeds 0 1 key=value`), which main() hands on to the overrides."""
    if "=" in text:
        return text
    try:
        return [int(s) for s in _csv(text)]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a seed: give integers, e.g. --seeds 0 1 2 or --seeds 0,1,2."
        ) from None


def run_all_command(
    scale: Optional[str] = None,
    ladder: Optional[str] = None,
    seeds: Optional[list[seed_list]] = None,
    schedules: Optional[str] = None,
    stages: Optional[str] = None,
    dry_run: bool = False,
    nodes: Optional[int] = None,
    gpus_per_node: Optional[int] = None,
    redo_changed: bool = False,
    overrides: list[str] = (),
    print_config: bool = False,
) -> int:
    """Reproduce the paper at one scale or along a ladder: train, evaluate, benchmark, analyse, report.

    Args:
        scale: any configs/scale/<scale>.yaml, e.g. tiny or 124m
        ladder: any configs/ladder/<name>.yaml (paper, cpu): every scale it lists in turn, smallest
            first, with the same options; the report once, after the last
        seeds: the config key seeds, e.g. --seeds 0 1 2 or --seeds 0,1,2 (default: the config's)
        schedules: the config key run_schedules, comma-separated: names (uniform,prism,config-1),
            head lists (uniform,3x2,6x2,12x8; ';' between two head lists) or a group such as table5
        stages: the config key run_all.stages, comma-separated
        dry_run: print the plan and its cost, run nothing
        nodes: plan for this many nodes (with --dry-run; default: the Slurm allocation)
        gpus_per_node: plan for this many GPUs per node (with --dry-run; default: the allocation, else 8)
        redo_changed: when a run was trained with other settings, move it aside and train again
        overrides: config overrides key=value, e.g. train.devices=8
    """


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    args = argparse.Namespace(
        **parse(run_all_command, argv, "run_all.py", __doc__, [("!", "scale", "ladder")])
    )
    if args.seeds:  # `--seeds 0 1 key=value`: the seeds' list takes the overrides after it too
        args.overrides += [s for s in args.seeds if isinstance(s, str)]
        args.seeds = [n for s in args.seeds if not isinstance(s, str) for n in s] or None
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # A scheduler's SIGTERM (time limit, preemption, requeue, scancel) and a Ctrl-C are passed on
    # to the running stage as SIGTERM, which checkpoints and stops (prism.pipeline.runner); its
    # record stays "running" and the next invocation (the requeued job) resumes it.
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        console = Console() if sys.stdout.isatty() else Console(width=160)
        return run_command(
            lambda: _orchestrate(args, console),
            interrupted="run the same command again to resume",
            console=console,
        )
    finally:  # main() is also called in-process (tests, notebooks): leave SIGTERM as it was
        signal.signal(signal.SIGTERM, previous)


def _orchestrate(args: argparse.Namespace, console: Console) -> int:
    if not (args.scale or args.ladder):
        raise ConfigError("give --scale or --ladder, or a --config file that sets scale.")
    if args.print_config:
        from prism.pipeline import load_run_config
        from prism.train.plan import plan_run

        schedules = split_schedules(args.schedules) if args.schedules else None
        cfg = load_run_config(args.scale, args.overrides, args.seeds, schedules)
        if args.stages:
            cfg.run_all.stages = _csv(args.stages)
        return show_config(to_dict(cfg), plan_run(cfg, launch=False, reach_data=False).derived())
    options = dict(
        seeds=args.seeds,
        schedules=split_schedules(args.schedules) if args.schedules else None,
        stages=_csv(args.stages) if args.stages else None,
        dry_run=args.dry_run,
        redo_changed=args.redo_changed,
        console=console,
        nodes=args.nodes,
        gpus_per_node=args.gpus_per_node,
    )
    if args.ladder:
        return run_ladder(args.ladder, args.overrides, **options)
    return run_all(args.scale, args.overrides, **options)
