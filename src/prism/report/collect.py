"""Read the result files the stages wrote (layout in docs/outputs.md) for one scale, each through
the one validator (prism.report.inputs): no section receives a value that was not checked.

Only finished runs count: a `train_summary.json` without `"finished": true` is a run in progress.
A file that cannot be used is listed in `problems` (shown in the report, and by report.py on the
console) under the path it was read from, instead of being skipped silently or stopping the whole
report. A context extension (runs/<scale>/<schedule>-ctx<len>/, prism.runs.layout) is its own
kind of run, kept in `extensions`, never read as a schedule.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from prism.report import inputs as I
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
class Extension:
    """A finished context-extension run: `folder` (e.g. prism-ctx256) continued the run at
    `source` from its weights at `seq_len` tokens per sequence, for `tokens` tokens."""

    folder: str
    seed: int
    run: RunResults
    source: str  # the source run, <scale>/<schedule>/seed<k> (no machine's path)
    source_seq_len: int | None  # the context the source was trained at
    seq_len: int  # the context the extension trained at (0: not recorded)
    tokens: int | None  # tokens the extension trained on (its budget)
    zero_shot: dict | None = None  # its zero-shot scores (results/<scale>/eval/<folder>/), when run

    def label(self) -> str:
        """`prism-ctx256 seed0: cpu-s/prism/seed0 (trained at 128 tokens) extended to 256 tokens
        for 8,192 tokens`."""
        at = f" (trained at {self.source_seq_len} tokens)" if self.source_seq_len else ""
        budget = f" for {self.tokens:,} tokens" if self.tokens else ""
        to = f"{self.seq_len} tokens" if self.seq_len else "a longer context"
        return f"{self.folder} {seed_dir_name(self.seed)}: {self.source}{at} extended to {to}{budget}"


@dataclass
class ScaleResults:
    scale: str
    runs: dict[str, dict[int, RunResults]] = field(default_factory=dict)  # schedule -> seed -> run
    evals: dict[str, dict[int, dict]] = field(default_factory=dict)  # schedule -> seed -> eval
    bench: dict | None = None
    analysis: dict | None = None
    problems: list[str] = field(default_factory=list)
    extensions: list[Extension] = field(default_factory=list)  # context extensions, by folder and seed

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


def _read_run(seed_dir: Path, schedule: str, seed: int, p: list[str]) -> RunResults | None:
    """A finished run's files, each checked; None for a run in progress or an unusable summary."""
    shown = str(seed_dir)  # the path as given (--runs-dir), so that it can be found
    where = f"{shown}/{SUMMARY_NAME}"
    summary = I.read_object(seed_dir / SUMMARY_NAME, p, where)
    if summary is None or summary.get("finished") is not True:
        return None
    if I.validated(summary, I.SUMMARY, p, where) is None:
        return None

    def optional(name: str, spec) -> dict | None:
        f = seed_dir / name
        return I.read_checked(f, spec, p, f"{shown}/{name}") if f.is_file() else None

    config = seed_dir / RUN_CONFIG_NAME
    return RunResults(
        schedule,
        seed,
        summary,
        optional(MILESTONES_NAME, I.MILESTONES),
        I.read_yaml_checked(config, I.RUN_CONFIG, p, f"{shown}/{RUN_CONFIG_NAME}")
        if config.is_file()
        else None,
        optional(ZEROSHOT_NAME, I.ZEROSHOT),
    )


def _extension(folder: str, run: RunResults) -> Extension | None:
    """The run as a context extension when its folder's name (prism.runs.layout) or what it
    recorded says it is one; None for a schedule's own run."""
    named = extension_of(folder)
    init = run.summary.get("init_from") or {}
    cfg_init = ((run.config or {}).get("train") or {}).get("init_from") or {}
    recorded = bool(init) or bool(
        isinstance(cfg_init, dict) and (cfg_init.get("run") or cfg_init.get("config_hash"))
    )
    if named is None and not recorded:
        return None
    seq_len = ((run.config or {}).get("model") or {}).get("seq_len") or (named[1] if named else None)
    source = _source_name(init, named, run.seed)
    return Extension(
        folder,
        run.seed,
        run,
        source,
        init.get("seq_len"),
        int(seq_len) if seq_len else 0,
        run.summary.get("tokens_seen"),
    )


def _source_name(init: dict, named: tuple[str, int] | None, seed: int) -> str:
    """The source run as <scale>/<schedule>/seed<k>: from what the extension recorded, else the
    last parts of its recorded folder, else its own folder's name; never a machine's path."""
    if init.get("scale") and init.get("schedule") and init.get("seed") is not None:
        return f"{init['scale']}/{init['schedule']}/{seed_dir_name(init['seed'])}"
    if init.get("run"):
        return "/".join(Path(init["run"]).parts[-3:])
    return f"{named[0]}/{seed_dir_name(seed)}" if named else "an earlier run"


def collect(scale: str, runs_dir: str | Path, results_dir: str | Path) -> ScaleResults:
    runs_dir, results_dir = Path(runs_dir), Path(results_dir)
    out = ScaleResults(scale)
    p = out.problems
    scale_runs = scale_folder(runs_dir, scale)
    for sched_dir in sorted(scale_runs.glob("*")) if scale_runs.is_dir() else []:
        for seed_dir in sorted(sched_dir.glob("*")):
            seed = seed_of(seed_dir.name)
            if seed is None or not (seed_dir / SUMMARY_NAME).is_file():
                continue
            run = _read_run(seed_dir, sched_dir.name, seed, p)
            if run is None:
                continue
            ext = _extension(sched_dir.name, run)
            if ext is not None:
                out.extensions.append(ext)
            else:
                out.runs.setdefault(sched_dir.name, {})[seed] = run
    extended = {(e.folder, e.seed): e for e in out.extensions}
    extension_folders = {e.folder for e in out.extensions}
    eval_dir = scale_folder(results_dir, scale) / EVAL_DIR
    for sched_dir in sorted(eval_dir.glob("*")) if eval_dir.is_dir() else []:
        # an extension's scores are no schedule's: they go to the extension they score
        extension = extension_of(sched_dir.name) is not None or sched_dir.name in extension_folders
        for f in sorted(sched_dir.glob("*")):
            seed = seed_of_eval_result(f.name)
            if seed is None:
                continue
            doc = I.read_checked(f, I.EVAL, p, str(f))
            if doc is None:
                continue
            if not extension:
                out.evals.setdefault(sched_dir.name, {})[seed] = doc
            elif (sched_dir.name, seed) in extended:
                extended[sched_dir.name, seed].zero_shot = doc
            else:
                p.append(
                    f"{f}: zero-shot scores of the context extension {sched_dir.name} "
                    f"{seed_dir_name(seed)}, which has no finished run at {scale}; left out."
                )
    for attr, name, spec in (("bench", BENCH_NAME, I.BENCH), ("analysis", ANALYSIS_NAME, I.ANALYSIS)):
        f = scale_folder(results_dir, scale) / name
        if f.is_file():
            setattr(out, attr, I.read_checked(f, spec, p, str(f)))
    return out
