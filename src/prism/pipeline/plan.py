"""The plan of a reproduction: which stage jobs exist for a scale and what state each is in.

Stages and their outputs (docs/outputs.md):
  train    per (schedule, seed)  runs/<scale>/<schedule>/seed<k>/train_summary.json
  eval     per (schedule, seed)  results/<scale>/eval/<schedule>/seed<k>.json
  bench    per scale             results/<scale>/bench.json
  analyze  per scale             results/<scale>/analysis.json
  report   once                  results/RESULTS.md
Each job's record (records.py) sits beside its output as `<name>.stage.json`; its config is the
part of the run configuration that decides the result, so a changed setting is seen, not mixed in.
"""

from __future__ import annotations

import json
import os
import shlex
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from prism.batch import BatchPlan
from prism.config import ConfigError, RunConfig, to_dict
from prism.identity import is_finished, saved_identity, training_identity
from prism.pipeline.records import StageRecord, config_hash, diff_configs

STAGES = ("train", "eval", "bench", "analyze", "report")
SCRIPTS = {
    "train": "train.py",
    "eval": "evaluate.py",
    "bench": "benchmark.py",
    "analyze": "analyze.py",
    "report": "report.py",
}
RUN_ALL_ONLY = ("run_all.", "seeds=", "run_schedules=")


def _read_json(path: Path) -> dict | None:
    try:
        doc = json.loads(path.read_text())
        return doc if isinstance(doc, dict) else None
    except (OSError, ValueError):
        return None


VALID: dict[str, Callable[[dict], bool]] = {
    "train": is_finished,
    "eval": lambda d: isinstance(d.get("tasks"), dict) and bool(d["tasks"]),
    "bench": lambda d: isinstance(d.get("schedules"), dict) and bool(d["schedules"]),
    "analyze": lambda d: bool(d.get("checkpoints")),
}


def launch_prefix(launcher: str, python: str) -> list[str]:
    """`python`, or `torchrun ...` (which takes the script itself), or `srun ... python`."""
    words = shlex.split(launcher or "")
    if not words:
        return [python]
    if Path(words[0]).name == "torchrun":
        return words
    return [*words, python]


def final_checkpoint(run_dir: Path) -> Path:
    """The exported weights when present, else Lightning's last checkpoint."""
    st = run_dir / "model.safetensors"
    return (
        st
        if st.is_file() or not (run_dir / "checkpoints" / "last.ckpt").is_file()
        else run_dir / "checkpoints" / "last.ckpt"
    )


@dataclass
class Job:
    stage: str
    label: str  # "train prism seed0"
    output: Path
    config: dict
    log: Path
    argv: Callable[[], list[str]]  # built when the job starts (checkpoint paths exist by then)
    deps: list["Job"] = field(default_factory=list)
    run_dir: Path | None = None  # train only
    status: str = "run"  # done | run | resume | rerun | conflict | blocked | skipped | unselected
    reason: str = ""

    @property
    def hash(self) -> str:
        return config_hash(self.config)

    @property
    def record_path(self) -> Path:
        base = self.run_dir if self.run_dir is not None else self.output.with_suffix("")
        return base.with_name(base.name + ".stage.json")

    def output_valid(self) -> bool:
        if self.stage == "report":
            return False
        doc = _read_json(self.output)
        return doc is not None and VALID[self.stage](doc)

    def record(self, status: str, returncode: int | None = None) -> StageRecord:
        return StageRecord(self.stage, self.label, self.hash, self.config, status, self.argv(), returncode)


@dataclass
class Plan:
    cfg: RunConfig
    stages: list[str]
    jobs: list[Job]
    logs_dir: Path
    report_path: Path
    layout_source: str | None = None  # where the device layout came from (allocation, --nodes)
    split: "BatchPlan | None" = None  # how every training run splits its global batch

    @property
    def conflicts(self) -> list[Job]:
        return [j for j in self.jobs if j.status == "conflict"]

    def selected(self) -> list[Job]:
        return [j for j in self.jobs if j.stage in self.stages]


# ----- building ---------------------------------------------------------------------------------
def hub_offline() -> str | None:
    """Why the Hugging Face hub cannot serve the eval datasets, or None when it looks reachable."""
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        if os.environ.get(var, "").lower() in ("1", "true", "yes"):
            return f"the hub is switched off ({var}=1)"
    try:  # one quick connection instead of the datasets library's long retries
        socket.create_connection(("huggingface.co", 443), timeout=3).close()
    except OSError:
        return "huggingface.co is unreachable"
    return None


def default_scripts(scripts_dir: Path) -> dict[str, str]:
    return {stage: str(scripts_dir / name) for stage, name in SCRIPTS.items()}


def build_plan(
    cfg: RunConfig, overrides: list[str], stages: list[str], scripts: dict[str, str], python: str
) -> Plan:
    """All jobs for cfg.scale over cfg.run_schedules x cfg.seeds (statuses not yet assigned).
    `scripts` maps each stage to the program that implements it (default_scripts())."""
    scale, full = cfg.scale, to_dict(cfg)
    runs, results = Path(cfg.runs_dir) / scale, Path(cfg.results_dir) / scale
    logs = Path(cfg.run_all.logs_dir) if cfg.run_all.logs_dir else results / "logs"
    launch = cfg.run_all.launcher
    passed = [o for o in overrides if not o.startswith(RUN_ALL_ONLY)]
    script = scripts
    if "eval" in stages and cfg.eval.data_dir and not Path(cfg.eval.data_dir).is_dir():
        raise ConfigError(
            f"eval.data_dir={cfg.eval.data_dir!r} is not a folder; point it at local "
            f"copies of the task datasets (see README, Data) or leave it unset for the hub."
        )
    jobs: list[Job] = []

    bench_cfg = {
        "model": full["model"],
        "bench": full["bench"],
        "heads": {s: list(cfg.head_schedule(s).heads) for s in cfg.run_schedules},
        "micro_batch": cfg.bench.micro_batch or cfg.train.micro_batch,
        "compile": cfg.train.compile,
        "precision": cfg.train.precision,
    }

    def bench_argv() -> list[str]:
        a = [
            *launch_prefix(launch.bench, python),
            script["bench"],
            "--scale",
            scale,
            "--schedules",
            ",".join(cfg.run_schedules),
            "--steps",
            str(cfg.bench.steps),
            "--micro-batch",
            str(bench_cfg["micro_batch"]),
        ]
        if cfg.train.compile is not None:
            a.append("--compile" if cfg.train.compile else "--no-compile")
        return [*a, "--out", str(results / "bench.json"), *passed]

    jobs.append(Job("bench", "bench", results / "bench.json", bench_cfg, logs / "bench.log", bench_argv))

    trains: list[Job] = []
    for seed in cfg.seeds:
        for sched in cfg.run_schedules:
            run_dir = runs / sched / f"seed{seed}"

            def train_argv(sched=sched, seed=seed) -> list[str]:
                return [
                    *launch_prefix(launch.train, python),
                    script["train"],
                    "--scale",
                    scale,
                    "--schedule",
                    sched,
                    "--seed",
                    str(seed),
                    *passed,
                ]

            t = Job(
                "train",
                f"train {sched} seed{seed}",
                run_dir / "train_summary.json",
                training_identity(full, sched, seed),
                logs / f"train-{sched}-seed{seed}.log",
                train_argv,
                run_dir=run_dir,
            )
            trains.append(t)
            jobs.append(t)
        for t in trains[-len(cfg.run_schedules) :]:
            sched, seed = t.config["schedule"], t.config["train"]["seed"]
            out = results / "eval" / sched / f"seed{seed}.json"

            def eval_argv(t=t, out=out) -> list[str]:
                a = [
                    *launch_prefix(launch.eval, python),
                    script["eval"],
                    "--checkpoint",
                    str(final_checkpoint(t.run_dir)),
                    "--tasks",
                    ",".join(cfg.eval.tasks),
                    "--batch-size",
                    str(cfg.eval.batch_size),
                ]
                if cfg.eval.data_dir:
                    a += ["--data-dir", str(cfg.eval.data_dir)]
                if cfg.eval.limit is not None:
                    a += ["--limit", str(cfg.eval.limit)]
                return [*a, "--out", str(out)]

            jobs.append(
                Job(
                    "eval",
                    f"eval {sched} seed{seed}",
                    out,
                    {
                        "eval": {
                            "tasks": list(cfg.eval.tasks),
                            "data_dir": cfg.eval.data_dir,
                            "limit": cfg.eval.limit,
                        },
                        "checkpoint": t.hash,
                    },
                    logs / f"eval-{sched}-seed{seed}.log",
                    eval_argv,
                    deps=[t],
                )
            )

    def analyze_argv() -> list[str]:
        # --scale: the exported weights carry the model, not the run's data settings
        return [
            *launch_prefix(launch.analyze, python),
            script["analyze"],
            "--scale",
            scale,
            "--checkpoints",
            *[str(final_checkpoint(t.run_dir)) for t in trains],
            "--sequences",
            str(cfg.analysis.sequences),
            "--out",
            str(results / "analysis.json"),
            *passed,
        ]

    data_id = {k: full["data"][k] for k in ("source", "path", "hub_name", "subset", "val_tokens", "seed")}
    if full["data"]["source"] == "hub":
        data_id["revision"] = full["data"]["revision"]
    jobs.append(
        Job(
            "analyze",
            "analyze",
            results / "analysis.json",
            {
                "analysis": full["analysis"],
                "data": data_id,
                "checkpoints": [[t.config["schedule"], t.config["train"]["seed"], t.hash] for t in trains],
            },
            logs / "analyze.log",
            analyze_argv,
            deps=list(trains),
        )
    )

    report_path = Path(cfg.results_dir) / "RESULTS.md"
    jobs.append(
        Job(
            "report",
            "report",
            report_path,
            {},
            logs / "report.log",
            lambda: [
                python,
                script["report"],
                "--runs-dir",
                str(cfg.runs_dir),
                "--results-dir",
                str(cfg.results_dir),
            ],
        )
    )
    return Plan(cfg, list(stages), jobs, logs, report_path)


# ----- state ------------------------------------------------------------------------------------
def _adopt_train(job: Job) -> tuple[str, str]:
    """A run folder without a record (train.py run by hand): compare its saved config."""
    try:
        identity = saved_identity(job.run_dir)
    except Exception:
        return "conflict", (
            f"{job.run_dir} exists but has no stage record and no readable "
            f"config.yaml, so its settings are unknown"
        )
    if config_hash(identity) != job.hash:
        return (
            "conflict",
            f"{job.run_dir} was trained with other settings: {diff_configs(identity, job.config)}",
        )
    return (
        ("done", "finished earlier (adopted)")
        if job.output_valid()
        else ("resume", "resumes from its checkpoint (adopted)")
    )


def job_state(job: Job, redo_changed: bool = False) -> tuple[str, str]:
    """(status, reason) of one job from its record and output, ignoring its dependencies."""
    if job.stage == "report":
        return "run", "regenerated every time (unchanged files are not rewritten)"
    rec = StageRecord.read(job.record_path)
    if rec is not None and rec.config_hash != job.hash:
        change = diff_configs(rec.config, job.config)
        if job.stage == "train" and not redo_changed:
            return "conflict", f"{job.run_dir} was trained with other settings: {change}"
        return "rerun", f"settings changed ({change})"
    if rec is not None:
        if rec.status == "done" and job.output_valid():
            return "done", "up to date"
        if job.stage == "train" and (job.run_dir / "checkpoints").is_dir():
            return "resume", f"resumes from its checkpoint (last attempt: {rec.status})"
        return "run", f"last attempt did not finish ({rec.status})"
    if job.stage == "train" and job.run_dir.exists() and any(job.run_dir.iterdir()):
        status, reason = _adopt_train(job)
        if status == "conflict" and redo_changed:
            return "rerun", reason
        return status, reason
    if job.output.exists():
        return "rerun", "an output without a stage record is recomputed"
    return "run", ""


def assign_statuses(plan: Plan, redo_changed: bool = False) -> Plan:
    """Set every job's status; stages not selected only count as inputs (done or not)."""
    cfg = plan.cfg
    cache: list[str | None] = []

    def offline() -> str | None:  # asked at most once per plan
        if not cache:
            cache.append(hub_offline())
        return cache[0]

    for job in plan.jobs:
        job.status, job.reason = job_state(job, redo_changed)
        if job.stage not in plan.stages:
            if job.status != "done":
                job.status, job.reason = "unselected", f"stage {job.stage} is not selected"
            continue
        if job.stage == "eval" and not cfg.eval.data_dir and job.status != "done" and offline():
            job.status, job.reason = (
                "skipped",
                (
                    f"eval.data_dir is not set and {offline()}: pass "
                    f"eval.data_dir=DIR with local copies of the tasks"
                ),
            )
        elif job.stage == "analyze" and ("uniform" not in cfg.run_schedules or len(cfg.run_schedules) < 2):
            job.status, job.reason = "skipped", "needs the uniform schedule and at least one other"
        bad = [d for d in job.deps if d.status in ("blocked", "conflict", "skipped", "unselected")]
        if bad and job.status != "done":
            job.status, job.reason = "blocked", f"waits for {bad[0].label} ({bad[0].status})"
    return plan
