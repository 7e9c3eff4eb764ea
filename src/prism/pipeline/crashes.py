"""Which ends of a stage process are crashes that another attempt may get past, what caused each,
and on which node (docs/cluster.md, "Crashes: retried within the allocation": which exits count,
the endings the kit's processes leave in a folder, the launchers' lines read from the log's end)."""

from __future__ import annotations

import json
import re
import signal
import socket
from dataclasses import dataclass
from pathlib import Path

from prism.cluster import EXIT_CRASHED
from prism.processes import signal_name, signal_of

SRUN_TASK = re.compile(r"^srun: error: (?P<node>[^\s:]+): tasks? (?P<tasks>[\d,\-]+): (?P<what>.+)$")
LIGHTNING_CHILD = re.compile(
    r"^(?P<line>\[rank: \d+\] Child process with PID \d+ terminated with code -?\d+)"
)


@dataclass(frozen=True)
class Said:
    """How one process of a stage ended, in its own words (prism.cluster.leave_ending)."""

    kind: str  # error (a refusal: deterministic), crashed, hung, preempted or interrupted
    exit_code: int
    sentence: str


def read_said(folder: Path) -> list[Said]:
    """The endings the processes of one attempt left in `folder`, oldest first; an unreadable file
    is skipped (a process killed while writing leaves none: the writes are atomic)."""
    found: list[tuple[int, str, Said]] = []
    for path in folder.glob("*.json") if folder.is_dir() else ():
        try:
            doc = json.loads(path.read_text())
            said = Said(str(doc["kind"]), int(doc["exit_code"]), str(doc["sentence"]))
            found.append((path.stat().st_mtime_ns, path.name, said))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return [said for *_, said in sorted(found)]


def first_sentence(text: str, limit: int = 240) -> str:
    """An exception's message up to its first full stop (gloo's go on for three sentences)."""
    head = re.split(r"(?<=\.)\s", text, maxsplit=1)[0]
    return head if len(head) <= limit else head[: limit - 3] + "..."


@dataclass(frozen=True)
class Ending:
    """How one attempt of a stage ended, read from its exit code and its part of the log."""

    returncode: int
    crashed: bool  # another attempt may succeed
    cause: str  # one line: what the launcher or the program said, or the signal
    node: str | None  # where it happened, when known
    srun: bool = False  # launched by srun: `node` is one of the allocation's nodes

    def describe(self) -> str:
        """'exit code 137: srun: error: node2: task 1: Killed'"""
        return f"exit code {self.returncode}: {self.cause}"


def read_ending(
    returncode: int, output: str, launched_by_srun: bool, said: tuple[Said, ...] | list[Said] = ()
) -> Ending:
    """The Ending of an attempt that exited with `returncode` after writing `output` (its part of
    the stage log), whose processes left the endings `said` (read_said). A refusal from any rank
    makes it deterministic."""
    lines = [line.strip() for line in output.splitlines()]
    srun = [m for m in map(SRUN_TASK.match, lines) if m]
    # a task killed by a signal (an OOM kill, a segfault) is the cause; its peers then exit with
    # an error of their own, and on a loaded node srun may name one of those first
    srun.sort(key=lambda m: m.group("what").startswith("Exited with exit code"))
    refusals = [s.sentence for s in said if s.kind == "error"]
    hangs = [s.sentence for s in said if s.kind == "hung"]  # prism.train.watchdog named who held the rest
    crashed_lines = [s.sentence for s in said if s.kind == "crashed"]
    children = [m.group("line") for m in map(LIGHTNING_CHILD.match, lines) if m]
    signum = signal_of(returncode)
    if refusals:
        cause = f"error: {refusals[-1]}"
    elif hangs:
        cause = first_sentence(hangs[0], limit=400)
    elif srun:
        cause = srun[0].group(0)
    elif children:
        cause = children[0]
    elif crashed_lines:
        cause = f"crashed: {first_sentence(crashed_lines[-1])}"
    elif signum is not None:
        cause = f"killed by {signal_name(signum)}"
    else:
        cause = next((line for line in reversed(lines) if line), "no output")[:300]
    if srun:
        node = srun[0].group("node")
    elif launched_by_srun:
        node = None  # srun said nothing: the step itself failed, not one of its nodes
    else:
        node = socket.gethostname()
    # which exits count as crashes: docs/cluster.md
    crashed = returncode == EXIT_CRASHED or signal_of(returncode) not in (None, signal.SIGINT)
    return Ending(returncode, bool(returncode) and crashed and not refusals, cause, node, launched_by_srun)


def repeated_node(endings: list[Ending]) -> str | None:
    """The node on which every one of two or more crashes happened, else None."""
    nodes = {e.node for e in endings}
    if len(endings) >= 2 and len(nodes) == 1 and None not in nodes:
        return nodes.pop()
    return None
