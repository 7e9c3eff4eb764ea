"""The run's trackers as one Lightning logger that cannot stop, slow or corrupt a run: RunTrackers,
which fans every call out to each tracker of train.loggers (prism.train.trackers.build makes it).
What reaches a tracker, and what happens when one fails: docs/tracking.md, "How the trackers are
built" and "A tracker that fails"."""

from __future__ import annotations

import logging
import queue
import threading
import time
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, Callable, Mapping

from lightning.pytorch.loggers import Logger
from lightning.pytorch.utilities.rank_zero import rank_zero_only

from prism.train.trackers.state import TrackerState

log = logging.getLogger(__name__)

QUEUE_CALLS = 10_000  # calls the remote trackers may fall behind before new ones are dropped
_CLOSE = object()


class Tracker(ABC):
    """One kind of tracker: how to open its run (returning its Lightning logger) and close it.
    Built from the run's config and plan; registered by `name` in prism.train.trackers.TRACKERS.
    `background`: a remote tracker, called on the trackers' thread; `package`: the module it
    needs and the extra that installs it, checked before anything runs."""

    name: str = ""
    background: bool = False
    package: tuple[str, str] | None = None

    def __init__(self, cfg, plan) -> None:
        self.cfg, self.plan, self.out = cfg, plan, Path(plan.out)

    @classmethod
    def check(cls, cfg) -> None:
        """Raise ConfigError, naming the key, for a setting of this tracker it cannot use; called
        for every registered tracker, selected or not (prism.train.trackers.check_trackers)."""
        return None

    def where(self) -> str:  # for the failure line: a URL, a folder
        return ""

    @abstractmethod
    def open(self, state: TrackerState) -> Logger:
        """Start or continue the tracker's run and return its Lightning logger."""

    def close(self, logger: Logger, status: str) -> None:
        logger.finalize(status)


def listed(names: list[str]) -> str:
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


class RunTrackers(Logger):
    """The Trainer's one logger: each call reaches every tracker, on rank 0 only, and only with
    the steps that tracker has not recorded yet (prism.train.trackers.state), whoever calls.

    Local trackers (TensorBoard, CSV) are called in line and flushed after each call, and their
    errors are the run's. Remote ones (W&B, MLflow) share one background thread behind one bounded
    queue, so training only enqueues; the first exception of one is named in one line and its
    later calls are dropped. At the end the remote trackers are closed together within one
    deadline, `wait_s`; one still busy then is named and left to its daemon thread."""

    def __init__(
        self,
        trackers: list[Tracker],
        state: TrackerState,
        identity: Callable[[], dict],
        wait_s: float,
        save_dir: str | None = None,
    ) -> None:
        super().__init__()
        self.trackers = list(trackers)
        self.local = [t for t in self.trackers if not t.background]
        self.remote = [t for t in self.trackers if t.background]
        self.state = state
        self.identity = identity  # the run's identity, added to the hyperparameters
        self.wait_s = float(wait_s)
        self._save_dir = save_dir
        self.opened: dict[str, Logger] = {}  # each tracker's own Lightning logger, once open
        self.failed: set[str] = set()
        self._closed_remote: set[str] = set()
        self._fail_lock = threading.Lock()
        self._queue: queue.Queue | None = None
        self._thread: threading.Thread | None = None
        self._dropped = 0
        self._finalized = False
        self._warned_unlogged = False

    # ----- what Lightning asks of a logger (never touching a tracker itself) ---------------------
    @property
    def name(self) -> str:
        return "trackers"

    @property
    def version(self) -> str:
        return ""

    @property
    def save_dir(self) -> str | None:
        return self._save_dir

    @property
    def log_dir(self) -> str | None:
        return self._save_dir

    # ----- the run's start (prism.train.trackers.begin, rank 0, after the fresh/resume decision) -----
    def begin(self, fresh: bool, earlier=()) -> None:
        if self.state.began:
            return
        self.state.begin(fresh, earlier)
        for tracker in self.local:
            self.opened[tracker.name] = tracker.open(self.state)
        if self.remote:
            self._queue = queue.Queue(maxsize=QUEUE_CALLS)
            self._thread = threading.Thread(target=self._work, name="prism-trackers", daemon=True)
            self._thread.start()

    # ----- calls ---------------------------------------------------------------------------------
    @rank_zero_only
    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        if not isinstance(params, Mapping):
            params = vars(params)  # an argparse.Namespace
        self._submit(("hparams", {**params, **self.identity()}))

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
    def save(self) -> None:
        pass  # every delivered call is flushed already

    @rank_zero_only
    def finalize(self, status: str) -> None:
        if self._finalized or not self.state.began:
            return
        self._finalized = True
        deadline = time.monotonic() + self.wait_s  # one deadline for every remote tracker
        if self._queue is not None:
            try:  # the thread drains the queue, so a full one makes room before the deadline
                self._queue.put((_CLOSE, status), timeout=self.wait_s)
            except queue.Full:
                pass
        for tracker in self.local:
            if tracker.name in self.opened:
                tracker.close(self.opened[tracker.name], status)
        if self._thread is None:
            return
        self._thread.join(max(0.0, deadline - time.monotonic()))
        if self._thread.is_alive():
            late = TimeoutError(f"it did not finish within {self.wait_s:g} s (train.tracker_wait_s)")
            for tracker in self.remote:
                if tracker.name not in self._closed_remote:
                    self._fail(tracker, late, verb="gave up")
        elif self._dropped:
            log.warning(
                f"the remote trackers ({listed([t.name for t in self.remote])}) lost "
                f"{self._dropped} logging call(s) while they lagged behind."
            )

    # ----- delivery ------------------------------------------------------------------------------
    def _submit(self, call: tuple) -> None:
        if not self.state.began or self._finalized:
            return
        for tracker in self.local:
            self._deliver(tracker, call)  # a local tracker: an error here is the run's error
        if self._queue is None or all(t.name in self.failed for t in self.remote):
            return
        try:
            self._queue.put_nowait(call)
        except queue.Full:
            if not self._dropped:
                log.warning(
                    f"the remote trackers ({listed([t.name for t in self.remote])}) are {QUEUE_CALLS} "
                    f"calls behind; their new metrics are dropped until they catch up (training continues)."
                )
            self._dropped += 1

    def _deliver(self, tracker: Tracker, call: tuple) -> None:
        logger, name = self.opened[tracker.name], tracker.name
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

    def _work(self) -> None:
        """The remote trackers' thread: open each, deliver every call to each that has not
        failed, close them all at the end."""
        for tracker in self.remote:
            try:
                self.opened[tracker.name] = tracker.open(self.state)
            except BaseException as exc:  # noqa: B036 - anything a tracker raises stays here
                self._fail(tracker, exc)
        while True:
            call = self._queue.get()
            for tracker in self.remote:
                if tracker.name in self.failed:
                    continue
                try:
                    if call[0] is _CLOSE:
                        tracker.close(self.opened[tracker.name], call[1])
                        self._closed_remote.add(tracker.name)
                    else:
                        self._deliver(tracker, call)
                except BaseException as exc:  # noqa: B036
                    self._fail(tracker, exc)
            if call[0] is _CLOSE:
                return

    def _fail(self, tracker: Tracker, exc: BaseException, verb: str = "failed") -> None:
        with self._fail_lock:
            if tracker.name in self.failed:
                return  # one line per tracker and run
            self.failed.add(tracker.name)
            alive = [t.name for t in self.trackers if t.name not in self.failed]
        cause = " ".join(str(exc).split())[:300] or type(exc).__name__
        where = f" at {tracker.where()}" if tracker.where() else ""
        keep = (
            f"{listed(alive)} keep{'s' if len(alive) == 1 else ''} recording"
            if alive
            else "with no tracker recording"
        )
        log.warning(
            f"{tracker.name} tracker{where} {verb} ({type(exc).__name__}: {cause}); "
            f"training continues, {keep}."
        )
