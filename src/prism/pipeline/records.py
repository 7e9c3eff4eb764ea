"""Stage records beside their outputs: the config that decides the result, its hash and a status;
run_all.py trusts an output only beside a `done` record of the same hash (docs/outputs.md)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prism.io import atomic_write_json

RECORD_VERSION = 1


def flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    """{'train.lr': 0.0006, ...}: the leaves of nested dicts under their dotted keys."""
    if not isinstance(d, dict):
        return {prefix[:-1]: d}
    leaves: dict[str, Any] = {}
    for k, v in d.items():
        leaves.update(flatten(v, f"{prefix}{k}."))
    return leaves


def diff_configs(old: dict, new: dict, limit: int = 6) -> str:
    """'train.lr 0.0006 -> 0.0003, model.norm layernorm -> rmsnorm' (at most `limit` keys)."""
    a, b = flatten(old), flatten(new)
    keys = sorted(k for k in set(a) | set(b) if a.get(k, "<unset>") != b.get(k, "<unset>"))
    parts = [f"{k} {a.get(k, '<unset>')!s} -> {b.get(k, '<unset>')!s}" for k in keys[:limit]]
    if len(keys) > limit:
        parts.append(f"and {len(keys) - limit} more")
    return ", ".join(parts) or "no visible key changed (the record may come from an older kit)"


@dataclass
class StageRecord:
    stage: str
    job: str
    config_hash: str
    config: dict
    status: str  # running | done | failed | preempted | interrupted
    command: list[str]
    returncode: int | None = None
    version: int = RECORD_VERSION

    def write(self, path: Path) -> None:
        atomic_write_json(path, self.__dict__)

    @classmethod
    def read(cls, path: Path) -> "StageRecord | None":
        """The record at `path`, or None when absent or unreadable (then the stage reruns)."""
        try:
            doc = json.loads(path.read_text())
            return cls(
                **{k: doc[k] for k in ("stage", "job", "config_hash", "config", "status", "command")},
                returncode=doc.get("returncode"),
                version=doc.get("version", 0),
            )
        except (OSError, ValueError, KeyError, TypeError):
            return None
