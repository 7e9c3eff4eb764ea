"""Where a run's curves go: TensorBoard, CSV, W&B and MLflow (train.loggers; docs/tracking.md).

    check_installed(cfg.train.loggers)      # planning: a missing package is a ConfigError
    loggers = build_loggers(cfg, plan)      # the Trainer's `logger=`; nothing opened yet
    begin(trainer, fresh)                   # rank 0, once the fresh/resume decision is made
    clear(run_dir)                          # a fresh start in an existing folder

build: the config -> Lightning's loggers; guarded: the wrapper that keeps a tracker from stopping
or slowing a run; state: <run>/trackers.json (run ids, logged-step floors); csv_file: a CSV
logger a resumed run continues; wandb_files: what an offline W&B run holds. The kit's version,
commit and hardware on a run's page come from prism.provenance."""

from prism.trackers.build import begin, build_loggers, check_installed, clear
from prism.trackers.guarded import TrackerLogger
from prism.trackers.state import STATE_NAME, TrackerState

__all__ = [
    "STATE_NAME",
    "TrackerLogger",
    "TrackerState",
    "begin",
    "build_loggers",
    "check_installed",
    "clear",
]
