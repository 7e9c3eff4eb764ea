"""Guards around the training loop: stop on a non-finite loss, and validate at the last step."""

from __future__ import annotations

import lightning as L
from lightning.pytorch.callbacks import Callback

from prism.errors import EXIT_REFUSED, PrismError
from prism.train.callbacks.checkpoint import StepCheckpoint
from prism.train.callbacks.priority import FINAL_VALIDATION


class NonFiniteLossError(PrismError, RuntimeError):
    """The training loss became NaN or infinite; the message names the step and checkpoint."""

    exit_code = EXIT_REFUSED  # the settings load and the data reads: the numbers diverged


def nonfinite_loss_error(trainer: L.Trainer) -> NonFiniteLossError:
    """The error for a step whose loss was NaN/inf on some rank, raised before the update."""
    ckpt = StepCheckpoint.of(trainer)
    path = str(ckpt.last_path) if ckpt is not None and ckpt.last_path.is_file() else ""
    return NonFiniteLossError(
        f"the training loss became NaN or infinite at step {trainer.global_step + 1}, so training "
        f"stopped before that update; the last good checkpoint is "
        f"{path or 'none (no checkpoint had been written yet)'} (left intact) — lower train.lr or "
        f"check the data, then resume."
    )


class FinalValidation(Callback):
    """Ask for a validation right after the last optimizer step (Lightning's would skip one that is
    not a multiple of val_check_interval): `should_stop` makes the loop validate before it exits."""

    priority = FINAL_VALIDATION

    def on_train_batch_end(self, trainer: L.Trainer, *args) -> None:
        if trainer.max_steps > 0 and trainer.global_step >= trainer.max_steps:
            trainer.should_stop = True
