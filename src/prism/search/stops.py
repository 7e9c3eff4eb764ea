"""How a search worker stops on a signal outside its trials' training steps (the signals during
them are prism.train.callbacks.Preemption's): the handler every worker process installs while it works
(prism.search.study.work, and prism.search.group.follow on the other ranks of a trial group)."""

from __future__ import annotations

import os
import signal
import threading

from prism.cluster import Interrupted, InterruptedAtOnce, Preempted
from prism.errors import exception_chain

# Slurm's warning (--signal=B:USR1@300), SIGTERM, and a Ctrl-C (SIGINT)
STOP_SIGNALS = (signal.SIGUSR1, signal.SIGTERM, signal.SIGINT)


class WorkerStop:
    """The worker's handler of STOP_SIGNALS outside training: it records the signal, raising
    Preempted (Interrupted for a Ctrl-C) at once only while the worker sleeps; a second Ctrl-C
    raises InterruptedAtOnce wherever the worker is, as train.py does."""

    def __init__(self) -> None:
        self.received, self.interrupts, self.idle = 0, 0, False
        self._previous: dict = {}

    def heard(self, signum: int) -> None:
        """Record a signal: this handler's, or one that prism.train.callbacks.Preemption got during
        a trial's training (SignalRelay)."""
        # the scheduler's signals outrank a Ctrl-C: a job it stops is requeued or resumable
        if self.received in (0, signal.SIGINT):
            self.received = int(signum)
        self.interrupts += signum == signal.SIGINT

    def _handler(self, signum, _frame) -> None:
        self.heard(signum)
        if signum == signal.SIGINT and not self.idle:
            if self.interrupts > 1:
                raise InterruptedAtOnce(
                    "a second Ctrl-C stopped this worker at once; its trial, if any, goes on from its "
                    "newest checkpoint when the search is run again"
                )
            os.write(  # os.write: the handler may run in the middle of a write to sys.stderr
                2,
                b"\nCtrl-C: this worker stops at its trial's first step boundary with a checkpoint, "
                b"or before its next trial (Ctrl-C again stops at once)\n",
            )
        if self.idle:
            self.idle = False
            self.stop()

    def stop(self) -> None:
        """Raise Preempted for the recorded signal (Interrupted for a Ctrl-C), after requeueing
        the Slurm job on SIGUSR1."""
        name = signal.Signals(self.received).name
        outcome = "no trial of this worker was running"
        if self.received == signal.SIGUSR1:
            from prism.train.callbacks.preemption import requeue_job  # Lightning: only when needed

            # said before the request: the requeue ends the job's steps, and a line after it may be lost
            os.write(2, f"SIGUSR1: {outcome}; requeueing the Slurm job.\n".encode())
            outcome += f"; {requeue_job()}"
        stop = Interrupted if self.received == signal.SIGINT else Preempted
        raise stop(f"stopped by {name} between trials ({outcome})")

    def __enter__(self) -> WorkerStop:
        self.received, self.interrupts, self.idle = 0, 0, False
        if threading.current_thread() is threading.main_thread():
            self._previous = {sig: signal.signal(sig, self._handler) for sig in STOP_SIGNALS}
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}
        self.received, self.interrupts, self.idle = 0, 0, False  # nothing left for a later trial


def at_once(exc: BaseException) -> InterruptedAtOnce | None:
    """The InterruptedAtOnce behind `exc`, if a second Ctrl-C is what ended it."""
    return next((e for e in exception_chain(exc) if isinstance(e, InterruptedAtOnce)), None)


STOP = WorkerStop()
