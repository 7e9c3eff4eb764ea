"""Step checkpoints that include the validation of their own step, written crash-safely.

Lightning's default writer serialises the whole checkpoint into memory and hands it to fsspec,
whose local "transaction" writes into $TMPDIR and then copies across filesystems: a small /tmp
fails at the first save, and a kill during the copy leaves a truncated file under the final
name. `AtomicCheckpointIO` writes into a temporary file beside the target, flushes it to disk and
renames it into place, so a kill at any moment leaves the old file or the new one.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from lightning.pytorch.callbacks import ModelCheckpoint

TMP_PREFIX = "."
TMP_SUFFIX = ".tmp"


class AtomicCheckpointIO(TorchCheckpointIO):
    """torch.save into `.<name>.<pid>.tmp` in the checkpoint's own folder, fsync, rename."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path, storage_options: Any | None = None) -> None:
        if storage_options is not None:
            raise TypeError("AtomicCheckpointIO takes no storage_options.")
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{TMP_PREFIX}{path.name}.{os.getpid()}{TMP_SUFFIX}")
        try:
            with open(tmp, "wb") as f:
                torch.save(checkpoint, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)  # the rename itself survives a crash of the machine
        finally:
            os.close(dir_fd)


def stale_temporaries(ckpt_dir: Path) -> list[Path]:
    """Half-written files a killed process left behind (never read as checkpoints)."""
    return sorted(ckpt_dir.glob(f"{TMP_PREFIX}*.ckpt.*{TMP_SUFFIX}")) if ckpt_dir.is_dir() else []


class StepCheckpoint(ModelCheckpoint):
    """`step-NNNNNN.ckpt` every `every_n_steps` optimizer steps and at the last step, plus
    `last.ckpt`; only the `keep` newest step files stay (-1 = all), through ModelCheckpoint's own
    top-k bookkeeping on the step number. A step trained again overwrites its file (no `-v1`).

    ModelCheckpoint saves step checkpoints at the end of the training batch, before the validation
    of that same step runs; a run resumed from it would never record that validation (Lightning
    skips it on restart). When a validation follows the step, this saves after it instead, so the
    checkpoint holds the milestone state of its own step and a resumed run is identical."""

    def __init__(self, dirpath: str | Path, every_n_steps: int, val_every_steps: int, keep: int = -1) -> None:
        super().__init__(
            dirpath=dirpath,
            filename="step-{step:06d}",
            auto_insert_metric_name=False,
            every_n_train_steps=every_n_steps,
            save_last=True,
            save_top_k=keep,
            monitor="step" if keep != -1 else None,
            mode="max",
            enable_version_counter=False,
        )
        self.val_every_steps = int(val_every_steps)
        self._pending = False

    @property
    def state_key(self) -> str:
        # The key under which checkpoints store this callback's state. Lightning derives it from
        # monitor/mode, which follow keep_checkpoints; keep it the one of keep=-1 so a run can
        # resume with another keep_checkpoints (and checkpoints of earlier versions still load).
        return self._generate_state_key(
            monitor=None,
            mode="min",
            every_n_train_steps=self._every_n_train_steps,
            every_n_epochs=self._every_n_epochs,
            train_time_interval=self._train_time_interval,
        )

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch, batch_idx: int
    ) -> None:
        step = trainer.global_step
        last = step >= trainer.max_steps > 0
        due = (step % self._every_n_train_steps == 0 or last) and step != self._last_global_step_saved
        val_follows = step % self.val_every_steps == 0 or last  # see FinalValidation
        if due and val_follows:
            self._pending = True
            return
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_validation_end(trainer, pl_module)
        if self._pending and not trainer.sanity_checking:
            self._pending = False
            candidates = self._monitor_candidates(trainer)
            self._save_topk_checkpoint(trainer, candidates)
            self._save_last_checkpoint(trainer, candidates)
