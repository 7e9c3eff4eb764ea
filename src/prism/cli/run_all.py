"""run_all.py's command line (docs/commands.md#run_allpy); planning and running live in prism.pipeline."""

from __future__ import annotations

import argparse
import sys
from functools import partial
from typing import Annotated, Optional

from rich.console import Console

from prism.cli.command import Key, run, show_config
from prism.config.schema import to_dict
from prism.core.schedule import split_schedules
from prism.errors import ConfigError
from prism.pipeline import load_run_config, run_all
from prism.pipeline.ladder import run_ladder
from prism.pipeline.runner import sigterm_stops_stages


def seed_list(text: str) -> list[int] | str:
    """One word after --seeds: seeds ("0" or "0,1,2"), or an override that follows them
    (`--seeds 0 1 key=value`), which main() hands on to the overrides."""
    if "=" in text:
        return text
    try:
        return [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a seed: give integers, e.g. --seeds 0 1 2 or --seeds 0,1,2."
        ) from None


def run_all_command(
    scale: Optional[str] = None,
    ladder: Optional[str] = None,
    seeds: Annotated[Optional[list[seed_list]], Key("seeds", listed=True)] = None,
    schedules: Annotated[Optional[str], Key("run_schedules", listed=split_schedules)] = None,
    stages: Annotated[Optional[str], Key("run_all.stages", listed=True)] = None,
    dry_run: bool = False,
    nodes: Optional[int] = None,
    gpus_per_node: Optional[int] = None,
    redo_changed: bool = False,
    overrides: list[str] = (),
    print_config: bool = False,
) -> int:
    """Reproduce the paper at one scale or along a ladder: train, evaluate, benchmark, analyse, report.

    Args:
        ladder: any configs/ladder/<name>.yaml (paper, cpu): every scale it lists in turn, smallest
            first, with the same options; the report once, after the last
        seeds: e.g. --seeds 0 1 2 or --seeds 0,1,2 (default: the config's)
        schedules: comma-separated names (uniform,prism,config-1), head lists (uniform,3x2,6x2,12x8;
            ';' between two head lists) or a group such as table5
        stages: comma-separated
        dry_run: print the plan and its cost, run nothing
        nodes: plan for this many nodes (with --dry-run; default: the Slurm allocation)
        gpus_per_node: plan for this many GPUs per node (with --dry-run; default: the allocation, else 8)
        redo_changed: when a run was trained with other settings, move it aside and train again
        overrides: config overrides key=value, e.g. train.devices=8
    """


EXCLUSIVE = [("!", "scale", "ladder")]


def main(argv: list[str] | None = None) -> int:
    console = Console() if sys.stdout.isatty() else Console(width=160)
    resume = "run the same command again to resume"
    work = partial(_orchestrate, console)
    return run(run_all_command, argv, None, EXCLUSIVE, interrupted=resume, console=console, work=work)


def _orchestrate(console, scale, ladder, overrides, print_config, seeds, schedules, stages, **options) -> int:
    """The parsed command's work (`seeds`, `schedules` and `stages` are among the overrides by now)."""
    if not (scale or ladder):
        raise ConfigError("give --scale or --ladder, or a --config file that sets scale.")
    if print_config:
        if not scale:
            raise ConfigError(
                "--print_config shows one scale's settings: give --scale, or a --config file that sets it."
            )
        from prism.train.plan import plan_run

        cfg = load_run_config(scale, overrides, None, None)
        return show_config(to_dict(cfg), plan_run(cfg, launch=False, reach_data=False).derived())
    with sigterm_stops_stages():  # passed on to the running stage, which checkpoints and stops
        return (run_ladder if ladder else run_all)(ladder or scale, overrides, console=console, **options)
