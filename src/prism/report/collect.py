"""Read the JSON files the stages wrote (layout in docs/outputs.md) for one scale.

Only finished runs count: a `train_summary.json` without `"finished": true` is a run in progress.
A file that cannot be read is listed in `problems` (shown in the report, and by report.py on the
console) under the path it was read from, instead of being skipped silently or stopping the whole
report.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from prism.io import read_json
from prism.runs.layout import (
    ANALYSIS_NAME,
    BENCH_NAME,
    EVAL_DIR,
    MILESTONES_NAME,
    RUN_CONFIG_NAME,
    SUMMARY_NAME,
    ZEROSHOT_NAME,
    scale_folder,
    seed_of,
    seed_of_eval_result,
)


@dataclass
class RunResults:
    """What one finished training run left in its folder, as the report reads it."""

    schedule: str
    seed: int
    summary: dict
    milestones: dict | None
    config: dict | None = None  # the run's saved config.yaml (what it was trained with)
    zeroshot: dict | None = None  # zero-shot scores at token milestones during training (zeroshot.json)


@dataclass
class ScaleResults:
    scale: str
    runs: dict[str, dict[int, RunResults]] = field(default_factory=dict)  # schedule -> seed -> run
    evals: dict[str, dict[int, dict]] = field(default_factory=dict)  # schedule -> seed -> eval
    bench: dict | None = None
    analysis: dict | None = None
    problems: list[str] = field(default_factory=list)

    def schedules(self) -> list[str]:
        """Schedules with any result, uniform first, prism second, the rest by name."""
        names = set(self.runs) | set(self.evals)
        if self.bench:
            names |= set(self.bench.get("schedules", {}))
        return sorted(names, key=schedule_order)

    def final_losses(self, schedule: str) -> list[float]:
        return [
            r.summary["final_val_loss"]
            for _, r in sorted(self.runs.get(schedule, {}).items())
            if r.summary.get("final_val_loss") is not None
        ]


def schedule_order(name: str) -> tuple:
    return (0 if name == "uniform" else 1 if name == "prism" else 2, name)


def _read_yaml(path: Path, problems: list[str], shown: str) -> dict | None:
    if not path.is_file():
        return None
    from omegaconf import OmegaConf

    try:
        doc = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
    except Exception as exc:  # a YAML error of any kind: say so and carry on
        problems.append(f"`{shown}` could not be read ({type(exc).__name__}); it is left out.")
        return None
    return doc if isinstance(doc, dict) else None


ZEROSHOT_KEYS = ("every_tokens", "tasks", "limit", "data_source", "batch_size", "semantics", "milestones")


def _read_zeroshot(path: Path, problems: list[str], shown: str) -> dict | None:
    """A run's in-loop zero-shot scores, or None when it has none; a file without the fields the
    report compares runs by is listed as a problem rather than half-used."""
    if not path.is_file():
        return None
    doc = read_json(path, problems, shown)
    if doc is None:
        return None
    missing = [k for k in ZEROSHOT_KEYS if k not in doc]
    if missing:
        problems.append(f"`{shown}` lacks {', '.join(missing)}; it is left out.")
        return None
    tasks, milestones = doc["tasks"], doc["milestones"]
    settings_ok = (
        isinstance(doc["every_tokens"], int)
        and isinstance(tasks, list)
        and all(isinstance(t, str) for t in tasks)
        and (doc["limit"] is None or isinstance(doc["limit"], (int, float)))
        and isinstance(doc["data_source"], str)
        and isinstance(doc["semantics"], str)
        and isinstance(milestones, list)
    )
    if not settings_ok:
        problems.append(
            f"`{shown}` has a setting of the wrong type (every_tokens and limit are numbers, tasks a list "
            "of names, data_source and semantics text, milestones a list); it is left out."
        )
        return None
    for m in milestones:
        scored = isinstance(m, dict) and isinstance(m.get("tasks"), dict)
        if not scored or not isinstance(m.get("tokens"), int):
            problems.append(f"`{shown}` has a milestone without token count or scores; it is left out.")
            return None
    return doc


def collect(scale: str, runs_dir: str | Path, results_dir: str | Path) -> ScaleResults:
    runs_dir, results_dir = Path(runs_dir), Path(results_dir)
    out = ScaleResults(scale)
    p = out.problems
    scale_runs = scale_folder(runs_dir, scale)
    for sched_dir in sorted(scale_runs.glob("*")) if scale_runs.is_dir() else []:
        for seed_dir in sorted(sched_dir.glob("*")):
            seed = seed_of(seed_dir.name)
            summary_path = seed_dir / SUMMARY_NAME
            if seed is None or not summary_path.is_file():
                continue
            shown = str(seed_dir)  # the path as given (--runs-dir), so that it can be found
            summary = read_json(summary_path, p, f"{shown}/{SUMMARY_NAME}")
            if not summary or summary.get("finished") is not True:
                continue
            ms_path = seed_dir / MILESTONES_NAME
            milestones = read_json(ms_path, p, f"{shown}/{MILESTONES_NAME}") if ms_path.is_file() else None
            out.runs.setdefault(sched_dir.name, {})[seed] = RunResults(
                sched_dir.name,
                seed,
                summary,
                milestones,
                _read_yaml(seed_dir / RUN_CONFIG_NAME, p, f"{shown}/{RUN_CONFIG_NAME}"),
                _read_zeroshot(seed_dir / ZEROSHOT_NAME, p, f"{shown}/{ZEROSHOT_NAME}"),
            )
    eval_dir = scale_folder(results_dir, scale) / EVAL_DIR
    for sched_dir in sorted(eval_dir.glob("*")) if eval_dir.is_dir() else []:
        for f in sorted(sched_dir.glob("*")):
            seed = seed_of_eval_result(f.name)
            if seed is None:
                continue
            doc = read_json(f, p, str(f))
            if doc is not None and not isinstance(doc.get("tasks"), dict):
                p.append(f"`{f}` holds no tasks; it is left out.")
            elif doc is not None:
                out.evals.setdefault(sched_dir.name, {})[seed] = doc
    for attr, name in (("bench", BENCH_NAME), ("analysis", ANALYSIS_NAME)):
        f = scale_folder(results_dir, scale) / name
        if f.is_file():
            setattr(out, attr, read_json(f, p, str(f)))
    return out
