"""Where a run's curves go: TensorBoard, CSV, W&B and MLflow (train.loggers; docs/tracking.md).

    check_installed(cfg.train.loggers)      # planning: a missing package is a ConfigError
    check_store(cfg)                        # planning: an MLflow store this install cannot open
    loggers = build_loggers(cfg, plan)      # the Trainer's `logger=`; nothing opened yet
    earlier = earlier_runs(run_dir)         # a fresh start: the runs a killed attempt left open
    clear(run_dir)                          # a fresh start in an existing folder
    begin(trainer, fresh, earlier)          # rank 0, once the fresh/resume decision is made

build: the config -> Lightning's loggers; guarded: the wrapper that keeps a tracker from stopping
or slowing a run; state: <run>/trackers.json (run ids, logged-step floors); csv_file: a CSV
logger a resumed run continues; wandb_files: what an offline W&B run holds. The kit's version,
commit and hardware on a run's page come from prism.provenance."""

from prism.train.trackers.build import begin, build_loggers, check_installed, check_store, clear, earlier_runs
from prism.train.trackers.guarded import TrackerLogger
from prism.train.trackers.state import STATE_NAME, TrackerState

__all__ = [
    "STATE_NAME",
    "TrackerLogger",
    "TrackerState",
    "begin",
    "build_loggers",
    "check_installed",
    "check_store",
    "clear",
    "earlier_runs",
]
