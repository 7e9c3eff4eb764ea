"""Lightning's ThroughputMonitor with the right peak FLOPs and a record for the run summary."""

from __future__ import annotations

import time
from typing import Any

import lightning as L
import torch
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

    Lightning's monitor synchronises the GPU after every micro-batch to read the clock. Here
    micro-batches are only counted (on the host), and the clock is read, after one synchronise,
    once per logging interval (train.log_every_steps optimizer steps) and at the last step:
    the device time of whole intervals, with no sync inside them.

    The rolling window covers the second half of the intervals still to run (at most 100), so the
    numbers kept for the summary exclude torch.compile warm-up on runs longer than a few steps."""

    def __init__(self) -> None:
        super().__init__(batch_size_fn=_samples, length_fn=_tokens)
        self.hardware: str | None = None
        self.final: dict[str, float] = {}
        self._flops_since = 0  # FLOPs of the micro-batches since the clock was last read

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        self.hardware = device_name(trainer.strategy.root_device)
        self.available_flops = peak_flops(self.hardware, _plugin_to_compute_dtype(trainer.precision_plugin))
        for throughput in self._throughputs.values():
            throughput.available_flops = self.available_flops

    def on_train_start(self, trainer: L.Trainer, *args: Any) -> None:
        intervals = max(0, trainer.max_steps - trainer.global_step) // max(1, trainer.log_every_n_steps)
        window = max(2, min(100, intervals // 2))
        self._throughputs[RunningStage.TRAINING] = Throughput(
            available_flops=self.available_flops, world_size=trainer.world_size, window_size=window
        )
        super().on_train_start(trainer, *args)

    @rank_zero_only
    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, *args: Any
    ) -> None:
        stage = RunningStage.TRAINING
        self._batches[stage] += 1
        self._samples[stage] += _samples(batch)
        self._lengths[stage] += _tokens(batch)
        self._flops_since += pl_module.flops_per_batch
        if trainer.fit_loop._should_accumulate():
            return  # inside an optimizer step
        last = trainer.global_step >= trainer.max_steps
        if not (last or trainer._logger_connector.should_update_logs):
            return
        self._read_clock(trainer)
        self._compute(trainer)  # logs train/... when this step logs
        if last:  # keep the window's numbers for the summary
            self.final = self._throughputs[stage].compute()

    def _read_clock(self, trainer: L.Trainer) -> None:
        """Record training time and counts so far (one synchronise, so the clock covers the
        device work queued until now); nothing when no batch ran since the last reading."""
        stage = RunningStage.TRAINING
        throughput = self._throughputs.get(stage)
        if throughput is None or not self._batches.get(stage):
            return  # training has not run a batch yet
        if throughput._batches and throughput._batches[-1] == self._batches[stage]:
            return
        if trainer.strategy.root_device.type == "cuda":
            torch.cuda.synchronize()
        throughput.update(
            time=time.perf_counter() - self._t0s[stage],
            batches=self._batches[stage],
            samples=self._samples[stage],
            lengths=self._lengths[stage],
            flops=self._flops_since,
        )
        self._flops_since = 0

    @rank_zero_only
    def on_validation_start(self, trainer: L.Trainer, *args: Any) -> None:
        # Lightning's monitor moves the training clock past a validation by assuming the last
        # reading was taken where training paused; take one there (validations are rare).
        if not trainer.sanity_checking and trainer.state.fn == "fit":
            self._read_clock(trainer)
        super().on_validation_start(trainer, *args)

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
