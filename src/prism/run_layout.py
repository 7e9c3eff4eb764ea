"""Where a training run lives on disk: runs/<scale>/<schedule>/seed<k>/ (docs/outputs.md)."""

from __future__ import annotations

from pathlib import Path

from prism.config import RunConfig
from prism.schedule import path_safe


def schedule_dir_name(cfg: RunConfig, spec: str | None = None) -> str:
    """The schedule's name ('uniform', 'prism', 'config-6') or its compact text, path-safe: of
    `spec` when given (a plan of several schedules), else of the run's own."""
    return path_safe(cfg.head_schedule(spec).name)


def run_dir(cfg: RunConfig, schedule: str | None = None, seed: int | None = None) -> Path:
    """The folder of the run of `cfg`, or of another schedule and seed of the same settings."""
    seed = cfg.train.seed if seed is None else seed
    return Path(cfg.runs_dir) / cfg.scale / schedule_dir_name(cfg, schedule) / f"seed{seed}"
