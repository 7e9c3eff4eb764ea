"""Step checkpoints that include the validation of their own step, written crash-safely: beside the
target and renamed into place, never through fsspec's $TMPDIR copy (docs/training.md, "Checkpoints")."""

from __future__ import annotations

import errno
import os
import re
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import lightning as L
import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from lightning.pytorch.callbacks import Checkpoint

from prism.compat import is_step_boundary
from prism.io import write_error
from prism.runs.layout import (
    CHECKPOINT_SUFFIX,
    LAST_CHECKPOINT_NAME,
    STEP_CHECKPOINT_GLOB,
    step_checkpoint_name,
)
from prism.train.callbacks.priority import CHECKPOINT

TMP_PREFIX = "."
TMP_SUFFIX = ".tmp"


class AtomicCheckpointIO(TorchCheckpointIO):
    """torch.save into `.<name>.<pid>.tmp` in the checkpoint's own folder, fsync, rename."""

    def __init__(self) -> None:
        super().__init__()
        self.held_failure: OSError | None = None  # see holding_failures
        self._holding = False

    @contextmanager
    def holding_failures(self) -> Iterator[None]:
        """Within it, an OS failure of a save is kept in `held_failure`, so that every rank can be told."""
        self.held_failure, self._holding = None, True
        try:
            yield
        finally:
            self._holding = False

    def save_checkpoint(self, checkpoint: dict[str, Any], path, storage_options: Any | None = None) -> None:
        if storage_options is not None:
            raise TypeError("AtomicCheckpointIO takes no storage_options.")
        path = Path(path)
        tmp = path.with_name(f"{TMP_PREFIX}{path.name}.{os.getpid()}{TMP_SUFFIX}")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(tmp, "wb") as f:
                torch.save(checkpoint, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException as exc:
            tmp.unlink(missing_ok=True)  # the previous file under `path` is untouched
            # a full disk reaches here as torch's "unexpected pos" RuntimeError: name the cause
            failure = write_error(exc, path, temp=tmp)
            if failure is not None and self._holding:
                self.held_failure = failure
                return
            if failure is None or failure is exc:
                raise
            raise failure from exc
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)  # the rename itself survives a crash of the machine
        finally:
            os.close(dir_fd)


def stale_temporaries(ckpt_dir: Path) -> list[Path]:
    """Half-written files a killed process left behind (never read as checkpoints)."""
    return sorted(ckpt_dir.glob(f"{TMP_PREFIX}*.ckpt.*{TMP_SUFFIX}")) if ckpt_dir.is_dir() else []


class StepCheckpoint(Checkpoint):
    """`step-NNNNNN.ckpt` every `every_n_steps` optimizer steps and at the last, plus `last.ckpt`; the
    `keep` newest stay (-1 = all, 0 = none); a step a validation follows is saved after it, on every
    rank."""

    priority = CHECKPOINT

    def __init__(self, dirpath: str | Path, every_n_steps: int, val_every_steps: int, keep: int = -1) -> None:
        self.dirpath = Path(dirpath)
        self.every_n_steps = int(every_n_steps)
        self.val_every_steps = int(val_every_steps)
        self.keep = int(keep)
        self.saved_step = -1  # the global step of the newest checkpoint on disk in this session
        self.last_model_path = ""  # last.ckpt once this session wrote it (named in messages)
        self._pending = False

    @staticmethod
    def of(trainer: L.Trainer) -> StepCheckpoint | None:
        """The run's StepCheckpoint, if the Trainer has one."""
        cb = trainer.checkpoint_callback
        return cb if isinstance(cb, StepCheckpoint) else None

    @property
    def last_path(self) -> Path:
        return self.dirpath / LAST_CHECKPOINT_NAME

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # resumed from last.ckpt: it holds this step; from any other file, it is written again
        resumed = trainer.ckpt_path is not None and Path(trainer.ckpt_path) == self.last_path
        self.saved_step = trainer.global_step if resumed else -1

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step = trainer.global_step
        if not is_step_boundary(trainer) or step == self.saved_step or not self.due(trainer):
            return
        if step % self.val_every_steps == 0 or step >= trainer.max_steps > 0:  # a validation follows
            self._pending = True
        else:
            self.save_step(trainer)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._pending and not trainer.sanity_checking:
            self._pending = False
            self.save_step(trainer)

    def due(self, trainer: L.Trainer) -> bool:
        """This step gets a step file: every `every_n_steps` steps, and the last step."""
        step = trainer.global_step
        return step >= trainer.max_steps > 0 or (self.every_n_steps > 0 and step % self.every_n_steps == 0)

    def save_stop(self, trainer: L.Trainer) -> Path:
        """What a stop at this step boundary writes: the step file when due, and last.ckpt."""
        if self.due(trainer) and self.saved_step != trainer.global_step:
            self._pending = False
            self.save_step(trainer)
        return self.save_last(trainer)

    def save_step(self, trainer: L.Trainer) -> None:
        """The step file (unless keep is 0), the retention, and last.ckpt."""
        if self.keep != 0:
            self.save(trainer, self.dirpath / step_checkpoint_name(trainer.global_step))
            self._prune(trainer)
        self.save_last(trainer)

    def save_last(self, trainer: L.Trainer) -> Path:
        """Write last.ckpt as of the current step, unless this session already saved this step."""
        if self.saved_step != trainer.global_step:
            self.save(trainer, self.last_path)
            self.saved_step = trainer.global_step
            self.last_model_path = str(self.last_path)
        return self.last_path

    @staticmethod
    def save(trainer: L.Trainer, path: Path) -> None:
        """`trainer.save_checkpoint(path)` on every rank; a failed write raises the same OSError on each."""
        io = trainer.strategy.checkpoint_io
        # weights_only=False said explicitly, so that Lightning does not log that it chose it
        if not isinstance(io, AtomicCheckpointIO):
            trainer.save_checkpoint(path, weights_only=False)
            return
        with io.holding_failures():
            trainer.save_checkpoint(path, weights_only=False)
        failure = io.held_failure
        if not trainer.strategy.reduce_boolean_decision(failure is not None, all=False):
            return
        mine = None if failure is None else (failure.errno, failure.filename)
        # rank 0's failure, else this rank's, else one that another rank met
        named = trainer.strategy.broadcast(mine) or mine or (errno.EIO, str(path))
        raise OSError(named[0], os.strerror(named[0]), named[1])

    def _prune(self, trainer: L.Trainer) -> None:
        """Delete step files beyond the `keep` newest up to this step (later ones get overwritten)."""
        if self.keep < 0:
            return
        ours = sorted((p for p in step_files(self.dirpath) if step_of(p) <= trainer.global_step), key=step_of)
        for old in ours[: max(0, len(ours) - self.keep)]:
            trainer.strategy.remove_checkpoint(old)


def step_of(path: Path) -> int:
    """The step number in a checkpoint's name (`step-000120.ckpt`, `hpc_ckpt_3.ckpt`), or -1."""
    m = re.search(rf"(\d+)(?:-v\d+)?{re.escape(CHECKPOINT_SUFFIX)}$", Path(path).name)
    return int(m.group(1)) if m else -1


def step_files(dirpath: Path) -> list[Path]:
    return sorted(Path(dirpath).glob(STEP_CHECKPOINT_GLOB)) if Path(dirpath).is_dir() else []
