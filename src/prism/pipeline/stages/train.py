"""train: one run per (schedule, seed) in runs/<scale>/<schedule>/seed<k>/, finished when its
train_summary.json says so (prism.runs.records.TrainSummary). Its job config is the run's identity, so the
record's hash is the config_hash train.py writes."""

from __future__ import annotations

from pathlib import Path

from prism.pipeline.records import StageRecord, diff_configs
from prism.pipeline.stages.base import Job, Phase, Placement, PlanContext, PlannedRun, Stage
from prism.runs.identity import final_weights, saved_identity, stable_hash, training_identity
from prism.runs.layout import (
    CHECKPOINT_SUFFIX,
    RUN_CONFIG_NAME,
    SUMMARY_NAME,
    WEIGHTS_NAME,
    checkpoints_dir,
    run_dir,
    set_aside,
)
from prism.runs.records import TrainSummary


class Train(Stage):
    name = "train"
    script = "train.py"
    phase = Phase.per_run
    keeps_changed = True
    placement = Placement.all_nodes
    reads_training_data = True
    retries_crashes = True  # train.py resumes from the newest checkpoint
    preemptible = True
    output_record = TrainSummary  # finished: the record's own condition

    def jobs(self, ctx: PlanContext, run: PlannedRun | None) -> list[Job]:
        out = run_dir(ctx.cfg, run.schedule, run.seed)  # train.py's folder

        def argv() -> list[str]:
            return [
                *ctx.command(self, scale=ctx.cfg.scale, schedule=run.schedule, seed=run.seed),
                *ctx.passed,
            ]

        identity = training_identity(ctx.full, run.schedule, run.seed)
        return self.one_job(ctx, run, out / SUMMARY_NAME, identity, argv, run_dir=out)

    def resumable(self, job: Job) -> bool:
        # a checkpoint, not just the folder: a run whose first save failed (a full disk) has none
        return any(checkpoints_dir(job.run_dir).glob(f"*{CHECKPOINT_SUFFIX}"))

    def adopt(self, job: Job) -> tuple[str, str] | None:
        """A run folder without a record (train.py run by hand): compare its saved config."""
        if not (job.run_dir.exists() and any(job.run_dir.iterdir())):
            return None
        try:
            identity = saved_identity(job.run_dir)
        except Exception:
            return "conflict", (
                f"{job.run_dir} exists but has no stage record and no readable "
                f"{RUN_CONFIG_NAME}, so its settings are unknown"
            )
        if stable_hash(identity) != job.hash:
            change = diff_configs(identity, job.config)
            return "conflict", f"{job.run_dir} was trained with other settings: {change}"
        if job.output_valid():
            return "done", "finished earlier (adopted)"
        if self.resumable(job):
            return "resume", "resumes from its checkpoint (adopted)"
        return "run", "an unfinished run of these settings without a checkpoint; it starts again (adopted)"

    def before_rerun(self, job: Job, console) -> None:
        """Keep a differently configured run folder (it holds GPU hours) under a new name."""
        if not job.run_dir.exists():
            return
        old = StageRecord.read(job.record_path)
        tag = old.config_hash[:8] if old else "unrecorded"
        dest, n = set_aside(job.run_dir, tag), 1
        while dest.exists():
            dest, n = set_aside(job.run_dir, tag, n), n + 1
        job.run_dir.rename(dest)
        console.print(f"  moved the old run to {dest}")


def run_weights(run_dir: Path) -> Path:
    """The weights later stages read from a run: its final weights, or where the exported ones
    will be while it has none yet."""
    return final_weights(run_dir) or run_dir / WEIGHTS_NAME
