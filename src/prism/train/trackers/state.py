"""<run>/trackers.json: what a resumed run needs to continue each tracker's run where it stopped
(its fields: docs/tracking.md, "How the trackers are built")."""

from __future__ import annotations

import secrets
import string
import threading
from pathlib import Path
from typing import Any, Iterable, Mapping

from prism.io import atomic_write_json, read_json
from prism.runs.layout import TRACKER_STATE_NAME as STATE_NAME

_ID_ALPHABET = string.ascii_lowercase + string.digits


def new_wandb_id() -> str:
    """A run id in W&B's own format (8 lowercase letters and digits), drawn without W&B."""
    return "".join(secrets.choice(_ID_ALPHABET) for _ in range(8))


def _texts(mapping) -> dict[str, str]:
    return {str(k): str(v) for k, v in dict(mapping or {}).items()}


def _steps(floors) -> dict[str, int]:
    return {str(k): int(s) for k, s in dict(floors).items()}


def _empty() -> dict[str, Any]:
    return {"run_ids": {}, "destinations": {}, "floors": {}, "hparams": [], "start_id": None, "earlier": []}


class TrackerState:
    """The run's tracker state, shared by its trackers (one instance per run, rank 0 only)."""

    def __init__(self, run_dir: str | Path) -> None:
        self.path = Path(run_dir) / STATE_NAME
        self._lock = threading.Lock()
        self._doc = _empty()
        self.began = self.resumed = False

    def begin(self, fresh: bool, earlier: Iterable[Mapping] = ()) -> None:
        """Start from nothing (fresh start, overwrite) or from the file (resume), once per run (by
        RunTrackers.begin). `earlier`: the runs earlier attempts left open (build.earlier_runs)."""
        with self._lock:
            self.began = True
            loaded = None if fresh else read_json(self.path)
            self.resumed = loaded is not None
            if loaded is None:
                loaded = {"earlier": earlier}
            entries = loaded.get("earlier") or []
            self._doc = {
                "run_ids": _texts(loaded.get("run_ids")),
                "destinations": _texts(loaded.get("destinations")),
                "floors": {str(t): _steps(f) for t, f in dict(loaded.get("floors") or {}).items()},
                "hparams": sorted({str(t) for t in loaded.get("hparams") or []}),
                # a file from before start ids: runs made from now on get one
                "start_id": loaded.get("start_id") or secrets.token_hex(6),
                "earlier": [dict(e) for e in entries if isinstance(e, Mapping) and e.get("tracker")],
            }
            self._doc["run_ids"].setdefault("wandb", new_wandb_id())
            self._write()

    def run_id(self, tracker: str) -> str | None:
        with self._lock:
            return self._doc["run_ids"].get(tracker)

    def set_run_id(self, tracker: str, run_id: str) -> None:
        """The tracker's run; what was recorded of another one goes."""
        with self._lock:
            if self._doc["run_ids"].get(tracker) != run_id:
                self._forget(tracker)
                self._doc["run_ids"][tracker] = run_id
                self._write()

    def claim(self, tracker: str, destination: str) -> bool:
        """Record where the tracker's run lives (a store URI, a W&B entity/project); False, the
        recorded run forgotten, when a resume points it somewhere else."""
        with self._lock:
            known = self._doc["destinations"].get(tracker)
            self._doc["destinations"][tracker] = destination
            moved = known is not None and known != destination
            if moved:
                self._forget(tracker)
                self._doc["run_ids"].pop(tracker, None)
            self._write()
            return not moved

    @property
    def start_id(self) -> str | None:
        with self._lock:
            return self._doc["start_id"]

    def earlier(self, tracker: str) -> list[dict]:
        """The runs of `tracker` that earlier attempts left open."""
        with self._lock:
            return [dict(e) for e in self._doc["earlier"] if e["tracker"] == tracker]

    def drop_earlier(self, entry: Mapping) -> None:
        """An earlier run is closed (or cannot be): it leaves the file."""
        with self._lock:
            self._doc["earlier"] = [e for e in self._doc["earlier"] if e != dict(entry)]
            self._write()

    def _forget(self, tracker: str) -> None:
        self._doc["floors"].pop(tracker, None)
        self._doc["hparams"] = [t for t in self._doc["hparams"] if t != tracker]

    def has_hparams(self, tracker: str) -> bool:
        with self._lock:
            return tracker in self._doc["hparams"]

    def mark_hparams(self, tracker: str) -> None:
        with self._lock:
            if tracker not in self._doc["hparams"]:
                self._doc["hparams"] = sorted([*self._doc["hparams"], tracker])
                self._write()

    def floors(self, tracker: str) -> dict[str, int]:
        with self._lock:
            return dict(self._doc["floors"].get(tracker, {}))

    def set_floors(self, tracker: str, floors: Mapping[str, int]) -> None:
        """Replace a tracker's floors by what the tracker itself holds (read back from its files)."""
        with self._lock:
            self._doc["floors"][tracker] = _steps(floors)
            self._write()

    def unseen(self, tracker: str, metrics: Mapping[str, Any], step: int) -> dict[str, Any]:
        """The metrics of `step` this tracker has not recorded yet."""
        with self._lock:
            floors = self._doc["floors"].get(tracker, {})
            return {k: v for k, v in metrics.items() if step > floors.get(k, -1)}

    def recorded(self, tracker: str, keys, step: int) -> None:
        """The tracker now holds `keys` at `step`: raise their floors and write the file."""
        with self._lock:
            floors = self._doc["floors"].setdefault(tracker, {})
            floors.update({k: int(step) for k in keys if step > floors.get(k, -1)})
            self._write()

    def _write(self) -> None:
        atomic_write_json(self.path, self._doc)
