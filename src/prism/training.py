"""Train one run: a RunConfig in, runs/<scale>/<schedule>/seed<k>/ out.

    from prism.config import load_config
    from prism.training import train
    run_dir = train(load_config("tiny", ["schedule=prism", "train.seed=0"]))

The Trainer does the work (precision, clipping, accumulation, DDP, checkpoints, logging); this
file turns the config into Trainer arguments, checks everything that can be checked before any
step runs, decides between a fresh start and a resume, and finishes a run in a fixed order:
final checkpoint -> safetensors export -> train_summary.json (the 'finished' marker).
"""

from __future__ import annotations

import os
import re
import shutil
import warnings
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import LearningRateMonitor
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.utilities import rank_zero_info
from omegaconf import OmegaConf

from prism import cluster, identity
from prism.batch import batch_plan, requested_devices
from prism.callbacks import (
    FinalValidation,
    LossMilestones,
    Preemption,
    PrismThroughputMonitor,
    StepCheckpoint,
    StepProgressBar,
    TrainSummary,
)
from prism.callbacks.checkpoint import AtomicCheckpointIO, stale_temporaries
from prism.checkpoint import export_safetensors
from prism.config import RunConfig, to_dict
from prism.identity import RUN_CONFIG_NAME, SUMMARY_NAME, config_hash
from prism.io import atomic_write_text
from prism.module import PrismLM
from prism.resume import DECISION_ENV, ResumeWithSplit, RunExistsError, agree, confirm_readable, decide
from prism.strategy import on_gpu, precision_args, strategy_arg

MILESTONES_NAME = "milestones.json"


# ----- what a run is -----------------------------------------------------------------------------
def schedule_dir_name(cfg: RunConfig) -> str:
    """The schedule's name ('uniform', 'prism', 'config-6') or its compact text, path-safe."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", cfg.head_schedule().name)


def run_dir(cfg: RunConfig) -> Path:
    return Path(cfg.runs_dir) / cfg.scale / schedule_dir_name(cfg) / f"seed{cfg.train.seed}"


def max_steps(cfg: RunConfig) -> int:
    """Optimizer steps from the token budget (whole steps; Table 1's budgets divide exactly)."""
    return cfg.train.tokens // cfg.train.global_batch_tokens


# ----- Trainer -----------------------------------------------------------------------------------
def build_callbacks(cfg: RunConfig, out: Path, info: dict) -> tuple[list, TrainSummary]:
    t = cfg.train
    milestones = LossMilestones(t.milestones, t.global_batch_tokens, out / MILESTONES_NAME)
    throughput = PrismThroughputMonitor()
    summary = TrainSummary(out / SUMMARY_NAME, milestones, throughput, info)
    callbacks = [
        FinalValidation(),
        Preemption(t.val_every_steps),
        milestones,
        throughput,
        summary,
        LearningRateMonitor(logging_interval="step"),
        StepProgressBar(refresh_rate=t.log_every_steps),
        StepCheckpoint(out / "checkpoints", t.ckpt_every_steps, t.val_every_steps, t.keep_checkpoints),
    ]
    return callbacks, summary


def build_trainer(cfg: RunConfig, out: Path, callbacks: list) -> L.Trainer:
    """The Trainer, with the cluster environment of this launch (prism.cluster) chosen here."""
    t = cfg.train
    logger = TensorBoardLogger(save_dir=str(out), name="tb", version="", default_hp_metric=False)
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
        max_steps=max_steps(cfg),
        max_epochs=-1,
        gradient_clip_val=t.grad_clip,
        gradient_clip_algorithm="norm",
        check_val_every_n_epoch=None,  # validate by step count, across epochs
        val_check_interval=t.val_every_steps,  # in micro-batches; scaled by accumulation below
        log_every_n_steps=t.log_every_steps,
        logger=logger,
        callbacks=callbacks,
        default_root_dir=str(out),
        use_distributed_sampler=False,  # the data module shards by rank itself
    )
    # Under DDP, Lightning broadcasts a SIGTERM flag from rank 0 before every micro-batch (a
    # collective and a host read each time). prism.callbacks.Preemption owns SIGTERM (its handler
    # replaces Lightning's, so that flag never rises) and agrees on it once per optimizer step.
    trainer.fit_loop.epoch_loop._broadcast_sigterm_tensor = lambda: None
    return trainer


# ----- run directory state ---------------------------------------------------------------------
def finished_summary(cfg: RunConfig) -> dict | None:
    """The summary of a finished run of exactly this config in its run directory, else None."""
    return identity.finished_summary(run_dir(cfg), config_hash(cfg))


# ----- the entry point ---------------------------------------------------------------------------
def train(
    cfg: RunConfig, overwrite: bool = False, resume: bool | None = None, extra_callbacks: list | None = None
) -> Path:
    """Train (or resume) one run and return its directory.

    resume: None = continue from the newest checkpoint when there is one; True = require one;
    False = refuse an existing partial run. A finished run is never retrained unless `overwrite`.
    Every error that can be detected before training raises ConfigError (LaunchError), DataError
    or RunExistsError with one sentence, on every rank."""
    from prism.data import FineWebDataModule, check_source_reachable
    from prism.data.sources import data_identity

    out = run_dir(cfg)
    digest = config_hash(cfg)
    schedule = cfg.head_schedule()
    steps = max_steps(cfg)  # config validation guarantees at least one
    cluster.check_training_launch(requested_devices(cfg), cfg.train.num_nodes)
    check_source_reachable(cfg.data)

    info = {
        "scale": cfg.scale,
        "schedule": schedule.name,
        "heads": list(schedule.heads),
        "seed": cfg.train.seed,
        "config_hash": digest,
        "data": data_identity(cfg.data),
    }
    callbacks, summary = build_callbacks(cfg, out, info)
    trainer = build_trainer(cfg, out, callbacks + list(extra_callbacks or []))
    # world_size is known only once the Trainer has read devices/num_nodes/the cluster
    # environment; both values below are read when fit starts.
    plan = batch_plan(cfg, trainer.world_size)
    trainer.accumulate_grad_batches = plan.accumulation
    trainer.val_check_interval = cfg.train.val_every_steps * plan.accumulation
    summary.info["batch_split"] = {
        "micro_batch": plan.micro_batch,
        "accumulation": plan.accumulation,
        "world_size": plan.world_size,
    }  # recorded in train_summary.json

    decision = agree(trainer, out, digest, lambda: decide(out, digest, overwrite, resume))
    if decision.kind == "refuse":
        raise RunExistsError(decision.message)
    confirm_readable(trainer, decision)
    ckpt = Path(decision.checkpoint) if decision.checkpoint else None
    fresh = ckpt is None
    trainer.num_sanity_val_steps = float("inf") if fresh else 0  # fresh: the start loss at step 0
    # a run may resume on another number of devices: the loop's micro-batch counters follow
    trainer.callbacks.append(ResumeWithSplit(plan.micro_batch, plan.accumulation, plan.world_size))

    datamodule = FineWebDataModule(cfg, micro_batch=plan.micro_batch)
    _ = datamodule.heldout  # reads/tokenizes the held-out set now: missing data fails before training

    if on_gpu(cfg):
        torch.set_float32_matmul_precision("high")  # TF32 for any fp32 matmul outside autocast
    if trainer.is_global_zero:
        if overwrite and out.exists():
            shutil.rmtree(out)
        out.mkdir(parents=True, exist_ok=True)
        atomic_write_text(out / RUN_CONFIG_NAME, OmegaConf.to_yaml(to_dict(cfg)))
        for skipped in decision.skipped:
            rank_zero_info(f"skipped checkpoint {skipped}")
        for tmp in stale_temporaries(out / "checkpoints"):
            rank_zero_info(f"removed {tmp}, a checkpoint a killed process did not finish writing")
            tmp.unlink(missing_ok=True)
        rank_zero_info(
            f"{'training' if fresh else f'resuming from {ckpt} (step {decision.step})'} -> {out}: "
            f"{steps} steps of {cfg.train.global_batch_tokens} tokens = {plan.describe()} "
            f"(train.micro_batch={cfg.train.micro_batch} is the per-device ceiling)"
        )

    # The same seed gives the same initial weights for every schedule of a shape (PrismDecoder
    # draws them in schedule-independent order); data order depends only on data.seed.
    L.seed_everything(cfg.train.seed, workers=True, verbose=False)
    module = PrismLM(
        model=cfg.model_config().to_dict(),
        run=to_dict(cfg),
        scale=cfg.scale,
        schedule=schedule.name,
        seed=cfg.train.seed,
        config_hash=digest,
    )
    try:
        with warnings.catch_warnings():
            # val/loss is computed from rank-summed states, identical on every rank: no sync needed
            warnings.filterwarnings("ignore", message=".*sync_dist=True.*")
            trainer.fit(module, datamodule=datamodule, ckpt_path=str(ckpt) if ckpt else None)
    finally:
        os.environ.pop(DECISION_ENV, None)

    if trainer.global_step < steps:  # stopped early without an exception (e.g. SIGTERM handling)
        raise RuntimeError(
            f"training stopped at step {trainer.global_step} of {steps}; rerun the "
            f"same command to resume from {out / 'checkpoints' / 'last.ckpt'}."
        )
    _finish(
        trainer,
        module,
        summary,
        out,
        {**info, "step": trainer.global_step, "tokens_seen": steps * cfg.train.global_batch_tokens},
    )
    return out


def _finish(trainer: L.Trainer, module: PrismLM, summary: TrainSummary, out: Path, meta: dict) -> None:
    """Export the final weights, then write the summary (the run's 'finished' marker). The final
    checkpoint was saved by StepCheckpoint right after the final validation."""
    if trainer.is_global_zero:
        export_safetensors(module.model, out, meta=meta)
    summary.write(trainer, module)
    trainer.strategy.barrier()
