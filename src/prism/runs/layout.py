"""Where a training run and the results tree live on disk (docs/outputs.md): runs/<scale>/<schedule>/seed<k>/
and <results_dir>/<scale>/..."""

from __future__ import annotations

from pathlib import Path

from prism.config.schema import RunConfig
from prism.core.schedule import path_safe


def schedule_dir_name(cfg: RunConfig, spec: str | None = None) -> str:
    """The schedule's name ('uniform', 'prism', 'config-6') or its compact text, path-safe: of
    `spec` when given (a plan of several schedules), else of the run's own."""
    return path_safe(cfg.head_schedule(spec).name)


def run_dir(cfg: RunConfig, schedule: str | None = None, seed: int | None = None) -> Path:
    """The folder of the run of `cfg`, or of another schedule and seed of the same settings."""
    seed = cfg.train.seed if seed is None else seed
    return Path(cfg.runs_dir) / cfg.scale / schedule_dir_name(cfg, schedule) / f"seed{seed}"


SEARCH_DIR = "search"  # a search's default folder, <results_dir>/<scale>/search
SEARCH_REPORT = "SEARCH.md"  # a search's report, in its folder
