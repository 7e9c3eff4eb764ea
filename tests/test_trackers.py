"""Trackers on real training processes (prism.trackers; docs/tracking.md): a run logging to
TensorBoard, CSV, W&B (offline) and MLflow (its local file store) is SIGKILLed after a checkpoint
and rerun; each tracker's own reader then shows one run with every step once and the final
validation loss of an uninterrupted run. Trackers at addresses nobody answers never stop a run;
a tracker package that is not installed is refused before anything is written.

The expected steps of every metric come from the uninterrupted `reference` run's TensorBoard
events (conftest), the same config with only TensorBoard."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT, load_script, train_py
from test_train import SMALL

from prism.trackers import wandb_files

# checkpoints at 6 and 12 (validation at 0, 6, 12): the kill lands between them, after step 8
KILLED = [*SMALL, "train.ckpt_every_steps=6"]
# the kill comes once these trackers hold these metrics up to these steps (x = step - 1). MLflow
# must hold what a resume cannot give back (docs/tracking.md): the validation and milestones of
# the checkpoint's step 6, logged just before it, and the tokens/s of step 8 (x = 7), which need
# two clock readings after a restart. W&B's floors are read back from its own file instead.
BOUNDS = (
    ("csv", "train/loss", 7),
    ("mlflow", "train/loss", 7),
    ("mlflow", "train/device/items_per_sec", 7),
    ("wandb", "train/loss", 5),
)
ALL_FOUR = ["train.loggers=[tensorboard,csv,wandb,mlflow]"]
RUN = ("tiny", "prism", "seed0")
TIMEOUT = 300
# keys a tracker adds itself, not metrics the run logged
OWN_KEYS = {"step", "trainer/global_step", "_step", "_runtime", "_timestamp"}


def env(**extra) -> dict:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("WANDB_", "MLFLOW_"))}
    return {**base, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1", **extra}


def float32(x: float) -> float:
    """x rounded to float32: Lightning logs val/loss as a float32 tensor, the summary keeps the
    float64 mean it came from."""
    return struct.unpack("f", struct.pack("f", x))[0]


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # free once closed: nothing listens there


def tensorboard_steps(run_dir: Path) -> dict[str, list[int]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir / "tb"), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [e.step for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def steps_of(rows: list[dict], step_key: str) -> dict[str, list[int]]:
    """Per metric key, the steps of the rows that hold it, in file order."""
    out: dict[str, list[int]] = {}
    for row in rows:
        for key, value in row.items():
            if key not in OWN_KEYS and value not in ("", None):
                out.setdefault(key, []).append(int(float(row[step_key])))
    return out


def csv_rows(run_dir: Path) -> list[dict]:
    import csv

    with (run_dir / "csv" / "metrics.csv").open(newline="") as f:
        return list(csv.DictReader(f))


def assert_every_step_once(got: dict[str, list[int]], expected: dict[str, list[int]], who: str) -> None:
    for key, steps in got.items():
        assert len(steps) == len(set(steps)), f"{who}: {key} logged twice at a step: {steps}"
    assert {k: sorted(v) for k, v in got.items()} == {k: sorted(v) for k, v in expected.items()}, who


def val_loss_at_the_end(rows: list[dict], step_key: str) -> float:
    last = [r for r in rows if r.get("val/loss") not in ("", None)]
    return float(max(last, key=lambda r: int(float(r[step_key])))["val/loss"])


@pytest.fixture(scope="module")
def unreachable(tmp_path_factory):
    """The run with W&B and MLflow at an address where nothing listens, started first and left
    running beside the kill-and-resume runs below (two processes use both cores)."""
    tmp = tmp_path_factory.mktemp("unreachable")
    url = f"http://127.0.0.1:{closed_port()}"
    overrides = [*SMALL, *ALL_FOUR, f"train.mlflow.tracking_uri={url}", "train.tracker_wait_s=20"]
    cmd = train_py(tmp / "runs", overrides)
    extra = {
        "WANDB_MODE": "online",
        "WANDB_BASE_URL": url,
        "WANDB_API_KEY": "x" * 40,
        "WANDB_INIT_TIMEOUT": "5",  # W&B's own wait for its server (90 s by default)
        "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0",  # MLflow retries for minutes by default
    }
    with open(tmp / "log", "w") as log:
        proc = subprocess.Popen(cmd, env=env(**extra), cwd=tmp, stdout=log, stderr=subprocess.STDOUT)
    yield {"proc": proc, "url": url, "log": tmp / "log", "out": tmp.joinpath("runs", *RUN)}
    if proc.poll() is None:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="module")
def killed_and_resumed(tmp_path_factory, unreachable):
    """The run SIGKILLed (its whole process group, W&B's service too) once step 8 is logged after
    the step-6 checkpoint, and the same command again to the end."""
    tmp = tmp_path_factory.mktemp("trackers")
    runs = tmp / "runs"
    out = runs.joinpath(*RUN)
    cmd = train_py(runs, [*KILLED, *ALL_FOUR, "train.wandb.mode=offline"])
    with open(tmp / "first.err", "w") as err:
        proc = subprocess.Popen(
            cmd, env=env(), cwd=tmp, stdout=subprocess.DEVNULL, stderr=err, start_new_session=True
        )
        try:
            deadline, ckpt_seen = time.monotonic() + TIMEOUT, None
            while True:
                assert proc.poll() is None, (tmp / "first.err").read_text()[-3000:]
                assert time.monotonic() < deadline, "the run did not reach step 8 in time"
                if ckpt_seen is None and (out / "checkpoints" / "step-000006.ckpt").is_file():
                    ckpt_seen = time.monotonic()
                try:
                    floors = json.loads((out / "trackers.json").read_text())["floors"]
                except (OSError, ValueError, KeyError):
                    floors = {}
                # train/loss of step 8 is logged at x = 7. Once the trackers hold BOUNDS, training
                # is frozen (SIGSTOP) while W&B's own process writes its file (every second), then
                # everything is killed: what the trackers lose after the checkpoint, the resume
                # replays, however loaded the machine
                if ckpt_seen and all(floors.get(t, {}).get(k, -1) >= b for t, k, b in BOUNDS):
                    os.kill(proc.pid, signal.SIGSTOP)
                    run_id = json.loads((out / "trackers.json").read_text())["run_ids"]["wandb"]
                    until = time.monotonic() + 60
                    while wandb_files.floors(out, run_id).get("train/loss", -1) < 5:
                        assert time.monotonic() < until, "W&B did not write step 5 to its file"
                        time.sleep(0.1)
                    break
                time.sleep(0.05)
        finally:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert not (out / "checkpoints" / "step-000012.ckpt").exists(), "killed too late to replay a step"
    before = json.loads((out / "trackers.json").read_text())
    second = subprocess.run(cmd, env=env(), cwd=tmp, capture_output=True, text=True, timeout=TIMEOUT)
    assert second.returncode == 0, second.stderr[-3000:]
    assert re.search(r"resuming from \S+ \(step 6\)", second.stderr), second.stderr[-3000:]
    return {
        "runs": runs,
        "out": out,
        "before": before,
        "state": json.loads((out / "trackers.json").read_text()),
        "summary": json.loads((out / "train_summary.json").read_text()),
    }


def test_resumed_run_matches_the_uninterrupted_one_in_csv_and_tensorboard(killed_and_resumed, reference):
    run = killed_and_resumed
    out, summary = run["out"], run["summary"]
    expected = tensorboard_steps(reference["out"])
    # the kill came after steps that the resume replays: the floors are what dropped them
    assert run["before"]["floors"]["csv"]["train/loss"] >= 7
    # 1e-4: the bound of the kit's resume tests (test_faults: reference on 2 threads, this on 1)
    assert abs(summary["final_val_loss"] - reference["summary"]["final_val_loss"]) < 1e-4
    rows = csv_rows(out)
    assert_every_step_once(steps_of(rows, "step"), expected, "csv")
    assert val_loss_at_the_end(rows, "step") == float32(summary["final_val_loss"])
    assert_every_step_once(tensorboard_steps(out), expected, "tensorboard")


def test_mlflow_file_store_holds_one_run_with_every_step_once(killed_and_resumed, reference, monkeypatch):
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    from mlflow.tracking import MlflowClient

    run = killed_and_resumed
    client = MlflowClient(f"file:{run['runs'] / 'mlruns'}")
    experiment = client.get_experiment_by_name("prism-repro")
    runs = client.search_runs([experiment.experiment_id])
    assert [r.info.run_id for r in runs] == [run["state"]["run_ids"]["mlflow"]]
    assert run["before"]["run_ids"]["mlflow"] == run["state"]["run_ids"]["mlflow"]
    mlrun = runs[0]
    assert mlrun.info.status == "FINISHED"
    got = {k: [m.step for m in client.get_metric_history(mlrun.info.run_id, k)] for k in mlrun.data.metrics}
    assert_every_step_once(got, tensorboard_steps(reference["out"]), "mlflow")
    val = client.get_metric_history(mlrun.info.run_id, "val/loss")
    assert max(val, key=lambda m: m.step).value == float32(run["summary"]["final_val_loss"])
    # the run's identity and grouping
    params, tags = mlrun.data.params, mlrun.data.tags
    assert params["config_hash"] == run["summary"]["config_hash"] == tags["config_hash"]
    assert params["schedule"] == tags["schedule"] == "prism" and params["seed"] == tags["seed"] == "0"
    assert tags["mlflow.runName"] == "tiny-prism-seed0" and tags["group"] == "tiny-prism"
    assert params["heads"] == str(run["summary"]["heads"])
    assert params["git_commit"] and params["kit_version"] and params["hardware"].startswith("CPU")
    assert params["run/train/lr"] == "0.003"  # the resolved config, flattened


def wandb_records(path: Path) -> list[dict]:
    """A .wandb file's records as W&B's own reader prints them (`wandb leet inspect --json`)."""
    wandb_cli = Path(sys.executable).with_name("wandb")
    proc = subprocess.run(
        [str(wandb_cli), "leet", "inspect", "--json", str(path)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


def test_wandb_offline_files_hold_one_run_with_every_step_once(killed_and_resumed, reference):
    run = killed_and_resumed
    run_id = run["state"]["run_ids"]["wandb"]
    assert run["before"]["run_ids"]["wandb"] == run_id
    folders = sorted((run["out"] / "wandb").glob("offline-run-*"))
    assert len(folders) == 2 and all(f.name.endswith(f"-{run_id}") for f in folders), folders
    rows, config = [], {}
    for folder in folders:
        for rec in wandb_records(folder / f"run-{run_id}.wandb"):
            if rec["type"] == "run":
                info = rec["run"]
                assert info["run_id"] == run_id and info["run_group"] == "tiny-prism"
                assert info["display_name"] == "tiny-prism-seed0"
                assert {"tiny", "prism", "seed0"} <= set(info["tags"])
            elif rec["type"] == "history":
                rows.append(rec["history"]["item"])
            elif rec["type"] == "config":
                config.update(rec["config"].get("update") or {})
    expected = tensorboard_steps(reference["out"])
    got = steps_of(rows, "trainer/global_step")
    # W&B writes its file every second: what the kill took from it, the resume replays, except
    # tokens/s and the like (train/device/*), which need two clock readings after a restart
    rates = {k for k in expected if k.startswith("train/device/")}
    assert_every_step_once(
        {k: v for k, v in got.items() if k not in rates},
        {k: v for k, v in expected.items() if k not in rates},
        "wandb",
    )
    for key in rates:
        assert len(got[key]) == len(set(got[key])) and set(got[key]) <= set(expected[key]), (key, got[key])
    assert val_loss_at_the_end(rows, "trainer/global_step") == float32(run["summary"]["final_val_loss"])
    assert config.get("config_hash") == run["summary"]["config_hash"], sorted(config)


def test_csv_hyperparameters_hold_the_run_identity(killed_and_resumed):
    import yaml

    run = killed_and_resumed
    hp = yaml.safe_load((run["out"] / "csv" / "hparams.yaml").read_text())
    s = run["summary"]
    for key in ("scale", "schedule", "heads", "seed", "config_hash", "data"):
        assert hp[key] == s[key], key
    assert hp["run"]["train"]["loggers"] == ["tensorboard", "csv", "wandb", "mlflow"]  # the resolved config
    assert hp["group"] == "tiny-prism" and hp["run_name"] == "tiny-prism-seed0"
    assert hp["git_commit"] and hp["kit_version"] and hp["hardware"] == s["throughput"]["hardware"]


def test_unreachable_trackers_never_stop_the_run(unreachable, killed_and_resumed, reference):
    proc, url = unreachable["proc"], unreachable["url"]
    rc = proc.wait(timeout=TIMEOUT)
    log = unreachable["log"].read_text()
    assert rc == 0, log[-3000:]
    for name in ("wandb", "mlflow"):
        lines = [line for line in log.splitlines() if f"{name} tracker" in line]
        assert len(lines) == 1, lines
        assert re.fullmatch(
            rf"{name} tracker at {re.escape(url)} (failed|gave up) \(.+\); "
            r"training continues, .+ keeps? recording\.",
            lines[0],
        ), lines[0]
    out = unreachable["out"]
    summary = json.loads((out / "train_summary.json").read_text())
    assert abs(summary["final_val_loss"] - reference["summary"]["final_val_loss"]) < 1e-4  # as above
    expected = tensorboard_steps(reference["out"])
    assert_every_step_once(steps_of(csv_rows(out), "step"), expected, "csv")
    assert_every_step_once(tensorboard_steps(out), expected, "tensorboard")


@pytest.mark.parametrize("name", ["wandb", "mlflow"])
def test_a_missing_tracker_package_is_refused_before_anything_is_written(name, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, name, None)  # `import wandb` fails as if it were not installed
    main = load_script("train").main
    args = ["--scale", "tiny", *SMALL, f"runs_dir={tmp_path / 'runs'}", f"train.loggers=[tensorboard,{name}]"]
    rc = main(args)
    err = capsys.readouterr().err.strip()
    assert rc == 2
    assert err.splitlines()[-1].endswith(
        f"train.loggers names {name}, but the {name} package is not installed; install it with "
        f'pip install -e ".[{name}]" or drop {name} from train.loggers.'
    ), err
    assert not (tmp_path / "runs").exists()
