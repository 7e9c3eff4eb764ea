"""The Optuna study of a search and the loop of its workers (docs/search.md, "Workers, faults and
resuming": the journal, the order of the trials, dead workers and signals)."""

from __future__ import annotations

import copy
import errno
import json
import os
import random
import sys
import time
import uuid
from collections import Counter
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

import optuna
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend
from optuna.trial import TrialState

from prism import compat
from prism.cluster import Interrupted, Preempted
from prism.config.schema import ConfigError, SearchSection
from prism.errors import exception_chain
from prism.io import PLACE_ERRNOS, os_error_message
from prism.runs import lock as runlock
from prism.runs.layout import STUDY_ASK_LOCK_NAME as ASK_LOCK
from prism.runs.layout import STUDY_CREATE_LOCK_NAME as CREATE_LOCK
from prism.runs.layout import STUDY_JOURNAL_NAME as JOURNAL_NAME
from prism.runs.layout import worker_lock
from prism.search.budget import Rungs
from prism.search.stops import STOP, at_once

STUDY_NAME = "prism-search"
STOPPED_ATTR = "stopped"  # on a trial whose worker stopped it on a signal: Preempted's label
DISK_FULL = "the disk was full"  # STOPPED_ATTR of a trial whose worker stopped on a full disk
FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})

# the study's defining arguments, in the order a change is named
DEFINITION_FLAGS = {
    "scale": "--scale",
    "space": "--space (and its filters)",
    "seeds": "--seeds",
    "rungs": "--rungs",
    "trials": "the budget (--trials/--tokens/--gpu-hours)",
    "study_seed": "--seed",
    "overrides": "the key=value overrides",
}


def check_locks(study_dir: Path) -> None:
    """Refuse a study folder that cannot be made or written (a file in the way, a read-only
    filesystem, no permission), or on a filesystem without working flock; leaves nothing behind.
    A full disk is left to raise: it is no fault of the arguments (see full_disk)."""
    probe = study_dir / CREATE_LOCK
    missing = [p for p in (study_dir, *study_dir.parents) if not p.exists()]

    def clean() -> None:  # the refused lock's file, and the folders made for it
        with suppress(OSError):  # none where its folder could not be made
            probe.unlink(missing_ok=True)
        for folder in missing:
            try:
                folder.rmdir()
            except OSError:
                break

    try:
        runlock.RunLock.acquire(probe).release()
    except runlock.LocksUnsupported as exc:
        clean()
        raise ConfigError(
            f"--study-dir {study_dir} is on a filesystem without file locks ({exc.reason}); the "
            f"search keeps its workers and runs apart with flock, so put it on one that supports it."
        ) from None
    except runlock.LockHeld:
        pass  # another invocation is making or opening the study right now: locks work
    except OSError as exc:
        if exc.errno not in PLACE_ERRNOS or exc.errno in FULL_ERRNOS:
            raise
        clean()
        raise ConfigError(
            f"{os_error_message(exc).rstrip('.')}; give --study-dir a folder this user can create and write."
        ) from None


def full_disk(exc: BaseException) -> OSError | None:
    """The OSError behind `exc` when a full disk (or quota) is what ended it, else None: not a
    property of a trial's schedule, so the worker stops and the trial waits for space."""
    return next((e for e in exception_chain(exc) if isinstance(e, OSError) and e.errno in FULL_ERRNOS), None)


def check_journal(path: Path) -> None:
    """Refuse, in one sentence and without changing it, a journal that is not whole lines of
    Optuna's JSON records (cut short, or changed outside the search), on which Optuna would raise or
    glue its next record onto a cut line; a last line cut short may be an append in progress, so it
    is read again under Optuna's append lock first."""
    from optuna.storages.journal import JournalFileSymlinkLock

    data = path.read_bytes()
    bad = _bad_line(data)
    if bad is None:
        return
    lock = JournalFileSymlinkLock(str(path))
    try:
        lock.acquire()
    except OSError:  # a read-only folder: nobody appends there either
        pass
    else:
        try:
            data = path.read_bytes()
            bad = _bad_line(data)
        finally:
            lock.release()
    if bad is None:
        return
    if bad > data.count(b"\n"):  # the last line, without its end: never whole, so never read
        raise ConfigError(
            f"{path} ends in a record cut short (line {bad}: the file was cut, or its disk filled while "
            f"the record was written); delete that last line to continue the study as its workers last "
            f"saw it, or restore the file from a copy."
        )
    raise ConfigError(
        f"{path} is damaged at line {bad} (not a whole record of the study: changed outside the "
        f"search); restore it from a copy, or move it aside to make the study again."
    )


def _bad_line(data: bytes) -> int | None:
    """The number (from 1) of the first line of `data` that is not a whole JSON object, or None;
    lines end at b"\\n" only, as Optuna reads them."""
    *lines, tail = data.split(b"\n")
    for number, line in enumerate(lines, start=1):
        try:
            record = json.loads(line)
        except ValueError:  # JSONDecodeError, UnicodeDecodeError
            record = None
        if not isinstance(record, dict):
            return number
    return len(lines) + 1 if tail else None


def held(path: Path) -> runlock.RunLock:
    """The lock at `path`, once its holder lets go (they keep it for milliseconds)."""
    while True:
        try:
            return runlock.RunLock.acquire(path)
        except runlock.LockHeld:
            time.sleep(0.02)


def storage(study_dir: Path) -> JournalStorage:
    return JournalStorage(JournalFileBackend(str(study_dir / JOURNAL_NAME)))


class RetryAwarePruner(optuna.pruners.BasePruner):
    """Optuna's successive halving with one loss per slot and rung, its newest attempt's: a retry
    reports its dead attempt's rung losses again, which Optuna alone would count twice."""

    def __init__(self, inner: optuna.pruners.BasePruner) -> None:
        self.inner = inner

    def prune(self, study: optuna.Study, trial: optuna.trial.FrozenTrial) -> bool:
        return self.inner.prune(_OneLossPerSlot(study, trial), trial)


def _slot(trial: optuna.trial.FrozenTrial):
    return trial.user_attrs.get("slot", ("trial", trial.number))  # a trial not enqueued is its own


class _OneLossPerSlot:
    """The study as RetryAwarePruner's pruner sees it: get_trials leaves out (on copies) the rung
    losses of the judged trial's earlier attempts and of those a newer attempt reported again."""

    def __init__(self, study: optuna.Study, judged: optuna.trial.FrozenTrial) -> None:
        self._study, self._judged = study, judged

    def __getattr__(self, name: str):
        return getattr(self._study, name)

    def get_trials(self, deepcopy: bool = True, states=None) -> list[optuna.trial.FrozenTrial]:
        trials = self._study.get_trials(deepcopy=deepcopy, states=states)
        newest: dict = {}  # (slot, rung key) -> the newest attempt holding it (trials come in number order)
        for t in self._study.get_trials(deepcopy=False):
            newest.update({(_slot(t), key): t.number for key in t.system_attrs if compat.is_rung_key(key)})
        judged = _slot(self._judged)
        out = []
        for t in trials:
            slot = _slot(t)
            stale = {
                k
                for k in t.system_attrs
                if compat.is_rung_key(k)
                and ((slot == judged and t.number != self._judged.number) or newest[(slot, k)] != t.number)
            }
            if stale:
                t = copy.copy(t)
                t.system_attrs = {k: v for k, v in t.system_attrs.items() if k not in stale}
            out.append(t)
        return out


def pruner(rungs: Rungs) -> optuna.pruners.BasePruner:
    if len(rungs.tokens) == 1:
        return optuna.pruners.NopPruner()
    return RetryAwarePruner(
        optuna.pruners.SuccessiveHalvingPruner(
            min_resource=rungs.tokens[0], reduction_factor=rungs.factor, min_early_stopping_rate=0
        )
    )


def trial_order(keys: list[str], seeds: list[int], n: int, study_seed: int) -> list[dict]:
    """The first `n` (schedule, seed) pairs in the study seed's order; uniform's first."""
    base = [{"schedule": keys[0], "seed": s} for s in seeds]
    rest = [{"schedule": k, "seed": s} for k in keys[1:] for s in seeds]
    random.Random(study_seed).shuffle(rest)
    return (base + rest)[:n]


def existing_study(study_dir: Path, rungs: Rungs) -> optuna.Study | None:
    if not (study_dir / JOURNAL_NAME).is_file():
        return None
    check_journal(study_dir / JOURNAL_NAME)
    try:
        return optuna.load_study(study_name=STUDY_NAME, storage=storage(study_dir), pruner=pruner(rungs))
    except KeyError:
        return None


def check_definition(study: optuna.Study, new: dict, study_dir: Path) -> None:
    """Refuse a study made with other defining arguments, naming the first flag that changed. The
    search.* and run_all.* overrides (prism.config.schema.SearchSection; run_all.stages is
    --final-stages) set how the search runs, reports and trains its final runs, not what its
    trials train: they may change between invocations."""
    old = study.user_attrs.get("definition", {})
    for key, flag in DEFINITION_FLAGS.items():
        was, now = old.get(key), new.get(key)
        if key == "overrides":
            was, now = (
                None if o is None else [x for x in o if not str(x).startswith(("search.", "run_all."))]
                for o in (was, now)
            )
        if was != now:
            raise ConfigError(
                f"{flag} changed: the study was made with {_show(was)}, not {_show(now)}; {study_dir} "
                f"holds a search of other arguments: run the same command to continue it, or give "
                f"another --study-dir."
            )


def _show(value) -> str:
    text = ", ".join(map(str, value)) if isinstance(value, list) else str(value)
    return text if len(text) <= 120 else text[:117] + "..."


def open_study(study_dir: Path, definition: dict, rungs: Rungs, order: list[dict]) -> optuna.Study:
    """The study of `study_dir`, made (and its trials enqueued) by whichever invocation comes
    first. Raises ConfigError when the folder holds a study of other arguments."""
    with held(study_dir / CREATE_LOCK):
        study = existing_study(study_dir, rungs)
        if study is not None and "definition" not in study.user_attrs:  # its maker died making it
            study.set_user_attr("definition", definition)
        if study is not None:
            check_definition(study, definition, study_dir)
            if study.user_attrs.get("enqueued") == len(order):
                return study
        else:
            study = optuna.create_study(
                study_name=STUDY_NAME,
                storage=storage(study_dir),
                sampler=optuna.samplers.RandomSampler(seed=definition["study_seed"]),
                pruner=pruner(rungs),
                direction="minimize",
            )
            study.set_user_attr("definition", definition)
        done = {t.user_attrs.get("slot") for t in study.get_trials(deepcopy=False)}
        for slot, params in enumerate(order):
            if slot not in done:  # an invocation killed while enqueueing left the rest
                study.enqueue_trial(params, user_attrs={"slot": slot, "attempt": 1})
        study.set_user_attr("enqueued", len(order))
    return study


@dataclass
class Progress:
    waiting: int
    running: int
    complete: int
    pruned: int
    failed: int
    restarted: int  # failed attempts a later attempt of the same trial replaced

    @property
    def done(self) -> bool:
        return self.waiting == 0 and self.running == 0

    def describe(self) -> str:
        again = f"; {self.restarted} attempt(s) started again after their worker stopped"
        return (
            f"{self.complete} complete, {self.pruned} stopped at a rung, {self.failed} failed, "
            f"{self.running} running, {self.waiting} waiting{again if self.restarted else ''}"
        )


def progress(study: optuna.Study) -> Progress:
    trials = study.get_trials(deepcopy=False)
    last = {t.user_attrs.get("slot"): t.number for t in trials}  # trials come in number order
    count = Counter(t.state for t in trials if last[t.user_attrs.get("slot")] == t.number)
    states = (TrialState.WAITING, TrialState.RUNNING, TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)
    return Progress(*(count[s] for s in states), len(trials) - sum(count.values()))


def fail_reason_key(number: int) -> str:
    return f"fail_reason.{number}"


def reap_dead(study: optuna.Study, study_dir: Path, own: str, max_attempts: int) -> None:
    """Fail the running trials of dead workers and enqueue their next attempt (under ASK_LOCK)."""
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        worker = t.user_attrs.get("worker")
        if worker == own:
            continue
        if worker is not None:
            try:
                runlock.RunLock.acquire(worker_lock(study_dir, worker)).release()
            except runlock.LockHeld:
                continue  # alive
        attempt = int(t.user_attrs.get("attempt", 1))
        stopped = t.user_attrs.get(STOPPED_ATTR)  # its worker stopped it on a signal (Preempted's label)
        deaths = int(t.user_attrs.get("deaths", 0)) + (0 if stopped else 1)
        retry = deaths < max_attempts
        then = "started again from its run's checkpoints" if retry else f"given up after {attempt} attempts"
        how = f" ({stopped})" if stopped == DISK_FULL else f" ({stopped} on a signal)" if stopped else ""
        reason = f"its worker stopped during attempt {attempt}{how}; {then}"
        # the next attempt is enqueued before this one is told failed: a reaper killed in between
        # leaves a running trial that the next reaper finds again, with its retry already there
        queued = any(u.user_attrs.get("retry_of") == t.number for u in study.get_trials(deepcopy=False))
        if retry and not queued:
            study.enqueue_trial(
                t.params or t.system_attrs.get("fixed_params", {}),
                user_attrs={
                    "slot": t.user_attrs.get("slot"),
                    "attempt": attempt + 1,
                    "deaths": deaths,
                    "retry_of": t.number,
                    "earlier": {str(k): v for k, v in t.intermediate_values.items()},
                },
            )
        study.set_user_attr(fail_reason_key(t.number), reason)
        study.tell(t.number, state=TrialState.FAIL)


def mark_stopped(trial: optuna.Trial, how: str) -> None:
    """Record on a running trial that its worker stopped it on a signal (not a death); a trial
    already told (the second Ctrl-C came after its end) stays as it was told."""
    with suppress(optuna.exceptions.UpdateFinishedTrialError):
        trial.set_user_attr(STOPPED_ATTR, how)


def work(study: optuna.Study, study_dir: Path, run_one, settings: SearchSection) -> int:
    """Take and run trials (`run_one(trial)` runs and tells one) until none waits or runs anywhere;
    how many this worker ran. Raises Preempted on SIGTERM or SIGUSR1, Interrupted on a Ctrl-C,
    leaving the trial it was training to the other workers."""
    worker = uuid.uuid4().hex[:12]
    ran = 0
    with runlock.RunLock.acquire(worker_lock(study_dir, worker)), STOP:
        while True:
            if STOP.received:
                STOP.stop()
            with held(study_dir / ASK_LOCK):
                reap_dead(study, study_dir, worker, settings.max_attempts)
                state = progress(study)
                trial = study.ask() if state.waiting else None  # the lowest waiting trial, now running
                if trial is not None:
                    trial.set_user_attr("worker", worker)
                    trial.set_user_attr("pid", os.getpid())
            if trial is not None and STOP.received:  # a signal came while it was being taken
                trial.set_user_attr(STOPPED_ATTR, "stopped before training")
                STOP.stop()
            if trial is None:
                if state.running == 0:
                    return ran
                STOP.idle = True  # others are training: stay to pick up what a dead one leaves
                try:
                    if not STOP.received:
                        time.sleep(settings.idle_poll_s)
                finally:
                    STOP.idle = False
                continue
            try:
                run_one(trial)
            except Preempted as exc:  # Preemption checkpointed it (and requeued the job on SIGUSR1)
                mark_stopped(trial, exc.label)
                raise
            except BaseException as exc:
                stop = at_once(exc)
                if stop is None and full_disk(exc) is not None:
                    # a stop, not a death: the trial resumes from its newest checkpoint once there
                    # is space; the mark is one short append, which a disk full to the byte refuses
                    with suppress(OSError):
                        mark_stopped(trial, DISK_FULL)
                if stop is None:
                    raise
                # a stop, not a death: the next attempt resumes from the trial's newest checkpoint
                mark_stopped(trial, "interrupted at once")
                raise Interrupted(str(stop)) from None
            ran += 1
            sys.stdout.flush()
