"""Committed results are readable by machines: every tracked .json file parses as JSON."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def committed_json() -> list[Path]:
    """The .json files git tracks (a source tarball without .git: every .json under results/)."""
    try:
        names = subprocess.run(
            ["git", "ls-files", "*.json"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.split()
    except (OSError, subprocess.CalledProcessError):
        return sorted((ROOT / "results").rglob("*.json"))
    return [ROOT / n for n in names]


def test_every_committed_json_file_parses():
    files = committed_json()
    assert any(p.is_relative_to(ROOT / "results") for p in files)  # the results are among them
    bad = []
    for path in files:
        try:
            json.loads(path.read_text())
        except ValueError as exc:
            bad.append(f"{path.relative_to(ROOT)}: {exc}")
    assert bad == []
