"""The plan of a reproduction: which stage jobs exist for a scale (one class per stage in
prism.pipeline.stages; their outputs: docs/outputs.md) and what state each is in, read from the
record beside its output (records.py), whose config is what decides the result."""

from __future__ import annotations

import functools
import socket
from dataclasses import dataclass
from pathlib import Path

from prism.config.schema import RunConfig, to_dict
from prism.data.hub_offline import hub_offline_switch
from prism.data.sources import source_for
from prism.pipeline.records import StageRecord, diff_configs
from prism.pipeline.stages import STAGES, Job, Phase, PlanContext, PlannedRun
from prism.runs.layout import report_path
from prism.train.batch import BatchPlan
from prism.train.memory import MemoryEstimate

RUN_ALL_ONLY = ("run_all.", "seeds=", "run_schedules=")  # overrides the stage scripts are not given


@dataclass
class Plan:
    cfg: RunConfig
    stages: list[str]
    jobs: list[Job]
    logs_dir: Path
    report_path: Path
    layout_source: str | None = None  # where the device layout came from (allocation, --nodes)
    split: "BatchPlan | None" = None  # how every training run splits its global batch
    # why the training data cannot be read here, when a selected job that needs it is skipped
    data_unreachable: str | None = None
    # the dry run's memory plan of every training job (prism.train.memory)
    memory: "MemoryEstimate | None" = None

    @property
    def conflicts(self) -> list[Job]:
        return [j for j in self.jobs if j.status == "conflict"]

    def selected(self) -> list[Job]:
        return [j for j in self.jobs if j.stage.name in self.stages]


# ----- building ---------------------------------------------------------------------------------
def hub_offline() -> str | None:
    """Why the Hugging Face hub cannot serve the eval datasets, or None when it looks reachable."""
    switch = hub_offline_switch()  # the rule training's data.source=hub check uses
    if switch:
        return f"the hub is switched off ({switch[0]}={switch[1]})"
    try:  # one quick connection instead of the datasets library's long retries
        socket.create_connection(("huggingface.co", 443), timeout=3).close()
    except OSError:
        return "huggingface.co is unreachable"
    return None


def default_scripts(scripts_dir: Path) -> dict[str, str]:
    return {stage.name: str(scripts_dir / stage.script) for stage in STAGES.parts()}


def build_plan(
    cfg: RunConfig, overrides: list[str], stages: list[str], scripts: dict[str, str], python: str
) -> Plan:
    """All jobs for cfg.scale (statuses not yet assigned) in the order they run: seed by seed each
    per-run stage over the schedules (a seed's evaluations start as its training ends), between the
    stages before and after the runs. `scripts`: each stage's program (default_scripts())."""
    for stage in STAGES.parts():
        if stage.name in stages:
            stage.check(cfg)
            stage.check_launcher(cfg)
    passed = [o for o in overrides if not o.startswith(RUN_ALL_ONLY)]
    ctx = PlanContext(cfg, to_dict(cfg), passed, scripts, python)

    def add(phase: Phase, runs: list[PlannedRun | None]) -> None:
        for stage in STAGES.parts():
            if stage.phase is phase:
                for run in runs:
                    for job in stage.jobs(ctx, run):
                        job.run = run
                        ctx.planned.append(job)

    add(Phase.before_runs, [None])
    for seed in cfg.seeds:
        add(Phase.per_run, [PlannedRun(sched, seed) for sched in cfg.run_schedules])
    add(Phase.after_runs, [None])
    return Plan(cfg, list(stages), ctx.planned, ctx.logs, report_path(cfg))


# ----- state ------------------------------------------------------------------------------------
def job_state(job: Job, redo_changed: bool = False) -> tuple[str, str]:
    """(status, reason) of one job from its record and output, ignoring its dependencies."""
    stage = job.stage
    if not stage.recorded:
        return "run", stage.always_note
    rec = StageRecord.read(job.record_path)
    if rec is not None and rec.config_hash != job.hash:
        change = diff_configs(rec.config, job.config)
        if stage.keeps_changed and not redo_changed:
            where = job.run_dir if job.run_dir is not None else job.output
            return "conflict", f"{where} was trained with other settings: {change}"
        return "rerun", f"settings changed ({change})"
    if rec is not None:
        if rec.status == "done" and job.output_valid():
            return "done", "up to date"
        if stage.resumable(job):
            return "resume", f"resumes from its checkpoint (last attempt: {rec.status})"
        return "run", f"last attempt did not finish ({rec.status})"
    adopted = stage.adopt(job)
    if adopted is not None:
        status, reason = adopted
        return ("rerun" if status == "conflict" and redo_changed else status), reason
    if job.output.exists():
        return "rerun", "an output without a stage record is recomputed"
    return "run", ""


def assign_statuses(plan: Plan, redo_changed: bool = False) -> Plan:
    """Set every job's status; stages not selected only count as inputs (done or not)."""
    offline = functools.cache(hub_offline)  # asked at most once per plan

    # the hub switched off (HF_HUB_OFFLINE=1): a plan is made without network, and the jobs that
    # would read the training data are skipped with the override that makes them run
    unreachable = source_for(plan.cfg.data).unreachable()
    for job in plan.jobs:
        job.status, job.reason = job_state(job, redo_changed)
        if job.stage.name not in plan.stages:
            if job.status != "done":
                job.status, job.reason = "unselected", f"stage {job.stage} is not selected"
            continue
        skip = job.stage.skip_reason(job, plan.cfg, offline)
        if not skip and unreachable and job.stage.reads_training_data and job.status != "done":
            plan.data_unreachable = unreachable  # shown once, below the plan
            skip = "its training data cannot be read here (the note below says what to pass)"
        if skip:
            job.status, job.reason = "skipped", skip
        bad = [d for d in job.deps if d.status in ("blocked", "conflict", "skipped", "unselected")]
        if bad and job.status != "done":
            job.status, job.reason = "blocked", f"waits for {bad[0].label} ({bad[0].status})"
    return plan
