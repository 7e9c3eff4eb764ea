"""Run a plan's jobs one after another as subprocesses, with a log file per job, rich progress
and a stage record around each run. A job whose inputs changed since planning (its dependency
just ran) is re-checked right before it starts."""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from prism import cluster
from prism.cluster import Preempted
from prism.config import ConfigError
from prism.pipeline.plan import Plan, job_state
from prism.pipeline.stages import Job

SRC_DIR = Path(__file__).resolve().parents[2]


class StageFailed(RuntimeError):
    def __init__(self, job: Job, returncode: int | None, tail: str):
        super().__init__(f"{job.label} failed (exit code {returncode}); its log is {job.log}.")
        self.job, self.returncode, self.tail = job, returncode, tail


class Held(StageFailed):
    """Another process (another job) holds the lock of this job's output."""

    def __init__(self, job: Job, message: str):
        RuntimeError.__init__(self, message)
        self.job, self.returncode, self.tail = job, None, ""


@dataclass
class Outcome:
    job: Job
    result: str  # ran | skipped (up to date) | not run (reason) | failed
    seconds: float = 0.0


def _log_tail(path: Path, lines: int = 25) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def child_env(argv: list[str] | None = None) -> dict[str, str]:
    """The stages import the same `prism` as this process, installed or not. A stage not started
    by srun is not one of the allocation's tasks and must not look like one (cluster.TASK_VARS)."""
    launched_by_srun = bool(argv) and Path(argv[0]).name == "srun"
    env = dict(os.environ) if launched_by_srun else cluster.single_process_env()
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SRC_DIR), env.get("PYTHONPATH")) if p)
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def run_job(job: Job, console: Console) -> float:
    """Run one job to completion; raises StageFailed. Returns seconds taken."""
    stage = job.stage
    if job.status == "rerun":
        stage.before_rerun(job, console)
    argv = job.argv()
    if stage.recorded:
        job.record("running").write(job.record_path)
    job.log.parent.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    with open(job.log, "a") as log:
        log.write(f"\n===== {job.label}: {' '.join(argv)}\n")
        log.flush()
        proc = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, env=child_env(argv), start_new_session=False
        )
        try:
            rc = proc.wait()
        except BaseException as exc:
            _stop_child(proc, getattr(exc, "signum", signal.SIGINT))
            raise
    seconds = time.monotonic() - start
    if stage.stops_resumable(rc):  # nothing more starts: the next invocation resumes it
        job.record("preempted", rc).write(job.record_path)
        raise Preempted(
            f"{job.label} stopped on the scheduler's signal with a checkpoint (log "
            f"{job.log}); the requeued job, or the same command, resumes it"
        )
    ok = rc == 0 and (not stage.recorded or job.output_valid())
    if stage.recorded:
        job.record("done" if ok else "failed", rc).write(job.record_path)
    if not ok:
        if rc == 0:
            with open(job.log, "a") as log:
                log.write(f"\n===== exit code 0 but {job.output} is missing or incomplete\n")
        raise StageFailed(job, rc, _log_tail(job.log))
    return seconds


def _stop_child(proc: subprocess.Popen, signum: int) -> None:
    """We were interrupted: pass a scheduler's SIGTERM on to the stage (training then writes a
    checkpoint at its next step boundary; srun forwards it to every task) and wait for it, so
    its record stays `running` and the next invocation resumes it. A Ctrl-C already reached the
    stage from the terminal. A second interrupt while waiting kills the stage."""
    if proc.poll() is not None:
        return
    try:
        if signum != signal.SIGINT:
            proc.send_signal(signum)
        proc.wait()
    except BaseException:
        proc.kill()
        proc.wait()
        raise


@contextmanager
def job_lock(job: Job):
    """One process per job output at a time: separate jobs (other seeds, schedules or stages of
    the same scale) run side by side, while a second one for the same run is told who holds it.
    The lock file names its holder (host, pid, Slurm job)."""
    import fcntl

    path = job.record_path.with_name(f".{job.record_path.name.removesuffix('.stage.json')}.lock")
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise ConfigError(
                    f"cannot lock {path}: the filesystem refuses file locks ({exc.strerror}); "
                    f"run_all.py needs them to keep two jobs off one run, so put results_dir and "
                    f"runs_dir on a filesystem that supports flock."
                ) from None
            f.seek(0)
            raise Held(
                job,
                f"{job.label} is being run by another process "
                f"({f.read().strip() or 'holder unknown'}; lock {path}); not started here.",
            ) from None
        f.seek(0)
        f.truncate()
        f.write(
            json.dumps(
                {
                    "host": socket.gethostname(),
                    "pid": os.getpid(),
                    "slurm_job": os.environ.get("SLURM_JOB_ID"),
                }
            )
            + "\n"
        )
        f.flush()
        try:
            yield
        finally:
            f.truncate(0)
            fcntl.flock(f, fcntl.LOCK_UN)


def execute(
    plan: Plan, console: Console, redo_changed: bool = False
) -> tuple[list[Outcome], list[StageFailed]]:
    """Run every selected job that is not done, in plan order. A failed job blocks only the jobs
    that need its output; the others still run (and the report shows what exists)."""
    todo = [j for j in plan.selected() if j.status in ("run", "resume", "rerun")]
    outcomes: list[Outcome] = []
    failures: list[StageFailed] = []
    columns = (
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console, transient=False) as progress:
        overall = progress.add_task(plan.cfg.scale, total=len(todo))
        for job in plan.selected():
            if job.status not in ("run", "resume", "rerun"):
                outcomes.append(
                    Outcome(job, "up to date" if job.status == "done" else f"not run: {job.reason}")
                )
                continue
            waiting = [d for d in job.deps if d.status != "done"]
            if waiting:
                job.status = "blocked"
                outcomes.append(Outcome(job, f"not run: {waiting[0].label} is {waiting[0].status}"))
                progress.advance(overall)
                continue
            if job.stage.recorded:  # a dependency may have just finished: look again
                job.status, job.reason = job_state(job, redo_changed)
                if job.status == "done":
                    outcomes.append(Outcome(job, "up to date"))
                    progress.advance(overall)
                    continue
            progress.update(overall, description=escape(f"{plan.cfg.scale}: {job.label} ({job.status})"))
            # a line per start as well: batch logs (SLURM) show no live progress bar
            progress.console.print(
                f"[cyan]start[/] {escape(job.label)} ({job.status}"
                + (f": {escape(job.reason)}" if job.reason else "")
                + ")"
            )
            started = time.monotonic()
            try:
                with job_lock(job):
                    secs = run_job(job, progress.console)
            except Held as exc:
                job.status = "held"
                failures.append(exc)
                outcomes.append(Outcome(job, f"not run: {exc}"))
                progress.console.print(f"[bold yellow]held[/] {escape(str(exc))}")
                progress.advance(overall)
                continue
            except StageFailed as exc:
                job.status = "failed"
                failures.append(exc)
                outcomes.append(Outcome(job, "failed", time.monotonic() - started))
                progress.console.print(
                    f"[bold red]failed[/] {escape(job.label)} (log {escape(str(job.log))})"
                )
                progress.advance(overall)
                continue
            job.status = "done"
            outcomes.append(Outcome(job, "ran", secs))
            progress.console.print(
                f"[green]done[/] {escape(job.label)} in {secs:,.0f} s (log {escape(str(job.log))})"
            )
            progress.advance(overall)
        progress.update(
            overall,
            description=f"{plan.cfg.scale}: finished"
            if not failures
            else f"{plan.cfg.scale}: {len(failures)} job(s) failed",
        )
    return outcomes, failures


def python_executable() -> str:
    return sys.executable or shutil.which("python3") or "python"
