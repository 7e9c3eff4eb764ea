"""Lightning's rich progress bar, reading the logged values only when it shows new ones.

RichProgressBar fetches its metrics after every micro-batch, whatever its refresh rate, and
fetching turns each logged tensor into a Python float: a host sync per micro-batch on a GPU.
Here the bar still advances every micro-batch (host-side only), but the metrics are read once per
`refresh_rate` optimizer steps, at a step's end, and at validation's end; in between the bar shows
the values it read last."""

from __future__ import annotations

import lightning as L
from lightning.pytorch.callbacks import RichProgressBar

from prism.compat import is_step_boundary


class StepProgressBar(RichProgressBar):
    SHOWN = ("train/loss",)  # logged without prog_bar (see PrismLM.training_step), shown here

    def __init__(self, refresh_rate: int = 1, **kwargs) -> None:
        super().__init__(refresh_rate=refresh_rate, **kwargs)
        self._shown: dict = {}

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
