"""Committed example results are readable by machines (every tracked .json file parses as JSON,
every link of their reports resolves), and what the stages write is never tracked: runs_dir and
results_dir are ignored output, so a quick start leaves the checkout clean."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from prism.config.schema import load_config

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"


def git(*args: str) -> str | None:
    """git's output in the checkout; None in a source tarball without .git."""
    try:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None


def committed_json() -> list[Path]:
    """The .json files git tracks (a source tarball without .git: every .json under examples/)."""
    names = git("ls-files", "*.json")
    return sorted(EXAMPLES.rglob("*.json")) if names is None else [ROOT / n for n in names.split()]


def test_every_committed_json_file_parses():
    files = committed_json()
    assert any(p.is_relative_to(EXAMPLES) for p in files)  # the example results are among them
    bad = []
    for path in files:
        try:
            json.loads(path.read_text())
        except ValueError as exc:
            bad.append(f"{path.relative_to(ROOT)}: {exc}")
    assert bad == []


def test_every_link_of_the_example_reports_resolves():
    reports = sorted(EXAMPLES.rglob("*.md"))
    assert EXAMPLES / "quickstart" / "RESULTS.md" in reports
    missing = []
    for md in reports:
        for target in re.findall(r"\]\(([^)#\s]+)", md.read_text()):
            if "://" not in target and not (md.parent / target).exists():
                missing.append(f"{md.relative_to(ROOT)}: {target}")
    assert missing == []


def test_what_the_quick_start_writes_is_ignored_and_untracked():
    if git("rev-parse", "--git-dir") is None:
        pytest.skip("not a git checkout")
    cfg = load_config("tiny")
    runs, results = Path(cfg.runs_dir), Path(cfg.results_dir)
    assert not runs.is_absolute() and not results.is_absolute()  # relative to the checkout
    written = [
        results / "RESULTS.md",
        results / "plots" / "tiny-val-loss.png",
        results / "tiny" / "bench.json",
        results / "tiny" / "bench.stage.json",
        results / "tiny" / "eval" / "prism" / "seed0.json",
        results / "tiny" / "logs" / "train-prism-seed0.log",
        runs / "tiny" / "prism" / "seed0" / "model.safetensors",
    ]
    # check-ignore does not report a tracked file as ignored: this also fails on a tracked one
    ignored = git("check-ignore", *map(str, written)) or ""
    assert ignored.split() == list(map(str, written))
    # tracked: only the GPU checks' raw output (results/gpu-h200/), which no stage writes
    tracked = (git("ls-files", str(runs), str(results)) or "").split()
    assert tracked and all(Path(t).parts[:2] == (results.name, "gpu-h200") for t in tracked), tracked
