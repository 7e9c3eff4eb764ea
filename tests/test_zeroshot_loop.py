"""Zero-shot scores during training (train.eval_every_tokens) on real two-process DDP runs of
reproduce/train.py: each milestone equals reproduce/evaluate.py on that step's checkpoint bit for
bit, a SIGTERM during an evaluation resumes to the same zeroshot.json, bad settings are refused
before anything is written. (The engine's batch sharding, bit for bit one process's numbers at a
batch size above 1, is tests/test_eval_engine.py's two-rank test.)"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest
from conftest import ROOT, load_script, shared_data_dir, train_py
from test_train import SMALL

from prism.eval.job import task_data_identity

DATA = shared_data_dir()
EVAL = DATA / "eval" if DATA else None
pytestmark = pytest.mark.skipif(
    EVAL is None or not EVAL.is_dir(), reason="needs ../shared/data/eval (PRISM_SHARED_DATA)"
)

TASKS = "arc_easy,winogrande"  # continuations fit model.seq_len=32 (piqa's and hellaswag's do not)
LIMIT, BATCH = 16, 4  # ~100 requests in ~25 batches: both ranks score several; ~2 s per milestone
STEPS = 8  # 1,024 tokens of 128: milestones at steps 4 and 8, each with its own checkpoint
ZS = [
    *SMALL,
    f"train.tokens={STEPS * 128}",
    "train.ckpt_every_steps=4",
    "train.keep_checkpoints=-1",
    "train.eval_every_tokens=512",
    f"train.eval_tasks=[{TASKS}]",
    f"train.eval_limit={LIMIT}",
    f"eval.batch_size={BATCH}",
    "train.accelerator=cpu",
    "train.devices=2",
    "train.strategy=ddp",
    # 2 ranks x 1 sequence x accumulation 2: a milestone is scored at optimizer steps only, once
    "train.micro_batch=1",
]
ENV = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
TIMEOUT = 600


def run_dir(runs: Path) -> Path:
    return runs / "tiny" / "prism" / "seed0"


def command(runs: Path, extra: list[str] = ()) -> list[str]:
    return train_py(runs, [*ZS, f"eval.data_dir={EVAL}", *extra])


def without_seconds(doc: dict) -> dict:
    return {**doc, "milestones": [{k: v for k, v in m.items() if k != "seconds"} for m in doc["milestones"]]}


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """The DDP run, start to end, logging to a CSV file too: its run folder and stderr."""
    runs = tmp_path_factory.mktemp("zs-ddp")
    cmd = command(runs, ["train.loggers=[tensorboard,csv]"])
    proc = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=TIMEOUT, cwd=runs)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return run_dir(runs), proc.stderr


@pytest.mark.slow
def test_milestones_equal_evaluate_py_on_that_steps_checkpoint(uninterrupted, tmp_path, one_thread):
    out, err = uninterrupted
    doc = json.loads((out / "zeroshot.json").read_text())
    evaluate = load_script("evaluate")
    assert {k: v for k, v in doc.items() if k != "milestones"} == {
        "every_tokens": 512,
        "tasks": TASKS.split(","),
        "limit": LIMIT,
        "data_source": task_data_identity(str(EVAL), TASKS.split(",")),
        "batch_size": BATCH,
        "semantics": "lm-evaluation-harness 0.4.x",
    }
    assert [(m["step"], m["tokens"]) for m in doc["milestones"]] == [(4, 512), (8, 1024)]
    for m in doc["milestones"]:
        # one line per milestone with its seconds, as written in the file
        assert f"zero-shot at step {m['step']} ({m['tokens']:,} tokens): arc_easy acc " in err
        assert f"({m['seconds']:.1f} s)" in err
        ckpt = out / "checkpoints" / f"step-{m['step']:06d}.ckpt"
        result = tmp_path / f"step{m['step']}.json"
        # in this process on one thread, as the ranks ran (OMP_NUM_THREADS=1)
        rc = evaluate.main(
            [
                *("--checkpoint", str(ckpt), "--tasks", TASKS, "--data-dir", str(EVAL)),
                *("--limit", str(LIMIT), "--batch-size", str(BATCH), "--out", str(result), "--no-progress"),
            ]
        )
        assert rc == 0
        assert json.loads(result.read_text())["tasks"] == m["tasks"], m["step"]  # ==, every float
    # the trackers got the same numbers, against the step (TensorBoard here: the default logger)
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(out / "tb")).Reload()
    logged = [(e.step, e.value) for e in acc.Scalars("zeroshot/winogrande/acc")]
    assert logged == [(m["step"], pytest.approx(m["tasks"]["winogrande"]["acc"])) for m in doc["milestones"]]
    assert [e.value for e in acc.Scalars("zeroshot/tokens")] == [512, 1024]
    # in the CSV file too: a milestone's scores are logged before its step's training metrics, at
    # the same step, so the rows' steps never go back
    import csv

    with (out / "csv" / "metrics.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    steps = [int(r["step"]) for r in rows]
    assert steps == sorted(steps), steps
    assert [int(r["step"]) for r in rows if r["zeroshot/tokens"]] == [4, 8]
    assert [int(r["step"]) for r in rows if r["val/loss"]] == [0, 6, 8]  # the last: with step 8's scores


@pytest.mark.slow
def test_sigterm_during_an_evaluation_resumes_to_the_same_scores(uninterrupted, tmp_path):
    runs = tmp_path / "runs"
    runs.mkdir()
    out = run_dir(runs)
    started = "zero-shot at step 4 (512 tokens): scoring"
    seen: list[str] = []
    with open(tmp_path / "stdout", "w") as stdout:
        proc = subprocess.Popen(
            command(runs),
            env=ENV,
            cwd=runs,
            stdout=stdout,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,  # SIGTERM to every process of the run, as Slurm sends it
        )
        try:
            for line in proc.stderr:
                seen.append(line)
                if line.startswith(started):
                    os.killpg(proc.pid, signal.SIGTERM)
                    signalled_at = len(seen)
            rc = proc.wait(timeout=TIMEOUT)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
    err = "".join(seen)
    assert rc == 75, err[-3000:]  # EXIT_PREEMPTED
    # the signal came while step 4 was being scored: its result line follows it, then the stop
    after = "".join(seen[signalled_at:])
    assert "zero-shot at step 4 (512 tokens): arc_easy acc" in after, err[-3000:]
    assert "preempted: stopped by SIGTERM at step 5 of 8" in after, err[-3000:]
    partial = json.loads((out / "zeroshot.json").read_text())
    assert [m["step"] for m in partial["milestones"]] == [4]
    assert not (out / "train_summary.json").exists()

    resumed = subprocess.run(
        command(runs), env=ENV, capture_output=True, text=True, timeout=TIMEOUT, cwd=runs
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming from" in resumed.stderr and "zero-shot at step 4 " not in resumed.stderr  # not redone
    ref_out, _ = uninterrupted
    final = json.loads((out / "zeroshot.json").read_text())
    reference = json.loads((ref_out / "zeroshot.json").read_text())
    assert without_seconds(final) == without_seconds(reference)  # each milestone once, same scores
    assert final["milestones"][0]["seconds"] == partial["milestones"][0]["seconds"]  # kept, not redone
    # and it trained as the uninterrupted run did: the same validation curve, to the bit
    curve = [
        (p["step"], p["val_loss"]) for p in json.loads((out / "train_summary.json").read_text())["val_curve"]
    ]
    ref_summary = json.loads((ref_out / "train_summary.json").read_text())
    assert curve == [(p["step"], p["val_loss"]) for p in ref_summary["val_curve"]]


@pytest.mark.parametrize(
    "extra, message",
    [
        (
            ["train.eval_every_tokens=500"],
            "train.eval_every_tokens=500 is not a multiple of train.global_batch_tokens=128; milestones "
            "fall on optimizer steps, so use a multiple of it (e.g. 512) or 0 (off).",
        ),
        (
            ["eval.data_dir=MISSING"],
            "train.eval_every_tokens=512 scores train.eval_tasks from eval.data_dir=MISSING, but "
            "eval.data_dir MISSING is not a folder",
        ),
        (
            ["train.eval_tasks=[piqa]"],
            "train.eval_tasks: task piqa has a continuation of 53 tokens in its first 16 documents "
            "(train.eval_limit), longer than model.seq_len=32",
        ),
    ],
    ids=["not-a-step-multiple", "missing-data", "too-long-for-seq-len"],
)
def test_bad_settings_are_refused_before_anything_is_written(tmp_path, capsys, extra, message):
    """In this process: the refusal comes before any Trainer or process exists."""
    main = load_script("train").main
    extra = [e.replace("MISSING", str(tmp_path / "no-eval-data")) for e in extra]
    message = message.replace("MISSING", str(tmp_path / "no-eval-data"))
    runs = tmp_path / "runs"
    assert main(command(runs, extra)[2:]) == 2
    err = capsys.readouterr().err
    assert message in err, err
    assert len([line for line in err.splitlines() if line.startswith("error:")]) == 1
    assert not runs.exists()


@pytest.mark.slow
def test_a_checkpoint_at_a_milestone_without_its_scores_is_scored_before_the_first_step(
    reference, tmp_path, one_thread
):
    """A stop agreed at a milestone's own step checkpoints without scoring it; so does a run that
    turned the evaluation on later. The resumed run scores exactly those weights first: here the
    one-process reference run's step-9 checkpoint, resumed with milestones every 9 steps, gets
    the scores reproduce/evaluate.py gives that checkpoint."""
    from prism.config.schema import load_config
    from prism.train.trainer import train

    run = tmp_path / "runs" / "tiny" / "prism" / "seed0"
    shutil.copytree(reference["out"], run)
    # back to step 9, as if stopped there: the newest checkpoint is step 9's
    for later in ("train_summary.json", "checkpoints/last.ckpt", "checkpoints/step-000012.ckpt"):
        (run / later).unlink()
    every = 9 * 128
    overrides = [
        *SMALL,
        "schedule=prism",
        f"runs_dir={tmp_path / 'runs'}",
        f"train.eval_every_tokens={every}",
        f"train.eval_tasks=[{TASKS}]",
        f"train.eval_limit={LIMIT}",
        f"eval.batch_size={BATCH}",
        f"eval.data_dir={EVAL}",
    ]
    train(load_config("tiny", overrides))
    doc = json.loads((run / "zeroshot.json").read_text())
    assert [(m["step"], m["tokens"]) for m in doc["milestones"]] == [(9, every)]
    result = tmp_path / "step9.json"
    rc = load_script("evaluate").main(
        [
            *("--checkpoint", str(reference["out"] / "checkpoints" / "step-000009.ckpt"), "--tasks", TASKS),
            *("--data-dir", str(EVAL), "--limit", str(LIMIT), "--batch-size", str(BATCH)),
            *("--out", str(result), "--no-progress"),
        ]
    )
    assert rc == 0
    assert json.loads(result.read_text())["tasks"] == doc["milestones"][0]["tasks"]  # ==, every float
    # and training went on from there as the reference did, within test_train's resume bound
    # (the reference may have run on more threads: another float32 summation order, ~1e-6)
    resumed = json.loads((run / "train_summary.json").read_text())["val_curve"]
    assert [p["step"] for p in resumed] == [p["step"] for p in reference["summary"]["val_curve"]]
    assert [p["val_loss"] for p in resumed] == pytest.approx(
        [p["val_loss"] for p in reference["summary"]["val_curve"]], abs=1e-4
    )
