"""Search head schedules of a scale by successive halving (docs/search.md)."""

from __future__ import annotations

import sys
from typing import Annotated, Optional

from prism import processes
from prism.cli.command import APPEND, HIDDEN, Key, run, show_config
from prism.cli.exits import run_command
from prism.cluster import this_launch
from prism.config.values import SEED, SEEDS, positive
from prism.search import session
from prism.search.plan import Search, SearchArgs

EPILOG = "Command lines, the budget, outputs and exit codes: docs/search.md."


def search(
    scale: str,
    rungs: str,
    space: Annotated[list[str], APPEND] = [],  # noqa: B006 (argparse's default, never changed)
    smooth: bool = False,
    baseline_preservation: bool = False,
    power_of_two: bool = False,
    max_head_dim: Annotated[Optional[int], positive("give a positive head dim")] = None,
    seeds: Annotated[Optional[list[int]], SEEDS] = None,
    trials: Optional[int] = None,
    tokens: Optional[str] = None,
    gpu_hours: Annotated[Optional[float], positive("give a positive number of GPU-hours")] = None,
    workers: Annotated[int, positive("give 1 or more")] = 1,
    devices_per_trial: Annotated[Optional[int], positive("give 1 or more")] = None,
    study_dir: Optional[str] = None,
    seed: Annotated[int, SEED] = 0,
    dry_run: bool = False,
    final: bool = False,
    top_k: Annotated[Optional[int], Key("search.top_k")] = None,
    final_stages: Annotated[Optional[str], Key("run_all.stages", listed=True)] = None,
    worker: Annotated[bool, HIDDEN] = False,
    overrides: list[str] = (),
    print_config: bool = False,
) -> int:
    """Search head schedules of a scale: successive halving over validation loss at token rungs,
    on Optuna with journal file storage, every trial a normal kit training run.

    Args:
        rungs: token rungs, e.g. 768,1536 or 1%,3%,9% of train.tokens
        space: table5 | rules | a schedule name or head list (repeatable)
        smooth: --space rules: early phases of 2-4 layers (§2.2a)
        baseline_preservation: --space rules: at least L/2 layers at h_base
        power_of_two: --space rules: early d_h powers of two
        max_head_dim: --space rules: largest early d_h
        seeds: train seeds (default: the scale's first)
        trials: budget: this many trials
        tokens: budget: proxy training tokens in all (e.g. 20B)
        gpu_hours: budget: GPU-hours in all
        workers: local worker processes (one per GPU)
        devices_per_trial: GPUs per trial: each worker is this many processes under torchrun
            (default 1, or a torchrun/srun launch's processes)
        study_dir: default: <results_dir>/<scale>/search
        seed: study seed: the order of the trials
        dry_run: print the plan and its cost; write nothing
        final: once the study is complete: train the best --top-k schedules and uniform at the full
            budget with the scale's seeds through the pipeline, rank them in SEARCH.md
        top_k: --final's schedules besides uniform (default: the last --final's, else search.top_k)
        final_stages: --final's comma-separated stages
        overrides: key=value config overrides for every trial
    """
    args = SearchArgs(**{name: value for name, value in locals().items() if name != "print_config"})
    if print_config:
        return show_config(*session.print_settings(args))
    return session.run_search(ARGV[0], args, final_stage)


ARGV: list[list[str]] = [[]]  # the command line, which --workers hands each worker


NOTHING_LOST = "nothing of the study is lost: run the same command to go on"
OUTSIDE = f"a Ctrl-C stopped search.py outside its trials; {NOTHING_LOST}"
# after a stop by SIGTERM, Slurm's warning signal or Ctrl-C, in a trial or between two
THEN = (
    "run the same command to continue the search (a trial this worker was training is resumed from its "
    "checkpoints by the next worker to look)."
)


def main(argv: list[str] | None = None) -> int:
    ARGV[0] = list(sys.argv[1:] if argv is None else argv)
    budget = [("trials", "tokens", "gpu_hours")]
    return run(search, ARGV[0], EPILOG, budget, interrupted=OUTSIDE, then_at_once=NOTHING_LOST, then=THEN)


def main_leaving_code(argv: list[str] | None = None) -> int:
    """main(), whose code rank 0 under torchrun also leaves for the parent (torchrun exits 1 on any stop)."""
    code = main(argv)
    if this_launch().rank == 0:
        processes.leave_exit_code(code)
    return code


def final_stage(search: Search, study) -> int:
    """The full-budget stage of `search` once its study is complete; a stop leaves the pipeline's records."""
    return run_command(
        lambda: session.full_budget_stage(search, study),
        interrupted="run the same command again to resume the full-budget stage",
    )
