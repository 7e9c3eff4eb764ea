"""train.profile_steps (prism.train.callbacks.profile; docs/profiling.md): a profiled run writes a
trace of exactly the optimizer steps it names, trains the same run as an unprofiled one, and
resumes like any other. Runs are test_train.py's shrunken tiny config cut to 4 steps of
micro_batch 2 x accumulation 2, validated and checkpointed every 2 steps."""

from __future__ import annotations

import gzip
import json
import logging
import pickle
from collections import Counter
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
from conftest import load_script
from test_train import SMALL, CrashAt, small

from prism.runs.checkpoint import load_model
from prism.train.trainer import train

main = load_script("train").main  # reproduce/train.py's

FOUR_STEPS = ["train.tokens=512", "train.val_every_steps=2", "train.ckpt_every_steps=2"]
# one optimizer step: a forward (one embedding lookup) per micro-batch, then one AdamW step
FORWARD, OPTIMIZER_STEP = "aten::embedding", "Optimizer.step#AdamW.step"


def four_steps(runs_dir, *extra):
    return small(runs_dir, *FOUR_STEPS, *extra)


def read_trace(path: Path) -> list[dict]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return json.load(f)["traceEvents"]


def in_span(events: list[dict], span: dict) -> Counter:
    """The complete events (ph X) that start within `span`, by name."""
    start, end = span["ts"], span["ts"] + span["dur"]
    return Counter(e["name"] for e in events if e.get("ph") == "X" and start <= e["ts"] <= end)


@contextmanager
def lightning_lines():
    """The lines Lightning's rank-zero logger (rank_zero_info) says within."""
    said: list[str] = []
    handler = logging.Handler(logging.INFO)
    handler.emit = lambda record: said.append(record.getMessage())
    logger = logging.getLogger("lightning.pytorch")  # rank_zero_info's, which does not propagate
    logger.addHandler(handler)
    try:
        yield said
    finally:
        logger.removeHandler(handler)


@pytest.fixture(scope="module")
def unprofiled(tmp_path_factory):
    return train(four_steps(tmp_path_factory.mktemp("plain")))


@pytest.mark.slow
def test_a_profiled_run_traces_its_steps_and_trains_the_same_run(unprofiled, tmp_path):
    with lightning_lines() as said:
        out = train(four_steps(tmp_path, "train.profile_steps=[2,3]"))
    [trace] = (out / "profile").iterdir()  # on a CPU: the trace alone, no memory snapshot
    assert trace.name == "rank0-steps-000002-000003.pt.trace.json.gz"
    assert any(line == f"profiled steps 2 to 3: {trace}" for line in said), said
    events = read_trace(trace)
    spans = {e["name"]: e for e in events if e.get("name", "").startswith("ProfilerStep#")}
    assert sorted(spans) == ["ProfilerStep#2", "ProfilerStep#3"]
    # each span is one optimizer step: both micro-batches of its accumulation and one update;
    # the trace holds no other update (steps 1 and 4 were not profiled)
    for span in spans.values():
        seen = in_span(events, span)
        assert (seen[FORWARD], seen[OPTIMIZER_STEP]) == (2, 1), seen
    assert sum(e.get("name") == OPTIMIZER_STEP for e in events) == 2
    # profiling only watches: the same hash, the same losses and weights, bit for bit (the same
    # operations in the same order in this process)
    profiled = json.loads((out / "train_summary.json").read_text())
    plain = json.loads((unprofiled / "train_summary.json").read_text())
    assert profiled["config_hash"] == plain["config_hash"]
    assert [(p["step"], p["val_loss"]) for p in profiled["val_curve"]] == [
        (p["step"], p["val_loss"]) for p in plain["val_curve"]
    ]
    assert profiled["final_val_loss"] == plain["final_val_loss"]
    weights, plain_weights = load_model(out)[0].state_dict(), load_model(unprofiled)[0].state_dict()
    assert all(torch.equal(weights[k], plain_weights[k]) for k in plain_weights)


@pytest.mark.parametrize(
    "window, first_session, resumed, said",
    [
        # the resume (from the step-2 checkpoint) is inside the window: it profiles step 3
        ([2, 3], [], ["rank0-steps-000003-000003"], "inside the window, so step 3 is profiled"),
        # past it: the first session's trace is all there is
        ([1, 2], ["rank0-steps-000001-000002"], [], "past the window, so nothing is profiled"),
    ],
)
@pytest.mark.slow
def test_a_profiled_run_resumes_like_any_other(unprofiled, tmp_path, window, first_session, resumed, said):
    profile = [f"train.profile_steps=[{window[0]},{window[1]}]"]
    with pytest.raises(RuntimeError, match="simulated crash"):  # after step 3, checkpoint at 2
        train(four_steps(tmp_path, *profile), extra_callbacks=[CrashAt(3)])
    out = tmp_path / "tiny" / "prism" / "seed0"

    def stems() -> list[str]:
        return sorted(p.name.split(".")[0] for p in (out / "profile").glob("*"))

    assert stems() == first_session  # a session stopped inside its window writes nothing
    with lightning_lines() as lines:
        train(four_steps(tmp_path, *profile), resume=True)
    assert any(line.endswith(said) for line in lines), lines
    assert stems() == sorted(first_session + resumed)
    for stem in resumed:
        events = read_trace(out / "profile" / f"{stem}.pt.trace.json.gz")
        assert [e["name"] for e in events if e.get("name", "").startswith("ProfilerStep#")] == [
            "ProfilerStep#3"
        ]
    summary = json.loads((out / "train_summary.json").read_text())
    plain = json.loads((unprofiled / "train_summary.json").read_text())
    assert summary["config_hash"] == plain["config_hash"] and summary["steps"] == 4
    assert summary["final_val_loss"] == plain["final_val_loss"]


@pytest.mark.parametrize(
    "window, message",
    [
        ("[3,2]", "train.profile_steps=[3, 2] is invalid: give [] (off) or two optimizer steps [START,END]"),
        ("[0,2]", "train.profile_steps=[0, 2] is invalid"),
        ("[2]", "train.profile_steps=[2] is invalid"),
        ("[1.5,2]", "train.profile_steps=[1.5, 2] is invalid"),
        ("[3,5]", "train.profile_steps=[3, 5] reaches past the run's 4 optimizer steps"),
    ],
)
def test_a_window_that_is_not_one_of_the_run_s_steps_is_refused(tmp_path, capsys, window, message):
    given = {o.split("=")[0] for o in FOUR_STEPS}  # a key given twice warns on stderr
    settings = [o for o in SMALL if o.split("=")[0] not in given] + FOUR_STEPS
    args = ["--scale", "tiny", *settings, f"runs_dir={tmp_path}", f"train.profile_steps={window}"]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1, err
    assert not any(tmp_path.iterdir())  # nothing written


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the memory snapshot is CUDA's: no GPU here")
def test_on_cuda_a_memory_snapshot_comes_with_the_trace(tmp_path):
    gpu = ["train.accelerator=gpu", "train.devices=1", "train.compile=false"]  # eager: no compile time
    out = train(four_steps(tmp_path, "train.profile_steps=[2,3]", *gpu))
    stem = out / "profile" / "rank0-steps-000002-000003"
    events = read_trace(stem.with_name(stem.name + ".pt.trace.json.gz"))
    assert any(e.get("cat") == "kernel" for e in events)  # CUDA kernels, not only CPU operators
    with open(stem.with_name(stem.name + ".memory.pickle"), "rb") as f:
        snapshot = pickle.load(f)
    assert snapshot["segments"] and any(trace for trace in snapshot["device_traces"])
