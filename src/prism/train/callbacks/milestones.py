"""Loss milestones (§3.4): when did validation loss first reach each threshold, and where was its
minimum; derived from the validation curve, which with the wall-clock is all the state to checkpoint."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
from lightning.pytorch.callbacks import Callback

from prism.runs import records
from prism.train.callbacks.priority import VALIDATION


class LossMilestones(Callback):
    priority = VALIDATION

    def __init__(self, thresholds: list[float], tokens_per_step: int, path: str | Path) -> None:
        self.thresholds = [float(t) for t in thresholds]
        self.tokens_per_step = int(tokens_per_step)
        self.path = Path(path)
        self.curve: list[dict[str, Any]] = []
        self._elapsed_before = 0.0  # wall-clock of earlier sessions of a resumed run
        self._t0: float | None = None

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._t0 = time.perf_counter()

    def elapsed(self) -> float:
        """Wall-clock seconds of this run, summed over resumed sessions."""
        return self._elapsed_before + (time.perf_counter() - self._t0 if self._t0 is not None else 0.0)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        loss = getattr(pl_module, "last_val_loss", None)
        step = trainer.global_step
        if loss is None or (trainer.sanity_checking and step != 0):
            return  # the sanity pass counts only as the step-0 point of a fresh run
        if self.curve and self.curve[-1]["step"] == step:
            return  # validated twice at one step (e.g. explicit trainer.validate): keep the first
        point = {
            "step": step,
            "tokens": step * self.tokens_per_step,
            "val_loss": loss,
            "wall_clock_s": round(self.elapsed(), 3),
        }
        newly_hit = [t for t in self.thresholds if loss <= t and all(p["val_loss"] > t for p in self.curve)]
        self.curve.append(point)
        if trainer.is_global_zero:
            self._log(trainer, point, newly_hit)
            self.record().write(self.path)

    def _log(self, trainer: L.Trainer, point: dict, newly_hit: list[float]) -> None:
        """Every metric of one validation in one call, at the optimizer steps done when it ran."""
        metrics = {
            # as float32, the value TensorBoard stores: every tracker holds the same number
            "val/loss": float(np.float32(point["val_loss"])),
            "val/loss_min": self.minimum()["val_loss"],
            "val/tokens_seen": point["tokens"],
            **{f"milestones/tokens_at_{t:g}": point["tokens"] for t in newly_hit},
        }
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=point["step"])

    def milestones(self) -> list[dict[str, Any]]:
        hits = [next((p for p in self.curve if p["val_loss"] <= t), None) for t in self.thresholds]
        keys = ("step", "tokens", "wall_clock_s")
        return [
            {"threshold": t, **{k: hit and hit[k] for k in keys}} for t, hit in zip(self.thresholds, hits)
        ]

    def minimum(self) -> dict[str, Any]:
        best = min(self.curve, key=lambda p: p["val_loss"]) if self.curve else {}  # the first of equals
        return {k: best.get(k) for k in ("val_loss", "step", "tokens")}

    def record(self) -> records.Milestones:
        return records.Milestones(
            thresholds=self.thresholds, milestones=self.milestones(), min=self.minimum()
        )

    def state_dict(self) -> dict[str, Any]:
        return {"curve": [dict(p) for p in self.curve], "elapsed_s": self.elapsed()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.curve = [dict(p) for p in state_dict["curve"]]
        self._elapsed_before = float(state_dict["elapsed_s"])
