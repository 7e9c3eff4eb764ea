"""Run a plan's jobs one after another as subprocesses, with a log file per job, rich progress
and a stage record around each run. A job whose inputs changed since planning (its dependency
just ran) is re-checked right before it starts."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from prism.pipeline.plan import Job, Plan, job_state
from prism.pipeline.records import StageRecord

SRC_DIR = Path(__file__).resolve().parents[2]


class StageFailed(RuntimeError):
    def __init__(self, job: Job, returncode: int, tail: str):
        super().__init__(f"{job.label} failed (exit code {returncode}); its log is {job.log}.")
        self.job, self.returncode, self.tail = job, returncode, tail


@dataclass
class Outcome:
    job: Job
    result: str          # ran | skipped (up to date) | not run (reason) | failed
    seconds: float = 0.0


def _log_tail(path: Path, lines: int = 25) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def child_env() -> dict[str, str]:
    """The stages import the same `prism` as this process, installed or not."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SRC_DIR), env.get("PYTHONPATH")) if p)
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def _move_aside(job: Job) -> Path | None:
    """Keep a differently configured run folder (it holds GPU hours) under a new name."""
    if job.run_dir is None or not job.run_dir.exists():
        return None
    old = StageRecord.read(job.record_path)
    tag = old.config_hash[:8] if old else "unrecorded"
    dest = job.run_dir.with_name(f"{job.run_dir.name}.old-{tag}")
    n = 1
    while dest.exists():
        dest = job.run_dir.with_name(f"{job.run_dir.name}.old-{tag}-{n}")
        n += 1
    job.run_dir.rename(dest)
    return dest


def run_job(job: Job, console: Console) -> float:
    """Run one job to completion; raises StageFailed. Returns seconds taken."""
    if job.stage == "train" and job.status == "rerun":
        moved = _move_aside(job)
        if moved:
            console.print(f"  moved the old run to {moved}")
    argv = job.argv()
    if job.stage != "report":
        job.record("running").write(job.record_path)
    job.log.parent.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    with open(job.log, "a") as log:
        log.write(f"\n===== {job.label}: {' '.join(argv)}\n")
        log.flush()
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=child_env(),
                                start_new_session=False)
        try:
            rc = proc.wait()
        except BaseException:
            # Interrupted (Ctrl-C, SIGTERM from the scheduler): stop our child, keep its record
            # as `running`, so the next invocation resumes instead of trusting a half result.
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            raise
    seconds = time.monotonic() - start
    ok = rc == 0 and (job.stage == "report" or job.output_valid())
    if job.stage != "report":
        job.record("done" if ok else "failed", rc).write(job.record_path)
    if not ok:
        if rc == 0:
            with open(job.log, "a") as log:
                log.write(f"\n===== exit code 0 but {job.output} is missing or incomplete\n")
        raise StageFailed(job, rc, _log_tail(job.log))
    return seconds


def execute(plan: Plan, console: Console,
            redo_changed: bool = False) -> tuple[list[Outcome], list[StageFailed]]:
    """Run every selected job that is not done, in plan order. A failed job blocks only the jobs
    that need its output; the others still run (and the report shows what exists)."""
    todo = [j for j in plan.selected() if j.status in ("run", "resume", "rerun")]
    outcomes: list[Outcome] = []
    failures: list[StageFailed] = []
    columns = (SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
               TextColumn("{task.completed}/{task.total}"), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=False) as progress:
        overall = progress.add_task(plan.cfg.scale, total=len(todo))
        for job in plan.selected():
            if job.status not in ("run", "resume", "rerun"):
                outcomes.append(Outcome(job, "up to date" if job.status == "done" else
                                        f"not run: {job.reason}"))
                continue
            waiting = [d for d in job.deps if d.status != "done"]
            if waiting:
                job.status = "blocked"
                outcomes.append(Outcome(job, f"not run: {waiting[0].label} is {waiting[0].status}"))
                progress.advance(overall)
                continue
            if job.stage != "report":  # a dependency may have just finished: look again
                job.status, job.reason = job_state(job, redo_changed)
                if job.status == "done":
                    outcomes.append(Outcome(job, "up to date"))
                    progress.advance(overall)
                    continue
            progress.update(overall, description=escape(f"{plan.cfg.scale}: {job.label} ({job.status})"))
            # a line per start as well: batch logs (SLURM) show no live progress bar
            progress.console.print(f"[cyan]start[/] {escape(job.label)} ({job.status}"
                                   + (f": {escape(job.reason)}" if job.reason else "") + ")")
            started = time.monotonic()
            try:
                secs = run_job(job, progress.console)
            except StageFailed as exc:
                job.status = "failed"
                failures.append(exc)
                outcomes.append(Outcome(job, "failed", time.monotonic() - started))
                progress.console.print(f"[bold red]failed[/] {escape(job.label)} (log {escape(str(job.log))})")
                progress.advance(overall)
                continue
            job.status = "done"
            outcomes.append(Outcome(job, "ran", secs))
            progress.console.print(f"[green]done[/] {escape(job.label)} in {secs:,.0f} s "
                                   f"(log {escape(str(job.log))})")
            progress.advance(overall)
        progress.update(overall, description=f"{plan.cfg.scale}: finished" if not failures
                        else f"{plan.cfg.scale}: {len(failures)} job(s) failed")
    return outcomes, failures


def python_executable() -> str:
    return sys.executable or shutil.which("python3") or "python"
