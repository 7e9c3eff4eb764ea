"""Typed, validated run configuration: the dataclasses' defaults <- configs/scale/<scale>.yaml <-
`key=value` overrides, with the named schedules of the scale's shape (docs/scales.md)."""

from __future__ import annotations

import dataclasses
import os
import typing
from dataclasses import astuple, dataclass, field, replace
from pathlib import Path
from typing import Any, Optional

from omegaconf import MISSING, DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from prism.config.overrides import as_patch, parse_override
from prism.config.roles import (
    Role,
    declare,
    execution_key,
    identity_key,
    other_stage,
    resolved_key,
    role_tree,
    setting,
)
from prism.config.values import (
    ACCELERATOR,
    DEVICES,
    EVAL_LIMIT,
    LONG_CONTEXT_ROPE_FACTOR,
    LONG_CONTEXT_SOURCES,
    MICRO_BATCH,
    MILESTONES,
    NON_EMPTY,
    NON_NEGATIVE,
    POSITIVE,
    POSITIVE_FLOAT,
    PRECISION,
    PROFILE_STEPS,
    ROPE_FACTOR,
    SCHEDULE_NAMES,
    SEED,
    SEEDS,
    STAGES,
    STRATEGY,
    TRACKERS,
    VOCAB,
    WORDS,
    at_least_zero,
    between,
    check_values,
    number,
    one_of,
    optional,
    positive,
    rules,
    seconds,
    tasks,
)
from prism.core.model import ModelConfig
from prism.core.schedule import HeadSchedule, ModelShape, ScheduleError, prism_rule
from prism.errors import ConfigError, first_line

# eval.tasks' default, the paper's benchmarks (prism.eval.tasks checks the names, the config the list)
DEFAULT_TASKS = ("hellaswag", "piqa", "arc_easy", "winogrande", "blimp", "wikitext")


def default_config_dir() -> Path:
    env = os.environ.get("PRISM_CONFIG_DIR")
    return Path(env) if env else Path(__file__).resolve().parents[3] / "configs"


# ----- sections -------------------------------------------------------------------------------
@dataclass
class WandbSection:
    """Weights & Biases (train.loggers=[...,wandb]; prism.train.trackers, docs/tracking.md)."""

    project: str = "prism-repro"
    entity: Optional[str] = None  # a W&B user or team; None = the API key's default entity
    mode: Optional[str] = None  # online | offline | disabled; None = WANDB_MODE, else online
    group: Optional[str] = None  # None = <scale>-<schedule>: "group by" puts a cell's seeds together
    tags: list = field(default_factory=list)  # besides the scale, schedule and seed tags of every run


@dataclass
class MlflowSection:
    """MLflow (train.loggers=[...,mlflow]; prism.train.trackers, docs/tracking.md)."""

    tracking_uri: Optional[str] = None  # None = MLFLOW_TRACKING_URI, else sqlite:///<runs_dir>/mlflow.db
    experiment: str = "prism-repro"


@dataclass
class InitFromSection:
    """Context extension (docs/training.md#context-extension): the run whose final weights this
    one starts from, at a longer model.seq_len (prism.train.extension)."""

    run: Optional[str] = other_stage(None)  # the source run's folder, e.g. runs/cpu-s/prism/seed0
    # the source's identity hash (else its train_summary.json's): a moved source is the same start
    config_hash: Optional[str] = identity_key(None)


# Every default of the kit, once (configs/ and `key=value` only override them); values the paper
# leaves open are marked "not stated".
@dataclass
class TrainSection:
    seed: int = identity_key(0, SEED)
    tokens: int = identity_key(MISSING, POSITIVE)  # training-token budget (Table 1)
    global_batch_tokens: int = identity_key(MISSING, POSITIVE)  # tokens per optimizer step (Table 1)
    # sequences per device per forward, at most; auto = the largest the memory plan fits (docs/performance.md)
    micro_batch: Any = execution_key(16, MICRO_BATCH)
    # peak LR (Table 1)
    lr: float = identity_key(MISSING, positive("it must be positive and finite, e.g. train.lr=6e-4"))
    # cosine floor = 10 % of peak (final LR not stated)
    min_lr_ratio: float = identity_key(0.1, between(0, 1, closed_high=True))
    # §3.1: linear warmup over the first 2.5 % of optimizer steps, rounded half to even
    warmup_frac: float = identity_key(0.025, between(0, 1, what="a fraction"))
    # AdamW (§3.1), on weights of >= 2 dims only (nanoGPT rule)
    weight_decay: float = identity_key(0.1, at_least_zero("use 0 (off) or a positive finite value"))
    beta1: float = identity_key(0.9, between(0, 1))
    beta2: float = identity_key(0.95, between(0, 1))
    eps: float = identity_key(1e-8, POSITIVE_FLOAT)
    # global-norm clipping (§3.1)
    grad_clip: float = identity_key(1.0, at_least_zero("use 0 (no clipping) or a positive finite norm"))
    precision: str = identity_key("auto", PRECISION)  # auto = bf16-mixed on GPU (§3.1), 32-true on CPU
    compile: Optional[bool] = execution_key(None)  # torch.compile; null (auto) = on for GPU, off on CPU
    fused: Optional[bool] = execution_key(None)  # fused AdamW kernel; null (auto) = on for GPU
    accelerator: str = execution_key("auto", ACCELERATOR)
    devices: Any = execution_key("auto", DEVICES)  # all visible GPUs; DDP (§3.1)
    num_nodes: int = execution_key(1, POSITIVE)
    # auto (DDP on several devices) | ddp | fsdp (the kit's FSDP2) | a Lightning name
    strategy: str = execution_key("auto", STRATEGY)
    ddp_bucket_cap_mb: int = execution_key(25, POSITIVE)  # DDP all-reduce bucket size in MB (torch's default)
    # gradients as views into the buckets: one copy and one gradient's memory less
    ddp_gradient_as_bucket_view: bool = execution_key(True)
    # true skips DDP's per-step graph bookkeeping; off until measured on GPUs under torch.compile
    ddp_static_graph: bool = execution_key(False)
    # seconds a collective waits for a peer before the run fails as a crash (docs/cluster.md)
    ddp_timeout_s: float = execution_key(600.0, seconds(", e.g. 600"))
    # seconds without a finished batch before the hang watchdog ends the run (docs/cluster.md); 0 = off
    hang_timeout_s: float = execution_key(
        300.0, at_least_zero("use 0 (off) or a positive number of seconds, e.g. 300")
    )
    # the straggler line's check of every rank's step times, every this many steps (docs/cluster.md); 0 = off
    straggler_every_steps: int = execution_key(50, at_least_zero("use 0 (off) or a count of steps, e.g. 50"))
    straggler_slower_pct: float = execution_key(20.0, positive("use a positive percentage, e.g. 20"))
    straggler_intervals: int = execution_key(3, positive("use a positive count of intervals, e.g. 3"))
    # a run of several processes first runs the pre-flight check (prism.train.preflight)
    preflight: bool = execution_key(True)
    # >0: the output layer + cross-entropy this many tokens at a time (the same math); 0 = off
    loss_chunk_tokens: int = execution_key(0, at_least_zero("use 0 (off) or a positive token count"))
    # recompute each block's activations in the backward pass: less memory, about a third more compute
    activation_checkpointing: bool = execution_key(False)
    # GiB per training device for the memory plan; null = the visible GPU's, else 79.1 (docs/performance.md)
    gpu_memory_gib: Optional[float] = execution_key(
        None, optional(POSITIVE_FLOAT, "use null (the visible GPU's memory) or a positive GiB")
    )
    # the memory plan's margin: GiB beyond the tensors, then the share of the rest they may fill
    # (docs/performance.md)
    memory_overhead_gib: float = execution_key(
        1.5, at_least_zero("use 0 or a positive, finite GiB, e.g. 1.5")
    )
    memory_fraction: float = execution_key(0.95, number("use a fraction in (0, 1], e.g. 0.95", gt=0, le=1))
    init_from: InitFromSection = identity_key(factory=InitFromSection)  # context extension
    val_every_steps: int = identity_key(250, POSITIVE)
    ckpt_every_steps: int = execution_key(1000, POSITIVE)
    # step checkpoints kept besides last.ckpt (-1 = all): 757m keeps 3 x 9.1 GB per run
    keep_checkpoints: int = execution_key(
        2, number("use -1 (keep all), 0 (last.ckpt only) or a count", ge=-1)
    )
    log_every_steps: int = execution_key(10, POSITIVE)
    # [START,END]: a profiler trace of these optimizer steps, counted from 1 (docs/profiling.md); [] = off
    profile_steps: list = execution_key(check=PROFILE_STEPS, factory=list)
    # val-loss thresholds for the milestone table
    milestones: list = identity_key(check=MILESTONES, factory=list)
    # where the curves go: any of tensorboard, csv, wandb, mlflow (docs/tracking.md)
    loggers: list = execution_key(check=TRACKERS, factory=lambda: ["tensorboard"])
    wandb: WandbSection = execution_key(factory=WandbSection)
    mlflow: MlflowSection = execution_key(factory=MlflowSection)
    # seconds the end of a run waits for W&B/MLflow to take what is queued, then goes on without them
    tracker_wait_s: float = execution_key(60.0, seconds(", e.g. 60"))
    # zero-shot scores along training every this many tokens (0 = off) on the first eval_limit documents
    # of each of eval_tasks (docs/evaluation.md)
    eval_every_tokens: int = execution_key(0, at_least_zero("use 0 (off) or a token count"))
    eval_tasks: list = execution_key(
        check=tasks("train.eval_tasks"), factory=lambda: ["hellaswag", "piqa", "arc_easy", "winogrande"]
    )
    eval_limit: int = execution_key(500, POSITIVE)


@dataclass
class DataSection:
    # hub | local | shards | offline, or a registered source (prism.data.sources; docs/data.md)
    source: str = identity_key("hub")
    # local: file(s)/folder of parquet|jsonl|txt with a `text` column; shards: prepare_fineweb.py's folder
    path: Optional[str] = identity_key(None)
    hub_name: str = identity_key("HuggingFaceFW/fineweb", NON_EMPTY)  # the hub dataset (source=hub)
    # FineWeb subset (not stated); sample-10BT holds ~10B GPT-2 tokens
    subset: str = identity_key("sample-10BT", NON_EMPTY)
    # hub commit of hub_name, so that runs started weeks apart read the same data; "main" = newest
    revision: str = identity_key("cd85054", NON_EMPTY)
    # held-out validation tokens (size not stated): 10 x 1M-token batches
    val_tokens: int = identity_key(10_485_760, POSITIVE)
    # DataLoader worker processes per rank (0 = in the training process)
    num_workers: int = execution_key(4, at_least_zero("use 0 (in the training process) or more"))
    seed: int = identity_key(1234, SEED)  # the token order depends on this, never on the model variant
    # offline/shards: seeded window permutation per epoch; hub/local: shard order per epoch + window buffer
    shuffle: bool = identity_key(True)
    # hub/local: windows in each reader's shuffle buffer (4 MB); 0 = off
    shuffle_buffer: int = identity_key(2048, at_least_zero("use 0 (off) or more"))
    doc_batch: int = identity_key(256, POSITIVE)  # hub/local: documents read and tokenized per call
    # tiktoken threads per DataLoader worker (scale num_workers first)
    tokenizer_threads: int = execution_key(1, POSITIVE)
    prefetch_factor: int = execution_key(4, POSITIVE)  # micro-batches each DataLoader worker keeps ready
    # datasets' streaming retries per hub request (library default 20)
    hub_retries: int = execution_key(60, POSITIVE)
    # seconds between those retries; the first wait before reopening
    hub_retry_interval_s: float = execution_key(10.0, at_least_zero("use 0 or a finite number of seconds"))
    # tries to open the dataset, waits doubling to 5 min, jittered (~15 min)
    hub_open_attempts: int = execution_key(8, POSITIVE)
    # no document for this long: checkpoint and stop (docs/data.md)
    stall_timeout_s: float = execution_key(900.0, seconds())


@dataclass
class EvalSection:
    tasks: list = setting(check=tasks("eval.tasks"), factory=lambda: list(DEFAULT_TASKS))
    data_dir: Optional[str] = None  # local copies in the hub schemas; None = the hub
    batch_size: int = setting(32, POSITIVE)
    limit: Any = setting(None, EVAL_LIMIT)  # first N documents of each task; below 1: that fraction


@dataclass
class BenchSection:
    steps: int = setting(20, POSITIVE)  # timed rounds
    warmup: int = setting(5, NON_NEGATIVE)  # untimed steps per schedule first (the first compiles)
    micro_batch: Optional[int] = setting(
        None, optional(POSITIVE, "use null (train.micro_batch) or a positive count")
    )  # None = train.micro_batch


@dataclass
class AnalysisSection:
    sequences: int = setting(64, POSITIVE)  # validation sequences for attention distance (count not stated)


@dataclass
class LongContextSection:
    """The long-context evaluation (reproduce/long_context.py; off by default in run_all.py) past the
    training length (docs/evaluation.md, "Beyond the training context")."""

    # "<k>x" = k times model.seq_len, or a token count; never shorter than model.seq_len
    lengths: list = field(default_factory=lambda: ["1x", "2x", "4x", "8x"])
    # model.rope_scaling choices to read each length with (prism.core.rope)
    rope_scalings: list = field(default_factory=lambda: ["none", "linear", "ntk", "yarn"])
    # null: length / model.seq_len at each length
    rope_factor: Optional[float] = setting(None, LONG_CONTEXT_ROPE_FACTOR)
    documents: int = setting(16, POSITIVE)  # held-out documents per length, each at least that long
    buckets: int = setting(16, POSITIVE)  # equal-width position buckets of each window
    # auto: the run's own validation documents when enough are long enough, else `path`'s;
    # own: only the run's; path: only `path`'s
    source: str = setting("auto", one_of(LONG_CONTEXT_SOURCES))
    path: Optional[str] = None  # a jsonl file of long documents, e.g. WikiText-2's test pages
    text_field: str = setting("text", NON_EMPTY)  # the field of each jsonl row that holds its text


@dataclass
class LauncherSection:
    """Command prefix per stage for run_all.py ("" = plain `python script.py`). A prefix starting
    with `torchrun` replaces `python`; any other (srun, mpirun) goes in front of it. Under Slurm
    run_all derives them from the allocation."""

    train: str = setting("", WORDS)  # e.g. "srun --ntasks-per-node=8" or "torchrun --nproc-per-node=8"
    eval: str = setting("", WORDS)
    bench: str = setting("", WORDS)  # one device: e.g. "srun --nodes=1 --ntasks=1"
    analyze: str = setting("", WORDS)
    long_context: str = setting("", WORDS)


@dataclass
class RunAllSection:
    """Orchestration only (run_all.py); never part of a run's identity or config hash."""

    stages: list = setting(check=STAGES, factory=lambda: ["train", "eval", "bench", "analyze", "report"])
    launcher: LauncherSection = field(default_factory=LauncherSection)
    logs_dir: Optional[str] = None  # one log file per stage; None = <results_dir>/<scale>/logs
    # a training that crashed (a rank killed or failing, a collective error: docs/cluster.md) is
    # started again this many times from its newest checkpoint, within the same allocation
    train_retries: int = setting(2, at_least_zero("use 0 (no retry) or a count of retries"))
    # seconds before each retry: a node's processes and ports settle
    retry_pause_s: float = setting(30.0, at_least_zero("use 0 or a finite number of seconds"))


@dataclass
class SearchSection:
    """reproduce/search.py's defaults (docs/search.md); never part of a run's identity, nor of a
    search's definition: a study continues under other values of these."""

    # schedules of the last rung re-run at the full budget (--final), besides uniform
    top_k: int = setting(3, positive("use a positive count of schedules besides uniform, e.g. 3"))
    # a trial whose worker died (SIGKILL, out of memory, a lost node) is tried this many times in
    # all, each attempt resuming its run's checkpoints; a clean stop on a signal does not count
    max_attempts: int = setting(3, positive("use a positive count of attempts, e.g. 3"))
    # how often a worker without a trial looks for one a dead worker left
    idle_poll_s: float = setting(1.0, seconds(", e.g. 1"))
    # two schedules whose Welch p >= alpha are marked "~" (not distinguishable)
    alpha: float = setting(0.05, number("use a significance level in (0, 1), e.g. 0.05", gt=0, lt=1))


@dataclass
class RunConfig:
    # Each field declares what it is to a training run (prism.config.roles.Role); a section of
    # another stage is declared as a whole, the model, train and data sections field by field.
    scale: str = identity_key(MISSING)
    schedule: str = identity_key("prism")  # the variant train.py trains when --schedule is not given
    # name -> compact head list, for this shape; a run's identity holds its resolved heads
    schedules: dict = resolved_key(factory=dict)
    # run_all's (Table 2)
    run_schedules: list = other_stage(check=SCHEDULE_NAMES, factory=lambda: ["uniform", "prism"])
    seeds: list = other_stage(check=SEEDS, factory=lambda: [0, 1, 2])  # three seeds (§3.1); values not stated
    runs_dir: str = other_stage("runs", NON_EMPTY)  # runs/<scale>/<schedule>/seed<k>/
    results_dir: str = other_stage("results", NON_EMPTY)  # results/<scale>/... and results/RESULTS.md
    # the class's defaults, not an instance's: ModelConfig() would fill in uniform heads
    model: ModelConfig = identity_key(factory=lambda: OmegaConf.structured(ModelConfig))
    train: TrainSection = identity_key(factory=TrainSection)
    data: DataSection = identity_key(factory=DataSection)
    eval: EvalSection = other_stage(factory=EvalSection)
    bench: BenchSection = other_stage(factory=BenchSection)
    analysis: AnalysisSection = other_stage(factory=AnalysisSection)
    long_context: LongContextSection = other_stage(factory=LongContextSection)
    run_all: RunAllSection = other_stage(factory=RunAllSection)
    search: SearchSection = other_stage(factory=SearchSection)

    # ----- derived objects ----------------------------------------------------------------
    @property
    def shape(self) -> ModelShape:
        return ModelShape(self.model.n_layer, self.model.d_model, self.model.h_base)

    def head_schedule(self, spec: str | None = None) -> HeadSchedule:
        return HeadSchedule.resolve(spec or self.schedule, self.shape, self.schedules)

    def model_config(self, spec: str | None = None) -> ModelConfig:
        sched = self.head_schedule(spec)
        return replace(self.model, heads=list(sched.heads), schedule_name=sched.name)


# ----- loading --------------------------------------------------------------------------------
def load_yaml(path: Path) -> DictConfig:
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist.")
    try:
        return OmegaConf.load(path)
    except Exception as exc:  # yaml errors carry line numbers; keep them in one sentence
        raise ConfigError(f"config file {path} is not valid YAML: {exc}".replace("\n", " ")) from exc


def available_scales(config_dir: Path | str | None = None) -> list[str]:
    """Every scale: a file configs/scale/<name>.yaml (any name, any shape)."""
    return sorted(p.stem for p in (Path(config_dir or default_config_dir()) / "scale").glob("*.yaml"))


def _schedule_file(path: Path) -> tuple[tuple, dict[str, str]]:
    """A configs/schedules/*.yaml file's (n_layer, d_model, h_base) and schedules (name -> heads)."""
    doc = load_yaml(path)
    named = {
        str(k): str(v["heads"] if isinstance(v, DictConfig) else v)
        for k, v in doc.get("schedules", {}).items()
    }
    return tuple(doc.get("shape", {}).get(k) for k in SHAPE_KEYS), named


def expand_schedule_groups(items: list[str], scale: str, config_dir: Path | str | None = None) -> list[str]:
    """Schedule names as given, where a group name (a file configs/schedules/<group>.yaml, e.g.
    `table5`) stands for uniform, prism and every schedule in that file (run_all's --schedules)."""
    config_dir = Path(config_dir) if config_dir else default_config_dir()
    out: list[str] = []
    for item in items:
        path = config_dir / "schedules" / f"{item}.yaml"
        names = [item]
        if path.is_file():
            defined_for, named = _schedule_file(path)
            ref = load_config(scale, config_dir=config_dir).shape
            if defined_for != astuple(ref):
                n_layer, d_model, h_base = defined_for
                raise ConfigError(
                    f"schedule group {item!r} is defined for n_layer={n_layer}, d_model={d_model}, "
                    f"h_base={h_base}, not for scale {scale} ({ref.n_layer} x {ref.d_model}, "
                    f"h_base {ref.h_base})."
                )
            names = ["uniform", "prism", *named]
        out += [n for n in names if n not in out]
    return out


def load_config(
    scale: str, overrides: list[str] | None = None, config_dir: Path | str | None = None
) -> RunConfig:
    """Merge defaults <- scale <- overrides and validate. Raises ConfigError with one sentence."""
    config_dir = Path(config_dir) if config_dir else default_config_dir()
    scales = available_scales(config_dir)
    if not scales:
        state = "does not exist" if not config_dir.is_dir() else "holds no scale/<scale>.yaml file"
        raise ConfigError(
            f"config folder {config_dir} {state}; point PRISM_CONFIG_DIR at a folder laid out like "
            f"the kit's configs/ (scale/, schedules/), or unset it."
        )
    if scale not in scales:
        raise ConfigError(f"unknown scale {scale!r}: valid scales are {', '.join(scales)}.")

    def complete(cfg: DictConfig) -> None:
        cfg.scale = scale
        shape = ModelShape(*(cfg.model[k] for k in SHAPE_KEYS))
        found: dict[str, str] = {}  # the named schedules of every configs/schedules/*.yaml of this shape
        for path in sorted((config_dir / "schedules").glob("*.yaml")):
            defined_for, named = _schedule_file(path)
            if defined_for == astuple(shape):
                found.update(named)
        cfg.schedules = {**found, **cfg.schedules}
        if not any(str(name).lower() == "prism" for name in cfg.schedules):
            # a scale file without Table 4's row: the documented rule gives its schedule
            cfg.schedules["prism"] = prism_rule(shape).text()

    path = config_dir / "scale" / f"{scale}.yaml"
    layer = load_yaml(path)
    model = layer.get("model") if OmegaConf.is_dict(layer) else None
    missing = [k for k in SHAPE_KEYS if not (OmegaConf.is_dict(model) and k in model)]
    if missing:
        raise ConfigError(
            f"scale file {path} does not set model.{', model.'.join(missing)}; a scale names its "
            f"shape, e.g. `model: {{n_layer: 8, d_model: 128, h_base: 4}}` (docs/scales.md)."
        )
    return _build([layer], overrides, complete)


SHAPE_KEYS = ("n_layer", "d_model", "h_base")  # a scale file's model shape (ModelShape)


def last_of_each_key(overrides: list[str]) -> list[str]:
    """The overrides without those a later one of the same key replaces, so that an earlier value
    is never read at all (not even to be refused for its type)."""
    last = {item.split("=", 1)[0].strip(): i for i, item in enumerate(overrides) if "=" in item}
    return [o for i, o in enumerate(overrides) if "=" not in o or last[o.split("=", 1)[0].strip()] == i]


def repeated_keys(overrides: list[str]) -> list[str]:
    """A warning for each key that one command line gives more than once: the last value counts
    (docs/training.md#overrides), but a key typed twice by mistake does not pass unseen."""
    given: dict[str, list[str]] = {}
    for item in overrides:
        if "=" in item:
            given.setdefault(item.split("=", 1)[0].strip(), []).append(item)
    return [
        f"config key {key} is given {'twice' if len(items) == 2 else f'{len(items)} times'} "
        f"({', then '.join(items)}); the last, {items[-1]}, is used."
        for key, items in given.items()
        if len(items) > 1
    ]


def config_from_dict(saved: dict, overrides: list[str] | None = None) -> RunConfig:
    """A config a run saved (`to_dict(RunConfig)`, e.g. a checkpoint's `run`) with overrides, validated."""
    return _build([saved], overrides)


AUTO_SWITCHES = ("compile", "fused")  # train.<switch>: true, false, or null = auto


def _build(layers: list, overrides: list[str] | None, complete=None) -> RunConfig:
    """Merge `layers` and `overrides` onto the schema, then type-check and validate."""
    try:
        for layer in layers:  # configs saved before these switches were typed say "auto" for null
            train = layer.get("train") if hasattr(layer, "get") else None
            for key in AUTO_SWITCHES:
                if train is not None and str(train.get(key, "")).lower() == "auto":
                    train[key] = None
        cfg = OmegaConf.merge(OmegaConf.structured(RunConfig), *layers)
        for item in last_of_each_key(overrides or []):
            cfg = OmegaConf.merge(cfg, _override_patch(cfg, item))
        if complete is not None:
            complete(cfg)
        for key in DERIVED_MODEL_KEYS:
            if OmegaConf.select(cfg, f"model.{key}") != getattr(ModelConfig, key):
                raise ConfigError(
                    f"model.{key} is set by the run's schedule, not by the config; use "
                    f"schedule=NAME or a head list (train.py --schedule)."
                )
        run: RunConfig = OmegaConf.to_object(cfg)
    except OmegaConfBaseException as exc:
        key = getattr(exc, "full_key", None) or "?"
        raise ConfigError(f"config key {key!r} is invalid: {first_line(exc)}.") from None
    except ScheduleError as exc:
        raise ConfigError(f"model shape is invalid: {exc}") from None
    except ValueError as exc:  # ModelConfig's own checks, an override that does not parse
        raise ConfigError(str(exc)) from None
    validate(run)
    return run


def _override_patch(cfg: DictConfig, item: str) -> DictConfig:
    """One `key=value` override (prism.config.overrides) as a config to merge onto `cfg`."""
    key, value = parse_override(item)
    if _declared_text(key) and isinstance(value, (bool, int, float)):
        # a text field keeps the text as given: a revision 1234e56 or a folder 1e3 is no number
        value = item.split("=", 1)[1]
    if key in [f"train.{k}" for k in AUTO_SWITCHES] and str(value).strip().lower() == "auto":
        value = None
    node = OmegaConf.select(cfg, key, default=None, throw_on_missing=False)
    if OmegaConf.is_list(node) and not isinstance(value, list):
        # a valid example, never the refused value again
        example = getattr(rules(RunConfig).get(key), "example", None) or "[]"
        raise ConfigError(f"{key} must be a list, e.g. {key}={example}.")
    if OmegaConf.is_dict(node) and not isinstance(value, dict):
        raise ConfigError(
            f"{key} is a mapping: set one of its keys ({key}.NAME=value) or give one, e.g. "
            f"{key}={{NAME: value}}."
        )
    return as_patch(key, value)


def _declared_text(key: str) -> bool:
    """Whether the schema declares `key` (dotted) a text field: str or Optional[str]."""
    cls: Any = RunConfig
    for part in key.split("."):  # None once a part is not a field of a section
        cls = typing.get_type_hints(cls).get(part) if dataclasses.is_dataclass(cls) else None
    return cls is str or cls == Optional[str]


def validate(run: RunConfig) -> None:
    """Checks that need more than a type: every value's range (prism.config.values), then the
    rules between fields. What a component knows (a data source's keys, task names) it checks
    itself, before any step (prism.train.plan)."""
    check_values(run)
    t, m = run.train, run.model
    if t.global_batch_tokens % m.seq_len:
        raise ConfigError(
            f"train.global_batch_tokens={t.global_batch_tokens} is not a multiple of "
            f"model.seq_len={m.seq_len}."
        )
    if t.tokens < t.global_batch_tokens:
        raise ConfigError(
            f"train.tokens={t.tokens} is smaller than one optimizer step of "
            f"train.global_batch_tokens={t.global_batch_tokens} tokens."
        )
    try:
        for name in {run.schedule, *run.run_schedules, *run.schedules}:
            run.model_config(name)  # resolves the heads; the decoder checks their widths' RoPE
    except ScheduleError as exc:
        raise ConfigError(f"schedule is invalid: {exc}") from None
    except ValueError as exc:  # ModelConfig's own checks, at the schedule's head widths
        raise ConfigError(str(exc)) from None


# Every field of the decoder's config is part of a run's identity except the per-layer heads and
# their name, which the run's schedule fills in (the identity holds the schedule instead).
declare(
    ModelConfig,
    Role.identity,
    roles=dict(heads=Role.resolved, schedule_name=Role.resolved),
    checks=dict(
        vocab_size=VOCAB,
        vocab_multiple=POSITIVE,
        seq_len=POSITIVE,
        mlp_hidden=optional(POSITIVE, "use null (8*d_model/3, rounded) or a positive width"),
        norm_eps=POSITIVE_FLOAT,
        dropout=between(0, 1),
        init_std=POSITIVE_FLOAT,
        rope_base=POSITIVE_FLOAT,
        rope_factor=ROPE_FACTOR,
    ),
)
DERIVED_MODEL_KEYS = tuple(k for k, (role, _) in role_tree(ModelConfig).items() if role is Role.resolved)


def to_dict(run: RunConfig) -> dict:
    """Plain containers only (enums as their names): what checkpoints, config.yaml and hashes
    hold. The model's heads are left out: the schedule decides them (RunConfig.model_config)."""
    d = OmegaConf.to_container(OmegaConf.structured(run), resolve=True, enum_to_str=True)
    for key in DERIVED_MODEL_KEYS:
        d["model"].pop(key, None)
    return d
