#!/usr/bin/env python
"""Figures of the package's shape, as JSON: import cycles, imports that go up a layer (the layers
of tests/test_layers.py), imports of the kit made inside functions, and lines per layer.

    python dev/architecture_figures.py                 # this checkout's src/
    python dev/architecture_figures.py --git REV       # the src/ of a commit (read from git)

A module of a commit made before the layer folders is placed by where it later moved
(RENAMED below), so the same layers measure both."""

from __future__ import annotations

import argparse
import ast
import json
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
from test_layers import LAYERS, cycles, layer_violations, module_graph, unit_of  # noqa: E402

# where each module of the flat layout went
RENAMED = {
    "prism.schedule": "prism.core.schedule",
    "prism.model": "prism.core.model",
    "prism.config_values": "prism.config.values",
    "prism.field_roles": "prism.config.roles",
    "prism.overrides": "prism.config.overrides",
    "prism.describe": "prism.config.describe",
    "prism.run_layout": "prism.runs.layout",
    "prism.identity": "prism.runs.identity",
    "prism.checkpoint": "prism.runs.checkpoint",
    "prism.runlock": "prism.runs.lock",
    "prism.resume": "prism.train.resume",
    "prism.batch": "prism.train.batch",
    "prism.strategy": "prism.train.strategy",
    "prism.optim": "prism.train.optim",
    "prism.module": "prism.train.module",
    "prism.training": "prism.train.trainer",
    "prism.callbacks": "prism.train.callbacks",
    "prism.trackers": "prism.train.trackers",
    "prism.analysis": "prism.measure.analysis",
    "prism.bench": "prism.measure.bench",
    "prism.report.stats": "prism.stats",
}


def renamed(module: str) -> str:
    if module == "prism.config":  # the flat config module is the schema now
        return "prism.config.schema"
    for old in sorted(RENAMED, key=len, reverse=True):
        if module == old or module.startswith(old + "."):
            return RENAMED[old] + module[len(old) :]
    return module


def figures(src: Path) -> dict:
    graph = module_graph(src, "prism")
    graph = {renamed(m): {renamed(t) for t in ts} for m, ts in graph.items()}
    inside_functions = 0
    lines: Counter[str] = Counter()
    for path in (src / "prism").rglob("*.py"):
        text = path.read_text()
        parts = list(path.relative_to(src).with_suffix("").parts)
        module = renamed(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
        unit = unit_of(module, LAYERS)
        lines[unit[1] if unit and unit[0] else "leaves"] += len(text.splitlines())
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for inner in ast.walk(node):
                    if isinstance(inner, ast.ImportFrom) and (inner.module or "").startswith("prism"):
                        inside_functions += 1
                    elif isinstance(inner, ast.Import) and any(
                        a.name.startswith("prism") for a in inner.names
                    ):
                        inside_functions += 1
    violations = layer_violations(graph, LAYERS)
    return {
        "modules": len(graph),
        "import_cycles": len(cycles(graph)),
        "upward_imports": [v for v in violations if "->" in v],
        "imports_inside_functions": inside_functions,
        "lines_per_layer": dict(sorted(lines.items())),
        "lines": sum(lines.values()),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--git", metavar="REV", help="measure the src/ of this commit")
    args = ap.parse_args()
    if not args.git:
        print(json.dumps(figures(ROOT / "src"), indent=2))
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        archive = subprocess.run(
            ["git", "-C", str(ROOT), "archive", args.git, "src"], capture_output=True, check=True
        )
        subprocess.run(["tar", "-x", "-C", tmp], input=archive.stdout, check=True)
        print(json.dumps({"commit": args.git, **figures(Path(tmp) / "src")}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
