"""Where runs and results live on disk: every folder and file name, and the functions that build
their paths (docs/design.md, "One home for each concern"; the sections follow docs/outputs.md)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from prism.config.schema import RunConfig
from prism.core.schedule import path_safe

# ----- the roots: runs_dir and results_dir (relative to the project root) ------------------------
MLFLOW_DB_NAME = "mlflow.db"  # MLflow's sqlite store when no tracking URI is set (tracking.md)
MLFLOW_ARTIFACTS_DIR = "mlartifacts"  # beside a sqlite store, as `mlflow server` keeps them
MLFLOW_FILE_STORE_LOCK_NAME = ".prism-experiments.lock"  # in an MLflow file store's folder


def scale_folder(root: str | Path, scale: str) -> Path:
    """<runs_dir>/<scale>/ or <results_dir>/<scale>/: what one scale wrote under a root."""
    return Path(root) / scale


def scale_runs_dir(cfg: RunConfig) -> Path:
    """runs/<scale>/: the run folders of one scale."""
    return scale_folder(cfg.runs_dir, cfg.scale)


def scale_results_dir(cfg: RunConfig) -> Path:
    """results/<scale>/: the result files of one scale."""
    return scale_folder(cfg.results_dir, cfg.scale)


def mlflow_db(cfg: RunConfig) -> Path:
    """The default MLflow store, absolute: every run of runs_dir records into it."""
    return Path(cfg.runs_dir).resolve() / MLFLOW_DB_NAME


def mlflow_artifacts_beside(db: Path) -> Path:
    return Path(db).resolve().parent / MLFLOW_ARTIFACTS_DIR


def sqlite_store_lock(db: Path) -> Path:
    """.<db>.prism-lock beside an MLflow sqlite store (the default one's: .mlflow.db.prism-lock)."""
    return Path(db).with_name(f".{Path(db).name}.prism-lock")


# ----- runs/<scale>/<schedule>/seed<k>/: one training run ----------------------------------------
SEED_DIR_PREFIX = "seed"


# a context extension (train.init_from) to 256 tokens of a prism run: runs/<scale>/prism-ctx256/seed<k>/
EXTENSION_INFIX = "-ctx"


def schedule_dir_name(cfg: RunConfig, spec: str | None = None) -> str:
    """The path-safe name or compact text of schedule `spec` (default: the run's own), with the new
    length after it for a context extension ('prism-ctx256')."""
    name = path_safe(cfg.head_schedule(spec).name)
    if cfg.train.init_from.run or cfg.train.init_from.config_hash:
        name += f"{EXTENSION_INFIX}{cfg.model.seq_len}"
    return name


def extension_of(name: str) -> tuple[str, int] | None:
    """(source schedule folder, new seq_len) of a context extension's folder name, as
    schedule_dir_name spells it ('prism-ctx256' -> ('prism', 256)); None for a schedule's own."""
    m = re.fullmatch(rf"(.+){re.escape(EXTENSION_INFIX)}(\d+)", name)
    return (m.group(1), int(m.group(2))) if m else None


def seed_dir_name(seed: int) -> str:
    return f"{SEED_DIR_PREFIX}{seed}"


def seed_of(name: str, suffix: str = "") -> int | None:
    """The seed a run folder (seed<k>) or, with `suffix`, a result file (seed<k>.json) is named
    for, or None for another name (seed01 too: it would be read as a second seed1)."""
    m = re.fullmatch(rf"{SEED_DIR_PREFIX}(0|[1-9]\d*){re.escape(suffix)}", name)
    return int(m.group(1)) if m else None


def run_dir(cfg: RunConfig, schedule: str | None = None, seed: int | None = None) -> Path:
    """The folder of the run of `cfg`, or of another schedule and seed of the same settings."""
    seed = cfg.train.seed if seed is None else seed
    return scale_runs_dir(cfg) / schedule_dir_name(cfg, schedule) / seed_dir_name(seed)


RUN_CONFIG_NAME = "config.yaml"  # the fully resolved RunConfig of the run
CHECKPOINTS_DIR = "checkpoints"  # Lightning checkpoints (training.md, Checkpoints)
CHECKPOINT_SUFFIX = ".ckpt"
LAST_CHECKPOINT_NAME = "last" + CHECKPOINT_SUFFIX  # the newest step, rewritten at every save
STEP_CHECKPOINT_PREFIX = "step-"  # step-NNNNNN.ckpt, kept train.keep_checkpoints at a time
STEP_CHECKPOINT_GLOB = f"{STEP_CHECKPOINT_PREFIX}*{CHECKPOINT_SUFFIX}"
# Lightning's own checkpoint before a Slurm requeue, in the run folder itself
HPC_CHECKPOINT_GLOB = f"hpc_ckpt_*{CHECKPOINT_SUFFIX}"
TENSORBOARD_DIR = "tb"  # TensorBoard event files
CSV_DIR = "csv"  # train.loggers=[...,csv]
CSV_METRICS_NAME = "metrics.csv"
CSV_HPARAMS_NAME = "hparams.yaml"
WANDB_DIR = "wandb"  # W&B's own files, train.loggers=[...,wandb]
TRACKER_STATE_NAME = "trackers.json"  # W&B/MLflow run ids, destinations, last logged steps
SUMMARY_NAME = "train_summary.json"  # written when the run finishes: the "finished" marker
MILESTONES_NAME = "milestones.json"  # loss milestones
ZEROSHOT_NAME = "zeroshot.json"  # zero-shot scores at token milestones, train.eval_every_tokens
# train.profile_steps (profiling.md): each rank's torch.profiler trace and (CUDA) memory snapshot
PROFILE_DIR = "profile"
TRACE_SUFFIX = ".pt.trace.json.gz"
MEMORY_SNAPSHOT_SUFFIX = ".memory.pickle"
WEIGHTS_SUFFIX = ".safetensors"
WEIGHTS_NAME = "model" + WEIGHTS_SUFFIX  # the final weights, no pickle
MODEL_CONFIG_NAME = "model_config.json"  # ModelConfig + run metadata, beside the weights


def checkpoints_dir(run: Path) -> Path:
    return Path(run) / CHECKPOINTS_DIR


def last_checkpoint(run: Path) -> Path:
    return checkpoints_dir(run) / LAST_CHECKPOINT_NAME


@dataclass(frozen=True)
class RunPaths:
    """The files of one run folder that a training start writes or reads (a RunPlan carries them)."""

    config: Path
    checkpoints: Path
    last_checkpoint: Path
    milestones: Path
    summary: Path
    diagnostics: Path  # diagnostics/: one folder per launch (attempt) below it


def run_paths(run: Path) -> RunPaths:
    return RunPaths(
        config=run / RUN_CONFIG_NAME,
        checkpoints=checkpoints_dir(run),
        last_checkpoint=last_checkpoint(run),
        milestones=run / MILESTONES_NAME,
        summary=run / SUMMARY_NAME,
        diagnostics=run / DIAGNOSTICS_DIR,
    )


def step_checkpoint_name(step: int) -> str:
    return f"{STEP_CHECKPOINT_PREFIX}{step:06d}{CHECKPOINT_SUFFIX}"


DIAGNOSTICS_DIR = "diagnostics"  # a hung run's state: per attempt, each rank's heartbeat and report


def _profiled(run: Path, first: int, last: int, rank: int, suffix: str) -> Path:
    """profile/rank<r>-steps-<first>-<last><suffix>: a file of one rank's profiled optimizer steps."""
    return Path(run) / PROFILE_DIR / f"rank{rank}-steps-{first:06d}-{last:06d}{suffix}"


def trace_path(run: Path, first: int, last: int, rank: int) -> Path:
    return _profiled(run, first, last, rank, TRACE_SUFFIX)


def memory_snapshot_path(run: Path, first: int, last: int, rank: int) -> Path:
    return _profiled(run, first, last, rank, MEMORY_SNAPSHOT_SUFFIX)


def set_aside(run: Path, tag: str, n: int = 0) -> Path:
    """Where run_all.py --redo-changed keeps a differently configured run: seed<k>.old-<tag>[-<n>]."""
    run = Path(run)
    return run.with_name(f"{run.name}.old-{tag}" + (f"-{n}" if n else ""))


def run_config_path_beside(weights: Path) -> Path:
    """The config.yaml of the run whose final weights are `weights`."""
    return Path(weights).with_name(RUN_CONFIG_NAME)


# ----- results/<scale>/ ----------------------------------------------------------------------------
EVAL_DIR = "eval"  # eval/<schedule>/seed<k>.json: zero-shot metrics of one checkpoint
RESULT_SUFFIX = ".json"
BENCH_NAME = "bench.json"  # throughput of every schedule
ANALYSIS_NAME = "analysis.json"  # attention distance per layer
LONG_CONTEXT_DIR = "long_context"  # long_context/<schedule>/seed<k>.json: past the training length
LOGS_DIR = "logs"  # one log per stage run by run_all.py
LOG_SUFFIX = ".log"
ENDINGS_SUFFIX = ".endings"  # .<log stem>.endings/: how the processes of one attempt ended
# the units a job finished so far (prism.runs.resumable): <out>.partial.json, or analyze.py's <out>.partial
EVAL_PARTIAL_SUFFIX = ".partial.json"
ANALYSIS_PARTIAL_SUFFIX = ".partial"


def eval_result(results: Path, schedule: str, seed: int) -> Path:
    """results/<scale>/eval/<schedule>/seed<k>.json, under `results` = results/<scale>/."""
    return Path(results) / EVAL_DIR / schedule / f"{seed_dir_name(seed)}{RESULT_SUFFIX}"


def long_context_result(results: Path, schedule: str, seed: int) -> Path:
    """results/<scale>/long_context/<schedule>/seed<k>.json: one run's long-context evaluation."""
    return Path(results) / LONG_CONTEXT_DIR / schedule / f"{seed_dir_name(seed)}{RESULT_SUFFIX}"


def seed_of_eval_result(name: str) -> int | None:
    """The seed of a file under eval/<schedule>/, or None for a file that is not a result."""
    return seed_of(name, RESULT_SUFFIX)


def scale_result(cfg: RunConfig, name: str) -> Path:
    """results/<scale>/<name>: bench.json or analysis.json."""
    return scale_results_dir(cfg) / name


def logs_dir(cfg: RunConfig) -> Path:
    """run_all.logs_dir, else results/<scale>/logs."""
    return Path(cfg.run_all.logs_dir) if cfg.run_all.logs_dir else scale_results_dir(cfg) / LOGS_DIR


def stage_log_name(stage: str, schedule: str | None = None, seed: int | None = None) -> str:
    """<stage>-<schedule>-seed<k>.log for a per-run stage, <stage>.log for one of the scale."""
    if schedule is None:
        return f"{stage}{LOG_SUFFIX}"
    return f"{stage}-{schedule}-{seed_dir_name(seed)}{LOG_SUFFIX}"


def stage_endings_dir(log: Path) -> Path:
    """The folder beside a stage's log where one attempt's processes leave how they ended (prism.cli.exits
    writes it, prism.pipeline.runner reads it); absolute: the processes may start elsewhere."""
    log = Path(log).absolute()
    return log.with_name(f".{log.stem}{ENDINGS_SUFFIX}")


# ----- results/RESULTS.md and results/plots/: the report ---------------------------------------------
REPORT_NAME = "RESULTS.md"
REPORT_JSON_NAME = "report.json"  # beside the report: the numbers of every table in it
PLOTS_DIR = "plots"  # beside the report
PLOT_SUFFIX = ".png"


def plot_name(scale: str, figure: str) -> str:
    """plots/<scale>-<figure>.png: val-loss, delta-loss, delta-distance, zeroshot-<task>, ..."""
    return f"{scale}-{figure}{PLOT_SUFFIX}"


def across_plot_name(figure: str) -> str:
    """plots/across-scales-<figure>.png: the "Across scales" figures, which span every scale."""
    return f"across-scales-{figure}{PLOT_SUFFIX}"


SCALING_JSON_NAME = "scaling.json"  # beside the report: "Across scales" and equal compute as JSON


def report_path(cfg: RunConfig) -> Path:
    return Path(cfg.results_dir) / REPORT_NAME


# ----- <study-dir>/: a schedule search (search.md) -------------------------------------------------
SEARCH_DIR = "search"  # a search's default folder, <results_dir>/<scale>/search
STUDY_JOURNAL_NAME = "study.journal"  # Optuna's journal of the study
STUDY_RUNS_DIR = "runs"  # the trials' run folders, <study-dir>/runs/<scale>/<schedule>/seed<k>/
SEARCH_REPORT = "SEARCH.md"  # a search's report, in its folder
SEARCH_JSON_NAME = "search.json"  # what the report shows, as JSON
SEARCH_LOSS_PLOT = "search-loss-per-rung.png"
SEARCH_RANK_PLOT = "search-rank-per-rung.png"
STUDY_CREATE_LOCK_NAME = ".search.lock"  # held while a worker makes or opens the study
STUDY_ASK_LOCK_NAME = ".ask.lock"  # held while a worker asks for its next trial
WORKERS_DIR = "workers"  # workers/.<worker>.lock, held by each live worker


def default_study_dir(cfg: RunConfig) -> Path:
    """A search's default folder."""
    return scale_results_dir(cfg) / SEARCH_DIR


def worker_lock(study: Path, worker: str) -> Path:
    return Path(study) / WORKERS_DIR / f".{worker}.lock"


# ----- run_all.py's stage records and the locks beside each output ---------------------------------
STAGE_RECORD_SUFFIX = ".stage.json"


def stage_record(output: Path, folder: bool = False) -> Path:
    """The record beside a stage's output: <run folder>.stage.json, or for a result file its name
    less the suffix (eval/prism/seed0.json -> eval/prism/seed0.stage.json)."""
    base = Path(output) if folder else Path(output).with_suffix("")
    return base.with_name(base.name + STAGE_RECORD_SUFFIX)


def stage_output_base(record: Path) -> Path:
    """The output (less a file's suffix) that a stage record sits beside."""
    return Path(record).with_name(Path(record).name.removesuffix(STAGE_RECORD_SUFFIX))


def lock_path(target: str | Path) -> Path:
    """The lock file of a run folder or an output file: `.<name>.lock` beside it."""
    target = Path(target)
    return target.with_name(f".{target.name}.lock")
