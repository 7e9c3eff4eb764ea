"""Run a plan's jobs one after another as subprocesses, with a log file per job, rich progress
and a stage record around each run. A job whose inputs changed since planning (its dependency
just ran) is re-checked right before it starts."""

from __future__ import annotations

import os
import shutil
import signal
import sys
import time
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from prism import cluster, processes
from prism.cluster import EXIT_INTERRUPTED, EXIT_PREEMPTED, InterruptedAtOnce, Preempted
from prism.config.schema import ConfigError
from prism.pipeline.crashes import Ending, Said, read_ending, read_said, repeated_node
from prism.pipeline.plan import Plan, job_state
from prism.pipeline.stages import Job
from prism.runs import lock as runlock
from prism.runs.layout import stage_endings_dir, stage_output_base

SRC_DIR = Path(__file__).resolve().parents[2]
EXIT_NOT_STARTED = 127  # a shell's code for a program it could not start
# the token of the job lock this process holds now, for the stage it starts (child_env)
_HELD_TOKEN: ContextVar[str | None] = ContextVar("held_run_lock_token", default=None)


class StageFailed(RuntimeError):
    def __init__(self, job: Job, returncode: int | None, tail: str, detail: str = ""):
        super().__init__(f"{job.label} failed (exit code {returncode}){detail}; its log is {job.log}.")
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


def child_env(argv: list[str] | None = None) -> dict[str, str]:
    """A stage's environment: this process's `prism`, no allocation task's variables unless srun
    starts it (cluster.TASK_VARS), and the token of the job lock held for it (job_lock)."""
    launched_by_srun = bool(argv) and Path(argv[0]).name == "srun"
    env = dict(os.environ) if launched_by_srun else cluster.single_process_env()
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SRC_DIR), env.get("PYTHONPATH")) if p)
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.pop(runlock.TOKEN_ENV, None)
    if _HELD_TOKEN.get():
        env[runlock.TOKEN_ENV] = _HELD_TOKEN.get()
    return env


def run_job(job: Job, console: Console, retries: int = 0, pause_s: float = 0.0) -> tuple[float, int]:
    """Run one job to completion; raises StageFailed. Returns (seconds taken, retries used). A
    stage that retries crashes is started again after one, up to `retries` times, `pause_s` apart,
    each retry said with its cause in the log and on the console (docs/cluster.md)."""
    stage = job.stage
    retries = retries if stage.retries_crashes else 0
    if job.status == "rerun":
        stage.before_rerun(job, console)
    job.log.parent.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    crashes: list[Ending] = []
    while True:
        argv = job.argv()
        job.write_record("running")
        with _interruption_recorded(job):
            rc, output, said = _attempt(job, argv, len(crashes), retries)
        if stage.preemptible and rc == EXIT_PREEMPTED:  # nothing more starts: the next invocation resumes it
            job.write_record("preempted", rc)
            raise Preempted(
                f"{job.label} stopped on the scheduler's signal with a checkpoint (log "
                f"{job.log}); the requeued job, or the same command, resumes it"
            )
        if rc == 0 and (not stage.recorded or job.output_valid()):
            job.write_record("done", rc)
            return time.monotonic() - start, len(crashes)
        ending = read_ending(rc, output, Path(argv[0]).name == "srun", said) if rc != 0 else None
        if ending is not None and ending.crashed:
            crashes.append(ending)
        if ending is not None and ending.crashed and len(crashes) <= retries:
            node = repeated_node(crashes)
            again = f"; it crashed on {node} {len(crashes)} times in a row" if node else ""
            line = (
                f"{job.label} crashed ({ending.describe()}); retry {len(crashes)} of "
                f"{retries} in {pause_s:g} s{again}"
            )
            _log_line(job, line)
            console.print(f"[bold yellow]{escape(line)}[/]", highlight=False)
            with _interruption_recorded(job):
                time.sleep(pause_s)  # a signal here raises, as during the attempt
            continue
        job.write_record("failed", rc)
        if rc == 0:
            _log_line(job, f"exit code 0 but {job.output} is missing or incomplete")
        tail = "\n".join(_read_from(job.log, 0).splitlines()[-25:])
        raise StageFailed(job, rc, tail, _failure_detail(crashes, ending, retries))


@contextmanager
def _interruption_recorded(job: Job):
    """A Ctrl-C or run_all.py's SIGTERM within: the stage record says `interrupted` instead of
    `running`, and the next invocation resumes it (prism.pipeline.plan.job_state)."""
    try:
        yield
    except (KeyboardInterrupt, InterruptedAtOnce):
        job.write_record("interrupted", EXIT_INTERRUPTED)
        raise


def _attempt(job: Job, argv: list[str], retry: int, retries: int) -> tuple[int, str, list[Said]]:
    """Start the job's program once, its output appended to the job's log, and wait for it: its
    exit code, the end of its output and the endings its processes left beside the log (Said)."""
    endings = stage_endings_dir(job.log)
    shutil.rmtree(endings, ignore_errors=True)
    endings.mkdir()
    env = {**child_env(argv), cluster.ENDINGS_DIR_ENV: str(endings)}
    try:
        with open(job.log, "a") as log:
            attempt = f" (retry {retry} of {retries})" if retry else ""
            log.write(f"\n===== {job.label}{attempt}: {' '.join(argv)}\n")
            log.flush()
            offset = log.tell()
            try:
                stage = processes.start(argv, env, output=log)
            except OSError as exc:  # the plan checked the launcher; it went away since
                log.write(f"cannot start {argv[0]}: {exc.strerror}\n")
                return EXIT_NOT_STARTED, "", read_said(endings)
            # an interrupt sends the stage SIGTERM and waits, so that training checkpoints; a second kills it
            [rc] = processes.wait([stage])
        return rc, _read_from(job.log, offset), read_said(endings)
    finally:
        shutil.rmtree(endings, ignore_errors=True)


def _read_from(path: Path, offset: int, limit: int = 1 << 18) -> str:
    """The text of `path` from `offset` on, at most its last `limit` bytes (the end of an
    attempt is where the launcher and the program say how it ended)."""
    try:
        with open(path, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(max(offset, size - limit))
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def _log_line(job: Job, line: str) -> None:
    with open(job.log, "a") as log:
        log.write(f"\n===== {line}\n")


def _failure_detail(crashes: list[Ending], final: Ending | None, retries: int) -> str:
    """What a job's failure sentence adds after its exit code: every attempt crashed (the last
    cause, the node they share), or on which retry another failure ended it."""
    if final is None or not final.crashed:
        return f" on retry {len(crashes)} of {retries}" if crashes else ""
    if retries == 0:
        return f"; it crashed ({final.cause}) and run_all.train_retries=0 allows no retry"
    text = f"; all {len(crashes)} attempts crashed (run_all.train_retries={retries}), the last: {final.cause}"
    node = repeated_node(crashes)
    if node is not None:
        leave_out = f"leave it out (sbatch --exclude={node})" if final.srun else "check it"
        text += f"; every attempt crashed on {node}, which may be faulty: {leave_out}"
    return text


@contextmanager
def job_lock(job: Job):
    """One process per job output at a time (the run's own lock, prism.runs.lock, which train.py
    takes too; the stage started here gets its token): a second one is told who holds it."""
    base = stage_output_base(job.record_path)
    path = runlock.lock_path(base)
    try:
        lock = runlock.RunLock.acquire(path)
    except runlock.LockHeld as exc:
        raise Held(
            job, f"{job.label} is being run by another process ({exc.holder}; lock {path}); not started here."
        ) from None
    except runlock.LocksUnsupported as exc:
        raise ConfigError(
            f"cannot lock {path}: the filesystem refuses file locks ({exc.reason}); "
            f"run_all.py needs them to keep two jobs off one run, so put results_dir and "
            f"runs_dir on a filesystem that supports flock."
        ) from None
    held = _HELD_TOKEN.set(lock.token)
    try:
        with lock:
            yield
    finally:
        _HELD_TOKEN.reset(held)


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
            if job.status in ("run", "resume", "rerun"):
                outcomes.append(_run_planned(job, plan, progress, overall, failures, redo_changed))
                progress.advance(overall)
            else:
                outcomes.append(
                    Outcome(job, "up to date" if job.status == "done" else f"not run: {job.reason}")
                )
        ending = f"{len(failures)} job(s) failed" if failures else "finished"
        progress.update(overall, description=f"{plan.cfg.scale}: {ending}")
    return outcomes, failures


def _run_planned(
    job: Job, plan: Plan, progress: Progress, overall, failures: list[StageFailed], redo_changed: bool
) -> Outcome:
    """Run one job of the plan unless a dependency did not finish or it is done by now; its outcome."""
    waiting = [d for d in job.deps if d.status != "done"]
    if waiting:
        job.status = "blocked"
        return Outcome(job, f"not run: {waiting[0].label} is {waiting[0].status}")
    if job.stage.recorded:  # a dependency may have just finished: look again
        job.status, job.reason = job_state(job, redo_changed)
        if job.status == "done":
            return Outcome(job, "up to date")
    progress.update(overall, description=escape(f"{plan.cfg.scale}: {job.label} ({job.status})"))
    # a line per start as well: batch logs (SLURM) show no live progress bar
    console, settings = progress.console, plan.cfg.run_all
    reason = f": {escape(job.reason)}" if job.reason else ""
    console.print(f"[cyan]start[/] {escape(job.label)} ({job.status}{reason})")
    started = time.monotonic()
    try:
        with job_lock(job):
            secs, retried = run_job(job, console, settings.train_retries, settings.retry_pause_s)
    except Held as exc:
        job.status = "held"
        failures.append(exc)
        console.print(f"[bold yellow]held[/] {escape(str(exc))}")
        return Outcome(job, f"not run: {exc}")
    except StageFailed as exc:
        job.status = "failed"
        failures.append(exc)
        console.print(f"[bold red]failed[/] {escape(job.label)} (log {escape(str(job.log))})")
        return Outcome(job, "failed", time.monotonic() - started)
    job.status = "done"
    again = f" after {retried} retr{'y' if retried == 1 else 'ies'}" if retried else ""
    console.print(f"[green]done[/] {escape(job.label)} in {secs:,.0f} s{again} (log {escape(str(job.log))})")
    return Outcome(job, "ran", secs)


def python_executable() -> str:
    return sys.executable or shutil.which("python3") or "python"


class StopSignal(KeyboardInterrupt):
    """A scheduler's SIGTERM to the process that runs the pipeline: like a Ctrl-C, passed on to
    the running stage, which checkpoints and stops; the same command resumes it."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@contextmanager
def sigterm_stops_stages() -> Iterator[None]:
    """SIGTERM raises StopSignal while the block runs; the handler before is restored after (the
    commands are also called in-process: tests, notebooks)."""

    def stop(signum, frame):
        raise StopSignal(signum)

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
