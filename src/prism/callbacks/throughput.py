"""Lightning's ThroughputMonitor with the right peak FLOPs and a record for the run summary."""

from __future__ import annotations

from typing import Any

import lightning as L
from lightning.fabric.utilities.throughput import Throughput
from lightning.pytorch.callbacks import ThroughputMonitor
from lightning.pytorch.callbacks.throughput_monitor import _plugin_to_compute_dtype
from lightning.pytorch.trainer.states import RunningStage
from lightning.pytorch.utilities.rank_zero import rank_zero_only

from prism.hardware import device_name, peak_flops


def _samples(batch) -> int:
    return batch[0].size(0)


def _tokens(batch) -> int:
    return batch[0].numel()


class PrismThroughputMonitor(ThroughputMonitor):
    """Tokens/s, FLOP/s and MFU logged under `train/...` every `log_every_n_steps`.

    The FLOPs of a batch come from the module's `flops_per_batch` (6N + 12·L·d·T per token,
    prism.model.flops_per_token). The peak comes from prism.hardware.peak_flops, the one place that
    knows dense bf16 peaks: Lightning's own table has no "NVIDIA H200" and lists some parts with
    2:4-sparse peaks. On a CPU the peak is unknown and MFU is left out.

    The rolling window covers the second half of the batches still to run (at most 100), so the
    numbers kept for the summary exclude torch.compile warm-up on runs longer than a few steps."""

    def __init__(self) -> None:
        super().__init__(batch_size_fn=_samples, length_fn=_tokens)
        self.hardware: str | None = None
        self.final: dict[str, float] = {}

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        self.hardware = device_name(trainer.strategy.root_device)
        self.available_flops = peak_flops(self.hardware, _plugin_to_compute_dtype(trainer.precision_plugin))
        for throughput in self._throughputs.values():
            throughput.available_flops = self.available_flops

    def on_train_start(self, trainer: L.Trainer, *args: Any) -> None:
        remaining = max(0, trainer.max_steps - trainer.global_step) * trainer.accumulate_grad_batches
        window = max(2, min(100, remaining // 2))
        self._throughputs[RunningStage.TRAINING] = Throughput(
            available_flops=self.available_flops, world_size=trainer.world_size, window_size=window)
        super().on_train_start(trainer, *args)

    @rank_zero_only
    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any,
                           batch: Any, *args: Any) -> None:
        super().on_train_batch_end(trainer, pl_module, outputs, batch, *args)
        if trainer.global_step >= trainer.max_steps:  # the last batch: keep the window's numbers
            self.final = self._throughputs[RunningStage.TRAINING].compute()

    def summary(self, trainer: L.Trainer) -> dict[str, Any]:
        """Steady-state numbers of the last window (rank zero; empty dict elsewhere)."""
        m = self.final
        per_device = m.get("device/items_per_sec")
        if per_device is None:
            return {}
        batches_per_s = m["device/batches_per_sec"]
        return {
            "tokens_per_s": per_device * trainer.world_size,
            "tokens_per_s_per_device": per_device,
            "step_time_s": trainer.accumulate_grad_batches / batches_per_s,
            "mfu": m.get("device/mfu"),
        }
