"""Context extension: a run that starts from another run's final weights at a longer model.seq_len,
otherwise a normal run (docs/training.md#context-extension)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from omegaconf import OmegaConf

from prism.config.schema import RunConfig
from prism.core.model import ModelConfig, PrismDecoder
from prism.errors import ConfigError
from prism.runs.checkpoint import CheckpointError, check_weights, load_model
from prism.runs.identity import final_weights, init_from_hash, read_summary
from prism.runs.layout import RUN_CONFIG_NAME
from prism.runs.records import TrainSummary

# what the weights' shapes and meaning depend on: an extension keeps all of them
SHAPE_KEYS = "n_layer d_model h_base heads vocab_size vocab_multiple hidden norm bias tie_embeddings".split()


@dataclass(frozen=True)
class SourceRun:
    """The finished run an extension starts from, as its folder records it."""

    folder: Path
    config_hash: str
    summary: TrainSummary
    model: ModelConfig
    weights: Path


def read_source(folder: str | Path) -> SourceRun:
    """The finished run in `folder`; a ConfigError in one sentence for any other folder."""
    folder = Path(folder)
    digest = init_from_hash(folder)  # refuses an unfinished run, naming what is missing
    summary = read_summary(folder)
    try:
        saved = OmegaConf.to_container(OmegaConf.load(folder / RUN_CONFIG_NAME), resolve=True)
        known = {f.name for f in dataclasses.fields(ModelConfig)}
        model_dict = {k: v for k, v in saved["model"].items() if k in known}
        model = ModelConfig(**{**model_dict, "heads": list(summary.heads)})
    except Exception as exc:  # a missing or hand-edited config.yaml, a summary without heads
        raise ConfigError(
            f"train.init_from.run={folder} has no readable model config ({folder / RUN_CONFIG_NAME}: "
            f"{type(exc).__name__}); give the folder of a run this kit trained."
        ) from None
    return SourceRun(folder, digest, summary, model, final_weights(folder))


def check_extension(cfg: RunConfig) -> SourceRun | None:
    """The source run of an extension (None for any other run), read once; refused, in one
    sentence, when it is unfinished, of another shape, or trained at a length not shorter."""
    init = cfg.train.init_from
    if not (init.run or init.config_hash):  # not an extension
        return None
    if not init.run:
        raise ConfigError(
            f"train.init_from.config_hash={init.config_hash} is set without train.init_from.run; "
            f"give the folder of the run to start from, train.init_from.run=runs/<scale>/<schedule>/seed<k>."
        )
    source = read_source(init.run)
    if init.config_hash and init.config_hash != source.config_hash:
        raise ConfigError(
            f"train.init_from.config_hash={init.config_hash} is not the hash of {init.run}, which is "
            f"{source.config_hash}; leave train.init_from.config_hash out (it is read from the run)."
        )
    new = cfg.model_config()
    for key in SHAPE_KEYS:
        was, now = getattr(source.model, key), getattr(new, key)
        if was == now:
            continue
        if key == "heads":
            name = source.summary.schedule
            raise ConfigError(
                f"train.init_from.run={init.run} was trained with heads {was} (schedule {name}), not "
                f"this run's {now}; an extension keeps the source's schedule: use --schedule {name}."
            )
        key = "mlp_hidden" if key == "hidden" else key  # the config key that sets the MLP width
        raise ConfigError(
            f"train.init_from.run={init.run} has model.{key}={was}, this run {now}; an extension "
            f"keeps the source's shape and changes only model.seq_len and the RoPE settings."
        )
    if new.seq_len <= source.model.seq_len:
        raise ConfigError(
            f"model.seq_len={new.seq_len} is not longer than the {source.model.seq_len} tokens "
            f"{init.run} was trained at; an extension needs model.seq_len > {source.model.seq_len}, "
            f"e.g. {2 * source.model.seq_len}."
        )
    try:  # the final weights open and fit their config (no tensor read), before any folder is written
        check_weights(source.weights)
    except CheckpointError as exc:
        raise ConfigError(
            f"train.init_from.run={source.folder} has final weights that cannot be read: {exc}"
        ) from None
    trained_at = new.train_len
    if new.rope_scaling == "yarn" and trained_at != source.model.seq_len:
        # YaRN places its ramp by the length the weights were pretrained at, not the new one
        raise ConfigError(
            f"model.rope_scaling=yarn treats {trained_at} tokens as the pretrained length, but "
            f"{init.run} was trained at {source.model.seq_len}; pass "
            f"model.rope_train_len={source.model.seq_len}."
        )
    return source


def source_info(source: SourceRun) -> dict:
    """What train_summary.json and the exported weights record of the source run."""
    run = {k: getattr(source.summary, k) for k in ("scale", "schedule", "seed", "steps", "tokens_seen")}
    return {
        "run": str(source.folder),
        "config_hash": source.config_hash,
        **run,
        "seq_len": source.model.seq_len,
    }


def load_source_weights(model: PrismDecoder, source: SourceRun) -> None:
    """Copy the source's final weights into `model` (a fresh start), strictly."""
    loaded, _ = load_model(source.weights)
    model.load_state_dict(loaded.state_dict())
