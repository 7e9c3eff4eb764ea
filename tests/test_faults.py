"""Faults on real training processes: `reproduce/train.py` stopped by SIGTERM (a checkpoint at the
next step boundary, exit code 75) or SIGKILL (nothing more written), then rerun with the same
command to the same result as an uninterrupted run; and a NaN loss on one rank of a real
two-process DDP run, which must stop both ranks with the same sentence instead of hanging.

Every process is started in its own session (process group) and the whole group is killed when
a test ends, so no training process or DataLoader worker outlives its test."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
from conftest import train_py
from test_train import SMALL

from prism.config.schema import load_config
from prism.runs.checkpoint import load_model
from prism.train.trainer import train

ROOT = Path(__file__).resolve().parents[1]
ENV = {
    **os.environ,
    "PYTHONPATH": str(ROOT / "src"),
    "OMP_NUM_THREADS": "1",
    "PRISM_TRAIN_SCRIPT": str(ROOT / "reproduce" / "train.py"),
}
START_TIMEOUT = 300  # interpreter + Lightning start-up is ~15 s on an idle 2-core machine
RUN_TIMEOUT = 300

# SMALL, four times longer so that a run is still training when it is signalled: 48 optimizer
# steps of 128 tokens, validation at steps 0, 12, 24, 36, 48 and step checkpoints at 8, 16, 24
# (after that step's validation), 32, 40, 48. 8 does not divide 12, so the step-8 and step-16
# checkpoints are written at the end of their training step, not after a validation.
LONG = [
    o
    for o in SMALL
    if not o.startswith(("train.tokens=", "train.val_every_steps=", "train.ckpt_every_steps="))
]
LONG += ["train.tokens=6144", "train.val_every_steps=12", "train.ckpt_every_steps=8"]
STEPS, VAL_STEPS = 48, [0, 12, 24, 36, 48]


def cli(runs_dir):
    return train_py(runs_dir, LONG)


@contextmanager
def launched(cmd, cwd, log):
    """Popen in a new session with stdout/stderr in files (no pipe to drain while polling); on
    exit from the block the whole process group is killed and the leader reaped."""
    with open(f"{log}.out", "w") as out, open(f"{log}.err", "w") as err:
        proc = subprocess.Popen(cmd, env=ENV, cwd=cwd, stdout=out, stderr=err, start_new_session=True)
        try:
            yield proc
        finally:
            kill_group(proc)


def kill_group(proc) -> None:
    """SIGKILL a process started with start_new_session=True and everything it started."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def wait_for_file(path, proc, log, timeout=START_TIMEOUT):
    deadline = time.monotonic() + timeout
    while not path.is_file():
        if proc.poll() is not None:
            pytest.fail(
                f"training exited with {proc.returncode} before {path.name} appeared:\n"
                + Path(f"{log}.err").read_text()[-3000:]
            )
        if time.monotonic() > deadline:
            pytest.fail(f"{path.name} did not appear within {timeout} s")
        time.sleep(0.01)  # one optimizer step takes ~0.3 s here, a step checkpoint comes every 8


def wait_until_mapped(proc, library: str, timeout=START_TIMEOUT) -> None:
    """Until `proc` has loaded a shared library whose path holds `library` (/proc/<pid>/maps)."""
    deadline = time.monotonic() + timeout
    while library not in Path(f"/proc/{proc.pid}/maps").read_text():
        if proc.poll() is not None or time.monotonic() > deadline:
            pytest.fail(f"the process never loaded {library} (exit code {proc.poll()})")
        time.sleep(0.005)


def ckpt_step(path):
    return int(torch.load(path, map_location="cpu", weights_only=True, mmap=True)["global_step"])


def rerun(runs_dir, cwd, log, meanwhile=lambda: None):
    """The same command again, to the end, with `meanwhile()` done in this process while it
    trains; returns (stdout, stderr)."""
    with launched(cli(runs_dir), cwd, log) as proc:
        meanwhile()
        rc = proc.wait(timeout=RUN_TIMEOUT)
    out, err = Path(f"{log}.out").read_text(), Path(f"{log}.err").read_text()
    assert rc == 0, err[-3000:]
    assert f"finished: {runs_dir / 'tiny' / 'prism' / 'seed0'}" in out
    assert "skipped checkpoint" not in err  # checkpoints are written atomically (temp + rename)
    return out, err


def assert_matches_uninterrupted(run, reference):
    """Bitwise the same computation: one CPU thread in both (see the `uninterrupted` fixture),
    and a resume restores weights, AdamW moments, the LR-schedule position, RNG and the data
    position, so the measured gap is 0.0. 1e-4 is the same bound as test_train's resume and DDP
    tests and allows no float reordering to go unnoticed here: this 48-step lr 3e-3 run amplifies
    one (2 threads instead of 1) to 2e-3 at step 24 and 0.18 at step 36, while a resume that lost
    a step, replayed a batch or reset the optimizer moves the loss by far more still."""
    summary = json.loads((run / "train_summary.json").read_text())
    ref = reference["summary"]
    assert summary["finished"] is True and summary["steps"] == STEPS
    assert summary["config_hash"] == ref["config_hash"]
    assert [p["step"] for p in summary["val_curve"]] == [p["step"] for p in ref["val_curve"]] == VAL_STEPS
    for a, b in zip(summary["val_curve"], ref["val_curve"]):
        assert abs(a["val_loss"] - b["val_loss"]) < 1e-4, (a, b)
    assert abs(summary["final_val_loss"] - ref["final_val_loss"]) < 1e-4
    milestones = json.loads((run / "milestones.json").read_text())["milestones"]
    assert [m["step"] for m in milestones] == [m["step"] for m in reference["milestones"]]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """The LONG run in this process, on one thread like the subprocesses (OMP_NUM_THREADS=1):
    conftest gives the test process 2 threads, which sums in another order (see above). The
    tests ask for it (request.getfixturevalue) while their last rerun trains, which it overlaps:
    two one-thread trainings on two cores."""
    runs = tmp_path_factory.mktemp("uninterrupted")
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        out = train(load_config("tiny", [*LONG, f"runs_dir={runs}", "schedule=prism", "train.seed=0"]))
    finally:
        torch.set_num_threads(before)
    return {
        "summary": json.loads((out / "train_summary.json").read_text()),
        "milestones": json.loads((out / "milestones.json").read_text())["milestones"],
    }


def sigterm_after(ckpt, runs, cwd, log) -> int:
    """The same command again, SIGTERMed (as Slurm does: every process of the job, workers too)
    once `ckpt` exists: it must checkpoint the next step boundary and exit 75 (EXIT_PREEMPTED)
    with one line. Returns the step it stopped at."""
    out = runs / "tiny" / "prism" / "seed0"
    last = out / "checkpoints" / "last.ckpt"
    with launched(cli(runs), cwd, log) as proc:
        wait_for_file(ckpt, proc, log)
        os.killpg(proc.pid, signal.SIGTERM)
        rc = proc.wait(timeout=RUN_TIMEOUT)
    err = Path(f"{log}.err").read_text()
    assert rc == 75, err[-3000:]  # EXIT_PREEMPTED
    lines = [line for line in err.splitlines() if line.startswith("preempted:")]
    assert len(lines) == 1, err[-3000:]
    m = re.fullmatch(
        rf"preempted: stopped by SIGTERM at step (\d+) of {STEPS} with checkpoint "
        rf"(\S+); run the same command again to resume\.",
        lines[0],
    )
    assert m, lines[0]
    step = int(m[1])
    assert ckpt_step(ckpt) < step < STEPS  # signalled after that checkpoint: stops at a later boundary
    assert m[2] == str(last) and ckpt_step(last) == step
    assert "Traceback" not in err
    assert not (out / "train_summary.json").exists()
    return step


@pytest.mark.slow
def test_sigkill_rerun_resumes_from_the_newest_checkpoint_and_matches(request, tmp_path):
    runs = tmp_path / "runs"
    out = runs / "tiny" / "prism" / "seed0"
    ckpts = out / "checkpoints"
    log = tmp_path / "first"
    with launched(cli(runs), tmp_path, log) as proc:
        wait_for_file(ckpts / "step-000016.ckpt", proc, log)
        os.killpg(proc.pid, signal.SIGKILL)  # no handler, no final checkpoint
        rc = proc.wait(timeout=RUN_TIMEOUT)
    assert rc == -signal.SIGKILL
    # last.ckpt is rewritten right after step-000016.ckpt, so the kill may land before that:
    # then it still holds step 8 and the newest checkpoint is the step file
    last_step = ckpt_step(ckpts / "last.ckpt")
    assert last_step in (8, 16)
    steps = {p.name: ckpt_step(p) for p in ckpts.glob("*.ckpt")}
    assert max(steps.values()) == 16, steps  # killed well before step 24's checkpoint
    assert not (out / "train_summary.json").exists()

    _, err = rerun(runs, tmp_path, tmp_path / "second", lambda: request.getfixturevalue("uninterrupted"))
    m = re.search(r"resuming from (\S+) \(step (\d+)\)", err)
    assert m and int(m[2]) == 16, err[-3000:]
    assert Path(m[1]) in (
        {ckpts / "step-000016.ckpt"} if last_step == 8 else {ckpts / "last.ckpt", ckpts / "step-000016.ckpt"}
    )
    assert_matches_uninterrupted(out, request.getfixturevalue("uninterrupted"))


# Lightning starts rank 1 by running this file again (same argv, LOCAL_RANK=1), so the callback
# must be registered by a script, not by the test process.
POISON_RANK_1 = '''\
"""reproduce/train.py's main() with one extra callback: NaN in a weight on rank 1 only."""
import functools
import os
import sys
from pathlib import Path

import torch
from lightning.pytorch.callbacks import Callback

import prism.train.trainer


class PoisonOnRank1(Callback):
    def __init__(self, step):
        self.step = step

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_rank == 1 and trainer.global_step == self.step:
            with torch.no_grad():
                pl_module.model.blocks[0].mlp.down.weight[0, 0] = float("nan")


def train_script():
    """reproduce/train.py (its path in PRISM_TRAIN_SCRIPT), imported as a module."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("train_script", os.environ["PRISM_TRAIN_SCRIPT"])
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


if __name__ == "__main__":
    report, step, *argv = sys.argv[1:]
    rank = os.environ.get("LOCAL_RANK", "0")
    Path(report, f"rank{rank}.pid").write_text(str(os.getpid()))
    # the command carries out its plan with trainer.run
    prism.train.trainer.run = functools.partial(prism.train.trainer.run,
                                           extra_callbacks=[PoisonOnRank1(int(step))])
    rc = train_script().main(argv)
    Path(report, f"rank{rank}.rc").write_text(str(rc))
    sys.exit(rc)
'''


@pytest.mark.slow
def test_nan_on_one_ddp_rank_stops_both_with_one_sentence(tmp_path):
    script = tmp_path / "poison_rank1.py"
    script.write_text(POISON_RANK_1)
    report = tmp_path / "report"
    report.mkdir()
    runs = tmp_path / "runs"
    # SMALL on 2 ranks x micro_batch 2 (accumulation 1): checkpoints at steps 3, 6, ...; rank 1's
    # weights turn NaN before step 5, so its step-5 loss is NaN while rank 0's is finite
    cmd = [
        sys.executable,
        str(script),
        str(report),
        "4",
        "--scale",
        "tiny",
        "--schedule",
        "prism",
        "--seed",
        "0",
        *SMALL,
        f"runs_dir={runs}",
        "train.accelerator=cpu",
        "train.devices=2",
        "train.strategy=ddp",
    ]
    proc = subprocess.Popen(
        cmd,
        env=ENV,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        # the pipes reach EOF only once every process holding them (rank 1 too) has exited
        _, err = proc.communicate(timeout=RUN_TIMEOUT)
    finally:
        kill_group(proc)
    assert proc.returncode == 1, err[-3000:]
    # both ranks ran main() to its end and returned 1: the NonFiniteLossError branch
    assert {p.name: p.read_text() for p in report.glob("*.rc")} == {"rank0.rc": "1", "rank1.rc": "1"}
    pids = {p.read_text() for p in report.glob("*.pid")}
    assert len(pids) == 2  # two real processes
    last = runs / "tiny" / "prism" / "seed0" / "checkpoints" / "last.ckpt"
    sentence = (
        f"error: the training loss became NaN or infinite at step 5, so training stopped "
        f"before that update; the last good checkpoint is {last} (left intact) — lower "
        f"train.lr or check the data, then resume."
    )
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert errors == [sentence, sentence], err[-3000:]  # once per rank, nothing else
    assert "Traceback" not in err
    model, meta = load_model(last)
    assert meta["step"] == 3 and all(torch.isfinite(p).all() for p in model.parameters())
    assert not (last.parent / "step-000006.ckpt").exists()
    assert not (runs / "tiny" / "prism" / "seed0" / "train_summary.json").exists()


@pytest.mark.slow
def test_training_leaves_the_signal_handlers_as_it_found_them(tmp_path):
    """A process that trained in-process must still die of SIGTERM: a stale handler left behind
    is inherited by every process it forks later (a multiprocessing pool then hangs in
    terminate())."""
    from test_train import small

    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)}
    train(small(tmp_path))
    assert {s: signal.getsignal(s) for s in before} == before


# ----- Ctrl-C (SIGINT to the process group, as a terminal sends it) ------------------------------
def interrupted_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("interrupted:")]


def wait_for_text(path, text, proc, timeout=RUN_TIMEOUT):
    deadline = time.monotonic() + timeout
    while text not in Path(path).read_text():
        if proc.poll() is not None or time.monotonic() > deadline:
            pytest.fail(f"{text!r} did not appear in {path}:\n" + Path(path).read_text()[-3000:])
        time.sleep(0.01)


@pytest.mark.slow
def test_sigint_or_sigterm_checkpoints_at_the_next_step_a_second_sigint_stops_at_once_and_the_rerun_matches(
    request, tmp_path
):
    """One Ctrl-C, rerun, two Ctrl-Cs, rerun, a SIGTERM, rerun to the end: the final losses of an
    uninterrupted run. One chain of the same LONG run, so that each stop resumes from the last."""
    runs = tmp_path / "runs"
    out = runs / "tiny" / "prism" / "seed0"
    ckpts = out / "checkpoints"
    last = ckpts / "last.ckpt"
    log = tmp_path / "first"
    with launched(cli(runs), tmp_path, log) as proc:
        wait_for_file(ckpts / "step-000008.ckpt", proc, log)
        os.killpg(proc.pid, signal.SIGINT)  # a terminal's Ctrl-C: every process of the job
        rc = proc.wait(timeout=RUN_TIMEOUT)
    err = Path(f"{log}.err").read_text()
    assert rc == 130, err[-3000:]
    lines = interrupted_lines(err)
    assert len(lines) == 1, err[-3000:]
    m = re.fullmatch(
        rf"interrupted: stopped at step (\d+) of {STEPS} with checkpoint (\S+); run the same "
        rf"command again to resume\.",
        lines[0],
    )
    assert m, lines[0]
    step = int(m[1])
    assert 8 < step < 16
    assert m[2] == str(last) and ckpt_step(last) == step
    assert err.count("Ctrl-C: stopping at the next step boundary") == 1  # said at once, once
    assert "Traceback" not in err and "Detected KeyboardInterrupt" not in err
    assert not (out / "train_summary.json").exists()
    assert not (out.parent / ".seed0.lock").exists()

    # the same command resumes; two Ctrl-Cs stop it at once, keeping the newest checkpoint whole
    log = tmp_path / "second"
    with launched(cli(runs), tmp_path, log) as proc:
        wait_for_file(ckpts / "step-000016.ckpt", proc, log)
        os.killpg(proc.pid, signal.SIGINT)
        # the first one handled (two pending signals of one kind would arrive as one)
        wait_for_text(f"{log}.err", "Ctrl-C: stopping", proc)
        os.killpg(proc.pid, signal.SIGINT)
        rc = proc.wait(timeout=RUN_TIMEOUT)
    err = Path(f"{log}.err").read_text()
    assert rc == 130, err[-3000:]
    assert f"resuming from {last} (step {step})" in err
    lines = interrupted_lines(err)
    assert len(lines) == 1, err[-3000:]
    m = re.fullmatch(
        rf"interrupted: a second Ctrl-C stopped training at once at step (\d+) of {STEPS}; no "
        rf"checkpoint was written for the steps since the last one \(the newest is (\S+), step "
        rf"(\d+)\); run the same command again to resume from it\.",
        lines[0],
    )
    assert m, lines[0]
    newest = int(m[3])
    assert 16 <= newest <= int(m[1]) < 24
    assert ckpt_step(Path(m[2])) == newest  # named right, and whole
    # every checkpoint on disk opens; one the abort cut short was never renamed into place
    assert max(ckpt_step(p) for p in ckpts.glob("*.ckpt")) == newest
    assert not list(ckpts.glob(".*.tmp"))
    assert "Traceback" not in err and "Detected KeyboardInterrupt" not in err
    assert not (out.parent / ".seed0.lock").exists()

    # the same command resumes again and is SIGTERMed (a preemption) after step 32's checkpoint
    log = tmp_path / "third"
    step = sigterm_after(ckpts / "step-000032.ckpt", runs, tmp_path, log)
    assert re.search(rf"resuming from \S+ \(step {newest}\)", Path(f"{log}.err").read_text())

    _, err = rerun(runs, tmp_path, tmp_path / "fourth", lambda: request.getfixturevalue("uninterrupted"))
    assert f"resuming from {last} (step {step})" in err
    assert_matches_uninterrupted(out, request.getfixturevalue("uninterrupted"))


@pytest.mark.slow
def test_sigint_before_training_stops_at_once_with_one_line_and_writes_nothing(tmp_path):
    runs = tmp_path / "runs"
    log = tmp_path / "first"
    with launched(cli(runs), tmp_path, log) as proc:
        # inside the kit's imports (torch's library is being loaded), not after a fixed time that a
        # loaded machine can outlast before the interpreter is even up
        wait_until_mapped(proc, "libtorch")
        os.killpg(proc.pid, signal.SIGINT)
        rc = proc.wait(timeout=RUN_TIMEOUT)
    err = Path(f"{log}.err").read_text()
    assert rc == 130, err[-3000:]
    assert interrupted_lines(err) == [
        "interrupted: stopped at once outside the training steps, so no step was lost; run the "
        "same command again to continue."
    ], err[-3000:]
    assert "Traceback" not in err
    assert not runs.exists()


@pytest.mark.slow
def test_ctrl_c_stops_run_all_and_its_stage_and_leaves_the_stage_resumable(tmp_path, monkeypatch):
    """reproduce/run_all.py (with the stand-in stages) and its stage, given a Ctrl-C together."""
    from test_run_all import DRIVER, FAKE_SCRIPTS, Kit

    kit = Kit(tmp_path, monkeypatch)
    hang = tmp_path / "train.pid"
    env = {**os.environ, "FAKE_TRAIN_HANG_FILE": str(hang), "PYTHONPATH": str(ROOT / "src")}
    code = DRIVER.format(fake=FAKE_SCRIPTS, overrides=kit.base, script=str(ROOT / "reproduce" / "run_all.py"))
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while not hang.is_file() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert hang.is_file(), proc.communicate(timeout=30)[0]
        stage = int(hang.read_text())
        os.killpg(proc.pid, signal.SIGINT)
        out = proc.communicate(timeout=60)[0]
    finally:
        kill_group(proc)
    assert proc.returncode == 130, out
    assert "interrupted: run the same command again to resume." in out
    assert "Traceback" not in out
    with pytest.raises(ProcessLookupError):  # the stage did not outlive the orchestrator
        os.kill(stage, 0)
    rec = json.loads((kit.tmp / "runs" / "tiny" / "uniform" / "seed0.stage.json").read_text())
    assert rec["status"] == "interrupted" and rec["returncode"] == 130  # how the job ended
    assert not (kit.tmp / "runs" / "tiny" / "uniform" / ".seed0.lock").exists()
    rc, plan = kit.run(seeds=[0], stages=["train"], dry_run=True)
    assert rc == 0 and "resume" in plan, plan  # the next invocation continues it


@pytest.mark.slow
def test_ctrl_c_in_prepare_fineweb_keeps_its_shards_and_the_rerun_continues(tmp_path, shared_data):
    from conftest import load_script

    prepare_main = load_script("prepare_fineweb").main
    src = tmp_path / "src"
    src.mkdir()
    for k in range(24):  # ~2 M tokens: seconds of tokenizing, dozens of shards
        (src / f"part{k:02d}.jsonl").symlink_to(shared_data / "web" / "fineweb-edu-150.jsonl")
    args = ["--source", "local", "--path", str(src), "--seq-len", "32", "--val-tokens", "256"]
    args += ["--shard-tokens", "50000", "--doc-batch", "4", "--workers", "2"]
    out, whole = tmp_path / "out", tmp_path / "whole"
    manifest = out / "manifest.json"
    log = tmp_path / "prepare"
    cmd = [sys.executable, str(ROOT / "reproduce" / "prepare_fineweb.py"), *args, "--out", str(out)]
    with launched(cmd, tmp_path, log) as proc:
        deadline = time.monotonic() + START_TIMEOUT
        while not manifest.is_file() or len(json.loads(manifest.read_text())["shards"]) < 3:
            assert proc.poll() is None and time.monotonic() < deadline, Path(f"{log}.err").read_text()
            time.sleep(0.01)
        os.killpg(proc.pid, signal.SIGINT)  # the pool's workers get it too
        rc = proc.wait(timeout=RUN_TIMEOUT)
    err = Path(f"{log}.err").read_text()
    assert rc == 130, err[-3000:]
    assert interrupted_lines(err) == [
        f"interrupted: the finished shards in {out} are kept; run the same command again to "
        f"continue after them."
    ], err[-3000:]
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    kept = json.loads(manifest.read_text())
    assert not kept["complete"] and all((out / s["name"]).is_file() for s in kept["shards"])

    assert prepare_main([*args, "--out", str(out)]) == 0  # the same command: continues
    assert prepare_main([*args, "--out", str(whole)]) == 0  # uninterrupted, for comparison
    resumed, reference = (json.loads((d / "manifest.json").read_text()) for d in (out, whole))
    assert resumed["shards"][: len(kept["shards"])] == kept["shards"]  # kept, not redone
    assert resumed["shards"] == reference["shards"] and resumed["docs_done"] == reference["docs_done"]
    for shard in reference["shards"]:
        assert (out / shard["name"]).read_bytes() == (whole / shard["name"]).read_bytes()
    assert not list(out.glob("*.tmp"))
