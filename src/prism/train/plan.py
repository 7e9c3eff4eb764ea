"""The run plan: a loaded config in, everything a training start decides out, checked once, its
refusals raised together (docs/design.md, "Run plan" and "Registries")."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from prism import cluster
from prism.config.schema import RunConfig, to_dict
from prism.errors import EXIT_REFUSED, ConfigError, PrismError
from prism.runs.identity import config_hash, read_summary
from prism.runs.layout import HPC_CHECKPOINT_GLOB, RunPaths, checkpoints_dir, run_dir, run_paths
from prism.train.batch import BatchPlan, auto_micro_batch, batch_plan, requested_devices, world_size
from prism.train.extension import SourceRun, check_extension, source_info

if TYPE_CHECKING:
    from prism.train.memory import MemoryEstimate

NEW, RESUME, FINISHED = "new", "resume", "finished"


class PlanRefused(ConfigError):
    """Several problems with one run's config, one sentence a line."""


class RunExistsError(PrismError, RuntimeError):
    """The run folder holds another finished run, is locked, or cannot be resumed; nothing started."""

    exit_code = EXIT_REFUSED


@dataclass(frozen=True)
class RunPlan:
    """What a training run is and how it splits over this launch, decided before any Trainer exists."""

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
                **{k: getattr(self.batch, k) for k in ("world_size", "micro_batch", "accumulation")},
                "micro_batch_chosen_by": "memory plan (train.micro_batch=auto)" if self.memory else "config",
                "precision": self.precision,
                "strategy": self.strategy,
                "run_dir": str(self.out),
                "config_hash": self.config_hash,
            }
        }


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
    """Check `cfg` and decide its run (`launch`: this process is about to train, its layout and
    devices checked; `reach_data`: the data source's reach checked); a finished run plans as FINISHED."""
    problems, memory = Problems(), None
    # without Lightning: a refusal of these comes at once
    from prism.data.sources import check_data_section, check_source_reachable, training_data_identity
    from prism.eval.tasks import check_task_config
    from prism.train.watchdog import check_timeouts

    if launch:
        problems.check(cluster.check_accelerator_visible, cfg.train.accelerator)
    problems.check(check_data_section, cfg.data)
    problems.check(check_task_config, cfg)
    source: SourceRun | None = problems.check(check_extension, cfg)
    batch = problems.check(batch_plan, cfg, world_size(cfg))
    problems.check(check_timeouts, float(cfg.train.hang_timeout_s), float(cfg.train.ddp_timeout_s))
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

    before = len(problems)
    problems.check(trackers.check_trackers, cfg)
    trackers_named = len(problems) == before
    problems.check(check_profile_config, cfg)
    if status != FINISHED:  # what this machine decides matters only to a run that will train
        if launch:
            problems.check(cluster.check_training_launch, requested_devices(cfg), int(cfg.train.num_nodes))
        problems.check(check_strategy, cfg)
        problems.check(check_zeroshot_config, cfg)
        if trackers_named:  # the names are known: their packages and store
            problems.check(trackers.check_installed, cfg.train.loggers)
            problems.check(trackers.check_store, cfg)
        if auto_micro_batch(cfg):  # seconds: only when asked for
            from prism.train.memory import fit_micro_batch

            memory = problems.check(fit_micro_batch, cfg, batch.world_size, batch)
        if reach_data and not problems:
            problems.check(check_source_reachable, cfg.data)
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
        "batch_split": {k: getattr(batch, k) for k in ("micro_batch", "accumulation", "world_size")},
    }
    if source is not None:  # a context extension records the run it starts from
        info["init_from"] = source_info(source)
    if memory is not None:  # why this split: the estimate it was chosen by
        info["memory"] = {**memory.to_dict(), "auto": True}
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
        strategy=str(cfg.train.strategy),
        source=source,
        info=info,
        memory=memory,
    )


class Problems(list):
    """The refusals of a plan's checks, each PrismError a check raises kept."""

    def check(self, check, *args):
        """`check(*args)`'s result, or None with its PrismError kept."""
        try:
            return check(*args)
        except PrismError as exc:
            self.append(exc)
            return None

    def refuse(self) -> None:
        """Raise the one problem as it is, or all of them together, one sentence a line."""
        if len(self) == 1:
            raise self[0]
        if self:
            raise PlanRefused("\n".join(str(p) for p in self))


def with_source(cfg: RunConfig, source: SourceRun | None) -> RunConfig:
    """`cfg` with the source's hash in train.init_from.config_hash (config.yaml and checkpoints hold it)."""
    if source is None or cfg.train.init_from.config_hash:
        return cfg
    init = replace(cfg.train.init_from, config_hash=source.config_hash)
    return replace(cfg, train=replace(cfg.train, init_from=init))


def run_status(out: Path, digest: str) -> str:
    """FINISHED when `out` holds a finished run of identity `digest`, RESUME when it holds a
    checkpoint, else NEW; a finished run of another identity is refused."""
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
