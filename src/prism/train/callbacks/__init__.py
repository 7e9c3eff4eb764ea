"""Training callbacks: what the Trainer does not record or enforce by itself (docs/training.md,
"Callbacks")."""

from prism.train.callbacks.checkpoint import StepCheckpoint
from prism.train.callbacks.guards import FinalValidation, NonFiniteLossError
from prism.train.callbacks.milestones import LossMilestones
from prism.train.callbacks.preemption import Preemption
from prism.train.callbacks.progress import StepProgressBar
from prism.train.callbacks.summary import TrainSummary
from prism.train.callbacks.throughput import PrismThroughputMonitor
from prism.train.callbacks.zeroshot import ZeroShotEval

__all__ = [
    "FinalValidation",
    "LossMilestones",
    "NonFiniteLossError",
    "Preemption",
    "PrismThroughputMonitor",
    "StepCheckpoint",
    "StepProgressBar",
    "TrainSummary",
    "ZeroShotEval",
]
