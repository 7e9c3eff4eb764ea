"""Profiler traces and CUDA memory snapshots of chosen optimizer steps (train.profile_steps), one per
rank in the run folder's profile/; profiling only watches (docs/profiling.md)."""

from __future__ import annotations

import gzip
import shutil
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn

from prism import compat
from prism.config.schema import ConfigError, RunConfig
from prism.io import atomic_path, os_error_message
from prism.runs.layout import memory_snapshot_path, trace_path
from prism.train.callbacks.priority import RECORD

# allocator events a snapshot keeps (a few KB each): more than one step of the largest scale
MEMORY_HISTORY_EVENTS = 100_000
# torch.profiler's own name for a step's span: TensorBoard's profiler plugin splits a trace by it
STEP_SPAN = "ProfilerStep#{}"


def check_profile_config(cfg: RunConfig) -> None:
    """The window must lie within the run's optimizer steps: refused before any step otherwise."""
    t = cfg.train
    if not t.profile_steps:
        return
    first, last = t.profile_steps
    steps = int(t.tokens) // int(t.global_batch_tokens)  # the run's optimizer steps (trainer.max_steps)
    if last > steps:
        raise ConfigError(
            f"train.profile_steps={[first, last]} reaches past the run's {steps} optimizer steps "
            f"(train.tokens / train.global_batch_tokens); give steps from 1 to {steps}."
        )


def steps_text(first: int, last: int) -> str:
    return f"step {first}" if first == last else f"steps {first} to {last}"


def write_trace(profiler: torch.profiler.profile, path: Path) -> None:
    """The profiler's Chrome trace, gzipped beside `path` and renamed into place (torch's own .gz
    export would stage the uncompressed trace in the system's temp folder)."""
    with atomic_path(path) as tmp:
        raw = tmp.with_name(tmp.name + ".json")
        try:
            profiler.export_chrome_trace(str(raw))
            with raw.open("rb") as src, gzip.open(tmp, "wb") as dst:
                shutil.copyfileobj(src, dst)
        finally:
            raw.unlink(missing_ok=True)


class ProfileSteps(Callback):
    """Profile optimizer steps `first` to `last`, counted from 1 (step k runs while global_step is
    k - 1), from the first of them this session runs."""

    priority = RECORD  # it only observes the step

    def __init__(self, first: int, last: int, run: Path) -> None:
        self.first, self.last, self.run = int(first), int(last), Path(run)
        self._profiler: torch.profiler.profile | None = None
        self._span: torch.profiler.record_function | None = None  # the open step's
        self._step = 0  # the step whose span is open or was closed last
        self._from = 0  # the first step this session profiles
        self._memory = False  # recording the CUDA allocator's history

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if trainer.strategy.root_device.type == "cuda":
            compat.check_memory_history()  # before any step, not when the window opens

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        done, window = trainer.global_step, f"train.profile_steps=[{self.first},{self.last}]"
        if done >= self.last:
            rank_zero_info(f"{window}: resumed after step {done}, past the window, so nothing is profiled")
        elif done >= self.first:
            rank_zero_info(
                f"{window}: resumed after step {done}, inside the window, so "
                f"{steps_text(done + 1, self.last)} {'is' if done + 1 == self.last else 'are'} profiled"
            )

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        step = trainer.global_step + 1
        if self._span is not None or not self.first <= step <= self.last:
            return  # a step's later micro-batch, or outside the window
        if self._profiler is None:
            self._start(trainer, step)
        self._step = step
        self._span = torch.profiler.record_function(STEP_SPAN.format(step))
        self._span.__enter__()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self._span is None or trainer.global_step < self._step:
            return  # no step profiled, or its accumulation goes on
        self._span.__exit__(None, None, None)
        self._span = None
        if self._step >= self.last:
            self._finish(trainer)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._profiler is not None:  # the run ended inside the window: the steps it ran
            self._finish(trainer)

    def on_exception(self, trainer, pl_module, exception) -> None:
        # a stop or a crash inside the window writes nothing: the resumed run profiles the rest
        self._abandon()

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self._abandon()

    def _start(self, trainer: L.Trainer, step: int) -> None:
        activities = [torch.profiler.ProfilerActivity.CPU]
        if trainer.strategy.root_device.type == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
            compat.record_memory_history(MEMORY_HISTORY_EVENTS)
            self._memory = True
        self._profiler = torch.profiler.profile(
            activities=activities, record_shapes=True, profile_memory=True
        )
        self._profiler.start()
        self._from = step

    def _finish(self, trainer: L.Trainer) -> None:
        """Stop, then write this rank's trace (and snapshot); a failed write is only warned about."""
        profiler, self._profiler = self._profiler, None
        profiler.stop()
        rank, first, last = trainer.global_rank, self._from, self._step
        steps, written = steps_text(first, last), []
        try:
            path = trace_path(self.run, first, last, rank)
            write_trace(profiler, path)
            written.append(path)
            if self._memory:
                path = memory_snapshot_path(self.run, first, last, rank)
                with atomic_path(path) as tmp:
                    compat.dump_memory_snapshot(str(tmp))
                written.append(path)
        except OSError as exc:
            rank_zero_warn(f"the profile of {steps} was not written: {os_error_message(exc)}")
        finally:
            self._stop_memory()
        if written:
            every_rank = " (and the same of every other rank)" if trainer.world_size > 1 else ""
            rank_zero_info(f"profiled {steps}: {' and '.join(map(str, written))}{every_rank}")

    def _stop_memory(self) -> None:
        if self._memory:
            compat.stop_memory_history()
            self._memory = False

    def _abandon(self) -> None:
        if self._span is not None:
            self._span.__exit__(None, None, None)
            self._span = None
        if self._profiler is not None:
            self._profiler.stop()
            self._profiler = None
        self._stop_memory()
