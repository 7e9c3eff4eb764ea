"""Step checkpoints that include the validation of their own step."""

from __future__ import annotations

from pathlib import Path

import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint


class StepCheckpoint(ModelCheckpoint):
    """`step-NNNNNN.ckpt` every `every_n_steps` optimizer steps and at the last step, plus
    `last.ckpt`.

    ModelCheckpoint saves step checkpoints at the end of the training batch, before the validation
    of that same step runs; a run resumed from it would never record that validation (Lightning
    skips it on restart). When a validation follows the step, this saves after it instead, so the
    checkpoint holds the milestone state of its own step and a resumed run is identical."""

    def __init__(self, dirpath: str | Path, every_n_steps: int, val_every_steps: int) -> None:
        super().__init__(dirpath=dirpath, filename="step-{step:06d}", auto_insert_metric_name=False,
                         every_n_train_steps=every_n_steps, save_top_k=-1, save_last=True)
        self.val_every_steps = int(val_every_steps)
        self._pending = False

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs, batch,
                           batch_idx: int) -> None:
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
