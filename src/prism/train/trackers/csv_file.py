"""<run>/csv/metrics.csv and hparams.yaml as Lightning's CSVLogger writes them, but continued by a
resumed run, not deleted (docs/tracking.md, "How the trackers are built")."""

from __future__ import annotations

import csv
import io
import json
import os
from pathlib import Path
from typing import Any

import yaml
from lightning.pytorch.loggers import CSVLogger

from prism.io import atomic_write_text
from prism.runs.layout import CSV_HPARAMS_NAME, CSV_METRICS_NAME


class AppendingCsvWriter:
    """The writer CSVLogger calls (log_metrics, log_hparams, save), appending to an existing file."""

    def __init__(self, log_dir: str | Path) -> None:
        self.log_dir = str(log_dir)
        self.metrics_file_path = os.path.join(self.log_dir, CSV_METRICS_NAME)
        self.metrics: list[dict[str, Any]] = []
        self.metrics_keys: list[str] = []
        self.hparams: dict[str, Any] = {}
        os.makedirs(self.log_dir, exist_ok=True)
        path = Path(self.metrics_file_path)
        if path.is_file():
            text = path.read_text()
            whole = text[: text.rfind("\n") + 1]  # a row cut off by a kill has no line end
            if whole != text:
                atomic_write_text(path, whole)
            header = next(csv.reader(io.StringIO(whole)), None)
            self.metrics_keys = list(header or [])
            if not header:
                path.unlink()

    def log_metrics(self, metrics_dict: dict[str, Any], step: int | None = None) -> None:
        self.metrics.append({**metrics_dict, "step": len(self.metrics) if step is None else step})

    def log_hparams(self, params: dict[str, Any]) -> None:
        self.hparams.update(params)
        plain = json.loads(json.dumps(self.hparams, default=str))  # what YAML cannot hold, as its text
        text = yaml.safe_dump(plain, sort_keys=True, default_flow_style=False)
        atomic_write_text(os.path.join(self.log_dir, CSV_HPARAMS_NAME), text)

    def save(self) -> None:
        if not self.metrics:
            return
        path = Path(self.metrics_file_path)
        new = sorted(set().union(*self.metrics) - set(self.metrics_keys))
        if new or not path.is_file():
            old = list(csv.DictReader(io.StringIO(path.read_text()))) if path.is_file() else []
            self.metrics_keys = sorted([*self.metrics_keys, *new])
            out = io.StringIO()
            writer = csv.DictWriter(out, fieldnames=self.metrics_keys, lineterminator="\n")
            writer.writeheader()
            writer.writerows([*old, *self.metrics])
            atomic_write_text(path, out.getvalue())
        else:
            with path.open("a", newline="") as f:
                csv.DictWriter(f, fieldnames=self.metrics_keys, lineterminator="\n").writerows(self.metrics)
        self.metrics = []


class ResumableCSVLogger(CSVLogger):
    """Lightning's CSVLogger (same folder layout and file format) on the appending writer."""

    def __init__(self, save_dir: str | Path, name: str = "csv", version: str = "") -> None:
        super().__init__(save_dir=save_dir, name=name, version=version)
        self._writer: AppendingCsvWriter | None = None

    @property
    def experiment(self) -> AppendingCsvWriter:
        if self._writer is None:
            self._writer = AppendingCsvWriter(self.log_dir)
        return self._writer
