"""A training run's identity, and whether it is finished: the one answer training, resume and
the pipeline all use.

Two runs are the same run when their *identity* is equal: the resolved config without the keys
that only say how it executes (EXECUTION_KEYS: hardware layout, batch split, compile, logging and
checkpoint cadence, data-loading workers; a run may resume with other values) and without other
stages' and the orchestrator's settings (NON_TRAINING_KEYS), with the schedule replaced by its
per-layer head counts. Its `config_hash` is written into train_summary.json and the pipeline's
stage records; a run is finished when its train_summary.json says so under that hash.
"""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prism.schedule import HeadSchedule, ModelShape

if TYPE_CHECKING:
    from prism.config import RunConfig

RUN_CONFIG_NAME = "config.yaml"  # the run's resolved config, in its run folder
SUMMARY_NAME = "train_summary.json"  # written at the end: the "finished" marker

# Keys that say how a run executes, not what it computes (hardware layout, batch split, compile,
# logging and checkpoint cadence, data-loading workers): a run may resume with other values, so
# they stay out of a training run's identity (config_hash).
EXECUTION_KEYS = {
    "train": (
        "devices",
        "num_nodes",
        "strategy",
        "accelerator",
        "micro_batch",
        "compile",
        "fused",
        "log_every_steps",
        "ckpt_every_steps",
        "keep_checkpoints",
        "ddp_bucket_cap_mb",
        "ddp_gradient_as_bucket_view",
        "ddp_static_graph",
        "loss_chunk_tokens",
    ),
    "data": (
        "num_workers",
        "prefetch_factor",
        "tokenizer_threads",
        "hub_retries",
        "hub_retry_interval_s",
        "hub_open_attempts",
        "stall_timeout_s",
    ),
}
# Top-level keys that belong to other stages or to the orchestrator, never to a training run.
NON_TRAINING_KEYS = (
    "runs_dir",
    "results_dir",
    "run_schedules",
    "seeds",
    "schedules",
    "eval",
    "bench",
    "analysis",
    "run_all",
)


def stable_hash(obj: Any) -> str:
    """16 hex digits of sha256 over canonical JSON (key order does not matter): the identity of
    a configuration in run records and train_summary.json."""
    blob = json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def training_identity(full: dict, schedule: str | None = None, seed: int | None = None) -> dict:
    """What decides a training run's result, from a resolved config dict (`to_dict(RunConfig)`
    or a run's saved config.yaml)."""
    d = copy.deepcopy(full)
    if schedule is not None:
        d["schedule"] = schedule
    if seed is not None:
        d["train"]["seed"] = int(seed)
    m = d["model"]
    shape = ModelShape(int(m["n_layer"]), int(m["d_model"]), int(m["h_base"]))
    d["heads"] = list(HeadSchedule.resolve(d["schedule"], shape, d.get("schedules") or {}).heads)
    for key in NON_TRAINING_KEYS:
        d.pop(key, None)
    for section, keys in EXECUTION_KEYS.items():
        for key in keys:
            d.get(section, {}).pop(key, None)
    if d.get("data", {}).get("source") != "hub":  # only the hub stream reads a revision
        d.get("data", {}).pop("revision", None)
    return d


def config_hash(cfg: "RunConfig") -> str:
    """The identity hash of a run config (what train_summary.json records as config_hash)."""
    from prism.config import to_dict

    return stable_hash(training_identity(to_dict(cfg)))


def saved_identity(run_dir: Path) -> dict:
    """The identity of the run trained in `run_dir`, from the config.yaml it saved (raises if
    that file is missing or unreadable)."""
    from omegaconf import OmegaConf

    return training_identity(
        OmegaConf.to_container(OmegaConf.load(Path(run_dir) / RUN_CONFIG_NAME), resolve=True)
    )


def read_summary(run_dir: Path) -> dict | None:
    """The run's train_summary.json, or None when it has none (or an unreadable one)."""
    try:
        doc = json.loads((Path(run_dir) / SUMMARY_NAME).read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def is_finished(summary: dict | None) -> bool:
    return bool(summary) and summary.get("finished") is True


def finished_summary(run_dir: Path, digest: str) -> dict | None:
    """The summary of a finished run with identity hash `digest` in `run_dir`, else None."""
    summary = read_summary(run_dir)
    return summary if is_finished(summary) and summary.get("config_hash") == digest else None
