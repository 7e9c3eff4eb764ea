"""The hang watchdog and the straggler line inside the training loop: the Lightning hooks that
tell prism.train.watchdog where a rank is, and time each rank's steps for prism.train.stragglers.
docs/cluster.md, "When a run hangs or crawls"."""

from __future__ import annotations

import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_info

from prism import cluster, compat
from prism.runs.layout import diagnostics_dir
from prism.train import stragglers, watchdog
from prism.train.callbacks.priority import CHECKPOINT

FIRST = 110  # before every other callback's end-of-step work (a stop's collective, a checkpoint)
# after all of it but the checkpoint, which Lightning calls last whatever its priority (the
# checkpoint's own time is then no data wait: on_save_checkpoint)
LAST = CHECKPOINT


class HangWatchdog(Callback):
    """Starts a prism.train.watchdog.Watchdog for the fit and reports each step and phase to it;
    once the first steps have passed, shortens the collective timeout (the watchdog's backstop)."""

    priority = FIRST

    def __init__(self, run: Path, hang_timeout_s: float, ddp_timeout_s: float) -> None:
        self.run, self.hang_timeout_s, self.ddp_timeout_s = Path(run), hang_timeout_s, ddp_timeout_s
        self.dog: watchdog.Watchdog | None = None
        self._step = -1
        self.shortened: float | None = None  # the collective timeout set after the first steps

    def marker(self) -> Callback:
        """The callback that marks the wait for the next batch, after every other callback's work."""
        return _DataPhase(self)

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage != "fit" or self.dog is not None:
            return
        self.dog = watchdog.Watchdog(
            diagnostics_dir(self.run, cluster.attempt_id()),
            trainer.global_rank,
            trainer.world_size,
            self.hang_timeout_s,
            watchdog.first_allowance(self.ddp_timeout_s),
        )
        self.dog.start()

    def on_train_start(self, trainer, pl_module) -> None:
        self._step = trainer.global_step  # a resumed run starts at its checkpoint's step

    def _phase(self, name: str) -> None:
        if self.dog is not None:
            self.dog.phase(name)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._phase(watchdog.COMPUTE)

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        self._phase(watchdog.OPTIMIZER)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self.dog is None:
            return
        if trainer.global_step != self._step:  # an optimizer step finished
            self._step = trainer.global_step
            self.dog.progress(trainer.global_step)
            if self.dog.steps_done == watchdog.WARM_STEPS:
                self._shorten_collective_timeout(trainer)
        self.dog.phase(watchdog.COLLECTIVE)  # the step's end: the stop agreement, a checkpoint

    def _shorten_collective_timeout(self, trainer: L.Trainer) -> None:
        if trainer.world_size > 1 and torch.distributed.is_initialized():
            seconds = watchdog.collective_timeout(self.hang_timeout_s)
            if seconds < self.ddp_timeout_s:
                compat.set_collective_timeout(timedelta(seconds=seconds))
                self.shortened = seconds

    def on_validation_start(self, trainer, pl_module) -> None:
        self._phase(watchdog.VALIDATION)

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        if self.dog is not None:  # a long validation is progress too
            self.dog.progress_at = time.time()

    def on_save_checkpoint(self, trainer, pl_module, checkpoint) -> None:
        self._phase(watchdog.CHECKPOINT)

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if self.dog is not None:
            self.dog.stop()
            self.dog = None

    def on_exception(self, trainer, pl_module, exception) -> None:
        self.teardown(trainer, pl_module, "fit")


class _DataPhase(Callback):
    priority = LAST

    def __init__(self, owner: HangWatchdog) -> None:
        self.owner = owner

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.owner._phase(watchdog.DATA)

    def on_validation_end(self, trainer, pl_module) -> None:
        self.owner._phase(watchdog.DATA)


class StragglerLine(Callback):
    """Times each rank's data wait and forward pass; every `every` steps gathers the means and
    hands them to the trackers, the rule and, at the end, train_summary.json (`per_rank`)."""

    priority = FIRST

    def __init__(self, every: int, slower_pct: float, intervals: int) -> None:
        self.every = every
        self.rule = stragglers.StragglerRule(slower_pct, intervals)
        self._batch_end: float | None = None
        self._fwd_start = 0.0
        self._step_end: float | None = None
        self._step = -1
        self._sums = [0.0, 0.0, 0.0]  # own, data, step seconds since the last gather
        self._steps = 0
        self._totals: torch.Tensor | None = None  # per rank: own, data, step seconds; steps
        self.nodes: list[str] = []
        self.lines: list[str] = []

    def marker(self) -> Callback:
        return _BatchEnd(self)

    def on_train_start(self, trainer, pl_module) -> None:
        self._step = trainer.global_step
        self.nodes = [cluster.node_name()] * trainer.world_size
        if trainer.world_size > 1 and torch.distributed.is_initialized():
            names: list[Any] = [None] * trainer.world_size
            torch.distributed.all_gather_object(names, cluster.node_name())
            self.nodes = [str(n) for n in names]

    def on_save_checkpoint(self, trainer, pl_module, checkpoint) -> None:
        self._batch_end = None  # the checkpoint's write, after the step's end, is no data wait

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        now = time.perf_counter()
        if self._batch_end is not None:
            waited = now - self._batch_end
            self._sums[0] += waited
            self._sums[1] += waited
        self._fwd_start = now

    def on_before_backward(self, trainer, pl_module, loss) -> None:
        self._sums[0] += time.perf_counter() - self._fwd_start

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step == self._step:
            return  # inside an optimizer step
        self._step = trainer.global_step
        now = time.perf_counter()
        if self._step_end is not None:
            self._sums[2] += now - self._step_end
            self._steps += 1
        self._step_end = now
        if self._steps and self._step % self.every == 0:
            self._gather(trainer, pl_module)

    def _gather(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        mine = torch.tensor([*self._sums, float(self._steps)], dtype=torch.float64)
        self._sums, self._steps = [0.0, 0.0, 0.0], 0
        if trainer.world_size > 1 and torch.distributed.is_initialized():
            gathered = pl_module.all_gather(mine.to(pl_module.device)).cpu().reshape(trainer.world_size, 4)
        else:
            gathered = mine.reshape(1, 4)
        self._totals = gathered if self._totals is None else self._totals + gathered
        counts = gathered[:, 3].clamp(min=1)
        times = [
            stragglers.RankTimes(float(o), float(d), float(s))
            for o, d, s in (gathered[:, :3] / counts[:, None]).tolist()
        ]
        interval = stragglers.assess(times)
        if trainer.is_global_zero:
            metrics = {
                "straggler/slowest_rank": float(interval.slowest),
                "straggler/slowest_s": interval.slowest_s,
                "straggler/median_s": interval.median_s,
            }
            for logger in trainer.loggers:
                logger.log_metrics(metrics, step=trainer.global_step)
        if trainer.world_size > 1 and self.rule.update(interval):
            text = stragglers.line(interval, self.nodes[interval.slowest], self.rule.streak, self.every)
            self.lines.append(text)
            rank_zero_info(text)

    def per_rank(self) -> list[dict] | None:
        """Each rank's mean seconds per step over the gathered intervals, for the summary."""
        if self._totals is None:
            return None
        out = []
        for rank, (own, data, step, n) in enumerate(self._totals.tolist()):
            n = max(n, 1.0)
            node = self.nodes[rank] if rank < len(self.nodes) else None
            out.append(
                {
                    "rank": rank,
                    "node": node,
                    "own_s": round(own / n, 6),
                    "data_s": round(data / n, 6),
                    "step_s": round(step / n, 6),
                }
            )
        return out


class _BatchEnd(Callback):
    priority = LAST

    def __init__(self, owner: StragglerLine) -> None:
        self.owner = owner

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.owner._batch_end = time.perf_counter()

    def on_validation_end(self, trainer, pl_module) -> None:
        self.owner._batch_end = time.perf_counter()  # validation is no data wait
