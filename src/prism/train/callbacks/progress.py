"""Lightning's rich progress bar, reading the logged values only when it shows new ones (no host sync
per micro-batch), counting the run's optimizer steps (docs/training.md, "Callbacks")."""

from __future__ import annotations

import lightning as L
from lightning.pytorch.callbacks import RichProgressBar

from prism.compat import is_step_boundary
from prism.train.callbacks.priority import DISPLAY


class StepProgressBar(RichProgressBar):
    priority = DISPLAY

    SHOWN = ("train/loss",)  # logged without prog_bar (see PrismLM.training_step), shown here
    DESCRIPTION = "Training steps"

    def __init__(self, refresh_rate: int = 1, **kwargs) -> None:
        super().__init__(refresh_rate=refresh_rate, **kwargs)
        self._shown: dict = {}
        self._placed = False  # the training bar shows this session's steps (_place)

    @property
    def total_train_batches(self) -> int | float:
        """The run's optimizer steps (Lightning's: the epoch's batches left, or the steps left)."""
        trainer = self.trainer
        return trainer.max_steps if trainer.max_steps > 0 else super().total_train_batches

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_train_start(trainer, pl_module)
        self._placed = False

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        super().on_train_epoch_start(trainer, pl_module)  # Lightning's bar, as for a new epoch
        self._placed = False
        self._place(trainer)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        # Lightning's hook puts the bar at batch_idx + 1: given the steps done, it counts steps
        super().on_train_batch_end(trainer, pl_module, outputs, batch, trainer.global_step - 1)
        self._place(trainer)  # a resumed run's bar is made here (no epoch start on a resume)

    def _place(self, trainer: L.Trainer) -> None:
        """Once per session: the bar, its label and its speed estimate at the steps done so far."""
        if self._placed or self.progress is None or self.train_progress_bar_id is None:
            return
        style = self.theme.description
        self.progress.reset(
            self.train_progress_bar_id,
            total=self.total_train_batches,
            completed=trainer.global_step,
            description=f"[{style}]{self.DESCRIPTION}" if style else self.DESCRIPTION,
        )
        self._placed = True

    def get_metrics(self, trainer: L.Trainer, pl_module: L.LightningModule) -> dict:
        if trainer.training and (
            not is_step_boundary(trainer) or trainer.global_step % max(1, self.refresh_rate)
        ):
            return self._shown  # inside an accumulated step, or a step whose values are not shown
        metrics = super().get_metrics(trainer, pl_module)
        for key in self.SHOWN:
            value = trainer.callback_metrics.get(key)
            if value is not None:
                metrics[key] = float(value)  # the host read, once per redraw
        self._shown = metrics
        return metrics
