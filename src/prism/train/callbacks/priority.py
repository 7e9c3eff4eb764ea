"""The order in which the Trainer calls the run's callbacks: each one carries a `priority`, and
the callbacks are called in descending priority within every hook (equal ones in the order they
were given). The kit's classes declare theirs as a class attribute; Lightning's own, and the
callbacks of other layers, get theirs where build_callbacks adds them (`with_priority`).

What depends on the order (tests/test_callbacks.py holds the run's callbacks to it):
- an in-loop evaluation scores a milestone in on_train_batch_end before a stop or a checkpoint
  at that step, so the checkpoint holds its scores (docs/training.md, "Zero-shot scores during
  training");
- callers' callbacks (train's extra_callbacks) and LossMilestones see a validation before
  Preemption ends the run at its step (a stop agreed during a step that a validation follows
  comes after that validation, and its checkpoint must hold it);
- the checkpoint comes after every callback whose state it holds (Lightning also calls a
  Checkpoint last)."""

from __future__ import annotations

from typing import Iterable, TypeVar

# higher runs first; the gaps leave room for a callback between two of these
FINAL_VALIDATION = 100  # FinalValidation: asks for the validation of the last step
SCORES = 90  # ZeroShotEval: a milestone's scores, before a stop or checkpoint at its step
EXTRA = 80  # a caller's callback that declares none: before the stop, after the scores
VALIDATION = 75  # LossMilestones: records a validation before a stop at its step
STOP = 70  # Preemption: stops at the agreed step boundary, after the work planned there
RECORD = 60  # PrismThroughputMonitor, TrainSummary, LearningRateMonitor
DISPLAY = 50  # StepProgressBar: nothing depends on where it runs
RESTORE = 40  # ResumeWithSplit, RenamedDataState: adapt an older checkpoint as it loads
CHECKPOINT = 0  # StepCheckpoint: after every callback whose state it saves

Callback = TypeVar("Callback")


def priority(callback: object) -> int:
    """The callback's priority; a callback that declares none runs where callers' callbacks do."""
    return int(getattr(callback, "priority", EXTRA))


def with_priority(callback: Callback, value: int) -> Callback:
    """`callback` with its priority set on the instance: for a class the kit does not declare."""
    callback.priority = value
    return callback


def ordered(callbacks: Iterable[Callback]) -> list[Callback]:
    """The callbacks in the order the Trainer calls them: descending priority, ties as given."""
    return sorted(callbacks, key=priority, reverse=True)
