"""Train one run: a RunConfig in, runs/<scale>/<schedule>/seed<k>/ out, finished in a fixed order:
final checkpoint -> export -> train_summary.json, the marker (docs/training.md, "The training path")."""

from __future__ import annotations

import logging
import os
import shutil
import warnings
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Iterator

import lightning as L
import torch
from lightning.fabric.utilities.warnings import PossibleUserWarning
from lightning.pytorch.callbacks import LearningRateMonitor
from lightning.pytorch.utilities import rank_zero_info
from omegaconf import OmegaConf

from prism import cluster, compat
from prism.config.schema import ConfigError, RunConfig
from prism.io import atomic_write_text, os_error_message
from prism.runs import lock as runlock
from prism.runs.checkpoint import export_from_all_ranks
from prism.train import trackers
from prism.train.callbacks import (
    FinalValidation,
    LossMilestones,
    Preemption,
    PrismThroughputMonitor,
    StepCheckpoint,
    StepProgressBar,
    TrainSummary,
)
from prism.train.callbacks.checkpoint import AtomicCheckpointIO, stale_temporaries
from prism.train.callbacks.health import BatchDone, HangWatchdog, StragglerLine
from prism.train.callbacks.priority import RECORD, RESTORE, ordered, with_priority
from prism.train.callbacks.profile import ProfileSteps
from prism.train.callbacks.zeroshot import ZeroShotEval
from prism.train.extension import load_source_weights
from prism.train.memory import occupied_warning
from prism.train.module import PrismLM
from prism.train.optim import warmup_steps
from prism.train.plan import RunPlan, plan_run
from prism.train.resume import (
    DECISION_ENV,
    Decision,
    ResumeWithSplit,
    RunExistsError,
    agree,
    confirm_readable,
    decide,
    refused,
)
from prism.train.strategy import on_gpu, precision_args, strategy_arg
from prism.train.watchdog import flight_recorder_env


# ----- build: the Trainer, once ------------------------------------------------------------------
def build_callbacks(plan: RunPlan, extra: list | None = None) -> tuple[list, TrainSummary]:
    """The run's callbacks, in the order of their priorities (prism.train.callbacks.priority), with
    `extra` (train's extra_callbacks) at theirs (before Preemption when they declare none)."""
    from prism.data import RenamedDataState

    cfg, out, t = plan.cfg, plan.out, plan.cfg.train
    milestones = LossMilestones(t.milestones, t.global_batch_tokens, plan.paths.milestones)
    throughput = PrismThroughputMonitor()
    # its documents are read (and so checked) now, before the Trainer or any step
    zeroshot = ZeroShotEval(cfg, out, throughput) if t.eval_every_tokens else None
    summary = TrainSummary(plan.paths.summary, milestones, throughput, plan.info)
    # the hang watchdog and the straggler line, each with its end-of-step marker
    dog = line = None
    if float(t.hang_timeout_s) > 0:
        dog = HangWatchdog(plan.paths.diagnostics, float(t.hang_timeout_s), float(t.ddp_timeout_s))
    if int(t.straggler_every_steps) > 0 and plan.batch.world_size > 1:  # one rank has no stragglers
        line = StragglerLine(
            int(t.straggler_every_steps), float(t.straggler_slower_pct), int(t.straggler_intervals)
        )
    health = [c for watcher in (dog, line) if watcher is not None for c in (watcher, BatchDone(watcher))]
    summary.stragglers = line
    if zeroshot is not None and dog is not None:  # a long in-loop evaluation is progress too
        zeroshot.on_batch = dog.alive
    callbacks = [
        FinalValidation(),
        *([zeroshot] if zeroshot is not None else []),
        *(extra or []),
        milestones,
        Preemption(t.val_every_steps),
        throughput,
        summary,
        with_priority(LearningRateMonitor(logging_interval="step"), RECORD),
        StepProgressBar(refresh_rate=t.log_every_steps),
        # a run may resume on another number of devices: the loop's micro-batch counters follow
        ResumeWithSplit(plan.batch.micro_batch, plan.batch.accumulation, plan.batch.world_size),
        # checkpoints that file the data state under its older class name
        with_priority(RenamedDataState(), RESTORE),
        # train.profile_steps: a trace of the steps it names
        *([ProfileSteps(*t.profile_steps, out)] if t.profile_steps else []),
        *health,  # their end-of-step markers just before the checkpoint, which comes last
        StepCheckpoint(plan.paths.checkpoints, t.ckpt_every_steps, t.val_every_steps, t.keep_checkpoints),
    ]
    return ordered(callbacks), summary


def build_trainer(plan: RunPlan, callbacks: list) -> L.Trainer:
    """The Trainer, with the cluster environment of this launch (prism.cluster) chosen here."""
    cfg, t = plan.cfg, plan.cfg.train
    # train.loggers (prism.train.trackers): opened on rank 0 only, once the start is decided (prepare)
    logger = trackers.build_logger(cfg, plan)
    environment = cluster.lightning_environment()
    precision = precision_args(cfg)
    plugins = [
        *precision.pop("plugins", []),
        AtomicCheckpointIO(),
        *([environment] if environment is not None else []),
    ]
    trainer = L.Trainer(
        accelerator=t.accelerator,
        devices=t.devices,
        num_nodes=t.num_nodes,
        strategy=strategy_arg(cfg),
        plugins=plugins,
        **precision,
        max_steps=plan.steps,
        max_epochs=-1,
        accumulate_grad_batches=plan.batch.accumulation,
        gradient_clip_val=t.grad_clip,
        gradient_clip_algorithm="norm",
        check_val_every_n_epoch=None,  # validate by step count, across epochs
        val_check_interval=t.val_every_steps * plan.batch.accumulation,  # counted in micro-batches
        # a fresh run validates all of the held-out set before step 0 (not on a resume)
        num_sanity_val_steps=-1,
        log_every_n_steps=t.log_every_steps,
        logger=logger,
        callbacks=callbacks,
        default_root_dir=str(plan.out),
        use_distributed_sampler=False,  # the data module shards by rank itself
    )
    if trainer.world_size != plan.batch.world_size:
        raise cluster.LaunchError(
            f"Lightning set up {trainer.world_size} process(es) but the batch split was planned for "
            f"{plan.batch.world_size} (train.devices x train.num_nodes); make train.devices the number "
            f"of devices each node uses."
        )
    compat.check_trainer(trainer)
    compat.silence_sigterm_broadcast(trainer)  # prism.train.callbacks.Preemption owns SIGTERM
    return trainer


# ----- the entry point ---------------------------------------------------------------------------
def train(
    cfg: RunConfig, overwrite: bool = False, resume: bool | None = None, extra_callbacks: list | None = None
) -> Path:
    """Train (or resume) one run and return its directory. resume: None = from the newest checkpoint
    if any; True = require one; False = refuse a partial run. A finished run of this config is done
    unless `overwrite`. Errors found before training raise one sentence, on every rank."""
    return run(plan_run(cfg, overwrite=overwrite, resume=resume), extra_callbacks)


def run(plan: RunPlan, extra_callbacks: list | None = None) -> Path:
    """Carry out a plan: build the Trainer once, decide the start under the run's lock, fit and finish."""
    if plan.finished:
        print(f"{plan.out} already holds this finished run; nothing to do (--overwrite trains it again).")
        return plan.out
    callbacks, summary = build_callbacks(plan, extra_callbacks)
    # before any process group exists: NCCL reads it when the group starts
    flight_recorder_env(plan.paths.diagnostics / cluster.attempt_id())
    with quiet_library_notices():
        trainer = build_trainer(plan, callbacks)
    with ExitStack() as held:  # the run's lock (rank 0), from the decision to the end
        decision = decide_start(trainer, plan, held)
        preflight(trainer, plan)
        datamodule = prepare(plan, trainer, decision)
        seed = plan.cfg.train.seed  # the same seed: the same initial weights for every schedule of a shape
        L.seed_everything(seed, workers=True, verbose=False)
        module = PrismLM(
            plan.model, plan.config, plan.cfg.scale, plan.info["schedule"], seed, plan.config_hash
        )
        source = plan.source
        if source is not None and decision.kind == "fresh":  # a resume reads its own checkpoint
            load_source_weights(module.model, source)  # a context extension's fresh start, every rank
            rank_zero_info(
                f"starting from {source.weights} (step {source.summary.steps}, trained at "
                f"{source.model.seq_len} tokens), extended to model.seq_len={plan.cfg.model.seq_len}"
            )
        fit(trainer, module, datamodule, decision)
        if trainer.global_step < plan.steps:  # stopped early without an exception
            raise RuntimeError(
                f"training stopped at step {trainer.global_step} of {plan.steps}; rerun the "
                f"same command to resume from {plan.paths.last_checkpoint}."
            )
        finish(trainer, module, summary, plan)
    return plan.out


def decide_start(trainer: L.Trainer, plan: RunPlan, held: ExitStack) -> Decision:
    """Fresh start, resume or refusal, decided on rank 0 for every rank, after it took the run's lock
    into `held` (a second writer is refused on every rank, naming the holder)."""
    out, digest = plan.out, plan.config_hash
    failed: list[OSError] = []  # rank 0's error behind a refusal: a full disk stops a search (prism.search)

    def make() -> Decision:
        try:
            held.enter_context(runlock.hold_run(out))
        except runlock.LockHeld as exc:
            return refused(
                f"{out} is already being trained by another process ({exc.holder}; lock "
                f"{exc.path}); nothing was started or changed here."
            )
        except runlock.LocksUnsupported as exc:
            return Decision(
                "invalid",
                message=(
                    f"{exc}; train.py needs them to keep two writers off one run, so put runs_dir "
                    f"on a filesystem that supports flock."
                ),
            )
        except OSError as exc:  # no folder for the lock file (read-only, a file in the way, full)
            if exc.filename is None:  # a write into the lock file (a full disk) names none
                exc = OSError(exc.errno, exc.strerror, str(runlock.lock_path(out)))
            failed.append(exc)
            return refused(os_error_message(exc))
        return decide(out, digest, plan.overwrite, plan.resume)

    decision = agree(trainer, out, digest, make)
    if decision.kind == "invalid":
        raise ConfigError(decision.message)
    if decision.kind == "refuse":
        raise RunExistsError(decision.message) from (failed[0] if failed else None)
    confirm_readable(trainer, decision)
    return decision


def preflight(trainer: L.Trainer, plan: RunPlan) -> None:
    """train.preflight: in a run of several processes, rank 0 prints prism.train.preflight's table."""
    if not plan.cfg.train.preflight or trainer.world_size < 2 or not torch.distributed.is_initialized():
        return
    from prism.train import preflight as check

    rank_zero_info(check.table(check.check(trainer.strategy.root_device)))


def prepare(plan: RunPlan, trainer: L.Trainer, decision: Decision):
    """The data module (its held-out set read now) and the run folder with its config.yaml (rank 0)."""
    from prism.data import TokenStreamDataModule

    cfg = plan.cfg
    datamodule = TokenStreamDataModule(cfg, micro_batch=plan.batch.micro_batch)
    _ = datamodule.heldout
    if on_gpu(cfg):
        torch.set_float32_matmul_precision("high")  # TF32 for any fp32 matmul outside autocast
        if plan.memory is not None and trainer.strategy.root_device.type == "cuda":
            # the plan counted on the whole device: each rank checks its own
            warning = occupied_warning(plan.memory, *torch.cuda.mem_get_info(trainer.strategy.root_device))
            if warning:
                warnings.warn(warning, stacklevel=1)
    if trainer.is_global_zero:
        out = plan.out
        # the W&B and MLflow runs of an earlier attempt that was killed: the new start closes them
        earlier = trackers.earlier_runs(out) if decision.kind == "fresh" else []
        if plan.overwrite and out.exists():
            shutil.rmtree(out)
        elif decision.kind == "fresh" and out.is_dir():  # a start that wrote no checkpoint
            trackers.clear(out)
        out.mkdir(parents=True, exist_ok=True)
        atomic_write_text(plan.paths.config, OmegaConf.to_yaml(plan.config))
        # the same tracker runs on a resume, new ones on a fresh start
        trackers.begin(trainer, fresh=decision.kind == "fresh", earlier=earlier)
        for skipped in decision.skipped:
            rank_zero_info(f"skipped checkpoint {skipped}")
        for tmp in stale_temporaries(plan.paths.checkpoints):
            rank_zero_info(f"removed {tmp}, a checkpoint a killed process did not finish writing")
            tmp.unlink(missing_ok=True)
        start = "training"
        if decision.checkpoint is not None:
            start = f"resuming from {decision.checkpoint} (step {decision.step})"
        ceiling = (
            f"train.micro_batch=auto, the memory plan's choice: {plan.memory.line()}"
            if plan.memory is not None
            else f"train.micro_batch={cfg.train.micro_batch} is the per-device ceiling"
        )
        rank_zero_info(
            f"{start} -> {out}: {plan.steps} steps of {cfg.train.global_batch_tokens} tokens = "
            f"{plan.batch.describe()} ({ceiling}); {warmup_line(plan.steps, cfg.train.warmup_frac)}"
        )
    return datamodule


def warmup_line(steps: int, warmup_frac: float) -> str:
    """The start-up line's account of the LR warmup, which rounds to whole optimizer steps."""
    warmup = warmup_steps(steps, warmup_frac)
    if warmup:
        return f"LR warmup over the first {warmup} of them"
    return (
        f"no LR warmup: train.warmup_frac={warmup_frac} of {steps} steps rounds to 0 steps, so the "
        f"first step runs at the peak LR"
    )


# what Lightning and torch say that does not apply to the kit's runs, silenced by text and category
QUIET_WARNINGS = (
    # val/loss is computed from rank-summed states, identical on every rank: no sync needed
    (r".*sync_dist=True", PossibleUserWarning),
    # torch deprecates the LeafSpec that Lightning 2.6 still builds: nothing for a user to change
    (r"`isinstance\(treespec, LeafSpec\)` is deprecated", FutureWarning),
    # both about the held-out set's loader, which runs in the training process (num_workers=0)
    (r"Your `IterableDataset` has `__len__` defined", UserWarning),
    (r"The 'val_dataloader' does not have many workers", PossibleUserWarning),
)
QUIET_LOGS = ("💡 Tip: For seamless cloud logging",)  # an advertisement for another package


@contextmanager
def quiet_library_notices() -> Iterator[None]:
    """QUIET_WARNINGS and QUIET_LOGS (Lightning's rank-zero log lines) silenced within."""
    from lightning_utilities.core import rank_zero

    def keep(record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(QUIET_LOGS)

    logger = rank_zero.log  # the logger rank_zero_info writes to
    with warnings.catch_warnings():
        for message, category in QUIET_WARNINGS:
            warnings.filterwarnings("ignore", message=message, category=category)
        logger.addFilter(keep)
        try:
            yield
        finally:
            logger.removeFilter(keep)


def fit(trainer: L.Trainer, module: PrismLM, datamodule, decision: Decision) -> None:
    try:
        with quiet_library_notices():
            # the kit's checkpoints hold tensors and plain containers only (prism.train.resume opened it so)
            trainer.fit(module, datamodule=datamodule, ckpt_path=decision.checkpoint, weights_only=True)
    finally:
        os.environ.pop(DECISION_ENV, None)


def finish(trainer: L.Trainer, module: PrismLM, summary: TrainSummary, plan: RunPlan) -> None:
    """Export the final weights, then write the summary (the run's 'finished' marker)."""
    meta = {
        # not batch_split and memory: how this launch ran it, not what the weights are
        **{k: v for k, v in plan.info.items() if k not in ("batch_split", "memory")},
        "step": trainer.global_step,
        "tokens_seen": trainer.global_step * plan.batch.global_batch_tokens,
    }
    # every rank: under FSDP the full weights are gathered from all shards first
    export_from_all_ranks(module.model, plan.out, trainer.is_global_zero, meta=meta)
    summary.write(trainer, module)
    trainer.strategy.barrier()
