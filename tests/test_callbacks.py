"""Loss-milestone bookkeeping (the data behind "Prism reaches its milestones earlier")."""

from prism.train.callbacks import LossMilestones


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
    assert set(cb.to_json()) == {"thresholds", "milestones", "min"}


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
