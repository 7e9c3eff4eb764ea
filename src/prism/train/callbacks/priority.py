"""The order in which the Trainer calls the run's callbacks: descending `priority` within every hook,
equal ones as given; Lightning's own get theirs from `with_priority` (docs/training.md, "Callbacks")."""

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


def with_priority(callback: Callback, value: int) -> Callback:
    """`callback` with its priority set on the instance: for a class the kit does not declare."""
    callback.priority = value
    return callback


def ordered(callbacks: Iterable[Callback]) -> list[Callback]:
    """The callbacks in the order the Trainer calls them: descending priority, ties as given; one that
    declares none runs where callers' callbacks do (EXTRA)."""
    return sorted(callbacks, key=lambda c: int(getattr(c, "priority", EXTRA)), reverse=True)
