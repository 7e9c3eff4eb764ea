"""Where a run's curves go: TensorBoard, CSV, W&B and MLflow (train.loggers; docs/tracking.md,
"How the trackers are built")."""

from prism.train.trackers.build import (
    TRACKERS,
    TrackedRun,
    begin,
    build_logger,
    check_installed,
    check_store,
    check_trackers,
    clear,
    earlier_runs,
)
from prism.train.trackers.guarded import RunTrackers, Tracker
from prism.train.trackers.state import TrackerState

__all__ = [
    "TRACKERS",
    "TrackedRun",
    "RunTrackers",
    "Tracker",
    "TrackerState",
    "begin",
    "build_logger",
    "check_installed",
    "check_store",
    "check_trackers",
    "clear",
    "earlier_runs",
]
