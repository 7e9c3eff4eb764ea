"""One tracker as a Lightning logger that cannot stop, slow or corrupt a run.

TrackerLogger wraps the Lightning logger of one tracker (prism.train.trackers.build makes both). Every
call reaches it only on rank 0 and only with the steps that tracker has not recorded yet
(prism.train.trackers.state), whoever calls: Lightning itself, the kit's callbacks, or any code that
loops over `trainer.loggers`.

Local trackers (TensorBoard, CSV) are called in line and flushed after each call, so what their
floors say is on disk. Remote ones (W&B, MLflow) run on a background thread behind a bounded queue:
training only enqueues. The first exception of a remote tracker is named in one line and its
later calls are dropped; at the end the run waits `wait_s` at most for the queue to drain, then
goes on without it (the thread is a daemon, so it cannot hold the process at exit either)."""

from __future__ import annotations

import logging
import queue
import threading
import time
from abc import ABC, abstractmethod
from typing import Any, Callable, Mapping

from lightning.pytorch.loggers import Logger
from lightning.pytorch.utilities.rank_zero import rank_zero_only

from prism.train.trackers.state import TrackerState

log = logging.getLogger(__name__)

QUEUE_CALLS = 10_000  # calls a remote tracker may fall behind before new ones are dropped
_CLOSE = object()


class Tracker(ABC):
    """What TrackerLogger needs of one tracker: how to open its run (returning the Lightning
    logger) and how to close it. prism.train.trackers.build has one per kind."""

    name: str = ""
    background: bool = False

    def where(self) -> str:  # for the failure line: a URL, a folder
        return ""

    @abstractmethod
    def open(self, state: TrackerState) -> Logger:
        """Start or continue the tracker's run and return its Lightning logger."""

    def close(self, logger: Logger, status: str) -> None:
        logger.finalize(status)


class TrackerLogger(Logger):
    def __init__(
        self,
        tracker: Tracker,
        state: TrackerState,
        identity: Callable[[], dict],
        others: Callable[[str], str],
        wait_s: float,
        save_dir: str | None = None,
        log_dir: str | None = None,
        version: str = "",
        siblings: list | None = None,
        closing: dict | None = None,
    ) -> None:
        super().__init__()
        # the run's other TrackerLoggers and their shared end: Lightning finalizes loggers one
        # after the other, but every remote tracker is told to close at the first finalize and
        # all of them together get `wait_s`, not `wait_s` each
        self.siblings = siblings if siblings is not None else [self]
        self.closing = closing if closing is not None else {}
        self.tracker = tracker
        self.state = state
        self.identity = identity  # the run's identity, added to the hyperparameters
        self.others = others  # names the trackers that keep recording when this one fails
        self.wait_s = float(wait_s)
        self._save_dir, self._log_dir, self._version = save_dir, log_dir, version
        self.logger: Logger | None = None  # the real one, once opened
        self.failed = False
        self._queue: queue.Queue | None = None
        self._thread: threading.Thread | None = None
        self._dropped = 0
        self._closed = False
        self._close_sent = False
        self._warned_unlogged = False

    # ----- what Lightning asks of a logger (never touching the tracker itself) -------------------
    @property
    def name(self) -> str:
        return self.tracker.name

    @property
    def version(self) -> str:
        return self._version

    @property
    def save_dir(self) -> str | None:
        return self._save_dir

    @property
    def log_dir(self) -> str | None:
        return self._log_dir

    # ----- the run's start (prism.train.trackers.begin, rank 0, after the fresh/resume decision) -------
    def begin(self, fresh: bool, earlier=()) -> None:
        self.state.begin(fresh, earlier)
        if self.tracker.background:
            self._queue = queue.Queue(maxsize=QUEUE_CALLS)
            self._thread = threading.Thread(target=self._work, name=f"prism-{self.name}-tracker", daemon=True)
            self._thread.start()
        else:
            self.logger = self.tracker.open(self.state)

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
                log.warning(
                    f"{self.name} tracker: metrics logged without a step are not recorded "
                    f"({sorted(metrics)})."
                )
            return  # the kit logs every metric at a step
        values = {k: (v.item() if hasattr(v, "item") else v) for k, v in metrics.items()}
        self._submit(("metrics", values, int(step)))

    @rank_zero_only
    def save(self) -> None:
        pass  # every delivered call is flushed already

    @rank_zero_only
    def finalize(self, status: str) -> None:
        if self._closed or not self.state.began:
            return
        self._closed = True
        if not self.tracker.background:
            if self.logger is not None:
                self.tracker.close(self.logger, status)
            return
        deadline = self.closing.setdefault("deadline", time.monotonic() + self.wait_s)
        for lg in self.siblings:
            lg.send_close(status)
        self._thread.join(max(0.0, deadline - time.monotonic()))
        if self._thread.is_alive():
            self._fail(
                TimeoutError(f"it did not finish within {self.wait_s:g} s (train.tracker_wait_s)"),
                verb="gave up",
            )
        elif self._dropped and not self.failed:
            log.warning(f"{self.name} tracker: {self._dropped} logging call(s) were dropped while it lagged.")

    def send_close(self, status: str) -> None:
        """Queue the close of a remote tracker (once), never blocking: a queue still full at
        the end means the tracker is hopelessly behind, and its thread is left to the exit."""
        if not self.tracker.background or not self.state.began or self._close_sent:
            return
        self._close_sent = True
        try:
            self._queue.put_nowait((_CLOSE, status))
        except queue.Full:
            pass

    # ----- delivery ------------------------------------------------------------------------------
    def _submit(self, call: tuple) -> None:
        if not self.state.began or self.failed or self._closed or self._close_sent:
            return
        if not self.tracker.background:
            self._deliver(call)  # a local tracker: an error here is the run's error, as before
            return
        try:
            self._queue.put_nowait(call)
        except queue.Full:
            if not self._dropped:
                log.warning(
                    f"{self.name} tracker is {QUEUE_CALLS} calls behind; its new metrics are dropped "
                    f"until it catches up (training continues)."
                )
            self._dropped += 1

    def _deliver(self, call: tuple) -> None:
        kind, *args = call
        if kind == "hparams":
            if not self.state.has_hparams(self.name):
                self.logger.log_hyperparams(args[0])
                self.logger.save()
                self.state.mark_hparams(self.name)
        else:
            metrics, step = args
            fresh = self.state.unseen(self.name, metrics, step)
            if fresh:
                self.logger.log_metrics(fresh, step=step)
                self.logger.save()
                self.state.recorded(self.name, fresh, step)

    def _work(self) -> None:
        try:
            self.logger = self.tracker.open(self.state)
        except BaseException as exc:  # noqa: B036 - anything the tracker raises stays here
            self._fail(exc)
        while True:
            call = self._queue.get()
            if call[0] is _CLOSE:
                if not self.failed and self.logger is not None:
                    try:
                        self.tracker.close(self.logger, call[1])
                    except BaseException as exc:  # noqa: B036
                        self._fail(exc)
                return
            if self.failed:
                continue
            try:
                self._deliver(call)
            except BaseException as exc:  # noqa: B036
                self._fail(exc)

    def _fail(self, exc: BaseException, verb: str = "failed") -> None:
        if self.failed:
            return  # one line per tracker and run
        self.failed = True
        cause = " ".join(str(exc).split())[:300] or type(exc).__name__
        where = self.tracker.where()
        log.warning(
            f"{self.name} tracker{f' at {where}' if where else ''} {verb} ({type(exc).__name__}: {cause}); "
            f"training continues, {self.others(self.name)}."
        )
