"""The run plan: a loaded config in, everything a training start decides out, checked once.

    plan = plan_run(load_config("tiny", ["schedule=prism"]))
    plan.status, plan.out, plan.batch.describe()

`plan_run` runs every check of a config once and takes every decision before the first step
once: the run folder and identity hash, whether the run is new, resumed or already finished, the
source run of a context extension (read once), the batch split over the launch's devices, the
precision and strategy, the trackers and the in-loop evaluation tasks. The builders (the Trainer,
the callbacks, the data module, the LightningModule; prism.train.trainer) take the plan and never
check the config again. A value that the plan holds is decided nowhere else: with
train.micro_batch=auto the memory plan picks the micro-batch (`memory`, beside `batch`), once,
here; a fixed micro-batch skips the estimate (seconds), which then only the dry run makes.

Problems are reported together, one sentence each (`PlanRefused` when there are several): first
those found without Lightning's import, so that such a refusal comes at once; then, only when
those pass, the ones that need Lightning (strategies, trackers, the in-loop evaluation).
How the checks divide between the config layer and here: docs/design.md, "Registries".
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from prism import cluster
from prism.config.schema import RunConfig, to_dict
from prism.errors import EXIT_REFUSED, ConfigError, PrismError
from prism.runs.identity import config_hash, read_summary
from prism.runs.layout import HPC_CHECKPOINT_GLOB, RunPaths, checkpoints_dir, run_dir, run_paths
from prism.train.batch import BatchPlan, auto_micro_batch, batch_plan, requested_devices
from prism.train.extension import SourceRun, check_extension, source_info

if TYPE_CHECKING:
    from prism.train.memory import MemoryEstimate

NEW, RESUME, FINISHED = "new", "resume", "finished"


class PlanRefused(ConfigError):
    """Several problems with one run's config, one sentence a line."""


class RunExistsError(PrismError, RuntimeError):
    """The run directory already holds a finished run of another config, is locked by another
    process, or holds one that cannot be resumed (prism.train.resume); nothing is started."""

    exit_code = EXIT_REFUSED


@dataclass(frozen=True)
class RunPlan:
    """What a training run is and how it splits over this launch, decided before any Trainer
    exists: the Trainer is then built once from it, and nothing of it changes afterwards."""

    cfg: RunConfig  # the config, with an extension's source hash filled in (with_source)
    config: dict  # cfg as config.yaml and the checkpoints hold it
    model: dict  # the model's config (ModelConfig.to_dict()) under the run's schedule
    out: Path
    paths: RunPaths  # the run folder's files
    config_hash: str
    status: str  # NEW, RESUME (a checkpoint is there; which one opens is decided under the lock), FINISHED
    overwrite: bool
    resume: bool | None  # None: resume when there is a checkpoint; True: require one; False: refuse one
    steps: int  # optimizer steps
    batch: BatchPlan  # micro-batch x accumulation x world size
    precision: str  # train.precision with auto resolved
    strategy: str
    trackers: tuple[str, ...]
    eval_tasks: tuple[str, ...]  # scored during training; empty when train.eval_every_tokens is 0
    source: SourceRun | None  # the finished run a context extension starts from
    info: dict  # what train_summary.json and the exported weights record about the run
    # train.micro_batch=auto: the memory plan's estimate at the micro-batch it chose (None when fixed)
    memory: MemoryEstimate | None = None

    @property
    def finished(self) -> bool:
        return self.status == FINISHED

    def derived(self) -> dict:
        """What the plan derives from the settings (--print_config shows it)."""
        return {
            "derived": {
                "steps": self.steps,
                "world_size": self.batch.world_size,
                "micro_batch": self.batch.micro_batch,
                "accumulation": self.batch.accumulation,
                "micro_batch_chosen_by": "memory plan (train.micro_batch=auto)" if self.memory else "config",
                "precision": self.precision,
                "strategy": self.strategy,
                "run_dir": str(self.out),
                "config_hash": self.config_hash,
            }
        }

    def done_message(self) -> str:
        """What a start of a finished run says (exit 0 from train.py)."""
        return f"{self.out} already holds this finished run; nothing to do (--overwrite trains it again)."


def max_steps(cfg: RunConfig) -> int:
    """Optimizer steps from the token budget (whole steps; Table 1's budgets divide exactly)."""
    return cfg.train.tokens // cfg.train.global_batch_tokens


def plan_run(
    cfg: RunConfig,
    *,
    overwrite: bool = False,
    resume: bool | None = None,
    launch: bool = True,
    reach_data: bool = True,
) -> RunPlan:
    """Check `cfg` and decide its run (module docstring). `launch`: this process is about to
    train, so its layout and devices are checked too; `reach_data`: whether the data source can be
    reached from here. A finished run of this identity is checked for what its settings get wrong
    only, nothing this machine decides (packages, devices, data), and plans as FINISHED; one of
    another identity in the same folder is refused (RunExistsError)."""
    problems, memory, trackers_named = Problems(), None, False
    # without Lightning: a refusal of these comes at once
    from prism.data.sources import check_data_section, check_source_reachable, training_data_identity
    from prism.eval.tasks import check_task_config
    from prism.train.watchdog import check_timeouts

    if launch:
        with problems:
            cluster.check_accelerator_visible(cfg.train.accelerator)
    with problems:
        check_data_section(cfg.data)
    with problems:
        check_task_config(cfg)
    with problems:
        source: SourceRun | None = check_extension(cfg)
    with problems:
        batch = batch_plan(cfg, requested_devices(cfg) * int(cfg.train.num_nodes))
    with problems:
        check_timeouts(float(cfg.train.hang_timeout_s), float(cfg.train.ddp_timeout_s))
    problems.refuse()

    cfg = with_source(cfg, source)
    out, digest = run_dir(cfg), config_hash(cfg)
    # a dry run does not look into the folder: run_all's own plan judges each job's (prism.pipeline.plan)
    status = run_status(out, digest) if launch and not overwrite else NEW

    # Lightning's imports (seconds), once the settings above are accepted
    from prism.train import trackers
    from prism.train.callbacks.profile import check_profile_config
    from prism.train.callbacks.zeroshot import check_zeroshot_config
    from prism.train.strategy import check_strategy, resolved_precision

    with problems:
        trackers.check_trackers(cfg)
        trackers_named = True
    with problems:
        check_profile_config(cfg)
    if status != FINISHED:  # what this machine decides matters only to a run that will train
        if launch:
            with problems:
                cluster.check_training_launch(requested_devices(cfg), int(cfg.train.num_nodes))
        with problems:
            check_strategy(cfg)
        with problems:
            check_zeroshot_config(cfg)
        if trackers_named:  # the names are known: their packages and store
            with problems:
                trackers.check_installed(cfg.train.loggers)
            with problems:
                trackers.check_store(cfg)
        if auto_micro_batch(cfg):  # seconds: only when asked for
            from prism.train.memory import fit_micro_batch

            with problems:
                memory = fit_micro_batch(cfg, batch.world_size, batch)
        if reach_data and not problems:
            with problems:
                check_source_reachable(cfg.data)
    problems.refuse()

    if memory is not None:  # the same global batch, in the micro-batches that fit
        batch = replace(batch, micro_batch=memory.micro_batch, accumulation=memory.accumulation)
    schedule = cfg.head_schedule()
    info = {
        "scale": cfg.scale,
        "schedule": schedule.name,
        "heads": list(schedule.heads),
        "seed": cfg.train.seed,
        "config_hash": digest,
        "data": training_data_identity(cfg.data),
        "batch_split": {
            "micro_batch": batch.micro_batch,
            "accumulation": batch.accumulation,
            "world_size": batch.world_size,
        },
    }
    if source is not None:  # a context extension records the run it starts from
        info["init_from"] = source_info(source)
    if memory is not None:  # why this split: the estimate it was chosen by
        info["memory"] = {**memory.to_dict(), "auto": True}
    t = cfg.train
    return RunPlan(
        cfg=cfg,
        config=to_dict(cfg),
        model=cfg.model_config().to_dict(),
        out=out,
        paths=run_paths(out),
        config_hash=digest,
        status=status,
        overwrite=overwrite,
        resume=resume,
        steps=max_steps(cfg),
        batch=batch,
        precision=resolved_precision(cfg),
        strategy=str(t.strategy),
        trackers=tuple(str(n) for n in t.loggers),
        eval_tasks=tuple(str(n) for n in t.eval_tasks) if t.eval_every_tokens else (),
        source=source,
        info=info,
        memory=memory,
    )


class Problems(list):
    """The refusals of a plan's checks: `with problems:` around a check keeps the PrismError it
    raises, so that every check runs and refuse() reports them together."""

    def __enter__(self) -> Problems:
        return self

    def __exit__(self, kind, exc, traceback) -> bool:
        if isinstance(exc, PrismError):
            self.append(exc)
            return True
        return False

    def refuse(self) -> None:
        """Raise the one problem as it is, or all of them together, one sentence a line."""
        if len(self) == 1:
            raise self[0]
        if self:
            raise PlanRefused("\n".join(str(p) for p in self))


def with_source(cfg: RunConfig, source: SourceRun | None) -> RunConfig:
    """`cfg` with the source's hash in train.init_from.config_hash, so that config.yaml and the
    checkpoints hold the identity without needing the source's folder again."""
    if source is None or cfg.train.init_from.config_hash:
        return cfg
    init = replace(cfg.train.init_from, config_hash=source.config_hash)
    return replace(cfg, train=replace(cfg.train, init_from=init))


def run_status(out: Path, digest: str) -> str:
    """FINISHED when `out` holds a finished run of identity `digest`, RESUME when it holds a
    checkpoint, else NEW. A finished run of another identity is refused, in one sentence: the
    one place that decides what a finished run means to a start, on every path."""
    summary = read_summary(out)  # None unless it marks a finished run
    if summary is not None:
        if summary.config_hash == digest:
            return FINISHED
        raise RunExistsError(
            f"{out} already holds a finished run (of a different config, hash {summary.config_hash}); "
            f"pass --overwrite to train it again or choose another runs_dir."
        )
    ckpts = checkpoints_dir(out)
    has_checkpoint = (ckpts.is_dir() and any(ckpts.iterdir())) or any(out.glob(HPC_CHECKPOINT_GLOB))
    return RESUME if has_checkpoint else NEW


__all__ = ["FINISHED", "NEW", "RESUME", "PlanRefused", "RunExistsError", "RunPlan", "max_steps", "plan_run"]
