"""The hang watchdog: a thread per rank that writes its heartbeat and, after its allowance without
progress, its stacks, names the rank(s) that held the others and exits EXIT_CRASHED (docs/cluster.md)."""

from __future__ import annotations

import json
import os
import shutil
import sys
import threading
import time
import traceback
from contextlib import suppress
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

from prism import cluster, compat
from prism.config.values import invalid
from prism.io import atomic_write_json, atomic_write_text

# phases a rank reports; in these it may be waiting for its peers inside a collective
PHASES = ("start-up", "data", "forward/backward", "optimizer step", "validation", "checkpoint", "collective")
STARTUP, DATA, COMPUTE, OPTIMIZER, VALIDATION, CHECKPOINT, COLLECTIVE = PHASES
WAITING_PHASES = frozenset({COMPUTE, OPTIMIZER, VALIDATION, COLLECTIVE})
# phases that run under train.ddp_timeout_s's collectives, so get the long allowance
LONG_PHASES = frozenset({STARTUP, CHECKPOINT})
WARM_STEPS = 2  # steps of a launch that get the long allowance (the first one compiles)
KEEP_ATTEMPTS = 3  # earlier attempts' folders kept in diagnostics/ (a hang's state; rank 0 prunes)


def collective_timeout(hang_timeout_s: float) -> float:
    """The collective timeout after the first steps: the allowance plus a minute (at most the
    allowance again), so that the watchdog acts first."""
    return hang_timeout_s + min(60.0, hang_timeout_s)


def long_allowance(ddp_timeout_s: float) -> float:
    """The allowance in LONG_PHASES and the first steps, which run under train.ddp_timeout_s: a
    minute (at most half) less, so that the watchdog acts before it."""
    return ddp_timeout_s - min(60.0, ddp_timeout_s / 2)


def allowance(phase: str, steps_done: int, timeout_s: float, long_s: float) -> float:
    """How long a rank may go without progress: `long_s` early and in LONG_PHASES, else `timeout_s`."""
    return long_s if steps_done < WARM_STEPS or phase in LONG_PHASES else timeout_s


def check_timeouts(hang_timeout_s: float, ddp_timeout_s: float) -> None:
    """Refuse a hang timeout that the collective timeout would always beat."""
    most = long_allowance(ddp_timeout_s)
    if hang_timeout_s > most:
        raise invalid(
            "train.hang_timeout_s",
            hang_timeout_s,
            f"use 0 (off) or at most {most:g} s with train.ddp_timeout_s={ddp_timeout_s:g}, whose "
            f"collectives would otherwise fail before the watchdog names the hung rank "
            f"(or raise train.ddp_timeout_s)",
        )


def beat_interval(timeout_s: float) -> float:
    """Seconds between heartbeats: a tenth of the allowance, between 0.5 and 15."""
    return min(15.0, max(0.5, timeout_s / 10))


def stale_after(interval_s: float) -> float:
    """A heartbeat older than this is from a rank that stopped running (three missed beats)."""
    return 3 * interval_s + 2


@dataclass(frozen=True)
class Beat:
    """One rank's heartbeat."""

    rank: int
    node: str
    pid: int
    step: int  # optimizer steps done (the trainer's global step)
    phase: str
    progress_at: float  # wall time of its last finished batch (or of its start)
    written_at: float  # wall time of this heartbeat

    @classmethod
    def read(cls, path: Path) -> Beat | None:
        try:
            return cls(**json.loads(path.read_text()))
        except (OSError, ValueError, TypeError):
            return None


@dataclass(frozen=True)
class Verdict:
    """Which ranks made no progress, and why they were chosen."""

    ranks: tuple[int, ...]
    why: str  # "stopped" (no heartbeat for a while), "missing", "behind", "holding", "all"


def hung_ranks(beats: dict[int, Beat | None], now: float, stale_s: float) -> Verdict:
    """The rank(s) that held the others, from every rank's heartbeat (None: none was read): those
    missing or stopped, else behind, else outside a collective, else all (docs/cluster.md)."""
    missing = tuple(r for r, b in sorted(beats.items()) if b is None)
    if missing:
        return Verdict(missing, "missing")
    live = {r: b for r, b in beats.items() if b is not None}
    stopped = tuple(r for r, b in sorted(live.items()) if now - b.written_at > stale_s)
    if stopped:
        return Verdict(stopped, "stopped")
    low = min(b.step for b in live.values())
    behind = tuple(r for r, b in sorted(live.items()) if b.step == low)
    if len(behind) < len(live):
        return Verdict(behind, "behind")
    holding = tuple(r for r in behind if live[r].phase not in WAITING_PHASES)
    if holding and len(holding) < len(live):
        return Verdict(holding, "holding")
    return Verdict(tuple(sorted(live)), "all")


def describe(
    verdict: Verdict, beats: dict[int, Beat | None], waited_s: float, folder: Path, now: float
) -> str:
    """The one sentence a hang leaves on the console and in the log."""
    parts = []
    for r in verdict.ranks:
        b = beats.get(r)
        if b is None:
            parts.append(f"rank {r} (no heartbeat: it never started its watchdog)")
            continue
        state = f"step {b.step}, {b.phase}"
        if verdict.why == "stopped":
            state += f", heartbeat silent for {now - b.written_at:.0f} s: stopped or frozen"
        parts.append(f"rank {r} on {b.node} ({state})")
    every = " (every rank was stuck alike)" if verdict.why == "all" and len(verdict.ranks) > 1 else ""
    return (
        f"hang: no batch finished for {waited_s:.0f} s; no progress from {'; '.join(parts)}{every}; "
        f"every running rank's stacks, step and phase are in {folder}, and this rank ends as a crash "
        f"(exit code {cluster.EXIT_CRASHED}) for a retry from the newest checkpoint"
    )


def rank_file(folder: Path, rank: int, what: str) -> Path:
    """rank<R>-heartbeat.json, rank<R>-hang.json, rank<R>-stacks.txt, rank<R>-flight-recorder.pkl"""
    return folder / f"rank{rank}-{what}"


def thread_stacks() -> str:
    """Every Python thread's stack, named, innermost call last."""
    names = {t.ident: t.name for t in threading.enumerate()}
    out = []
    for ident, frame in sys._current_frames().items():
        out += [f"Thread {names.get(ident, '?')} ({ident}):\n", *traceback.format_stack(frame), "\n"]
    return "".join(out)


def prune_attempts(folder: Path, keep: int = KEEP_ATTEMPTS) -> None:
    """Leave only the newest `keep` attempt folders beside `folder` (this attempt's)."""
    try:
        older = [p for p in folder.parent.iterdir() if p.is_dir() and p != folder]
        older.sort(key=lambda p: p.stat().st_mtime)
    except OSError:
        return
    for old in older[: max(0, len(older) - keep)]:
        shutil.rmtree(old, ignore_errors=True)


def _exit_crashed() -> None:  # pragma: no cover - the process ends here
    sys.stderr.flush()
    sys.stdout.flush()
    os._exit(cluster.EXIT_CRASHED)


class Watchdog:
    """The thread of one rank, told of progress (`progress`) and of the phase it moves on to (`phase`)."""

    def __init__(
        self,
        folder: Path,
        rank: int,
        world_size: int,
        timeout_s: float,
        long_s: float,
        on_hang: Callable[[], None] = _exit_crashed,
    ) -> None:
        self.folder, self.rank, self.world_size = Path(folder), rank, world_size
        self.timeout_s, self.long_s = timeout_s, long_s
        self.interval_s = beat_interval(min(timeout_s, long_s))
        self.on_hang = on_hang
        self.node, self.pid = cluster.node_name(), os.getpid()
        self.step, self.steps_done, self._phase = 0, 0, STARTUP
        self.progress_at = time.time()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="prism-hang-watchdog", daemon=True)
        self.report: str | None = None  # the sentence, once it acted

    # ----- called by the training loop (cheap: attribute writes only) ---------------------------
    def progress(self, step: int | None = None) -> None:
        """A batch finished: an optimizer step (its number), or a validation or zero-shot batch."""
        self.progress_at = time.time()
        if step is not None:
            self.step, self.steps_done, self._phase = step, self.steps_done + 1, DATA

    def phase(self, name: str) -> None:
        # a finished save (or start-up) is progress: the next allowance counts from its end
        if self._phase in LONG_PHASES and name not in LONG_PHASES:
            self.progress_at = time.time()
        self._phase = name

    @property
    def allowance_s(self) -> float:
        return allowance(self._phase, self.steps_done, self.timeout_s, self.long_s)

    # ----- the thread ----------------------------------------------------------------------------
    def start(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        if self.rank == 0:
            prune_attempts(self.folder)
        self.progress_at = time.time()
        self._beat()
        self._thread.start()

    def stop(self) -> None:
        """Training ended: the thread stops and its heartbeat goes (an empty folder with it)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        rank_file(self.folder, self.rank, "heartbeat.json").unlink(missing_ok=True)
        for empty in (self.folder, self.folder.parent):  # diagnostics/ too, when nothing is in it
            try:
                empty.rmdir()
            except OSError:
                break  # other ranks' files, or a hang's report

    def _own(self, written_at: float) -> Beat:
        return Beat(self.rank, self.node, self.pid, self.step, self._phase, self.progress_at, written_at)

    def _write(self, what: str, doc: dict) -> None:
        """This rank's rank<R>-<what>; a full disk leaves it unwritten (as for a frozen rank)."""
        with suppress(OSError):
            atomic_write_json(rank_file(self.folder, self.rank, what), doc)

    def _beat(self) -> None:
        self._write("heartbeat.json", asdict(self._own(time.time())))

    def _run(self) -> None:
        last = time.time()
        while not self._stop.wait(self.interval_s):
            now = time.time()
            # a wait far past its interval: this process itself was stopped or frozen
            frozen_s = now - last if now - last > stale_after(self.interval_s) else None
            last = now
            self._beat()
            if now - self.progress_at > self.allowance_s:
                self.act(now - self.progress_at, frozen_s)
                return

    def read_beats(self) -> dict[int, Beat | None]:
        return {r: Beat.read(rank_file(self.folder, r, "heartbeat.json")) for r in range(self.world_size)}

    def act(self, waited_s: float, frozen_s: float | None = None) -> None:
        """Write this rank's state, name the ranks that made no progress, end the rank (`frozen_s`:
        how long this rank's own thread did not run)."""
        now = time.time()
        with suppress(OSError):
            atomic_write_text(rank_file(self.folder, self.rank, "stacks.txt"), thread_stacks())
            try:
                dump = compat.flight_recorder_dump()
            except Exception:  # no collective recorded, or no backend that keeps a record
                dump = None
            if dump:
                rank_file(self.folder, self.rank, "flight-recorder.pkl").write_bytes(dump)
        beats = self.read_beats()
        beats[self.rank] = self._own(now if frozen_s is None else now - frozen_s)
        verdict = hung_ranks(beats, now, stale_after(self.interval_s))
        if frozen_s is not None:  # the others' heartbeats stopped while this rank was stopped
            verdict = Verdict((self.rank,), "stopped")
        self.report = describe(verdict, beats, waited_s, self.folder, now)
        report = {
            **asdict(beats[self.rank]),
            "seconds_without_progress": round(waited_s, 3),
            "allowance_s": self.allowance_s,
            "hung_ranks": list(verdict.ranks),
            "why": verdict.why,
            "sentence": self.report,
            "at": now,
        }
        self._write("hang.json", report)
        sys.stderr.write(f"[rank {self.rank}] {self.report}\n")
        cluster.leave_ending("hung", cluster.EXIT_CRASHED, self.report)
        self._wait_for_peers()
        self.on_hang()

    def _wait_for_peers(self) -> None:
        """Give every rank that still runs two heartbeats and a few seconds to write its own state."""
        stale = stale_after(self.interval_s)
        deadline = time.monotonic() + 2 * self.interval_s + 5
        while time.monotonic() < deadline:
            now = time.time()
            beats = self.read_beats().items()
            running = [r for r, b in beats if b is not None and now - b.written_at <= stale]
            if all(rank_file(self.folder, r, "hang.json").is_file() for r in running):
                return
            time.sleep(0.2)


# torch's flight recorder: each rank's last collectives, dumped on a timeout or a hang (torchfrtrace)
FLIGHT_RECORDER_ENV = {
    "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000",  # collectives kept per rank (torchtitan keeps 20000)
    "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
}
FLIGHT_RECORDER_FILE_VARS = ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE")  # new, old name


def flight_recorder_env(folder: Path, env: dict | None = None) -> dict:
    """The flight recorder's settings, dumping into `folder` (a value set already is kept)."""
    env = os.environ if env is None else env
    for key, value in FLIGHT_RECORDER_ENV.items():
        env.setdefault(key, value)
    for key in FLIGHT_RECORDER_FILE_VARS:
        env.setdefault(key, str(Path(folder) / "nccl-flight-recorder-rank"))
    return env
