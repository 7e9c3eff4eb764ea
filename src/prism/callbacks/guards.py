"""Guards around the training loop: stop on a non-finite loss, and validate at the last step."""

from __future__ import annotations

from pathlib import Path

import lightning as L
from lightning.pytorch.callbacks import Callback


class NonFiniteLossError(RuntimeError):
    """The training loss became NaN or infinite; the message names the step and checkpoint."""


class NonFiniteLossGuard(Callback):
    """Checks, once per optimizer step and before the update, whether any micro-batch loss of the
    step was NaN/inf on any rank. Raising there means the weights are never updated with bad
    gradients and no checkpoint of this step is written, so the last one stays good."""

    def __init__(self, ckpt_dir: str | Path) -> None:
        super().__init__()
        self.ckpt_dir = Path(ckpt_dir)

    def on_before_optimizer_step(self, trainer: L.Trainer, pl_module: L.LightningModule,
                                 optimizer) -> None:
        # Summed over ranks so every rank stops together (or the others would wait forever in the
        # next all-reduce); one host sync per optimizer step.
        bad = trainer.strategy.reduce(pl_module.pop_nonfinite(), reduce_op="sum")
        if bad.item() > 0:
            raise NonFiniteLossError(
                f"the training loss became NaN or infinite at step {trainer.global_step + 1}, so "
                f"training stopped before that update; the last good checkpoint is "
                f"{self._last_good(trainer)} (left intact) — lower train.lr or check the data, "
                f"then resume.")

    def _last_good(self, trainer: L.Trainer) -> str:
        cb = trainer.checkpoint_callback
        path = getattr(cb, "last_model_path", "") or ""
        if not path and (self.ckpt_dir / "last.ckpt").is_file():
            path = str(self.ckpt_dir / "last.ckpt")
        return path or "none (no checkpoint had been written yet)"


class FinalValidation(Callback):
    """Ask for a validation right after the last optimizer step.

    Lightning validates every `val_check_interval` batches but not at `max_steps` unless it is a
    multiple; setting `should_stop` on the last step makes the loop validate before it exits
    (the same path EarlyStopping uses), so the final loss is always measured on the final weights."""

    def on_train_batch_end(self, trainer: L.Trainer, *args) -> None:
        if trainer.max_steps > 0 and trainer.global_step >= trainer.max_steps:
            trainer.should_stop = True
