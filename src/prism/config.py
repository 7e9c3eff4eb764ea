"""Typed, validated run configuration.

`configs/base.yaml` (paper §3.1) <- `configs/scale/<scale>.yaml` (Table 1 + Table 4) <-
`key=value` overrides, merged by OmegaConf onto the dataclasses below. Named schedules come from
the scale file and from every `configs/schedules/*.yaml` whose shape matches the scale's model.
An unknown key or a wrong type stops with one sentence naming the key.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional

from omegaconf import MISSING, DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from prism.model import ModelConfig
from prism.schedule import HeadSchedule, ModelShape, ScheduleError

SCALES = ("tiny", "124m", "354m", "757m")

class ConfigError(ValueError):
    """A configuration value that cannot be used; the message names the key."""


def default_config_dir() -> Path:
    env = os.environ.get("PRISM_CONFIG_DIR")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[2] / "configs"


# ----- sections -------------------------------------------------------------------------------
@dataclass
class ModelSection:
    n_layer: int = MISSING
    d_model: int = MISSING
    h_base: int = MISSING
    vocab_size: int = 50257
    vocab_multiple: int = 64
    seq_len: int = 1024
    mlp_hidden: Optional[int] = None
    norm: str = "layernorm"
    norm_eps: float = 1e-5
    bias: bool = False
    dropout: float = 0.0
    init_std: float = 0.02
    rope_base: float = 10000.0
    tie_embeddings: bool = True


@dataclass
class TrainSection:
    seed: int = 0
    tokens: int = MISSING                 # training-token budget (Table 1)
    global_batch_tokens: int = MISSING    # tokens per optimizer step (Table 1)
    micro_batch: int = 16                 # sequences per device per forward
    lr: float = MISSING                   # peak LR (Table 1)
    min_lr_ratio: float = 0.1             # final LR / peak: not stated in the paper
    warmup_frac: float = 0.025            # §3.1: linear warmup over the first 2.5 % of tokens
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    grad_clip: float = 1.0
    precision: str = "auto"               # auto = bf16-mixed on GPU, 32-true on CPU
    compile: str = "auto"                 # auto = on for GPU, off on CPU; or "true"/"false"
    fused: str = "auto"                   # fused AdamW kernel: auto = on for GPU; or "true"/"false"
    accelerator: str = "auto"
    devices: Any = "auto"
    num_nodes: int = 1
    strategy: str = "auto"
    ddp_bucket_cap_mb: int = 25           # DDP gradient bucket size (torch's default)
    ddp_gradient_as_bucket_view: bool = True   # gradients live in the buckets: no copy, less memory
    ddp_static_graph: bool = False        # not measured with torch.compile yet; see base.yaml
    loss_chunk_tokens: int = 0            # output layer + loss in chunks of this many tokens; 0 = whole
    val_every_steps: int = 250
    ckpt_every_steps: int = 1000
    keep_checkpoints: int = 2             # newest step checkpoints kept besides last.ckpt; -1 = all
    log_every_steps: int = 10
    milestones: list = field(default_factory=list)  # val-loss thresholds for the milestone table


@dataclass
class DataSection:
    source: str = "offline"               # offline | hub | local | shards
    path: Optional[str] = None            # local files/folder, or shard folder
    hub_name: str = "HuggingFaceFW/fineweb"
    subset: str = "sample-10BT"
    revision: str = "cd85054"             # hub commit read by every run (see base.yaml)
    val_tokens: int = 1_048_576           # fixed held-out set, identical for every variant
    num_workers: int = 2
    seed: int = 1234                      # the data order depends on this, never on the model
    shuffle: bool = True                  # shuffle training windows (see base.yaml for how per source)
    shuffle_buffer: int = 2048            # hub/local: windows in each reader's shuffle buffer
    doc_batch: int = 256                  # hub/local: documents read and tokenized per call
    tokenizer_threads: int = 1            # tiktoken threads per DataLoader worker
    prefetch_factor: int = 4              # micro-batches each DataLoader worker keeps ready
    hub_retries: int = 60                 # datasets streaming retries per request (default 20)
    hub_retry_interval_s: float = 10.0    # seconds between those retries; first wait when opening
    hub_open_attempts: int = 8            # tries to open the hub dataset, waits doubling to 5 min
    stall_timeout_s: float = 900.0        # no document for this long = a clear error, not a hang


@dataclass
class EvalSection:
    tasks: list = field(default_factory=lambda: ["hellaswag", "piqa", "arc_easy", "winogrande",
                                                 "blimp", "wikitext"])
    data_dir: Optional[str] = None
    batch_size: int = 32
    limit: Optional[int] = None


@dataclass
class BenchSection:
    steps: int = 20
    warmup: int = 5
    micro_batch: Optional[int] = None     # None = train.micro_batch


@dataclass
class AnalysisSection:
    sequences: int = 64


@dataclass
class LauncherSection:
    """Command prefix per stage for run_all.py ("" = plain `python script.py`). A prefix starting
    with `torchrun` replaces `python`; any other (srun, mpirun) goes in front of it."""

    train: str = ""
    eval: str = ""
    bench: str = ""
    analyze: str = ""


@dataclass
class RunAllSection:
    """Orchestration only (run_all.py); never part of a run's identity or config hash."""

    stages: list = field(default_factory=lambda: ["train", "eval", "bench", "analyze", "report"])
    launcher: LauncherSection = field(default_factory=LauncherSection)
    logs_dir: Optional[str] = None        # None = <results_dir>/<scale>/logs


@dataclass
class RunConfig:
    scale: str = MISSING
    schedule: str = "prism"               # the variant this run trains
    schedules: dict = field(default_factory=dict)  # name -> compact head list, for this shape
    run_schedules: list = field(default_factory=lambda: ["uniform", "prism"])
    seeds: list = field(default_factory=lambda: [0])
    runs_dir: str = "runs"
    results_dir: str = "results"
    model: ModelSection = field(default_factory=ModelSection)
    train: TrainSection = field(default_factory=TrainSection)
    data: DataSection = field(default_factory=DataSection)
    eval: EvalSection = field(default_factory=EvalSection)
    bench: BenchSection = field(default_factory=BenchSection)
    analysis: AnalysisSection = field(default_factory=AnalysisSection)
    run_all: RunAllSection = field(default_factory=RunAllSection)

    # ----- derived objects ----------------------------------------------------------------
    @property
    def shape(self) -> ModelShape:
        return ModelShape(self.model.n_layer, self.model.d_model, self.model.h_base)

    def head_schedule(self, spec: str | None = None) -> HeadSchedule:
        return HeadSchedule.resolve(spec or self.schedule, self.shape, self.schedules)

    def model_config(self, spec: str | None = None) -> ModelConfig:
        sched = self.head_schedule(spec)
        fields = asdict(self.model)
        return ModelConfig(**fields, heads=list(sched.heads), schedule_name=sched.name)


# ----- loading --------------------------------------------------------------------------------
def _load_yaml(path: Path) -> DictConfig:
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist.")
    try:
        return OmegaConf.load(path)
    except Exception as exc:  # yaml errors carry line numbers; keep them in one sentence
        raise ConfigError(f"config file {path} is not valid YAML: {exc}".replace("\n", " ")) from exc


def available_scales(config_dir: Path | None = None) -> list[str]:
    d = (config_dir or default_config_dir()) / "scale"
    return sorted(p.stem for p in d.glob("*.yaml"))


def _matching_named_schedules(config_dir: Path, shape: ModelShape) -> dict[str, str]:
    """Named schedules from configs/schedules/*.yaml whose `shape` equals this model's."""
    found: dict[str, str] = {}
    for path in sorted((config_dir / "schedules").glob("*.yaml")):
        doc = _load_yaml(path)
        s = doc.get("shape", {})
        if (s.get("n_layer"), s.get("d_model"), s.get("h_base")) == (shape.n_layer, shape.d_model, shape.h_base):
            found.update({str(k): str(v["heads"] if isinstance(v, DictConfig) else v)
                          for k, v in doc.get("schedules", {}).items()})
    return found


def load_config(scale: str, overrides: list[str] | None = None,
                config_dir: Path | str | None = None) -> RunConfig:
    """Merge base <- scale <- overrides and validate. Raises ConfigError with one sentence."""
    config_dir = Path(config_dir) if config_dir else default_config_dir()
    scales = available_scales(config_dir)
    if scale not in scales:
        raise ConfigError(f"unknown scale {scale!r}: valid scales are {', '.join(scales)}.")

    def complete(cfg: DictConfig) -> None:
        cfg.scale = scale
        shape = ModelShape(cfg.model.n_layer, cfg.model.d_model, cfg.model.h_base)
        cfg.schedules = {**_matching_named_schedules(config_dir, shape), **cfg.schedules}

    return _build([_load_yaml(config_dir / "base.yaml"), _load_yaml(config_dir / "scale" / f"{scale}.yaml")],
                  overrides, complete)


def config_from_dict(saved: dict, overrides: list[str] | None = None) -> RunConfig:
    """A resolved config saved by a run (`to_dict(RunConfig)`, e.g. a checkpoint's `run`), with
    `key=value` overrides, validated like `load_config`."""
    return _build([saved], overrides)


def _build(layers: list, overrides: list[str] | None, complete=None) -> RunConfig:
    """Merge `layers` and `overrides` onto the schema, then type-check and validate."""
    try:
        cfg = OmegaConf.merge(OmegaConf.structured(RunConfig), *layers)
        for item in overrides or []:
            if "=" not in item:
                raise ConfigError(f"override {item!r} is not of the form key=value (e.g. train.lr=3e-4).")
            cfg = OmegaConf.merge(cfg, OmegaConf.from_dotlist([item]))
        if complete is not None:
            complete(cfg)
        run: RunConfig = OmegaConf.to_object(cfg)
    except OmegaConfBaseException as exc:
        key = getattr(exc, "full_key", None) or "?"
        msg = str(exc).splitlines()[0]
        raise ConfigError(f"config key {key!r} is invalid: {msg}.") from None
    except ScheduleError as exc:
        raise ConfigError(f"model shape is invalid: {exc}") from None
    validate(run)
    return run


def validate(run: RunConfig) -> None:
    """Checks that need more than a type: ranges and cross-field rules."""
    t, d, m = run.train, run.data, run.model

    def positive(name: str, value: float) -> None:
        if value is None or value <= 0:
            raise ConfigError(f"{name}={value!r} is invalid: it must be positive.")

    for name in ("tokens", "global_batch_tokens", "micro_batch", "lr", "val_every_steps",
                 "ckpt_every_steps", "log_every_steps"):
        positive(f"train.{name}", getattr(t, name))
    positive("model.seq_len", m.seq_len)
    positive("data.val_tokens", d.val_tokens)
    if t.keep_checkpoints < -1:
        raise ConfigError(f"train.keep_checkpoints={t.keep_checkpoints!r} is invalid: use -1 (keep "
                          f"all), 0 (last.ckpt only) or a count.")
    if not 0 <= t.warmup_frac < 1:
        raise ConfigError(f"train.warmup_frac={t.warmup_frac!r} is invalid: use a fraction in [0, 1).")
    if not 0 <= t.min_lr_ratio <= 1:
        raise ConfigError(f"train.min_lr_ratio={t.min_lr_ratio!r} is invalid: use a value in [0, 1].")
    if d.source not in ("offline", "hub", "local", "shards"):
        raise ConfigError(f"data.source={d.source!r} is invalid: use offline, hub, local or shards.")
    if d.source in ("local", "shards") and not d.path:
        raise ConfigError(f"data.source={d.source} needs data.path, the folder or file(s) to read.")
    if t.global_batch_tokens % m.seq_len:
        raise ConfigError(f"train.global_batch_tokens={t.global_batch_tokens} is not a multiple of "
                          f"model.seq_len={m.seq_len}.")
    if t.tokens < t.global_batch_tokens:
        raise ConfigError(f"train.tokens={t.tokens} is smaller than one optimizer step of "
                          f"train.global_batch_tokens={t.global_batch_tokens} tokens.")
    try:
        for name in {run.schedule, *run.run_schedules, *run.schedules}:
            run.head_schedule(name)
    except ScheduleError as exc:
        raise ConfigError(f"schedule is invalid: {exc}") from None
    try:
        ModelConfig(**asdict(m))
    except (ValueError, ScheduleError) as exc:
        raise ConfigError(str(exc)) from None


def to_dict(run: RunConfig) -> dict:
    return OmegaConf.to_container(OmegaConf.structured(run), resolve=True)
