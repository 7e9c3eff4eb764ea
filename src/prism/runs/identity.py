"""A training run's identity, and whether it is finished: the one answer training, resume and
the pipeline all use (docs/design.md, "Run identity")."""

from __future__ import annotations

import copy
import hashlib
import json
from functools import lru_cache
from pathlib import Path
from typing import Any

from prism.config.roles import Role, role_tree
from prism.config.schema import RunConfig, to_dict
from prism.core.schedule import HeadSchedule, ModelShape
from prism.errors import ConfigError
from prism.runs.layout import RUN_CONFIG_NAME, SUMMARY_NAME, WEIGHTS_NAME, last_checkpoint
from prism.runs.records import TrainSummary


@lru_cache(maxsize=None)
def _run_roles() -> dict[str, tuple[Role, dict | None]]:
    return role_tree(RunConfig)


def _keep_identity(d: dict, tree: dict[str, tuple[Role, dict | None]]) -> None:
    """Drop the keys of `d` whose field is not part of the identity; keys the schema does not
    know (a saved config of an older kit) stay, so they are seen as a difference."""
    for key in list(d):
        if key not in tree:
            continue
        role, sub = tree[key]
        if role is not Role.identity:
            del d[key]
        elif sub is not None and isinstance(d[key], dict):
            _keep_identity(d[key], sub)


# Identity keys added after runs carried hashes, with the value every earlier run had implicitly:
# at that value the key stays out of the identity, so those runs keep their config_hash; any other
# value is a different run.
LATER_KEYS = {
    "model.rope_scaling": "none",
    "model.rope_factor": 1.0,
    "model.rope_beta_fast": 32.0,
    "model.rope_beta_slow": 1.0,
    "model.rope_train_len": None,
    "train.init_from": {"config_hash": None},  # a run that starts from no other run's weights
}


def _same_rope_math(model: dict) -> None:
    """RoPE settings that compute the same model written one way: any choice at factor 1, and
    `none` at any factor, is plain RoPE; only YaRN reads the betas and the pretrained length."""
    scaling, factor = model.get("rope_scaling", "none"), model.get("rope_factor", 1.0)
    if scaling == "none" or factor == 1:
        model.update(rope_scaling="none", rope_factor=1.0)
    if model.get("rope_scaling", "none") != "yarn":
        for key in ("rope_beta_fast", "rope_beta_slow", "rope_train_len"):
            if key in model:
                model[key] = LATER_KEYS[f"model.{key}"]


def drop_later_keys_at_default(d: dict) -> dict:
    """`d` (a config dict or identity) without the LATER_KEYS that hold their earlier value, RoPE
    settings first written the one way that computes the same model."""
    if isinstance(d.get("model"), dict):
        _same_rope_math(d["model"])
    for key, earlier in LATER_KEYS.items():
        section, name = key.split(".")
        if isinstance(d.get(section), dict) and name in d[section] and d[section][name] == earlier:
            del d[section][name]
    return d


# ----- identity and hash ------------------------------------------------------------------------
def stable_hash(obj: Any) -> str:
    """16 hex digits of sha256 over canonical JSON (key order aside): a configuration's identity."""
    blob = json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def training_identity(full: dict, schedule: str | None = None, seed: int | None = None) -> dict:
    """What decides a training run's result, from a resolved config dict (to_dict or config.yaml)."""
    d = copy.deepcopy(full)
    if schedule is not None:
        d["schedule"] = schedule
    if seed is not None:
        d["train"]["seed"] = int(seed)
    shape = ModelShape(*(int(d["model"][k]) for k in ("n_layer", "d_model", "h_base")))
    d["heads"] = list(HeadSchedule.resolve(d["schedule"], shape, d.get("schedules") or {}).heads)
    # a context extension's identity holds the hash of the run it starts from, read from that
    # run's folder when the config does not hold it yet (before _keep_identity drops the folder)
    init = (d.get("train") or {}).get("init_from")
    if isinstance(init, dict) and init.get("run") and not init.get("config_hash"):
        init["config_hash"] = init_from_hash(init["run"])
    _keep_identity(d, _run_roles())
    drop_later_keys_at_default(d)
    from prism.data.sources import identity_keys_not_read  # e.g. the revision: only the hub reads one

    for key in identity_keys_not_read(d.get("data", {})):
        d.get("data", {}).pop(key, None)
    return d


# Identity keys that may differ between the scales of one ladder or one scaling fit: the shape,
# the size-dependent settings (Table 1: tokens, batch, LR; the data subset that holds the tokens;
# the milestones' thresholds), and what tells the runs of one scale apart (schedule, seed).
SCALE_KEYS = tuple(
    (
        "scale schedule heads model.n_layer model.d_model model.h_base model.heads model.schedule_name "
        "train.tokens train.global_batch_tokens train.lr train.micro_batch train.milestones train.seed "
        "data.subset"
    ).split()
)


def recipe_of(identity: dict) -> dict:
    """A run's recipe: its identity (training_identity) without SCALE_KEYS. Runs of one recipe
    differ only in size, schedule and seed, so that a fit across scales compares like with like."""
    d = copy.deepcopy(identity)
    for key in SCALE_KEYS:  # a top-level key or section.name
        section, _, name = key.rpartition(".")
        node = d.get(section) if section else d
        if isinstance(node, dict):
            node.pop(name, None)
    return d


def recipe_differences(a: dict, b: dict) -> list[str]:
    """Dotted keys whose values differ between two recipes (or identities), sorted; keys both
    hold first, because a key only one holds follows from another (a data source's own keys)."""
    both, one = [], []

    def walk(x: dict, y: dict, prefix: str) -> None:
        for key in sorted(set(x) | set(y), key=str):
            u, v = x.get(key), y.get(key)
            if isinstance(u, dict) and isinstance(v, dict):
                walk(u, v, f"{prefix}{key}.")
            elif key not in x or key not in y:
                one.append(prefix + key)
            elif u != v:
                both.append(prefix + key)

    walk(a, b, "")
    return both + one


def init_from_hash(run: str | Path) -> str:
    """The config_hash of the finished run in folder `run` (train.init_from.run); ConfigError if none."""
    summary = read_summary(Path(run))
    if not Path(run).is_dir():
        reason = "the folder does not exist"
    elif not (Path(run) / SUMMARY_NAME).is_file():
        reason = f"its training has not finished: it holds no {SUMMARY_NAME}"
    elif summary is None or not summary.config_hash:
        reason = f"its {SUMMARY_NAME} does not mark it finished"
    elif final_weights(Path(run)) is None:
        reason = "it holds no final weights"
    else:
        return summary.config_hash
    raise ConfigError(
        f"train.init_from.run={run} is not a finished run ({reason}); finish that run first (its "
        f"train.py command resumes it) or give the folder of a finished one, runs/<scale>/<schedule>/seed<k>."
    )


def config_hash(cfg: RunConfig) -> str:
    """The identity hash of a run config (what train_summary.json records as config_hash)."""
    return stable_hash(training_identity(to_dict(cfg)))


def saved_identity(run_dir: Path) -> dict:
    """The identity of the run in `run_dir`, from the config.yaml it saved (raises if it is unreadable)."""
    from omegaconf import OmegaConf

    return training_identity(
        OmegaConf.to_container(OmegaConf.load(Path(run_dir) / RUN_CONFIG_NAME), resolve=True)
    )


def read_summary(run_dir: Path) -> TrainSummary | None:
    """The summary of the finished run in `run_dir`; None without one that its record accepts."""
    return TrainSummary.read(Path(run_dir) / SUMMARY_NAME, [])


def final_weights(run_dir: Path) -> Path | None:
    """A run folder's final weights: its exported safetensors, else its last checkpoint, else None."""
    return next((p for p in (Path(run_dir) / WEIGHTS_NAME, last_checkpoint(run_dir)) if p.is_file()), None)


def summary_if_finished_with_hash(run_dir: Path, digest: str) -> TrainSummary | None:
    """The summary of a finished run with identity hash `digest` in `run_dir`, else None."""
    summary = read_summary(run_dir)
    return summary if summary is not None and summary.config_hash == digest else None
