"""train.loggers -> Lightning's own loggers, each behind a TrackerLogger (prism.trackers.guarded).

    tensorboard  TensorBoardLogger  <run>/tb/  (as the kit always wrote it: curves continue)
    csv          CSVLogger          <run>/csv/metrics.csv and hparams.yaml
    wandb        WandbLogger        train.wandb.*; W&B's files in <run>/wandb/
    mlflow       MLFlowLogger       train.mlflow.*; default store file:<runs_dir>/mlruns

A run is named <scale>-<schedule>-seed<k> and grouped as <scale>-<schedule> (the W&B group, an
MLflow tag), with scale, schedule and seed as tags, so "group by" puts a cell's seeds together."""

from __future__ import annotations

import fcntl
import importlib.util
import logging
import os
import shutil
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from lightning.pytorch.loggers import Logger

from prism import provenance
from prism.config import ConfigError, RunConfig
from prism.trackers import wandb_files
from prism.trackers.guarded import Tracker, TrackerLogger
from prism.trackers.state import STATE_NAME, TrackerState, new_wandb_id

log = logging.getLogger(__name__)

# tracker -> (module it needs, the extra that installs it)
PACKAGES = {"wandb": ("wandb", "wandb"), "mlflow": ("mlflow", "mlflow")}
LOCAL = ("tensorboard", "csv")
RUN_FOLDERS = ("tb", "csv", "wandb")  # what the trackers write inside a run folder


def check_installed(names) -> None:
    """Refuse, before anything runs, a tracker whose package is not installed."""
    if not list(names):
        raise ConfigError(
            "train.loggers=[] leaves the run without curves; name at least one of tensorboard, csv, "
            "wandb, mlflow."
        )
    for name in names:
        if name not in PACKAGES:
            continue
        module, extra = PACKAGES[name]
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):  # a broken or blocked package
            found = False
        if not found:
            raise ConfigError(
                f"train.loggers names {name}, but the {module} package is not installed; install it "
                f'with pip install -e ".[{extra}]" or drop {name} from train.loggers.'
            )


# ----- naming and identity -----------------------------------------------------------------------
def names(cfg: RunConfig, plan) -> dict[str, Any]:
    from prism.training import schedule_dir_name

    schedule = schedule_dir_name(cfg)
    group = cfg.train.wandb.group or f"{cfg.scale}-{schedule}"
    return {
        "run_name": f"{cfg.scale}-{schedule}-seed{cfg.train.seed}",
        "group": group,
        "tags": [cfg.scale, plan.info["schedule"], f"seed{cfg.train.seed}"],
    }


class RunIdentity:
    """The run's identity for the hyperparameters: the plan's (scale, schedule and heads, seed,
    config hash, data, batch split), the kit's version and commit, and the hardware (known once
    the Trainer is set up)."""

    def __init__(self, cfg: RunConfig, plan) -> None:
        self.base = {**plan.info, **{k: v for k, v in names(cfg, plan).items() if k != "tags"}}
        self.trainer = None
        self._cached: dict | None = None

    def __call__(self) -> dict:
        if self._cached is None:
            extra = provenance.hardware(self.trainer) if self.trainer is not None else {}
            self._cached = {
                **self.base,
                "kit_version": provenance.kit_version(),
                "git_commit": provenance.git_commit(),
                **extra,
            }
        return self._cached


# ----- the trackers ------------------------------------------------------------------------------
class TensorBoardTracker(Tracker):
    name = "tensorboard"

    def __init__(self, out: Path) -> None:
        self.out = out

    def where(self) -> str:
        return str(self.out / "tb")

    def open(self, state: TrackerState) -> Logger:
        from lightning.pytorch.loggers import TensorBoardLogger

        return TensorBoardLogger(save_dir=str(self.out), name="tb", version="", default_hp_metric=False)


class CsvTracker(Tracker):
    name = "csv"

    def __init__(self, out: Path) -> None:
        self.out = out

    def where(self) -> str:
        return str(self.out / "csv")

    def open(self, state: TrackerState) -> Logger:
        from prism.trackers.csv_file import ResumableCSVLogger

        return ResumableCSVLogger(self.out, name="csv", version="")

    def close(self, logger: Logger, status: str) -> None:
        logger.save()


def wandb_mode(cfg: RunConfig) -> str:
    return cfg.train.wandb.mode or os.environ.get("WANDB_MODE") or "online"


class WandbTracker(Tracker):
    name = "wandb"
    background = True

    def __init__(self, cfg: RunConfig, plan, wait_s: float) -> None:
        self.cfg, self.out, self.wait_s = cfg, plan.out, wait_s
        self.names = names(cfg, plan)
        self.mode = wandb_mode(cfg)

    def where(self) -> str:
        if self.mode == "online":
            return os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")
        return f"{self.out / 'wandb'} ({self.mode})"

    def open(self, state: TrackerState) -> Logger:
        import wandb
        from lightning.pytorch.loggers import WandbLogger

        w = self.cfg.train.wandb
        base_url = os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")
        if not state.claim(self.name, f"{base_url} {w.entity or '(default entity)'}/{w.project}"):
            log.warning(
                "wandb tracker: the run now goes to another W&B project or server; a new W&B run starts."
            )
            state.set_run_id(self.name, new_wandb_id())
        run_id = state.run_id(self.name)
        if state.resumed and self.mode == "offline":
            # what W&B wrote before the kill, not what it was handed (see wandb_files); files it
            # cannot read leave the floors of trackers.json as they are
            try:
                held = wandb_files.floors(self.out, run_id)
            except Exception as exc:  # noqa: BLE001 - W&B's file format is its own
                held = {}
                log.warning(f"wandb tracker: its offline files could not be read back ({exc}).")
            if held:
                state.set_floors(self.name, held)
        settings = {}
        fields = wandb.Settings.model_fields
        if "finish_timeout" in fields:  # wandb >= 0.27: the end of a run never waits longer
            # a little under the kit's own wait, so W&B gives up first and says what it kept
            settings["finish_timeout"] = 0.8 * self.wait_s
        if "x_transaction_log_flush_interval" in fields:
            # W&B writes its run file every 15 s by default: a SIGKILL would lose the steps before
            # the last checkpoint too, which no resume replays; every second it loses at most the
            # last second, which the resume replays (wandb_files)
            settings["x_transaction_log_flush_interval"] = 1.0
        logger = WandbLogger(
            name=self.names["run_name"],
            project=w.project,
            entity=w.entity,
            group=self.names["group"],
            tags=[*self.names["tags"], *w.tags],
            id=run_id,
            save_dir=str(self.out),
            mode=self.mode,
            job_type="train",
            settings=wandb.Settings(**settings),
        )
        run = logger.experiment  # wandb.init: reach W&B here, on this thread
        if getattr(run, "id", run_id) != run_id:
            # Lightning's WandbLogger joins a W&B run already active in this process (a notebook's,
            # an earlier run's that never finished) instead of starting this one
            raise RuntimeError(
                f"a W&B run ({run.id}) is already active in this process, and Lightning's WandbLogger "
                f"joins it instead of starting run {run_id}; call wandb.finish() before training"
            )
        return logger

    def close(self, logger: Logger, status: str) -> None:
        logger.finalize(status)
        logger.experiment.finish(exit_code=0 if status in ("success", "finished") else 1)


def mlflow_uri(cfg: RunConfig) -> str:
    uri = cfg.train.mlflow.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
    return uri or f"file:{Path(cfg.runs_dir).resolve() / 'mlruns'}"


class MlflowTracker(Tracker):
    name = "mlflow"
    background = True

    def __init__(self, cfg: RunConfig, plan) -> None:
        self.cfg, self.plan = cfg, plan
        self.names = names(cfg, plan)
        self.uri = mlflow_uri(cfg)

    def where(self) -> str:
        return self.uri

    def open(self, state: TrackerState) -> Logger:
        store = file_store(self.uri)
        if store is not None:
            # recent MLflow (3.17) refuses its file store, now in maintenance mode, unless asked for it
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        from lightning.pytorch.loggers import MLFlowLogger
        from mlflow.exceptions import MlflowException
        from mlflow.tracking import MlflowClient

        if not state.claim(self.name, self.uri):
            log.warning(f"mlflow tracker: the run now goes to {self.uri}; a new MLflow run starts there.")
        ensure_experiment(MlflowClient(self.uri), self.cfg.train.mlflow.experiment, store)
        run_id = state.run_id(self.name)
        if run_id is not None:
            client = MlflowClient(self.uri)
            try:
                held = client.get_run(run_id).data.metrics
            except MlflowException as exc:
                if exc.error_code != "RESOURCE_DOES_NOT_EXIST":
                    raise
                run_id = None  # deleted, or another store: a new run
            else:
                if state.resumed:
                    # what MLflow holds, not what trackers.json last recorded: the background
                    # thread may have sent a step whose floor a kill kept off the file
                    state.set_floors(
                        self.name,
                        {k: max(m.step for m in client.get_metric_history(run_id, k)) for k in held},
                    )
        info = self.plan.info
        logger = MLFlowLogger(
            experiment_name=self.cfg.train.mlflow.experiment,
            run_name=self.names["run_name"],
            tracking_uri=self.uri,
            tags={
                "group": self.names["group"],
                "scale": self.cfg.scale,
                "schedule": info["schedule"],
                "seed": str(self.cfg.train.seed),
                "config_hash": info["config_hash"],
            },
            run_id=run_id,
        )
        state.set_run_id(self.name, logger.run_id)  # creates the experiment and the run
        if run_id is not None:  # a resume: the last attempt may have ended it as FINISHED/FAILED
            logger.experiment.update_run(run_id, status="RUNNING")
        return logger


def file_store(uri: str) -> Path | None:
    """The folder of an MLflow file store (a file: URI or a plain path, as MLflow reads both)."""
    parsed = urlparse(uri)
    if parsed.scheme == "file":
        return Path(parsed.path)
    if parsed.scheme == "":
        return Path(uri)
    return None


def ensure_experiment(client, name: str, store: Path | None) -> None:
    """Create the experiment once, however many runs start at the same moment (a search's
    workers, a job array): a server refuses the second creation, which is then looked up again;
    a file store has no such check, so its creation is serialised with a lock file."""
    from mlflow.exceptions import MlflowException

    if client.get_experiment_by_name(name) is not None:
        return
    lock = None
    if store is not None:
        store.mkdir(parents=True, exist_ok=True)
        lock = open(store / ".prism-experiments.lock", "a")
        fcntl.flock(lock, fcntl.LOCK_EX)
    try:
        if client.get_experiment_by_name(name) is None:
            try:
                client.create_experiment(name)
            except MlflowException as exc:
                if exc.error_code != "RESOURCE_ALREADY_EXISTS":
                    raise
    finally:
        if lock is not None:
            lock.close()  # releases the flock


# ----- the run's loggers -------------------------------------------------------------------------
def build_loggers(cfg: RunConfig, plan) -> list[TrackerLogger]:
    """One TrackerLogger per entry of train.loggers, in that order (the first is trainer.logger).
    Nothing is opened here: prism.trackers.begin does that on rank 0 once the run's start is
    decided, so other ranks never reach a tracker."""
    out = Path(plan.out)
    state = TrackerState(out)
    identity = RunIdentity(cfg, plan)
    wanted = list(cfg.train.loggers)
    loggers: list[TrackerLogger] = []

    def others(failed: str) -> str:
        alive = [lg.name for lg in loggers if lg.name != failed and not lg.failed]
        if not alive:
            return "with no tracker recording"
        shown = alive[0] if len(alive) == 1 else f"{', '.join(alive[:-1])} and {alive[-1]}"
        return f"{shown} keep{'s' if len(alive) == 1 else ''} recording"

    wait = float(cfg.train.tracker_wait_s)
    closing: dict = {}  # the run's one deadline for closing every remote tracker
    for name in wanted:
        if name == "tensorboard":
            tracker, dirs = TensorBoardTracker(out), (str(out), str(out / "tb"))
        elif name == "csv":
            tracker, dirs = CsvTracker(out), (str(out), str(out / "csv"))
        elif name == "wandb":
            tracker, dirs = WandbTracker(cfg, plan, wait), (str(out), str(out / "wandb"))
        else:
            tracker, dirs = MlflowTracker(cfg, plan), (None, None)
        loggers.append(
            TrackerLogger(tracker, state, identity, others, wait, *dirs, siblings=loggers, closing=closing)
        )
    return loggers


def begin(trainer, fresh: bool) -> None:
    """Rank 0, after the run folder is ready: load (resume) or start (fresh) the tracker state and
    open every tracker (the remote ones on their own threads)."""
    for lg in trainer.loggers:
        if isinstance(lg, TrackerLogger):
            lg.identity.trainer = trainer
            lg.begin(fresh)


def clear(out: Path) -> None:
    """A fresh start in an existing folder (a start that wrote no checkpoint): its curves have
    nothing to continue, so the trackers' folders and state go."""
    for name in RUN_FOLDERS:
        if (out / name).is_dir():
            shutil.rmtree(out / name)
    (out / STATE_NAME).unlink(missing_ok=True)
