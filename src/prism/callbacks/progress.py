"""Lightning's rich progress bar, reading the logged values only when it shows new ones.

RichProgressBar fetches `trainer.progress_bar_metrics` after every micro-batch, whatever its
refresh rate, and that turns each logged tensor into a Python float: a host sync per micro-batch
on a GPU. Here the bar still advances every micro-batch (host-side only), but the metrics are
read once per `refresh_rate` optimizer steps, at a step's end, and at validation's end."""

from __future__ import annotations

import lightning as L
from lightning.pytorch.callbacks import RichProgressBar


class StepProgressBar(RichProgressBar):
    SHOWN = ("train/loss",)  # logged without prog_bar (see PrismLM.training_step), shown here

    def get_metrics(self, trainer: L.Trainer, pl_module: L.LightningModule) -> dict:
        metrics = super().get_metrics(trainer, pl_module)
        for key in self.SHOWN:
            value = trainer.callback_metrics.get(key)
            if value is not None:
                metrics[key] = float(value)  # the host read, once per redraw
        return metrics

    def _update_metrics(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.training and (
            trainer.fit_loop._should_accumulate() or trainer.global_step % max(1, self.refresh_rate)
        ):
            return  # inside an accumulated step, or a step whose values are not shown
        super()._update_metrics(trainer, pl_module)
