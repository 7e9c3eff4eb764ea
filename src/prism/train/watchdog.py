"""The hang watchdog: a thread in every rank that notices when training stops making progress,
writes each rank's state, names the rank(s) that held the others, and ends the rank as a crash.

A rank that hangs (a stuck GPU, a lost link, a read that never returns, a process stopped by the
system) holds every other rank in its next collective, so no rank can ask the others anything.
Instead each rank's thread writes a heartbeat file (rank, node, optimizer step, phase, when it
last finished a step) into the run folder's diagnostics/<attempt>/ every few seconds: the run
folder is on a filesystem every node sees. A stopped or frozen process stops writing; a rank
blocked in a read keeps writing but its step does not move. When this rank has finished no step
for its allowance, it:
1. writes every thread's Python stack, its step and phase, and the flight recorder's record of
   its collectives (where torch keeps one) into diagnostics/<attempt>/;
2. names, from the heartbeats, the rank(s) that made no progress and their node (`hung_ranks`),
   in one sentence on stderr (the stage log) and in the ending the pipeline reads;
3. exits with EXIT_CRASHED, which srun (--kill-on-bad-exit), torchrun and run_all.py treat as a
   crash: the launcher ends the ranks that cannot exit by themselves, and the run is retried from
   its newest checkpoint.

The allowance is train.hang_timeout_s once the first steps have passed; before them (start-up,
loading a checkpoint, compilation) a little less than train.ddp_timeout_s, so that the watchdog,
with its diagnostics, acts before the collective's own timeout. Once the first steps have passed
the collective timeout is shortened to train.hang_timeout_s plus a margin (`collective_timeout`),
as torchtitan does: a backstop for a watchdog that cannot run. docs/cluster.md, "When a run hangs
or crawls"."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import traceback
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Callable

from prism import cluster, compat
from prism.io import atomic_write_json, atomic_write_text

# Phases a rank reports. In these it may be waiting for its peers inside a collective (DDP's
# gradient all-reduce runs during the backward pass); in the others (data, checkpoint, start-up)
# it holds them.
STARTUP, DATA, COMPUTE, OPTIMIZER, VALIDATION, CHECKPOINT, COLLECTIVE = (
    "start-up",
    "data",
    "forward/backward",
    "optimizer step",
    "validation",
    "checkpoint",
    "collective",
)
WAITING_PHASES = frozenset({COMPUTE, OPTIMIZER, VALIDATION, COLLECTIVE})
WARM_STEPS = 2  # steps of a launch that get the start-up allowance (the first one compiles)


def margin(timeout_s: float) -> float:
    """How much longer than the watchdog's allowance a collective waits: a minute, or the
    allowance itself when that is shorter (tests)."""
    return min(60.0, timeout_s)


def collective_timeout(hang_timeout_s: float) -> float:
    """The collective timeout after the first steps: the watchdog acts first."""
    return hang_timeout_s + margin(hang_timeout_s)


def first_allowance(ddp_timeout_s: float) -> float:
    """The watchdog's allowance during the first steps, which run under train.ddp_timeout_s."""
    return ddp_timeout_s - min(60.0, ddp_timeout_s / 2)


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
    progress_at: float  # wall time of its last finished step (or of its start)
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
    """The rank(s) that held the others, from every rank's heartbeat (None: none was read):
    - ranks without a heartbeat, or whose heartbeat stopped (a stopped or frozen process);
    - else the ranks behind the others' step;
    - else, at the same step, the ranks outside a collective (reading data, writing a
      checkpoint) while others wait in one;
    - else every rank (all stuck alike, e.g. in the same collective)."""
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


def describe(verdict: Verdict, beats: dict[int, Beat | None], waited_s: float, folder: Path) -> str:
    """The one sentence a hang leaves on the console and in the log."""
    parts = []
    for r in verdict.ranks:
        b = beats.get(r)
        if b is None:
            parts.append(f"rank {r} (no heartbeat: it never started its watchdog)")
            continue
        state = f"step {b.step}, {b.phase}"
        if verdict.why == "stopped":
            state += f", heartbeat silent for {time.time() - b.written_at:.0f} s: stopped or frozen"
        parts.append(f"rank {r} on {b.node} ({state})")
    who = "; ".join(parts)
    every = " (every rank was stuck alike)" if verdict.why == "all" and len(verdict.ranks) > 1 else ""
    return (
        f"hang: no optimizer step finished for {waited_s:.0f} s; no progress from {who}{every}; "
        f"every running rank's stacks, step and phase are in {folder}, and this rank ends as a crash "
        f"(exit code {cluster.EXIT_CRASHED}) for a retry from the newest checkpoint"
    )


def heartbeat_path(folder: Path, rank: int) -> Path:
    return folder / f"heartbeat-rank{rank}.json"


def report_path(folder: Path, rank: int) -> Path:
    return folder / f"rank{rank}-hang.json"


def stacks_path(folder: Path, rank: int) -> Path:
    return folder / f"rank{rank}-stacks.txt"


def flight_recorder_path(folder: Path, rank: int) -> Path:
    return folder / f"rank{rank}-flight-recorder.pkl"


def thread_stacks() -> str:
    """Every Python thread's stack, named, innermost call last."""
    names = {t.ident: t.name for t in threading.enumerate()}
    out = []
    for ident, frame in sys._current_frames().items():
        out.append(f"Thread {names.get(ident, '?')} ({ident}):\n")
        out.extend(traceback.format_stack(frame))
        out.append("\n")
    return "".join(out)


def _exit_crashed() -> None:  # pragma: no cover - the process ends here
    sys.stderr.flush()
    sys.stdout.flush()
    os._exit(cluster.EXIT_CRASHED)


class Watchdog:
    """The thread of one rank. `progress(step)` after every optimizer step, `phase(name)` when the
    rank moves on; start() once the run folder exists, stop() when training ends."""

    def __init__(
        self,
        folder: Path,
        rank: int,
        world_size: int,
        timeout_s: float,
        first_timeout_s: float,
        on_hang: Callable[[], None] = _exit_crashed,
    ) -> None:
        self.folder, self.rank, self.world_size = Path(folder), rank, world_size
        self.timeout_s, self.first_timeout_s = timeout_s, first_timeout_s
        self.interval_s = beat_interval(min(timeout_s, first_timeout_s))
        self.on_hang = on_hang
        self.node, self.pid = cluster.node_name(), os.getpid()
        self.step, self.steps_done, self._phase = 0, 0, STARTUP
        self.progress_at = time.time()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="prism-hang-watchdog", daemon=True)
        self.report: str | None = None  # the sentence, once it acted

    # ----- called by the training loop (cheap: attribute writes only) ---------------------------
    def progress(self, step: int) -> None:
        self.step, self.progress_at = step, time.time()
        self.steps_done += 1
        self._phase = DATA

    def phase(self, name: str) -> None:
        self._phase = name

    @property
    def allowance_s(self) -> float:
        return self.timeout_s if self.steps_done >= WARM_STEPS else self.first_timeout_s

    # ----- the thread ----------------------------------------------------------------------------
    def start(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        self.progress_at = time.time()
        self._beat()
        self._thread.start()

    def stop(self) -> None:
        """Training ended: the thread stops and its heartbeat goes (an empty folder with it)."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        heartbeat_path(self.folder, self.rank).unlink(missing_ok=True)
        for empty in (self.folder, self.folder.parent):  # diagnostics/ too, when nothing is in it
            try:
                empty.rmdir()
            except OSError:
                break  # other ranks' files, or a hang's report

    def _beat(self) -> None:
        beat = Beat(self.rank, self.node, self.pid, self.step, self._phase, self.progress_at, time.time())
        try:
            atomic_write_json(heartbeat_path(self.folder, self.rank), asdict(beat))
        except OSError:
            pass  # a full disk: the peers see a silent heartbeat, as for a frozen rank

    def _run(self) -> None:
        last = time.time()
        while not self._stop.wait(self.interval_s):
            now = time.time()
            # this thread itself did not run for a while: the process was stopped (SIGSTOP) or
            # frozen, and the launcher woke it to end it; the peers named it already
            silent = now - last
            last = now
            self._beat()
            waited = now - self.progress_at
            if waited > self.allowance_s:
                self.act(waited, silent if silent > stale_after(self.interval_s) else None)
                return

    def read_beats(self) -> dict[int, Beat | None]:
        return {r: Beat.read(heartbeat_path(self.folder, r)) for r in range(self.world_size)}

    def act(self, waited_s: float, frozen_s: float | None = None) -> None:
        """Write this rank's state, name the ranks that made no progress, end the rank.
        `frozen_s`: how long this rank's own thread did not run (it was stopped itself)."""
        now = time.time()
        try:
            atomic_write_text(stacks_path(self.folder, self.rank), thread_stacks())
            try:
                dump = compat.flight_recorder_dump()
            except Exception:  # no collective recorded, or no backend that keeps a record
                dump = None
            if dump:
                with open(flight_recorder_path(self.folder, self.rank), "wb") as f:
                    f.write(dump)
        except OSError:
            pass
        beats = self.read_beats()
        beats[self.rank] = Beat(self.rank, self.node, self.pid, self.step, self._phase, self.progress_at, now)
        verdict = hung_ranks(beats, now, stale_after(self.interval_s))
        if frozen_s is not None:  # the others' heartbeats stopped while this rank was stopped
            verdict = Verdict((self.rank,), "stopped")
            beats[self.rank] = replace(beats[self.rank], written_at=now - frozen_s)
        sentence = describe(verdict, beats, waited_s, self.folder)
        self.report = sentence
        report = {
            "rank": self.rank,
            "node": self.node,
            "pid": self.pid,
            "step": self.step,
            "phase": self._phase,
            "seconds_without_progress": round(waited_s, 3),
            "allowance_s": self.allowance_s,
            "hung_ranks": list(verdict.ranks),
            "why": verdict.why,
            "sentence": sentence,
            "at": now,
        }
        try:
            atomic_write_json(report_path(self.folder, self.rank), report)
        except OSError:
            pass
        sys.stderr.write(f"[rank {self.rank}] {sentence}\n")
        _leave_ending(sentence)
        self._wait_for_peers(verdict)
        self.on_hang()

    def _wait_for_peers(self, verdict: Verdict) -> None:
        """Give every rank that still runs the time to write its own state before this one exits
        (srun then ends the whole step at once): at most two heartbeats and a few seconds."""
        stale = stale_after(self.interval_s)
        deadline = time.monotonic() + 2 * self.interval_s + 5
        while time.monotonic() < deadline:
            now = time.time()
            running = [
                r for r, b in self.read_beats().items() if b is not None and now - b.written_at <= stale
            ]
            if all(report_path(self.folder, r).is_file() for r in running):
                return
            time.sleep(0.2)


def _leave_ending(sentence: str) -> None:
    """How this process ended, where a pipeline runner reads it (the format of
    prism.cli.exits.leave_ending, with the kind `hung`: prism.pipeline.crashes)."""
    folder = os.environ.get(cluster.ENDINGS_DIR_ENV)
    if not folder:
        return
    import socket

    path = Path(folder) / f"{socket.gethostname()}-{os.getpid()}.json"
    try:
        atomic_write_json(path, {"kind": "hung", "exit_code": cluster.EXIT_CRASHED, "sentence": sentence})
    except OSError:
        pass


# torch's flight recorder: a ring buffer of each rank's last collectives, which NCCL's own
# watchdog dumps when a collective times out (TORCH_NCCL_DUMP_ON_TIMEOUT) and this watchdog
# dumps when a rank stops making progress. Read a dump with torch's `torchfrtrace`.
FLIGHT_RECORDER_ENV = {
    "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000",  # collectives kept per rank (torchtitan keeps 20000)
    "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
}
FLIGHT_RECORDER_FILE_VARS = ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE")  # new, old name


def flight_recorder_env(folder: Path, env: dict | None = None) -> dict:
    """The flight recorder's settings, with its dumps in `folder` (the run's diagnostics/<attempt>/;
    torch appends the rank to the file name). Set before the process group exists; a value the
    user or the batch script set already is kept."""
    env = os.environ if env is None else env
    for key, value in FLIGHT_RECORDER_ENV.items():
        env.setdefault(key, value)
    for key in FLIGHT_RECORDER_FILE_VARS:
        env.setdefault(key, str(Path(folder) / "nccl-flight-recorder-rank"))
    return env
