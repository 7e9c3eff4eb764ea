"""The run's trackers as one Lightning logger that cannot stop, slow or corrupt a run (RunTrackers):
docs/tracking.md, "How the trackers are built" and "A tracker that fails"."""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from lightning.pytorch.loggers import Logger
from lightning.pytorch.utilities.rank_zero import rank_zero_only

from prism.train.trackers.state import TrackerState

log = logging.getLogger(__name__)

QUEUE_CALLS = 10_000  # calls a remote tracker may fall behind before its new ones are dropped
_CLOSE = object()


@dataclass(frozen=True)
class Tracker:
    """One kind of tracker, a row of TRACKERS (docs/tracking.md, "How the trackers are built")."""

    open: Callable[[Any, TrackerState], Logger]  # (TrackedRun, state) -> its started or continued logger
    close: Callable[[Logger, str], None] = lambda logger, status: logger.finalize(status)
    where: Callable[[Any], str] = lambda run: ""  # where it records, for the failure line
    check: Callable[[Any], None] = lambda cfg: None  # ConfigError for a setting it cannot use
    background: bool = False  # a remote tracker, called on a thread of its own
    package: tuple[str, str] | None = None  # the module it needs and the extra that installs it


class RunTrackers(Logger):
    """The Trainer's one logger: each call reaches every tracker, on rank 0 only, with the steps it
    has not recorded yet; local ones in line, each remote one on its own thread and queue."""

    def __init__(self, trackers: Mapping[str, Tracker], run: Any, state: TrackerState, wait_s: float) -> None:
        super().__init__()
        self.trackers = dict(trackers)
        self.local = [n for n, t in self.trackers.items() if not t.background]
        self.remote = [n for n, t in self.trackers.items() if t.background]
        self.run = run  # what each tracker opens with; its identity goes beside the hyperparameters
        self.state = state
        self.wait_s = float(wait_s)
        self.opened: dict[str, Logger] = {}  # each tracker's own Lightning logger, once open
        self.failed: set[str] = set()
        self._fail_lock = threading.Lock()
        # per remote tracker, by name: its queue (one slot above QUEUE_CALLS, which calls never take:
        # the close always fits), its thread (started by begin), the calls dropped while it lagged
        self._queues = {n: queue.Queue(maxsize=QUEUE_CALLS + 1) for n in self.remote}
        self._threads = {
            n: threading.Thread(target=self._work, args=(n,), name=f"prism-{n}-tracker", daemon=True)
            for n in self.remote
        }
        self._dropped = dict.fromkeys(self.remote, 0)
        self._finalized = self._warned_unlogged = False

    # ----- what Lightning asks of a logger (never touching a tracker itself) ---------------------
    @property
    def name(self) -> str:
        return "trackers"

    @property
    def version(self) -> str:
        return ""

    @property
    def save_dir(self) -> str:
        return str(self.run.out)

    # ----- the run's start (prism.train.trackers.begin, rank 0, after the fresh/resume decision) -----
    def begin(self, fresh: bool, earlier=()) -> None:
        if self.state.began:
            return
        self.state.begin(fresh, earlier)
        for name in self.local:
            self.opened[name] = self.trackers[name].open(self.run, self.state)
        for thread in self._threads.values():
            thread.start()

    @rank_zero_only
    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        if not isinstance(params, Mapping):
            params = vars(params)  # an argparse.Namespace
        self._submit(("hparams", {**params, **self.run.identity}))

    @rank_zero_only
    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        if step is None or not metrics:
            if metrics and not self._warned_unlogged:
                self._warned_unlogged = True
                log.warning(f"metrics logged without a step are not recorded ({sorted(metrics)}).")
            return  # the kit logs every metric at a step
        values = {k: (v.item() if hasattr(v, "item") else v) for k, v in metrics.items()}
        self._submit(("metrics", values, int(step)))

    @rank_zero_only
    def finalize(self, status: str) -> None:
        if self._finalized or not self.state.began:
            return
        self._finalized = True
        deadline = time.monotonic() + self.wait_s  # one deadline for every remote tracker
        for q in self._queues.values():  # every remote tracker starts closing now, on its thread
            q.put_nowait((_CLOSE, status))  # calls leave the close its slot
        for name in self.local:
            if name in self.opened:
                self.trackers[name].close(self.opened[name], status)
        for thread in self._threads.values():
            if thread.ident is not None:  # begin() may have failed before starting them
                thread.join(max(0.0, deadline - time.monotonic()))
        late = [n for n in self.remote if self._threads[n].is_alive()]
        if late:
            exc = TimeoutError(f"it did not finish within {self.wait_s:g} s (train.tracker_wait_s)")
            self._fail(late, exc, verb="gave up")
        for name in self.remote:
            if self._dropped[name] and name not in self.failed:
                log.warning(
                    f"{name} tracker: {self._dropped[name]} logging call(s) were dropped while it lagged."
                )

    def _submit(self, call: tuple) -> None:
        if not self.state.began or self._finalized:
            return
        for name in self.local:
            self._deliver(name, call)  # a local tracker: an error here is the run's error
        for name in self.remote:
            if name in self.failed:
                continue
            if self._queues[name].qsize() >= QUEUE_CALLS:  # only this thread puts: never over
                if not self._dropped[name]:
                    log.warning(
                        f"{name} tracker is {QUEUE_CALLS} calls behind; its new metrics are dropped "
                        f"until it catches up (training continues)."
                    )
                self._dropped[name] += 1
            else:
                self._queues[name].put_nowait(call)

    def _deliver(self, name: str, call: tuple) -> None:
        logger = self.opened[name]
        kind, *args = call
        if kind == "hparams":
            if not self.state.has_hparams(name):
                logger.log_hyperparams(args[0])
                logger.save()
                self.state.mark_hparams(name)
        else:
            metrics, step = args
            fresh = self.state.unseen(name, metrics, step)
            if fresh:
                logger.log_metrics(fresh, step=step)
                logger.save()
                self.state.recorded(name, fresh, step)

    def _work(self, name: str) -> None:
        """One remote tracker's thread: open it, deliver its calls, close it; stop at its first failure."""
        tracker, calls = self.trackers[name], self._queues[name]
        try:
            self.opened[name] = tracker.open(self.run, self.state)
            while name not in self.failed:
                call = calls.get()
                if name in self.failed:
                    return  # given up while it was busy: nothing more reaches it
                if call[0] is _CLOSE:
                    tracker.close(self.opened[name], call[1])
                    return
                self._deliver(name, call)
        except BaseException as exc:  # noqa: B036 - anything a tracker raises stays here
            self._fail([name], exc)

    def _fail(self, names: list[str], exc: BaseException, verb: str = "failed") -> None:
        """Name each tracker that now fails (or is given up on) in one line, once per run, all marked
        first, so that no line says one of them keeps recording."""
        with self._fail_lock:
            new = [n for n in names if n not in self.failed]
            self.failed.update(new)
            alive = [n for n in self.trackers if n not in self.failed]
        cause = " ".join(str(exc).split())[:300] or type(exc).__name__
        keep = "with no tracker recording"
        if alive:
            listed = alive[0] if len(alive) == 1 else f"{', '.join(alive[:-1])} and {alive[-1]}"
            keep = f"{listed} keep{'s' if len(alive) == 1 else ''} recording"
        for name in new:
            where = self.trackers[name].where(self.run)
            log.warning(
                f"{name} tracker{f' at {where}' if where else ''} {verb} ({type(exc).__name__}: {cause}); "
                f"training continues, {keep}."
            )
