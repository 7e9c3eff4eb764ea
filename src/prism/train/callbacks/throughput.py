"""Training throughput (tokens/s, FLOP/s, MFU) on Lightning's public `Throughput` meter, with a
record for the run summary."""

from __future__ import annotations

import time
from typing import Any

import lightning as L
import torch
from lightning.fabric.utilities.throughput import Throughput
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities.rank_zero import rank_zero_only

from prism.compat import is_step_boundary
from prism.hardware import device_name, peak_flops
from prism.train.callbacks.priority import RECORD

PREFIX = "train/"  # the names Lightning's ThroughputMonitor used: train/device/items_per_sec, ...


def compute_dtype(precision: str) -> torch.dtype:
    """The dtype matmuls run in under a Trainer precision name ('bf16-mixed', '32-true', ...)."""
    name = str(precision)
    if name.startswith("bf16"):
        return torch.bfloat16
    return torch.float16 if name.startswith("16") else torch.float32


class PrismThroughputMonitor(Callback):
    """Tokens/s, FLOP/s and MFU logged under `train/...` every `log_every_n_steps` optimizer steps,
    the clock read once per interval, pauses left out (docs/training.md, "Callbacks")."""

    priority = RECORD

    def __init__(self) -> None:
        self.hardware: str | None = None
        self.available_flops: float | None = None
        self.final: dict[str, float] = {}
        self.meter: Throughput | None = None
        self._reset()

    def _reset(self) -> None:
        self._t0 = time.perf_counter()
        self._paused_at: float | None = None
        self._batches = self._samples = self._tokens = 0
        self._read_batches = 0  # micro-batches counted at the last clock reading
        self._flops_since = 0  # FLOPs of the micro-batches since the clock was last read

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self.hardware = device_name(trainer.strategy.root_device)
        self.available_flops = peak_flops(self.hardware, compute_dtype(trainer.precision))

    @rank_zero_only
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        intervals = max(0, trainer.max_steps - trainer.global_step) // max(1, trainer.log_every_n_steps)
        window = max(2, min(100, intervals // 2))
        self.meter = Throughput(
            available_flops=self.available_flops, world_size=trainer.world_size, window_size=window
        )
        self._reset()

    @rank_zero_only
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        x = batch[0]
        self._batches += 1
        self._samples += x.size(0)
        self._tokens += x.numel()
        self._flops_since += pl_module.flops_per_batch
        if not is_step_boundary(trainer):
            return  # inside an optimizer step
        last = trainer.global_step >= trainer.max_steps
        every = trainer.log_every_n_steps
        if not (last or trainer.should_stop or (every and trainer.global_step % every == 0)):
            return
        self._read_clock(trainer)
        metrics = self.meter.compute()
        # at the optimizer steps done, as train/loss of the same step (docs/tracking.md)
        for logger in trainer.loggers:
            logger.log_metrics({PREFIX + k: v for k, v in metrics.items()}, step=trainer.global_step)
        if last:  # keep the window's numbers for the summary
            self.final = metrics

    def _read_clock(self, trainer: L.Trainer) -> None:
        """Record training time and counts so far, after one synchronise (if a batch ran since)."""
        if self.meter is None or self._batches == self._read_batches:
            return
        if trainer.strategy.root_device.type == "cuda":
            torch.cuda.synchronize()
        self.meter.update(
            time=time.perf_counter() - self._t0,
            batches=self._batches,
            samples=self._samples,
            lengths=self._tokens,
            flops=self._flops_since,
        )
        self._read_batches = self._batches
        self._flops_since = 0

    def pause(self, trainer: L.Trainer) -> None:
        """Stop the training clock for work done between steps, once the queued device work is done."""
        if self._paused_at is None:
            if trainer.strategy.root_device.type == "cuda":
                torch.cuda.synchronize()
            self._paused_at = time.perf_counter()

    def unpause(self) -> None:
        """Start the clock again, moved past the pause."""
        if self._paused_at is not None:
            self._t0 += time.perf_counter() - self._paused_at
            self._paused_at = None

    @rank_zero_only
    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # take a reading where training pauses, then move the clock past the validation
        if not trainer.sanity_checking and trainer.state.fn == "fit":
            self._read_clock(trainer)
            self._paused_at = time.perf_counter()

    @rank_zero_only
    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.unpause()

    def summary(self, trainer: L.Trainer) -> dict[str, Any]:
        """Steady-state numbers of the last window (rank zero; empty dict elsewhere)."""
        m = self.final
        per_device = m.get("device/items_per_sec")
        if per_device is None:
            return {}
        return {
            "tokens_per_s": per_device * trainer.world_size,
            "tokens_per_s_per_device": per_device,
            "step_time_s": trainer.accumulate_grad_batches / m["device/batches_per_sec"],
            "mfu": m.get("device/mfu"),
        }
