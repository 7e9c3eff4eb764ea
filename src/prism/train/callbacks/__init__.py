"""Training callbacks: what the Trainer does not record or enforce by itself.

- LossMilestones: the validation curve, the first step/tokens/time at or below each loss
  threshold and the minimum (milestones.json), restored on resume; every metric of a validation
  (val/loss among them) goes to the trackers from here, at that validation's step.
- PrismThroughputMonitor: tokens/s, FLOP/s and MFU on Lightning's public Throughput meter, with
  dense peak FLOPs from prism.hardware, remembering the steady-state numbers for the summary.
- TrainSummary: train_summary.json at the end of a run.
- Preemption: once per optimizer step, one all-reduce decides whether to stop: on SIGTERM or
  Slurm's warning signal (checkpoint at the step boundary, stop, requeue on the warning), on a
  NaN/inf loss (stop before the update), on a stalled data stream (checkpoint the boundary).
- FinalValidation, StepCheckpoint: validate at the last step, and checkpoint (through
  trainer.save_checkpoint) after a step's validation so a resumed run restarts with it recorded.
- StepProgressBar: the rich progress bar, reading logged values only when it shows them.
- ZeroShotEval: zero-shot scores at token milestones (train.eval_every_tokens) through
  reproduce/evaluate.py's engine, sharded over the ranks, into zeroshot.json and the trackers.
"""

from prism.train.callbacks.checkpoint import StepCheckpoint
from prism.train.callbacks.guards import FinalValidation, NonFiniteLossError
from prism.train.callbacks.milestones import LossMilestones
from prism.train.callbacks.preemption import EXIT_PREEMPTED, Preempted, Preemption
from prism.train.callbacks.progress import StepProgressBar
from prism.train.callbacks.summary import TrainSummary
from prism.train.callbacks.throughput import PrismThroughputMonitor
from prism.train.callbacks.zeroshot import ZeroShotEval

__all__ = [
    "EXIT_PREEMPTED",
    "FinalValidation",
    "LossMilestones",
    "NonFiniteLossError",
    "Preempted",
    "Preemption",
    "PrismThroughputMonitor",
    "StepCheckpoint",
    "StepProgressBar",
    "TrainSummary",
    "ZeroShotEval",
]
