"""The Lightning hooks that tell prism.train.watchdog where a rank is and time each rank's steps for
prism.train.stragglers (docs/cluster.md, "When a run hangs or crawls")."""

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
from prism.train import stragglers, watchdog
from prism.train.callbacks.priority import CHECKPOINT

FIRST = 110  # before every other callback's end-of-step work (a stop's collective, a checkpoint)


def _distributed(trainer: L.Trainer) -> bool:
    return trainer.world_size > 1 and torch.distributed.is_initialized()


class BatchDone(Callback):
    """Calls its owner's `batch_done()` after every other callback's end-of-batch work."""

    priority = CHECKPOINT

    def __init__(self, owner: Any) -> None:
        self.owner = owner

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.owner.batch_done()

    def on_validation_end(self, trainer, pl_module) -> None:
        self.owner.batch_done()


class HangWatchdog(Callback):
    """Starts a prism.train.watchdog.Watchdog for the fit and reports each batch and phase to it; after
    the first steps, shortens the collective timeout (but for each checkpoint's write)."""

    priority = FIRST

    def __init__(self, diagnostics: Path, hang_timeout_s: float, ddp_timeout_s: float) -> None:
        self.diagnostics = Path(diagnostics)
        self.hang_timeout_s, self.ddp_timeout_s = hang_timeout_s, ddp_timeout_s
        self.dog: watchdog.Watchdog | None = None
        self._step = -1
        self.shortened: float | None = None  # the collective timeout set after the first steps
        self._lengthened = False  # for a checkpoint's write: shortened again at the next batch

    def _phase(self, name: str) -> None:
        if self.dog is not None:
            self.dog.phase(name)

    def alive(self, *_: Any) -> None:
        """A batch of other work (an in-loop zero-shot evaluation) finished: progress too."""
        if self.dog is not None:
            self.dog.progress()

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage == "fit" and self.dog is None:
            folder = self.diagnostics / cluster.attempt_id()
            long_s = watchdog.long_allowance(self.ddp_timeout_s)
            self.dog = watchdog.Watchdog(
                folder, trainer.global_rank, trainer.world_size, self.hang_timeout_s, long_s
            )
            self.dog.start()

    def on_train_start(self, trainer, pl_module) -> None:
        self._step = trainer.global_step  # a resumed run starts at its checkpoint's step

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._phase(watchdog.COMPUTE)
        if self._lengthened:
            self._lengthened = False
            compat.set_collective_timeout(timedelta(seconds=self.shortened))

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        self._phase(watchdog.OPTIMIZER)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self.dog is None or trainer.global_step == self._step:
            return  # no optimizer step finished (gradient accumulation)
        self._step = trainer.global_step
        self.dog.progress(trainer.global_step)
        seconds = watchdog.collective_timeout(self.hang_timeout_s)
        if (
            self.dog.steps_done == watchdog.WARM_STEPS
            and _distributed(trainer)
            and seconds < self.ddp_timeout_s
        ):
            compat.set_collective_timeout(timedelta(seconds=seconds))
            self.shortened = seconds
        self.dog.phase(watchdog.COLLECTIVE)  # the step's end: the stop agreement, a checkpoint

    def on_validation_start(self, trainer, pl_module) -> None:
        self._phase(watchdog.VALIDATION)

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        self.alive()

    def on_save_checkpoint(self, trainer, pl_module, checkpoint) -> None:
        # every rank comes here; rank 0 then writes while the others wait in a barrier
        self._phase(watchdog.CHECKPOINT)
        if self.shortened is not None and not self._lengthened:
            compat.set_collective_timeout(timedelta(seconds=self.ddp_timeout_s))
            self._lengthened = True

    def batch_done(self) -> None:
        self._phase(watchdog.DATA)  # waiting for the next batch

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if self.dog is not None:
            self.dog.stop()
            self.dog = None

    def on_exception(self, trainer, pl_module, exception) -> None:
        self.teardown(trainer, pl_module, "fit")


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
        self._sums = [0.0] * 4  # own, data, step seconds; steps (floats: cheaper than a tensor)
        self._totals: torch.Tensor | None = None  # the same per rank, over every gather
        self.nodes: list[str] = []

    def batch_done(self) -> None:
        self._batch_end = time.perf_counter()  # after a validation too: it is no data wait

    def on_train_start(self, trainer, pl_module) -> None:
        self._step = trainer.global_step
        self.nodes = [cluster.node_name()] * trainer.world_size
        if _distributed(trainer):
            names: list[Any] = [None] * trainer.world_size
            torch.distributed.all_gather_object(names, cluster.node_name())
            self.nodes = [str(n) for n in names]

    def on_save_checkpoint(self, trainer, pl_module, checkpoint) -> None:
        self._batch_end = None  # the checkpoint's write, after the step's end, is no data wait

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        now = time.perf_counter()
        if self._batch_end is not None:
            self._sums[0] += now - self._batch_end
            self._sums[1] += now - self._batch_end
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
            self._sums[3] += 1
        self._step_end = now
        if self._sums[3] and self._step % self.every == 0:
            self._gather(trainer, pl_module)

    def _gather(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        mine, self._sums = torch.tensor(self._sums, dtype=torch.float64), [0.0] * 4
        gathered = mine.reshape(1, 4)
        if _distributed(trainer):
            gathered = pl_module.all_gather(mine.to(pl_module.device)).cpu().reshape(trainer.world_size, 4)
        self._totals = gathered if self._totals is None else self._totals + gathered
        means = gathered[:, :3] / gathered[:, 3:].clamp(min=1)
        interval = stragglers.assess([stragglers.RankTimes(*row) for row in means.tolist()])
        if trainer.is_global_zero:
            metrics = {
                "straggler/slowest_rank": float(interval.slowest),
                "straggler/slowest_s": interval.slowest_s,
                "straggler/median_s": interval.median_s,
            }
            for logger in trainer.loggers:
                logger.log_metrics(metrics, step=trainer.global_step)
        if trainer.world_size > 1 and self.rule.update(interval):
            rank_zero_info(
                stragglers.line(interval, self.nodes[interval.slowest], self.rule.streak, self.every)
            )

    def per_rank(self) -> list[dict] | None:
        """Each rank's mean seconds per step over the gathered intervals, for the summary."""
        if self._totals is None:
            return None
        means = (self._totals[:, :3] / self._totals[:, 3:].clamp(min=1)).tolist()
        keys = ("own_s", "data_s", "step_s")
        return [
            {"rank": r, "node": self.nodes[r], **{k: round(v, 6) for k, v in zip(keys, row)}}
            for r, row in enumerate(means)
        ]
