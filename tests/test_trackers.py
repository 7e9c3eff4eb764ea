"""Trackers on real training processes (prism.train.trackers; docs/tracking.md): a run logging to
TensorBoard, CSV, W&B (offline) and MLflow (its default sqlite store) is SIGKILLed after a
checkpoint and rerun; each tracker's own reader then shows one run with every step once and the
final validation loss of an uninterrupted run. A run SIGKILLed before its first checkpoint and
rerun leaves one live run per tracker, the killed attempt's closed with a note. Trackers at
addresses nobody answers never stop a run; a tracker package that is not installed, or an MLflow
store MLflow would refuse, is refused before anything is written; runs that open one new sqlite
store at the same moment share it.

The expected steps of every metric come from the uninterrupted `reference` run's TensorBoard
events (conftest), the same config with TensorBoard and CSV only."""

from __future__ import annotations

import json
import os
import re
import shutil
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

from prism.train.trackers import wandb_files


def but(overrides: list[str], *changes: str) -> list[str]:
    """`overrides` with the keys of `changes` set to their new values (a key is given once)."""
    keys = {c.split("=", 1)[0] for c in changes}
    return [o for o in overrides if o.split("=", 1)[0] not in keys] + list(changes)


# checkpoints at 6 and 12 (validation at 0, 6, 12): the kill lands between them, after step 8
KILLED = but(SMALL, "train.ckpt_every_steps=6")
# the kill comes once these trackers hold these metrics up to these steps (x = the step's number,
# docs/tracking.md). MLflow must hold what a resume cannot give back: the validation and
# milestones of the checkpoint's step 6, logged just before it, and the tokens/s of step 8, which
# need two clock readings after a restart. W&B's floors are read back from its own file instead.
BOUNDS = (
    ("csv", "train/loss", 8),
    ("mlflow", "train/loss", 8),
    ("mlflow", "train/device/items_per_sec", 8),
    ("wandb", "train/loss", 6),
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


def mlflow_client(runs: Path):
    """MLflow's client on the kit's default store under `runs`."""
    from mlflow.tracking import MlflowClient

    return MlflowClient(f"sqlite:///{runs.resolve() / 'mlflow.db'}")


@pytest.fixture(scope="module")
def mlflow_tables(tmp_path_factory) -> Path:
    """A sqlite file with MLflow's tables and nothing else, made once: MLflow's migrations of a new
    file take seconds (in a tiny run's MLflow thread, about as long as the run takes to end)."""
    folder = tmp_path_factory.mktemp("mlflow-tables")
    mlflow_client(folder).search_experiments()
    return folder / "mlflow.db"


def make_mlflow_tables(runs: Path, tables: Path) -> None:
    """The default store under `runs`, with MLflow's tables, before a run opens it."""
    runs.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(tables, runs / "mlflow.db")


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
def killed_and_resumed(tmp_path_factory, unreachable, mlflow_tables):
    """The run SIGKILLed (its whole process group, W&B's service too) once step 8 is logged after
    the step-6 checkpoint, and the same command again to the end."""
    tmp = tmp_path_factory.mktemp("trackers")
    runs = tmp / "runs"
    out = runs.joinpath(*RUN)
    cmd = train_py(runs, [*KILLED, *ALL_FOUR, "train.wandb.mode=offline"])
    make_mlflow_tables(runs, mlflow_tables)
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
                # train/loss of step 8 is logged at x = 8. Once the trackers hold BOUNDS, training
                # is frozen (SIGSTOP) while W&B's own process writes its file (every second), then
                # everything is killed: what the trackers lose after the checkpoint, the resume
                # replays, however loaded the machine
                if ckpt_seen and all(floors.get(t, {}).get(k, -1) >= b for t, k, b in BOUNDS):
                    run_id = json.loads((out / "trackers.json").read_text())["run_ids"]["wandb"]
                    freeze_until_wandb_wrote(proc, out, run_id, 6)
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


def freeze_until_wandb_wrote(proc, out, run_id: str, step: int) -> None:
    """Stop the training process (SIGSTOP) and wait until W&B's own process has written train/loss
    of `step` to its run file (it writes every second), so that a kill loses nothing W&B took."""
    os.kill(proc.pid, signal.SIGSTOP)
    until = time.monotonic() + 60
    while wandb_files.floors(out, run_id).get("train/loss", -1) < step:
        assert time.monotonic() < until, f"W&B did not write step {step} to its file"
        time.sleep(0.1)


@pytest.mark.slow
def test_resumed_run_matches_the_uninterrupted_one_in_csv_and_tensorboard(killed_and_resumed, reference):
    run = killed_and_resumed
    out, summary = run["out"], run["summary"]
    expected = tensorboard_steps(reference["out"])
    # the kill came after steps that the resume replays: the floors are what dropped them
    assert run["before"]["floors"]["csv"]["train/loss"] >= 8
    # 1e-4: the bound of the kit's resume tests (test_faults: reference on 2 threads, this on 1)
    assert abs(summary["final_val_loss"] - reference["summary"]["final_val_loss"]) < 1e-4
    rows = csv_rows(out)
    assert_every_step_once(steps_of(rows, "step"), expected, "csv")
    steps = [int(r["step"]) for r in rows]
    assert steps == sorted(steps), steps  # the resumed run's rows continue after the killed one's
    assert val_loss_at_the_end(rows, "step") == float32(summary["final_val_loss"])
    assert_every_step_once(tensorboard_steps(out), expected, "tensorboard")


@pytest.mark.slow
def test_mlflow_sqlite_store_holds_one_run_with_every_step_once(killed_and_resumed, reference):
    run = killed_and_resumed
    client = mlflow_client(run["runs"])
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


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.parametrize("case", ["file store", "no alembic"])
def test_an_mlflow_store_that_cannot_be_opened_is_refused_before_anything_is_written(
    case, tmp_path, monkeypatch, capsys
):
    import mlflow

    for var in ("MLFLOW_ALLOW_FILE_STORE", "MLFLOW_TRACKING_URI"):
        monkeypatch.delenv(var, raising=False)
    runs = tmp_path / "runs"
    if case == "file store":
        uri = f"file:{tmp_path / 'mlruns'}"
        extra = [f"train.mlflow.tracking_uri={uri}"]
        expected = (
            f"the MLflow tracking URI {uri} is a file store, which MLflow {mlflow.__version__} refuses "
            f"unless MLFLOW_ALLOW_FILE_STORE=true is set; set that variable yourself to use it, or "
            f"leave train.mlflow.tracking_uri and MLFLOW_TRACKING_URI unset for the sqlite store "
            f"sqlite:///<runs_dir>/mlflow.db."
        )
    else:
        monkeypatch.setitem(sys.modules, "alembic", None)  # as if it were not installed
        uri, extra = f"sqlite:///{runs.resolve() / 'mlflow.db'}", []
        expected = (
            f"the MLflow store {uri} is a database, which MLflow opens with SQLAlchemy and Alembic, "
            f'but alembic is not installed; install them with pip install -e ".[mlflow]" or set '
            f"train.mlflow.tracking_uri to an MLflow server."
        )
    main = load_script("train").main
    rc = main(["--scale", "tiny", *SMALL, f"runs_dir={runs}", "train.loggers=[tensorboard,mlflow]", *extra])
    err = capsys.readouterr().err.strip()
    assert rc == 2
    assert err.splitlines()[-1].endswith(expected), err
    assert not runs.exists() and not (tmp_path / "mlruns").exists()


STARTS = 4  # runs opening one MLflow store at the same moment


def open_mlflow_at_once(cfg, plan, barrier) -> None:
    """In a forked process: open the run's MLflow tracker as the others do, record a step, close."""
    from prism.train.trackers import TRACKERS, TrackedRun
    from prism.train.trackers.state import TrackerState

    plan.out.mkdir(parents=True)
    state = TrackerState(plan.out)
    state.begin(fresh=True)
    tracker = TRACKERS["mlflow"]
    barrier.wait(timeout=TIMEOUT)
    logger = tracker.open(TrackedRun(cfg, plan), state)
    logger.log_metrics({"x": float(cfg.train.seed)}, step=0)
    tracker.close(logger, "success")


@pytest.mark.parametrize("store", ["sqlite", "file"])
@pytest.mark.slow
def test_runs_starting_at_once_share_one_new_mlflow_store(store, tmp_path, monkeypatch):
    """A search's workers or a job array open one store nobody made yet at the same moment: one
    experiment, every run recorded. MLflow gives a new sqlite file its tables in the first process
    that opens it, and two processes doing so collide; a file store's experiment has no check."""
    import multiprocessing

    import mlflow.store.tracking.sqlalchemy_store  # noqa: F401 - imported once, before the fork
    import mlflow.tracking  # noqa: F401
    from test_train import small

    from prism.train.plan import plan_run
    from prism.train.trackers.build import mlflow_uri

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    runs = tmp_path / "runs"
    extra = ["train.loggers=[mlflow]"]
    if store == "file":
        monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # the user's choice (check_store)
        extra.append(f"train.mlflow.tracking_uri=file:{runs / 'mlruns'}")
    cfgs = [small(runs, *extra, f"train.seed={seed}") for seed in range(STARTS)]
    ctx = multiprocessing.get_context("fork")  # no re-import of torch and MLflow per process
    barrier = ctx.Barrier(STARTS)
    procs = [ctx.Process(target=open_mlflow_at_once, args=(c, plan_run(c), barrier)) for c in cfgs]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(TIMEOUT)
    assert [proc.exitcode for proc in procs] == [0] * STARTS  # a child's traceback is in stderr

    from mlflow.tracking import MlflowClient

    uri = mlflow_uri(cfgs[0])
    assert uri.startswith("sqlite:///" if store == "sqlite" else "file:"), uri
    client = MlflowClient(uri)
    experiments = [e.name for e in client.search_experiments()]
    assert experiments.count("prism-repro") == 1, experiments
    found = client.search_runs([client.get_experiment_by_name("prism-repro").experiment_id])
    got = {r.data.tags["mlflow.runName"]: (r.info.status, r.data.metrics) for r in found}
    assert got == {f"tiny-prism-seed{k}": ("FINISHED", {"x": float(k)}) for k in range(STARTS)}


# a checkpoint only at the end (step 12): the kill comes after the first training steps, before
# any checkpoint
UNCHECKPOINTED = but(SMALL, "train.ckpt_every_steps=12")
THREE = ["train.loggers=[tensorboard,wandb,mlflow]", "train.wandb.mode=offline"]


@pytest.fixture(scope="module")
def killed_before_checkpoint(tmp_path_factory, mlflow_tables):
    """The run SIGKILLed (its whole process group, W&B's service too) once MLflow and W&B's own
    file hold its first training steps, before its first checkpoint, and the same command again to
    the end: a fresh start, since there is no checkpoint to resume."""
    tmp = tmp_path_factory.mktemp("uncheckpointed")
    runs = tmp / "runs"
    out = runs.joinpath(*RUN)
    cmd = train_py(runs, [*UNCHECKPOINTED, *THREE])
    make_mlflow_tables(runs, mlflow_tables)
    with open(tmp / "first.err", "w") as err:
        proc = subprocess.Popen(
            cmd, env=env(), cwd=tmp, stdout=subprocess.DEVNULL, stderr=err, start_new_session=True
        )
        try:
            deadline = time.monotonic() + TIMEOUT
            while True:
                assert proc.poll() is None, (tmp / "first.err").read_text()[-3000:]
                assert time.monotonic() < deadline, "the run did not reach a training step in time"
                try:
                    doc = json.loads((out / "trackers.json").read_text())
                except (OSError, ValueError):
                    doc = {}
                floors = doc.get("floors", {})
                # once both hold a training step's loss past step 0: frozen (SIGSTOP) while W&B's own
                # process writes it to its file, so that the killed W&B run holds steps as MLflow's does
                if all(floors.get(t, {}).get("train/loss", -1) >= 1 for t in ("mlflow", "wandb")):
                    freeze_until_wandb_wrote(proc, out, doc["run_ids"]["wandb"], 1)
                    break
                time.sleep(0.05)
        finally:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert not list(out.glob("checkpoints/*.ckpt")), "killed too late: a checkpoint was written"
    before = json.loads((out / "trackers.json").read_text())
    second = subprocess.run(cmd, env=env(), cwd=tmp, capture_output=True, text=True, timeout=TIMEOUT)
    assert second.returncode == 0, second.stderr[-3000:]
    assert re.search(r"^training -> ", second.stderr, re.M), second.stderr[-3000:]
    return {
        "runs": runs,
        "out": out,
        "before": before,
        "state": json.loads((out / "trackers.json").read_text()),
    }


@pytest.mark.slow
def test_mlflow_holds_one_live_run_after_a_kill_before_the_first_checkpoint(
    killed_before_checkpoint, reference
):
    from prism.train.trackers.build import EARLIER_NOTE

    run = killed_before_checkpoint
    client = mlflow_client(run["runs"])
    experiment = client.get_experiment_by_name("prism-repro")
    found = client.search_runs([experiment.experiment_id], "attributes.run_name = 'tiny-prism-seed0'")
    statuses = {r.info.run_id: r.info.status for r in found}
    killed, new = run["before"]["run_ids"]["mlflow"], run["state"]["run_ids"]["mlflow"]
    # the only RUNNING-or-FINISHED run is the new one; the killed attempt's is KILLED, with a note
    assert statuses == {killed: "KILLED", new: "FINISHED"}, statuses
    assert client.get_run(killed).data.tags["mlflow.note.content"] == EARLIER_NOTE
    assert not run["state"]["earlier"]  # nothing left to close
    # each keeps its own steps: the killed one its first ones, the new one every step once
    held = [m.step for m in client.get_metric_history(killed, "train/loss")]
    assert held and max(held) < 12, held
    mlrun = client.get_run(new)
    got = {k: [m.step for m in client.get_metric_history(new, k)] for k in mlrun.data.metrics}
    assert_every_step_once(got, tensorboard_steps(reference["out"]), "mlflow")


@pytest.mark.slow
def test_wandb_holds_no_second_live_run_after_a_kill_before_the_first_checkpoint(
    killed_before_checkpoint, reference
):
    """Live: a run id whose newest attempt (offline-run-<time>-<id>/, by time) holds no exit
    record; `wandb sync` would show it running until W&B gives up on it. Here exactly one run id
    ends with exit code 0 and holds every step once; the killed attempt's id ends with the
    closing attempt: exit code 1, the note, nothing logged."""
    from prism.train.trackers.build import EARLIER_NOTE

    run = killed_before_checkpoint
    killed, new = run["before"]["run_ids"]["wandb"], run["state"]["run_ids"]["wandb"]
    attempts: dict[str, list[list[dict]]] = {}
    for folder in sorted((run["out"] / "wandb").glob("offline-run-*")):
        run_id = folder.name.rsplit("-", 1)[-1]
        attempts.setdefault(run_id, []).append(wandb_records(folder / f"run-{run_id}.wandb"))

    def exits(records):
        return [r["exit"].get("exit_code", 0) for r in records if r["type"] == "exit"]

    def history(records):
        return [r["history"]["item"] for r in records if r["type"] == "history"]

    def notes(records):
        return [r["run"].get("notes") for r in records if r["type"] == "run"]

    assert sorted(attempts) == sorted([killed, new]) and killed != new, sorted(attempts)
    assert [exits(a) for a in attempts[new]] == [[0]]
    got = steps_of(history(attempts[new][0]), "trainer/global_step")
    assert_every_step_once(got, tensorboard_steps(reference["out"]), "wandb")
    first, closing = attempts[killed]
    assert exits(first) == [] and history(first), "the killed attempt: steps, and no exit record"
    assert exits(closing) == [1] and notes(closing) == [EARLIER_NOTE] and not history(closing)


@pytest.mark.slow
def test_a_fresh_start_closes_the_mlflow_run_whose_id_a_kill_kept_off_trackers_json(
    tmp_path, monkeypatch, mlflow_tables
):
    """The kill lands after MLflow made the run and before its id reached trackers.json: the next
    fresh start finds it by the start id it is tagged with, and closes it as KILLED."""
    from test_train import small

    from prism.train.plan import plan_run
    from prism.train.trackers import TRACKERS, TrackedRun
    from prism.train.trackers.build import EARLIER_NOTE, earlier_runs
    from prism.train.trackers.state import STATE_NAME, TrackerState

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    cfg = small(tmp_path / "runs", "train.loggers=[mlflow]")
    plan = plan_run(cfg)
    make_mlflow_tables(tmp_path / "runs", mlflow_tables)
    plan.out.mkdir(parents=True)
    first = TrackerState(plan.out)
    first.begin(fresh=True)
    logger = TRACKERS["mlflow"].open(TrackedRun(cfg, plan), first)
    logger.log_metrics({"train/loss": 1.0}, step=1)
    killed = logger.run_id
    doc = json.loads((plan.out / STATE_NAME).read_text())
    del doc["run_ids"]["mlflow"]  # what trackers.json held at the kill
    (plan.out / STATE_NAME).write_text(json.dumps(doc))

    earlier = earlier_runs(plan.out)
    second = TrackerState(plan.out)
    second.begin(fresh=True, earlier=earlier)
    new = TRACKERS["mlflow"].open(TrackedRun(cfg, plan), second).run_id

    client = mlflow_client(tmp_path / "runs")
    experiment = client.get_experiment_by_name("prism-repro")
    statuses = {r.info.run_id: r.info.status for r in client.search_runs([experiment.experiment_id])}
    assert statuses == {killed: "KILLED", new: "RUNNING"}, statuses
    assert client.get_run(killed).data.tags["mlflow.note.content"] == EARLIER_NOTE
    assert json.loads((plan.out / STATE_NAME).read_text())["earlier"] == []


@pytest.mark.parametrize("ending", ["resume", "fresh start"])
def test_an_mlflow_file_store_keeps_one_live_run_across_a_kill(ending, tmp_path, monkeypatch):
    """MLflow with a local file store, in process: an attempt records steps 1-4 and is killed
    (never closed). A resume continues that run with the replayed steps once each; a fresh start
    closes it as KILLED, with the note, and records in a new run."""
    from mlflow.tracking import MlflowClient
    from test_train import small

    from prism.train.plan import plan_run
    from prism.train.trackers import TRACKERS, RunTrackers, TrackedRun, TrackerState, clear, earlier_runs
    from prism.train.trackers.build import EARLIER_NOTE

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # the user's choice (check_store)
    uri = f"file:{tmp_path / 'mlruns'}"
    cfg = small(tmp_path / "runs", "train.loggers=[mlflow]", f"train.mlflow.tracking_uri={uri}")
    plan = plan_run(cfg)
    plan.out.mkdir(parents=True)

    def attempt(fresh: bool, steps, earlier=()) -> RunTrackers:
        run, state = TrackedRun(cfg, plan), TrackerState(plan.out)
        logger = RunTrackers({"mlflow": TRACKERS["mlflow"]}, run, state, wait_s=30)
        logger.begin(fresh, earlier)
        for step in steps:
            logger.log_metrics({"train/loss": float(step)}, step=step)
        return logger

    killed = attempt(True, range(1, 5))
    until = time.monotonic() + TIMEOUT  # its thread delivers the steps; then the kill
    while killed.state.floors("mlflow").get("train/loss", -1) < 4:
        assert time.monotonic() < until and not killed.failed, "the first attempt recorded no step 4"
        time.sleep(0.05)
    killed_id = killed.state.run_id("mlflow")
    if ending == "resume":  # from a step-2 checkpoint: steps 3 and 4 are replayed
        attempt(False, range(3, 7)).finalize("success")
    else:
        earlier = earlier_runs(plan.out)
        clear(plan.out)
        attempt(True, range(1, 7), earlier).finalize("success")
    client = MlflowClient(uri)
    found = client.search_runs([client.get_experiment_by_name("prism-repro").experiment_id])
    statuses = {r.info.run_id: r.info.status for r in found}
    new_id = json.loads((plan.out / "trackers.json").read_text())["run_ids"]["mlflow"]
    history = [m.step for m in client.get_metric_history(new_id, "train/loss")]
    assert sorted(history) == list(range(1, 7)), history  # every step once
    if ending == "resume":
        assert new_id == killed_id and statuses == {killed_id: "FINISHED"}, statuses
    else:
        assert statuses == {killed_id: "KILLED", new_id: "FINISHED"}, statuses
        assert client.get_run(killed_id).data.tags["mlflow.note.content"] == EARLIER_NOTE
