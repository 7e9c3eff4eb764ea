"""Loss-milestone bookkeeping (the data behind "Prism reaches its milestones earlier"), and the
order of the run's callbacks (prism.train.callbacks.priority)."""

import json
import os
import signal

import pytest
from conftest import shared_data_dir
from lightning.pytorch.callbacks import Callback, LearningRateMonitor
from test_train import small

from prism.train.callbacks import (
    FinalValidation,
    LossMilestones,
    Preemption,
    PrismThroughputMonitor,
    StepCheckpoint,
    StepProgressBar,
    TrainSummary,
    ZeroShotEval,
)
from prism.train.callbacks.priority import RESTORE, with_priority
from prism.train.plan import plan_run
from prism.train.trainer import build_callbacks


def _curve(losses, every=250, tokens_per_step=262144):
    return [
        {"step": i * every, "tokens": i * every * tokens_per_step, "val_loss": v, "wall_clock_s": 10.0 * i}
        for i, v in enumerate(losses)
    ]


def test_first_crossing_of_each_threshold_and_the_minimum(tmp_path):
    cb = LossMilestones([4.0, 3.8, 3.5], 262144, tmp_path / "m.json")
    cb.curve = _curve([10.8, 4.2, 4.0, 3.9, 3.79, 3.81, 3.7, 3.7])
    got = cb.milestones()
    assert [m["threshold"] for m in got] == [4.0, 3.8, 3.5]
    assert (got[0]["step"], got[0]["tokens"], got[0]["wall_clock_s"]) == (500, 500 * 262144, 20.0)
    assert got[1]["step"] == 1000  # 3.79 <= 3.8; the later 3.81 does not undo it
    assert got[2] == {"threshold": 3.5, "step": None, "tokens": None, "wall_clock_s": None}
    assert cb.minimum() == {"val_loss": 3.7, "step": 1500, "tokens": 1500 * 262144}  # first of ties
    assert set(cb.record().as_json()) == {"thresholds", "milestones", "min"}


def test_state_round_trip_keeps_curve_and_clock(tmp_path):
    cb = LossMilestones([4.0], 1024, tmp_path / "m.json")
    cb.curve = _curve([10.0, 3.9], tokens_per_step=1024)
    cb._elapsed_before = 12.5
    state = cb.state_dict()
    assert state["elapsed_s"] == 12.5
    other = LossMilestones([4.0], 1024, tmp_path / "m.json")
    other.load_state_dict(state)
    assert other.curve == cb.curve and other.milestones() == cb.milestones()
    assert other.elapsed() == 12.5
    state["curve"][0]["val_loss"] = 0.0
    assert other.curve[0]["val_loss"] == 10.0  # restored by copy, not by reference


def test_no_validation_yet(tmp_path):
    cb = LossMilestones([4.0], 1024, tmp_path / "m.json")
    assert cb.minimum() == {"val_loss": None, "step": None, "tokens": None}
    assert cb.milestones()[0]["step"] is None


class CallersCallback(Callback):
    """A callback passed to train() as extra_callbacks."""


EVAL = shared_data_dir() / "eval" if shared_data_dir() else None


@pytest.mark.skipif(EVAL is None or not EVAL.is_dir(), reason="needs ../shared/data/eval (PRISM_SHARED_DATA)")
def test_the_run_calls_its_callbacks_in_the_order_their_priorities_declare(tmp_path):
    """What depends on the order holds in the list the Trainer gets, whatever order the callbacks
    are listed in; a priority changed so that one of these breaks fails here."""
    cfg = small(
        tmp_path,
        "train.eval_every_tokens=768",
        "train.eval_tasks=[arc_easy]",
        "train.eval_limit=4",
        f"eval.data_dir={EVAL}",
    )
    first, second = CallersCallback(), CallersCallback()
    late = with_priority(CallersCallback(), RESTORE)  # a caller's callback with its own priority
    callbacks, _ = build_callbacks(plan_run(cfg), [late, first, second])
    order = [type(c) for c in callbacks]

    def at(kind) -> int:
        return order.index(kind)

    def before(a, b, why: str) -> None:
        assert at(a) < at(b), f"{a.__name__} must run before {b.__name__}: {why} (order: {order})"

    # an in-loop evaluation's scores come before a stop or a checkpoint at its step
    before(ZeroShotEval, Preemption, "a stop at a milestone's step comes after its scores")
    before(ZeroShotEval, StepCheckpoint, "the milestone's checkpoint holds its scores")
    # the curve and callers' callbacks without a priority see a validation before the stop at its
    # step, the latter in the order given; one with its own priority runs at it
    before(LossMilestones, Preemption, "a stop after a validation comes after it is recorded")
    assert callbacks.index(first) < callbacks.index(second) < at(Preemption)
    assert callbacks.index(late) > at(StepProgressBar)
    # the checkpoint holds the state of every other callback as of its step
    assert order[-1] is StepCheckpoint
    for kind in (FinalValidation, PrismThroughputMonitor, TrainSummary, LearningRateMonitor):
        assert kind in order
    # every callback the kit adds declares its priority (a caller's may not)
    kit = [c for c in callbacks if not isinstance(c, CallersCallback)]
    assert all(isinstance(getattr(c, "priority", None), int) for c in kit), kit


class SigtermAt(Callback):
    """Sends SIGTERM to this process during the optimizer step that ends at `step`."""

    def __init__(self, step: int) -> None:
        self.step, self.sent = step, False

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_step == self.step - 1 and not self.sent:
            self.sent = True
            os.kill(os.getpid(), signal.SIGTERM)


@pytest.mark.slow
def test_a_stop_at_a_validation_step_keeps_that_validation_in_the_curve(tmp_path):
    """SIGTERM during a step that a validation follows: Preemption stops after that validation,
    and LossMilestones has recorded it before then, so the stop's checkpoint holds it and the
    resumed run's curve has every validation once, as an uninterrupted run's has."""
    from prism.cluster import Preempted
    from prism.train.trainer import train

    cfg = small(tmp_path, "train.tokens=768", "train.val_every_steps=3", "train.loggers=[csv]")
    with pytest.raises(Preempted, match="stopped by SIGTERM at step 3 of 6"):
        train(cfg, extra_callbacks=[SigtermAt(3)])
    out = train(cfg)
    summary = json.loads((out / "train_summary.json").read_text())
    assert [p["step"] for p in summary["val_curve"]] == [0, 3, 6]
