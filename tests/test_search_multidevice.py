"""Multi-device trials of reproduce/search.py on CPU (gloo): --devices-per-trial 2 makes the worker a
torchrun group of 2 ranks; rank 0 alone talks to the study and sends the other rank each trial
and each rung's prune decision. Every trial trains on both ranks through the kit's DDP path,
uniform's final loss is that of reproduce/train.py with train.devices=2 (Lightning's own launcher),
a stopped trial stops on both ranks at its rung's step, and the same search again under torchrun
itself (no --devices-per-trial: the launch's 2 ranks) says it is complete and writes nothing.

Three trials of 4 steps (2 per rung) of 64 tokens: the cost is the processes' start-up."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import SEARCH_TINY, file_stamps, load_script

from prism.config.schema import load_config
from prism.search.budget import parse_rungs
from prism.search.trial_config import trial_overrides

ROOT = Path(__file__).resolve().parents[1]
TINY = [
    *SEARCH_TINY,
    "train.ckpt_every_steps=4",  # the final checkpoint only
]
RUNGS = "128,256"  # 2 and 4 steps of 64 tokens
ARGS = [
    "--scale",
    "tiny",
    "--space",
    "uniform",
    "--space",
    "prism",
    "--space",
    "2x2,4x6",
    "--rungs",
    RUNGS,
    *TINY,
]
TIMEOUT = 600
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
GROUP_LINE = re.compile(r"^trial (\d+): trained on (\d+) ranks, which ended at steps ([\d, ]+)$", re.M)


def run(*command: str) -> subprocess.CompletedProcess:
    return subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT, env=ENV)


def search_py(*args: str) -> list[str]:
    return [str(ROOT / "reproduce" / "search.py"), *args]


@pytest.fixture(scope="module")
def grouped(tmp_path_factory):
    """The search, and beside it (two more processes, started first) the reference: uniform's
    trial config through reproduce/train.py with train.devices=2, which Lightning's own launcher
    starts as two processes."""
    study, ref_runs = tmp_path_factory.mktemp("search") / "study", tmp_path_factory.mktemp("ref")
    rungs = parse_rungs(RUNGS, load_config("tiny", TINY))
    overrides = trial_overrides(TINY, rungs, ref_runs, "uniform", 0, devices=2)
    train_py = [sys.executable, str(ROOT / "reproduce" / "train.py"), "--scale", "tiny", *overrides]
    log = ref_runs / "train.log"  # a file, not a pipe: a full pipe would stall the run
    with open(log, "w") as out:
        ref = subprocess.Popen(train_py, stdout=out, stderr=subprocess.STDOUT, env=ENV)
    try:
        done = run(sys.executable, *search_py(*ARGS, "--devices-per-trial", "2", "--study-dir", str(study)))
        ref.wait(timeout=TIMEOUT)
    finally:
        if ref.poll() is None:
            ref.kill()
            ref.wait()
    reference = subprocess.CompletedProcess(train_py, ref.returncode, "", log.read_text())
    return study, done, ref_runs / "tiny" / "uniform" / "seed0", reference


@pytest.mark.slow
def test_every_trial_trains_on_both_ranks_and_a_stopped_one_stops_on_both_at_its_rung(grouped):
    study, done, _, _ = grouped
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])
    assert f"the search in {study} is complete" in done.stdout
    trials = json.loads((study / "search.json").read_text())["trials"]
    assert sorted(t["slot"] for t in trials) == [0, 1, 2]  # every trial exactly once
    states = {t["schedule"]: t["state"] for t in trials}
    assert states["uniform"] == "complete" and "stopped" in states.values(), states
    # rank 0's account of where each rank's own trainer ended, one line per trial
    ended = {
        int(n): (int(size), [int(s) for s in steps.split(", ")])
        for n, size, steps in GROUP_LINE.findall(done.stdout)
    }
    assert sorted(ended) == sorted(t["number"] for t in trials), done.stdout[-3000:]
    for t in trials:
        run_dir = study / "runs" / "tiny" / t["schedule"].replace(",", "-") / "seed0"
        config = yaml.safe_load((run_dir / "config.yaml").read_text())
        assert config["train"]["devices"] == 2
        if t["state"] == "stopped":  # at the first rung, step 2, on both ranks
            assert ended[t["number"]] == (2, [2, 2]) and list(t["rungs"]) == ["128"]
            assert not (run_dir / "checkpoints").exists() and not (run_dir / "train_summary.json").exists()
        else:
            assert ended[t["number"]] == (2, [4, 4])
            summary = json.loads((run_dir / "train_summary.json").read_text())
            assert summary["batch_split"] == {"micro_batch": 1, "accumulation": 1, "world_size": 2}
            assert summary["throughput"]["num_devices"] == 2
            assert summary["final_val_loss"] == t["value"]


@pytest.mark.slow
def test_the_trial_is_the_run_train_py_makes_on_two_devices(grouped):
    """The same config through reproduce/train.py on two devices: the same DDP code, the same two
    ranks' data and the same gloo all-reduce of two partial gradients (a sum of two float32
    numbers is the same either way round), so nothing in the arithmetic differs and the losses
    are equal to the bit. A wrong rank, data shard or batch split moves them far more than any
    rounding would."""
    study, done, ref_run, ref = grouped
    assert done.returncode == 0, done.stderr[-3000:]
    assert ref.returncode == 0, ref.stderr[-3000:]
    mine = json.loads((study / "runs" / "tiny" / "uniform" / "seed0" / "train_summary.json").read_text())
    theirs = json.loads((ref_run / "train_summary.json").read_text())
    assert mine["config_hash"] == theirs["config_hash"] and theirs["batch_split"]["world_size"] == 2
    curve = [(p["step"], p["val_loss"]) for p in mine["val_curve"]]
    assert curve == [(p["step"], p["val_loss"]) for p in theirs["val_curve"]] and len(curve) == 3  # 0, 2, 4
    assert mine["final_val_loss"] == theirs["final_val_loss"], (
        mine["final_val_loss"],
        theirs["final_val_loss"],
    )


@pytest.mark.slow
def test_the_same_search_under_torchrun_is_complete_and_writes_nothing(grouped):
    study, done, _, _ = grouped
    assert done.returncode == 0, done.stderr[-3000:]
    before = file_stamps(study, with_folders=True)
    torchrun = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nnodes=1",
        "--nproc-per-node=2",
    ]
    again = run(*torchrun, *search_py(*ARGS, "--study-dir", str(study)))
    assert again.returncode == 0, (again.stdout[-2000:], again.stderr[-2000:])
    assert again.stdout.count("is complete") == 1 and "nothing to do" in again.stdout  # rank 0 alone
    assert file_stamps(study, with_folders=True) == before


@pytest.mark.parametrize(
    "args, sentence",
    [
        (["--devices-per-trial", "3"], "which 3 device(s) cannot share evenly"),
        (["--devices-per-trial", "0"], "--devices-per-trial=0 is invalid: give 1 or more."),
        (["train.devices=2"], "train.devices is set by the search, not by an override"),
    ],
    ids=["batch-not-divisible", "zero", "devices-override"],
)
def test_bad_device_counts_get_one_sentence_and_nothing_is_written(tmp_path, capsys, args, sentence):
    code = load_script("search").main([*ARGS, *args, "--study-dir", str(tmp_path / "study")])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("error: ") and sentence in err and err.count("\n") == 1
    assert list(tmp_path.iterdir()) == []


TORCHRUN_RANK0_OF_2 = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2", "TORCHELASTIC_RUN_ID": "test"}


@pytest.mark.parametrize(
    "args, sentence",
    [
        (["--workers", "2"], "--workers 2 is invalid under a launcher (2 torchrun ranks)"),
        (["--devices-per-trial", "4"], "--devices-per-trial 4 differs from this launch, which started 2"),
    ],
    ids=["workers", "devices-per-trial"],
)
def test_a_launch_that_contradicts_the_arguments_gets_one_sentence(
    tmp_path, capsys, monkeypatch, args, sentence
):
    """The variables torchrun gives rank 0 of two; nothing starts a process group before the check."""
    for k, v in TORCHRUN_RANK0_OF_2.items():
        monkeypatch.setenv(k, v)
    code = load_script("search").main([*ARGS, *args, "--study-dir", str(tmp_path / "study")])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("error: ") and sentence in err and err.count("\n") == 1
    assert list(tmp_path.iterdir()) == []


def test_a_group_that_workers_started_keeps_their_arguments(tmp_path, capsys, monkeypatch):
    """--workers 2 --devices-per-trial 2 hands both flags (and --worker) to each torchrun group."""
    for k, v in TORCHRUN_RANK0_OF_2.items():
        monkeypatch.setenv(k, v)
    argv = [*ARGS, "--workers", "2", "--devices-per-trial", "2", "--worker", "--dry-run"]
    assert load_script("search").main([*argv, "--study-dir", str(tmp_path / "study")]) == 0
    assert "trial order" in capsys.readouterr().out
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("how, code", [("SIGTERM", 75), ("SIGUSR1", 75), ("SIGINT", 130)])
@pytest.mark.slow
def test_a_stop_signal_stops_both_ranks_of_a_local_group_with_a_checkpoint_and_its_code(tmp_path, how, code):
    """SIGTERM or Slurm's warning SIGUSR1 to search.py, or a Ctrl-C to its process group as a
    terminal sends it, while a group of 2 ranks under torchrun trains a trial: torchrun passes
    the signal on (SIGUSR1 too, which it would otherwise die of), both ranks stop at one step
    boundary with a checkpoint, and search.py exits 75 or 130 as a worker of one process does
    (torchrun's own code is 1 for any stop; rank 0 leaves the worker's)."""
    import signal
    import time

    study = tmp_path / "study"
    args = [*ARGS, "--trials", "1", "--devices-per-trial", "2", "--study-dir", str(study)]
    log = tmp_path / "log"
    with log.open("w") as out:
        command = [sys.executable, *search_py(*args)]
        # its own process group, as a terminal's foreground job
        parent = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, env=ENV, start_new_session=True
        )
        try:
            deadline = time.monotonic() + TIMEOUT
            while not list(study.glob("runs/tiny/*/seed0/config.yaml")):  # the trial is starting
                assert parent.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
                time.sleep(0.1)
            signum = getattr(signal, how)
            if signum == signal.SIGINT:
                os.killpg(parent.pid, signum)
            else:
                parent.send_signal(signum)
            assert parent.wait(timeout=TIMEOUT) == code, log.read_text()[-3000:]
        finally:
            if parent.poll() is None:
                os.killpg(parent.pid, signal.SIGKILL)
                parent.wait()
    text = log.read_text()
    assert f"worker exit codes [{code}]" in text
    if how == "SIGTERM" and "stopped by SIGTERM while the trial was starting" in text:
        return  # it came during sanity validation, where Lightning's own SIGTERM handling stops
    stopped = re.findall(rf"{how}: stopped at step (\d+) with checkpoint", text)
    assert len(stopped) == 1, text[-3000:]  # rank 0's account; both ranks agreed on the step
    assert (study / "runs" / "tiny" / "uniform" / "seed0" / "checkpoints" / "last.ckpt").is_file()
