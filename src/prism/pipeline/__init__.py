"""The orchestrator behind reproduce/run_all.py: plan the stage jobs of a scale, show what they
cost, run the ones that are not done and say where everything went."""

from __future__ import annotations

import json
import shlex
from dataclasses import replace
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from prism import cluster
from prism.cluster import EXIT_PREEMPTED, Preempted
from prism.config.overrides import override_value
from prism.config.schema import ConfigError, RunConfig, expand_schedule_groups, load_config
from prism.data.errors import DataError
from prism.pipeline.estimate import estimate, memory_plan
from prism.pipeline.layout import resolve_layout
from prism.pipeline.plan import Plan, assign_statuses, build_plan, default_scripts
from prism.pipeline.runner import execute, python_executable
from prism.pipeline.show import show_plan, show_summary
from prism.pipeline.stages import STAGES

SCRIPTS_DIR = Path(__file__).resolve().parents[3] / "reproduce"

__all__ = ["STAGES", "Plan", "assign_statuses", "build_plan", "load_run_config", "run_all"]


def load_run_config(
    scale: str, overrides: list[str], seeds: list[int] | None, schedules: list[str] | None
) -> RunConfig:
    """The config of one scale of run_all: the schedules (`schedules`, else the run_schedules key),
    a group such as table5 expanded, and the seeds as their config keys."""
    extra = []
    schedules = schedules or override_value(overrides, "run_schedules")
    if schedules:
        names = expand_schedule_groups(schedules, scale)
        # quoted: a head list's own commas stay in its name
        extra.append(f"run_schedules=[{','.join(json.dumps(s) for s in names)}]")
    if seeds:
        extra.append(f"seeds=[{','.join(str(int(s)) for s in seeds)}]")
    return load_config(scale, [*overrides, *extra])  # the config's value rules check the seeds


def with_layout(
    overrides: list[str], nodes: int | None, gpus_per_node: int | None, alloc: cluster.Allocation | None
) -> tuple[list[str], str | None]:
    """The overrides plus the device layout and, inside an allocation, the stage launchers the
    user did not set; and a line saying where the layout came from."""
    layout = resolve_layout(overrides, nodes, gpus_per_node, alloc)
    if layout is None:
        return list(overrides), None
    given = {o.split("=", 1)[0] for o in overrides}
    launchers = [
        f"run_all.launcher.{stage}={line}"
        for stage, line in layout.launchers.items()
        if f"run_all.launcher.{stage}" not in given
    ]
    return [*overrides, *layout.overrides, *launchers], layout.source


def trains_here(cfg: RunConfig, stages: list[str]) -> bool:
    """Whether the train stage is selected and starts its jobs on this machine: as plain python
    or under torchrun (srun starts them on the allocation's nodes, where train.py checks)."""
    words = shlex.split(cfg.run_all.launcher.train or "")
    return "train" in stages and (not words or Path(words[0]).name == "torchrun")


def run_all(
    scale: str,
    overrides: list[str],
    seeds: list[int] | None = None,
    schedules: list[str] | None = None,
    stages: list[str] | None = None,
    dry_run: bool = False,
    redo_changed: bool = False,
    console: Console | None = None,
    scripts: dict[str, str] | None = None,
    nodes: int | None = None,
    gpus_per_node: int | None = None,
) -> int:
    """Plan, show and (unless dry_run) run. Returns the process exit code. `scripts` replaces
    the program of any stage (default: reproduce/<stage script>). `nodes`/`gpus_per_node`
    describe a layout to plan for (default: the Slurm allocation this runs in, if any)."""
    console = console or Console()
    alloc = cluster.allocation()
    if not dry_run and (nodes or gpus_per_node) and alloc is None:
        raise ConfigError(
            "--nodes and --gpus-per-node describe a layout for --dry-run; to run on "
            "several nodes, start run_all.py inside a Slurm allocation (docs/cluster.md)."
        )
    overrides, layout_source = with_layout(overrides, nodes, gpus_per_node, alloc)
    cfg = load_run_config(scale, overrides, seeds, schedules)
    stages = list(stages or cfg.run_all.stages)
    for name in stages:
        STAGES.get(name)  # refuses a stage nobody registered, naming the valid ones
    if not dry_run and trains_here(cfg, stages):  # a dry run may plan GPUs from a login node
        cluster.check_accelerator_visible(cfg.train.accelerator)
    # Lightning (seconds, here and in the train stage's jobs) once the arguments and config are accepted
    from prism.train.callbacks.zeroshot import load_zeroshot_docs
    from prism.train.plan import plan_run

    plan = assign_statuses(
        build_plan(
            cfg, overrides, stages, {**default_scripts(SCRIPTS_DIR), **(scripts or {})}, python_executable()
        ),
        redo_changed,
    )
    plan.layout_source = layout_source
    # training's refusals before anything is queued: every run shares the batch split; with nothing
    # left to train, train.micro_batch=auto is not lowered by the memory plan (an execution key)
    from prism.train.batch import auto_micro_batch, batch_plan, world_size

    training = any(j.stage.name == "train" and j.status in ("run", "resume", "rerun") for j in plan.jobs)
    plan_cfg = cfg
    if auto_micro_batch(cfg) and not training:
        whole = batch_plan(cfg, world_size(cfg)).micro_batch
        plan_cfg = replace(cfg, train=replace(cfg.train, micro_batch=whole))
    plan.split = plan_run(plan_cfg, launch=False, reach_data=False).batch
    if cfg.train.eval_every_tokens and cfg.eval.data_dir and "train" in stages:
        # a local folder is read now: missing eval data stops the plan, not every training job
        load_zeroshot_docs(cfg)
    if plan.data_unreachable and not dry_run:  # before a job is queued or GPUs are held
        raise DataError(plan.data_unreachable)
    if dry_run and "train" in stages:
        plan.memory = memory_plan(cfg, plan.split, "long_context" in stages)
    show_plan(plan, estimate(cfg), console, dry_run)
    if plan.data_unreachable:
        console.print(f"[bold yellow]note:[/] {escape(plan.data_unreachable)}")
    if plan.conflicts:
        for job in plan.conflicts:
            console.print(f"[bold red]conflict:[/] {escape(job.reason)}.")
        console.print(
            "Nothing was run. Use the settings those runs were trained with, move the "
            "folders away, or pass --redo-changed to move them aside and train again."
        )
        return 0 if dry_run else 2
    if dry_run:
        return 0
    try:
        outcomes, failures = execute(plan, console, redo_changed)
    except Preempted as exc:
        console.print(f"[bold yellow]preempted:[/] {escape(str(exc))}")
        return EXIT_PREEMPTED
    show_summary(plan, outcomes, failures, console)
    return 1 if failures else 0
