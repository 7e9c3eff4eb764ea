"""Read one scale's result files (docs/outputs.md) through prism.runs.records: finished runs only,
an unusable file named in `problems`, a context extension kept apart from the schedules."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from prism.core.schedule import path_safe
from prism.runs import records as R
from prism.runs.layout import (
    ANALYSIS_NAME,
    BENCH_NAME,
    EVAL_DIR,
    MILESTONES_NAME,
    RUN_CONFIG_NAME,
    SUMMARY_NAME,
    ZEROSHOT_NAME,
    extension_of,
    scale_folder,
    seed_dir_name,
    seed_of,
    seed_of_eval_result,
)
from prism.stats import mean


@dataclass
class RunResults:
    """What one finished training run left in its folder, as the report reads it."""

    schedule: str
    seed: int
    summary: R.TrainSummary
    milestones: R.Milestones | None
    config: R.RunConfig | None = None  # the run's saved config.yaml (what it was trained with)
    zeroshot: R.ZeroShotCurve | None = None  # zero-shot scores at token milestones during training


@dataclass
class Extension:
    """A finished context-extension run: `folder` (e.g. prism-ctx256) continued `source`."""

    folder: str
    seed: int
    run: RunResults
    source: str  # the source run, <scale>/<schedule>/seed<k> (no machine's path)
    source_seq_len: int | None  # the context the source was trained at
    seq_len: int  # the context the extension trained at (0: not recorded)
    tokens: int | None  # tokens the extension trained on (its budget)
    zero_shot: R.EvalResult | None = None  # its zero-shot scores (results/<scale>/eval/<folder>/), when run

    def label(self) -> str:
        """`prism-ctx256 seed0: cpu-s/prism/seed0 (trained at 128 tokens) extended to 256 tokens ...`."""
        at = f" (trained at {self.source_seq_len} tokens)" if self.source_seq_len else ""
        budget = f" for {self.tokens:,} tokens" if self.tokens else ""
        to = f"{self.seq_len} tokens" if self.seq_len else "a longer context"
        return f"{self.folder} {seed_dir_name(self.seed)}: {self.source}{at} extended to {to}{budget}"


@dataclass
class ScaleResults:
    scale: str
    runs: dict[str, dict[int, RunResults]] = field(default_factory=dict)  # schedule -> seed -> run
    evals: dict[str, dict[int, R.EvalResult]] = field(default_factory=dict)  # schedule -> seed -> eval
    bench: R.Bench | None = None
    analysis: R.Analysis | None = None
    problems: list[str] = field(default_factory=list)
    extensions: list[Extension] = field(default_factory=list)  # context extensions, by folder and seed

    def schedules(self) -> list[str]:
        """Schedules with any result, uniform first, prism second, the rest by name."""
        names = {*self.runs, *self.evals, *(self.bench.schedules if self.bench else ())}
        return sorted(names, key=schedule_order)

    def named_runs(self, schedules) -> list[tuple[str, RunResults]]:
        """(scale/schedule/seed<k>, run) of the finished runs of `schedules`, by schedule and seed."""
        return [
            (f"{self.scale}/{s}/{seed_dir_name(seed)}", run)
            for s in schedules
            for seed, run in sorted(self.runs.get(s, {}).items())
        ]

    def run_mean(self, schedules, field) -> float | None:
        """The mean of `field(summary)` over the finished runs of `schedules` that recorded it (not 0)."""
        vals = [v for _, r in self.named_runs(schedules) if (v := field(r.summary))]
        return mean(vals) if vals else None

    def final_losses(self, schedule: str) -> list[float]:
        losses = [r.summary.final_val_loss for _, r in self.named_runs([schedule])]
        return [v for v in losses if v is not None]


def schedule_order(name: str) -> tuple:
    return (0 if name == "uniform" else 1 if name == "prism" else 2, name)


def _read_run(seed_dir: Path, scale: str, schedule: str, seed: int, p: list[str]) -> RunResults | None:
    """A finished run's files, each checked; None for a run in progress or an unusable summary."""
    shown = str(seed_dir)  # the path as given (--runs-dir), so that it can be found
    where = f"{shown}/{SUMMARY_NAME}"
    doc = R.read_object(seed_dir / SUMMARY_NAME, p, where)
    if doc is None or doc.get("finished", False) is False:
        return None  # a run in progress
    summary = R.TrainSummary.validated(doc, p, where)
    if summary is None or not _is_its_folder(summary, scale, schedule, seed, where, p):
        return None

    def optional(name: str, record: type[R.Record]) -> R.Record | None:
        f = seed_dir / name
        return record.read(f, p, f"{shown}/{name}") if os.path.lexists(f) else None

    config = seed_dir / RUN_CONFIG_NAME
    config = R.RunConfig.read_yaml(config, p, f"{shown}/{RUN_CONFIG_NAME}") if config.is_file() else None
    milestones = optional(MILESTONES_NAME, R.Milestones)
    return RunResults(schedule, seed, summary, milestones, config, optional(ZEROSHOT_NAME, R.ZeroShotCurve))


def _is_its_folder(record, scale: str | None, schedule: str, seed: int, where: str, p: list[str]) -> bool:
    """Whether a record names the folder it lies in (seed0 copied as seed7 would count twice). A scale
    of None is not compared; an extension's folder holds its source's schedule, a head list's its
    path-safe name (3x2-6x2/)."""
    folder = (extension_of(schedule) or (schedule,))[0]
    said = [
        ("scale", record.scale, record.scale, scale),
        ("schedule", record.schedule, record.schedule and path_safe(record.schedule), folder),
        ("seed", record.seed, record.seed, seed),
    ]
    for key, value, compared, want in said:
        if value is not None and want is not None and compared != want:
            p.append(R.problem(where, f"says `{key}` = {value!r}, but lies in the folder of {key} {want!r}"))
            return False
    return True


def _extension(folder: str, run: RunResults) -> Extension | None:
    """The run as a context extension when its folder's name or its record says so, else None."""
    named = extension_of(folder)
    init = run.summary.init_from or R.InitFrom()
    cfg_init = getattr(run.config.train, "init_from", None) if run.config else None
    recorded = run.summary.init_from is not None or bool(
        isinstance(cfg_init, dict) and (cfg_init.get("run") or cfg_init.get("config_hash"))
    )
    if named is None and not recorded:
        return None
    seq_len = (run.config.model.seq_len if run.config else None) or (named[1] if named else None)
    source = _source_name(init, named, run.seed)
    return Extension(folder, run.seed, run, source, init.seq_len, seq_len or 0, run.summary.tokens_seen)


def _source_name(init: R.InitFrom, named: tuple[str, int] | None, seed: int) -> str:
    """The source run as <scale>/<schedule>/seed<k>, never a machine's path."""
    if init.scale and init.schedule and init.seed is not None:
        return f"{init.scale}/{init.schedule}/{seed_dir_name(init.seed)}"
    if init.run:
        return "/".join(Path(init.run).parts[-3:])
    return f"{named[0]}/{seed_dir_name(seed)}" if named else "an earlier run"


def _entries(folder: Path, p: list[str]) -> list[Path]:
    """The entries of `folder`, sorted; a link that leads nowhere is named, not read."""
    try:
        found = sorted(folder.iterdir()) if folder.is_dir() else []
    except OSError as exc:
        p.append(R.problem(str(folder), f"could not be listed ({exc.strerror or type(exc).__name__})"))
        return []
    broken = [f for f in found if f.is_symlink() and not f.exists()]
    p += [R.problem(str(f), "is a link that leads nowhere (or to itself)") for f in broken]
    return [f for f in found if f not in broken]


def _collect_runs(out: ScaleResults, runs_dir: Path) -> None:
    """The finished runs of the scale under `runs_dir`: each a schedule's seed, or an extension."""
    p = out.problems
    for sched_dir in _entries(scale_folder(runs_dir, out.scale), p):
        for seed_dir in _entries(sched_dir, p):
            seed = seed_of(seed_dir.name)
            if seed is None or not os.path.lexists(seed_dir / SUMMARY_NAME):
                continue
            run = _read_run(seed_dir, out.scale, sched_dir.name, seed, p)
            if run is None:
                continue
            ext = _extension(sched_dir.name, run)
            if ext is not None:
                out.extensions.append(ext)
            else:
                out.runs.setdefault(sched_dir.name, {})[seed] = run


def _collect_evals(out: ScaleResults, results_dir: Path) -> None:
    """The zero-shot scores of the scale under `results_dir`: a schedule's, or an extension's."""
    p = out.problems
    extended = {(e.folder, e.seed): e for e in out.extensions}
    extension_folders = {e.folder for e in out.extensions}
    for sched_dir in _entries(scale_folder(results_dir, out.scale) / EVAL_DIR, p):
        # an extension's scores are no schedule's: they go to the extension they score
        extension = extension_of(sched_dir.name) is not None or sched_dir.name in extension_folders
        for f in _entries(sched_dir, p):
            seed = seed_of_eval_result(f.name)
            if seed is None:
                if re.fullmatch(r"seed\d+\.json", f.name):  # seed01.json: no seed's name
                    p.append(R.problem(str(f), "is not named seed<k>.json for a seed k"))
                continue
            doc = R.EvalResult.read(f, p)
            # an evaluation's scale is not compared: its checkpoint may be read from anywhere
            if doc is None or not _is_its_folder(doc, None, sched_dir.name, seed, str(f), p):
                continue
            if not extension:
                out.evals.setdefault(sched_dir.name, {})[seed] = doc
            elif (sched_dir.name, seed) in extended:
                extended[sched_dir.name, seed].zero_shot = doc
            else:
                p.append(
                    f"{f}: zero-shot scores of the context extension {sched_dir.name} "
                    f"{seed_dir_name(seed)}, which has no finished run at {out.scale}; left out."
                )


def collect(scale: str, runs_dir: str | Path, results_dir: str | Path) -> ScaleResults:
    """The scale's runs, evaluations, throughput benchmark and analysis, where they were written."""
    out = ScaleResults(scale)
    _collect_runs(out, Path(runs_dir))
    _collect_evals(out, Path(results_dir))
    for attr, name, record in (("bench", BENCH_NAME, R.Bench), ("analysis", ANALYSIS_NAME, R.Analysis)):
        f = scale_folder(results_dir, scale) / name
        if os.path.lexists(f):
            setattr(out, attr, record.read(f, out.problems))
    return out
