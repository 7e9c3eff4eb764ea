"""train.loggers -> Lightning's own loggers behind one RunTrackers; TRACKERS, per name, opens, closes,
checks and places each tracker's run (docs/tracking.md)."""

from __future__ import annotations

import fcntl
import importlib.util
import logging
import os
import shutil
from contextlib import contextmanager
from functools import cached_property
from pathlib import Path
from typing import Callable
from urllib.parse import urlparse

from lightning.pytorch.loggers import Logger, TensorBoardLogger

from prism import provenance
from prism.config.schema import ConfigError, RunConfig
from prism.config.values import invalid
from prism.io import read_json
from prism.registry import Registry
from prism.runs.layout import (
    CSV_DIR,
    MLFLOW_DB_NAME,
    MLFLOW_FILE_STORE_LOCK_NAME,
    TENSORBOARD_DIR,
    WANDB_DIR,
    mlflow_artifacts_beside,
    mlflow_db,
    schedule_dir_name,
    sqlite_store_lock,
)
from prism.train.trackers import wandb_files
from prism.train.trackers.csv_file import ResumableCSVLogger
from prism.train.trackers.guarded import RunTrackers, Tracker
from prism.train.trackers.state import STATE_NAME, TrackerState, new_wandb_id

log = logging.getLogger(__name__)

# what a fresh start clears in a run folder; W&B's stay: closing a run left open adds to its files
RUN_FOLDERS = (TENSORBOARD_DIR, CSV_DIR)
DATABASES = ("sqlite", "mysql", "postgresql", "mssql")  # the stores MLflow opens with SQLAlchemy
START_TAG = "prism.start_id"  # MLflow tag: the fresh start that made the run (trackers.json start_id)
NOTE_TAG = "mlflow.note.content"  # the run's description in MLflow's UI
EARLIER_NOTE = (
    "Closed by the next start of its run folder: the process recording this run was killed before "
    "it could close it, and the next start began again at step 0 (no checkpoint to resume from, or "
    "--overwrite), recording its steps in a new run of the same name."
)


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a broken or blocked package
        return False


def check_installed(names) -> None:
    """Refuse, before anything runs, a tracker whose package is not installed."""
    if not list(names):
        raise ConfigError(
            f"train.loggers=[] leaves the run without curves; name at least one of "
            f"{', '.join(TRACKERS.names())}."
        )
    for name in names:
        module, extra = TRACKERS.get(name).package or (None, None)
        if module is not None and not _installed(module):
            raise ConfigError(
                f"train.loggers names {name}, but the {module} package is not installed; install it "
                f'with pip install -e ".[{extra}]" or drop {name} from train.loggers.'
            )


def check_store(cfg: RunConfig) -> None:
    """Refuse, before anything runs, an MLflow store this installation cannot open: a database
    without SQLAlchemy and Alembic, or a file store that MLflow (3.13+) refuses."""
    if "mlflow" not in list(cfg.train.loggers):
        return
    uri = mlflow_uri(cfg)
    if urlparse(uri).scheme.split("+")[0] in DATABASES:
        missing = [m for m in ("sqlalchemy", "alembic") if not _installed(m)]
        if missing:
            raise ConfigError(
                f"the MLflow store {uri} is a database, which MLflow opens with SQLAlchemy and Alembic, "
                f"but {' and '.join(missing)} is not installed; install them with "
                f'pip install -e ".[mlflow]" or set train.mlflow.tracking_uri to an MLflow server.'
            )
    elif file_store(uri) is not None:
        import mlflow  # seconds to import: only for a file store, which needs MLflow's own answer
        from mlflow import environment_variables as mlflow_env

        allow = getattr(mlflow_env, "MLFLOW_ALLOW_FILE_STORE", None)  # absent before MLflow 3.13
        try:
            allowed = allow is None or allow.get()
        except ValueError:  # a value MLflow cannot read as a boolean
            allowed = False
        if not allowed:
            raise ConfigError(
                f"the MLflow tracking URI {uri} is a file store, which MLflow {mlflow.__version__} refuses "
                f"unless MLFLOW_ALLOW_FILE_STORE=true is set; set that variable yourself to use it, or "
                f"leave train.mlflow.tracking_uri and MLFLOW_TRACKING_URI unset for the sqlite store "
                f"sqlite:///<runs_dir>/{MLFLOW_DB_NAME}."
            )


# ----- the run as its trackers see it ------------------------------------------------------------
class TrackedRun:
    """What a tracker's constructor is given: the run's config, plan, folder, name, group and tags,
    and the identity every tracker records beside the hyperparameters (identity)."""

    def __init__(self, cfg: RunConfig, plan) -> None:
        self.cfg, self.plan, self.out = cfg, plan, Path(plan.out)
        schedule = schedule_dir_name(cfg)
        self.name = f"{cfg.scale}-{schedule}-seed{cfg.train.seed}"
        self.group = cfg.train.wandb.group or f"{cfg.scale}-{schedule}"
        self.tags = [cfg.scale, plan.info["schedule"], f"seed{cfg.train.seed}"]
        self.trainer = None

    @cached_property
    def identity(self) -> dict:
        return {
            **self.plan.info,
            "run_name": self.name,
            "group": self.group,
            "kit_version": provenance.kit_version(),
            "git_commit": provenance.git_commit(),
            **(provenance.hardware(self.trainer) if self.trainer is not None else {}),
        }


def close_earlier(
    tracker: str, state: TrackerState, destination: str, close: Callable[[dict], None], left: str
) -> None:
    """Close the runs of `tracker` that killed attempts left open in `destination` (others are `left`)."""
    for entry in state.earlier(tracker):
        run_id, where = entry.get("run_id"), entry.get("destination")
        try:
            if where != destination:
                log.warning(
                    f"{tracker} tracker: run {run_id} of an earlier attempt is in {where}, not "
                    f"{destination}; it is {left}."
                )
            else:
                close(entry)
        except Exception as exc:  # noqa: BLE001 - the new run starts all the same
            log.warning(
                f"{tracker} tracker: run {run_id} of an earlier attempt could not be closed "
                f"({type(exc).__name__}: {' '.join(str(exc).split())[:200]}); it is {left}."
            )
        state.drop_earlier(entry)


def open_tensorboard(run: TrackedRun, state: TrackerState) -> Logger:
    return TensorBoardLogger(save_dir=str(run.out), name=TENSORBOARD_DIR, version="", default_hp_metric=False)


def open_csv(run: TrackedRun, state: TrackerState) -> Logger:
    return ResumableCSVLogger(run.out, name=CSV_DIR, version="")


WANDB_MODES = ("online", "offline", "disabled")
# the attempt that closes an earlier W&B run records nothing but its note and exit code
QUIET_WANDB = {"console": "off", "x_disable_stats": True, "x_disable_meta": True}


def wandb_mode(cfg: RunConfig) -> str:
    return cfg.train.wandb.mode or os.environ.get("WANDB_MODE") or "online"


def wandb_url() -> str:
    return os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")


def check_wandb(cfg: RunConfig) -> None:
    w = cfg.train.wandb
    if w.mode is not None and w.mode not in WANDB_MODES:
        raise invalid(
            "train.wandb.mode", w.mode, f"use null (WANDB_MODE, else online) or {', '.join(WANDB_MODES)}"
        )
    if not str(w.project).strip():
        raise invalid("train.wandb.project", w.project, "it must not be empty")
    if not all(isinstance(x, str) and x.strip() for x in w.tags):
        raise invalid("train.wandb.tags", list(w.tags), "give non-empty texts, e.g. [ablation,lr-sweep]")


def wandb_args(run: TrackedRun, **settings) -> dict:
    """What a W&B run is opened with (and the attempt that closes an earlier one), with `settings`."""
    import wandb

    w = run.cfg.train.wandb
    common = dict(name=run.name, project=w.project, entity=w.entity, group=run.group, job_type="train")
    return {**common, "settings": wandb.Settings(**settings)}


def wandb_where(run: TrackedRun) -> str:
    mode = wandb_mode(run.cfg)
    return wandb_url() if mode == "online" else f"{run.out / WANDB_DIR} ({mode})"


def open_wandb(run: TrackedRun, state: TrackerState) -> Logger:
    from lightning.pytorch.loggers import WandbLogger

    w, mode = run.cfg.train.wandb, wandb_mode(run.cfg)
    destination = f"{wandb_url()} {w.entity or '(default entity)'}/{w.project}"
    if not state.claim("wandb", destination):
        log.warning("wandb tracker: the run now goes to another W&B project or server; a new W&B run starts.")
        state.set_run_id("wandb", new_wandb_id())
    if mode != "disabled":  # with no W&B traffic now, a later start closes them
        close_earlier("wandb", state, destination, lambda entry: close_wandb_run(run, entry), "left open")
    run_id = state.run_id("wandb")
    if state.resumed and mode == "offline":
        # what W&B wrote before the kill, not what it was handed (wandb_files)
        try:
            held = wandb_files.floors(run.out, run_id)
        except Exception as exc:  # noqa: BLE001 - W&B's file format is its own
            held = {}
            log.warning(f"wandb tracker: its offline files could not be read back ({exc}).")
        if held:
            state.set_floors("wandb", held)
    # a little under the kit's own wait, so W&B gives up first and says what it kept;
    # the run file flushed every second, not 15 s: a SIGKILL would lose steps before the last checkpoint
    wait = 0.8 * float(run.cfg.train.tracker_wait_s)
    args = wandb_args(run, finish_timeout=wait, x_transaction_log_flush_interval=1.0)
    logger = WandbLogger(tags=[*run.tags, *w.tags], id=run_id, save_dir=str(run.out), mode=mode, **args)
    opened = logger.experiment  # wandb.init: reach W&B here, on this thread
    if getattr(opened, "id", run_id) != run_id:
        # Lightning's WandbLogger joins a W&B run already active in this process instead
        raise RuntimeError(
            f"a W&B run ({opened.id}) is already active in this process, and Lightning's WandbLogger "
            f"joins it instead of starting run {run_id}; call wandb.finish() before training"
        )
    return logger


def close_wandb(logger: Logger, status: str) -> None:
    logger.finalize(status)
    logger.experiment.finish(exit_code=0 if status in ("success", "finished") else 1)


def close_wandb_run(run: TrackedRun, entry: dict) -> None:
    """Close, as failed with a note, a W&B run a killed attempt left open: an attempt of the same
    id that holds only the note and exit code 1, in the mode the run was made in."""
    import wandb

    run_id, offline = entry.get("run_id"), bool(entry.get("offline"))
    if offline and not wandb_files.run_files(run.out, run_id):
        return  # its files went with --overwrite: the run exists nowhere, nothing to close
    try:
        wandb.init(
            id=run_id,
            resume="must",  # online: only a run W&B holds; offline: its files above
            mode="offline" if offline else "online",
            dir=str(run.out),
            notes=EARLIER_NOTE,
            **wandb_args(run, **QUIET_WANDB),
        ).finish(exit_code=1)
    except Exception:
        if wandb.run is not None:  # or Lightning's WandbLogger would join it
            wandb.run.finish(exit_code=1)
        raise


def mlflow_uri(cfg: RunConfig) -> str:
    uri = cfg.train.mlflow.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
    # MLflow's file store is in maintenance mode (and refused from 3.13 on): a sqlite file
    return uri or f"sqlite:///{mlflow_db(cfg)}"


def check_mlflow(cfg: RunConfig) -> None:
    if not str(cfg.train.mlflow.experiment).strip():
        raise invalid("train.mlflow.experiment", cfg.train.mlflow.experiment, "it must not be empty")


def open_mlflow(run: TrackedRun, state: TrackerState) -> Logger:
    from lightning.pytorch.loggers import MLFlowLogger

    cfg, uri = run.cfg, mlflow_uri(run.cfg)
    if not state.claim("mlflow", uri):
        log.warning(f"mlflow tracker: the run now goes to {uri}; a new MLflow run starts there.")
    client, experiment_id = open_experiment(uri, cfg.train.mlflow.experiment)

    def close(entry: dict) -> None:  # KILLED, with a note: a run a killed attempt left RUNNING
        for run_id in left_running(client, experiment_id, entry):
            client.set_tag(run_id, NOTE_TAG, EARLIER_NOTE)
            client.set_terminated(run_id, status="KILLED")

    close_earlier("mlflow", state, uri, close, "left as it is")
    held = mlflow_run(client, state.run_id("mlflow"))  # None: deleted, or another store: a new run
    run_id = None if held is None else held.info.run_id
    if held is not None and state.resumed:
        # what MLflow holds, not what trackers.json last recorded (a kill may have kept a floor off)
        steps = {k: max(m.step for m in client.get_metric_history(run_id, k)) for k in held.data.metrics}
        state.set_floors("mlflow", steps)
    logger = MLFlowLogger(
        experiment_name=cfg.train.mlflow.experiment,
        run_name=run.name,
        tracking_uri=uri,
        tags={
            "group": run.group,
            "scale": cfg.scale,
            "schedule": run.plan.info["schedule"],
            "seed": str(cfg.train.seed),
            "config_hash": run.plan.info["config_hash"],
            START_TAG: state.start_id,
        },
        run_id=run_id,
    )
    state.set_run_id("mlflow", logger.run_id)  # creates the run
    if run_id is not None:  # a resume: the last attempt may have ended it as FINISHED/FAILED
        logger.experiment.update_run(run_id, status="RUNNING")
    return logger


def mlflow_run(client, run_id: str | None):
    """The MLflow run `run_id` of the client's store, or None (none given, or none there)."""
    from mlflow.exceptions import MlflowException

    if not run_id:
        return None
    try:
        return client.get_run(run_id)
    except MlflowException as exc:
        if exc.error_code != "RESOURCE_DOES_NOT_EXIST":
            raise
        return None


def left_running(client, experiment_id: str, entry: dict) -> list[str]:
    """The runs of an earlier attempt still RUNNING: the one recorded and any tagged with its start id."""
    runs = [r for r in [mlflow_run(client, entry.get("run_id"))] if r is not None]
    if entry.get("start_id"):
        query = f"tags.`{START_TAG}` = '{entry['start_id']}'"
        runs += client.search_runs([experiment_id], filter_string=query)
    return sorted({r.info.run_id for r in runs if r.info.status == "RUNNING"})


def file_store(uri: str) -> Path | None:
    """The folder of an MLflow file store (a file: URI or a plain path, as MLflow reads both)."""
    parsed = urlparse(uri)
    return {"file": Path(parsed.path), "": Path(uri)}.get(parsed.scheme)


def sqlite_file(uri: str) -> Path | None:
    """The database file of an MLflow sqlite store (sqlite:///relative or sqlite:////absolute)."""
    return Path(uri.removeprefix("sqlite:///").split("?", 1)[0]) if uri.startswith("sqlite:///") else None


@contextmanager
def store_locked(uri: str):
    """Under the lock file of a local store (a file store's folder, a sqlite file's); a server's: none."""
    folder, db = file_store(uri), sqlite_file(uri)
    if folder is None and db is None:
        yield
        return
    path = folder / MLFLOW_FILE_STORE_LOCK_NAME if folder is not None else sqlite_store_lock(db)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        yield


def open_experiment(uri: str, name: str):
    """MLflow's client for `uri` and the id of experiment `name`, created once however many runs start
    together: a local store under a lock file (sqlite migrations collide), a server refuses a second."""
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    with store_locked(uri):
        client = MlflowClient(uri)  # opens the store: a new sqlite file gets its tables here
        experiment = client.get_experiment_by_name(name)
        if experiment is not None:
            return client, experiment.experiment_id
        db = sqlite_file(uri)
        # beside the database, as `mlflow server` keeps them, not under the first run's folder
        artifacts = None if db is None else mlflow_artifacts_beside(db).as_uri()
        try:
            return client, client.create_experiment(name, artifact_location=artifacts)
        except MlflowException as exc:
            if exc.error_code != "RESOURCE_ALREADY_EXISTS":
                raise
        return client, client.get_experiment_by_name(name).experiment_id


# ----- the table: train.loggers -> how each tracker is opened, closed and checked -----------------
TRACKERS: Registry[Tracker] = Registry("tracker")
TRACKERS.add("tensorboard", Tracker(open_tensorboard, where=lambda run: str(run.out / TENSORBOARD_DIR)))
TRACKERS.add(
    "csv", Tracker(open_csv, close=lambda lg, status: lg.save(), where=lambda run: str(run.out / CSV_DIR))
)
TRACKERS.add(
    "wandb",
    Tracker(
        open_wandb,
        close_wandb,
        where=wandb_where,
        check=check_wandb,
        background=True,
        package=("wandb", "wandb"),
    ),
)
TRACKERS.add(
    "mlflow",
    Tracker(
        open_mlflow,
        where=lambda run: mlflow_uri(run.cfg),
        check=check_mlflow,
        background=True,
        package=("mlflow", "mlflow"),
    ),
)


def check_trackers(cfg: RunConfig) -> None:
    """Refuse, naming the key, an unknown or repeated tracker, a tracker's settings it cannot use,
    and a wait for the remote trackers that the other ranks could not sit through."""
    t = cfg.train
    wanted = list(t.loggers)
    if not all(isinstance(n, str) and n in TRACKERS for n in wanted) or len(set(wanted)) != len(wanted):
        raise invalid(
            "train.loggers",
            wanted,
            f"give distinct names out of {', '.join(TRACKERS.names())}, e.g. [tensorboard,csv]",
        )
    for tracker in TRACKERS.parts():  # every tracker's section, used now or not
        tracker.check(cfg)
    remote = [n for n in wanted if TRACKERS.get(n).background]
    if remote and 2 * t.tracker_wait_s >= t.ddp_timeout_s:
        # rank 0 waits for the trackers while the other ranks wait in a collective for it
        raise invalid(
            "train.tracker_wait_s",
            t.tracker_wait_s,
            f"with {' and '.join(remote)} in train.loggers use less than half of "
            f"train.ddp_timeout_s={t.ddp_timeout_s:g}, which the other ranks wait at most while rank 0 "
            f"closes the trackers",
        )


# ----- the run's loggers -------------------------------------------------------------------------
def build_logger(cfg: RunConfig, plan) -> RunTrackers:
    """The Trainer's one logger, fanning out to train.loggers in order; nothing opened before begin()."""
    trackers = {name: TRACKERS.get(name) for name in cfg.train.loggers}
    return RunTrackers(
        trackers, TrackedRun(cfg, plan), TrackerState(plan.out), float(cfg.train.tracker_wait_s)
    )


def begin(trainer, fresh: bool, earlier=()) -> None:
    """Rank 0, after the run folder is ready: load (resume) or start (fresh) the tracker state and
    open every tracker. `earlier`: earlier_runs(), read before a fresh start cleared the folder."""
    for lg in trainer.loggers:
        if isinstance(lg, RunTrackers):
            lg.run.trainer = trainer
            lg.begin(fresh, earlier)


def earlier_runs(out: Path) -> list[dict]:
    """The W&B and MLflow runs that the attempts recorded in <out>/trackers.json may have left open,
    read before a fresh start or --overwrite clears the folder, to be closed with a note."""
    doc = read_json(Path(out) / STATE_NAME)
    if doc is None:
        return []
    runs = [dict(e) for e in doc.get("earlier") or [] if isinstance(e, dict) and e.get("tracker")]
    run_ids, where = dict(doc.get("run_ids") or {}), dict(doc.get("destinations") or {})
    if "mlflow" in where:  # it was opened; which of its runs are still RUNNING, MLflow says
        runs.append(
            {
                "tracker": "mlflow",
                "destination": where["mlflow"],
                "run_id": run_ids.get("mlflow"),
                "start_id": doc.get("start_id"),
            }
        )
    if "wandb" in where and run_ids.get("wandb"):
        try:
            files = wandb_files.run_files(out, run_ids["wandb"])
            # W&B writes an exit record when a run is closed: the newest attempt lacks one if killed
            left_open = bool(files) and wandb_files.exit_code(files[-1]) is None
        except Exception as exc:  # noqa: BLE001 - W&B's file format is its own
            left_open = False
            log.warning(f"wandb tracker: the files of the earlier attempt could not be read ({exc}).")
        if left_open:
            runs.append(
                {
                    "tracker": "wandb",
                    "destination": where["wandb"],
                    "run_id": run_ids["wandb"],
                    "offline": files[-1].parent.name.startswith("offline-"),
                }
            )
    return runs


def clear(out: Path) -> None:
    """A fresh start in an existing folder: TensorBoard's and the CSV's folders and the state go."""
    for name in RUN_FOLDERS:
        if (out / name).is_dir():
            shutil.rmtree(out / name)
    (out / STATE_NAME).unlink(missing_ok=True)
