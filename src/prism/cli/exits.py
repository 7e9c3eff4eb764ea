"""The one way every command ends (docs/design.md, "Errors and exit codes"): `run_command` turns what
the work raised into one line (one write: ranks' lines never interleave) and an exit code."""

from __future__ import annotations

import sys
import traceback
from typing import TYPE_CHECKING, Callable

from prism.cluster import (
    EXIT_CRASHED,
    EXIT_INTERRUPTED,
    EXIT_PREEMPTED,
    InterruptedAtOnce,
    Preempted,
    leave_ending,
)
from prism.errors import EXIT_REFUSED, PrismError, cause, exception_chain
from prism.io import PLACE_ERRNOS, os_error_message

if TYPE_CHECKING:  # rich is imported by the commands that pass a console, not by train.py
    from rich.console import Console


SIGTERM_BEFORE_FIRST_STEP = (
    "stopped by SIGTERM before the first step of this session, so no checkpoint was written for it; the "
    "same command resumes from the newest one."
)


def run_command(
    work: Callable[[], int],
    *,
    interrupted: str,
    then: str = "",
    then_at_once: str = "",
    console: Console | None = None,
    crashes: bool = False,
) -> int:
    """`work()`'s exit code, or the code of what it raised, after its one line. `interrupted`: what
    a plain Ctrl-C leaves; `then`, `then_at_once`: what follows a Preempted's and an
    InterruptedAtOnce's sentence; `console`: default stderr; `crashes`: an unexpected exception is a
    crash (EXIT_CRASHED), only an OSError of the place a refusal. A bug otherwise raises on."""
    try:
        return work()
    except BaseException as exc:
        # a Ctrl-C anywhere in the chain is the interrupt (torch.save cut short raises its own
        # error), unless a stop with a checkpoint was unwinding: that stop's account stands
        chain = exception_chain(exc)
        interrupt = next((e for e in chain if isinstance(e, (InterruptedAtOnce, KeyboardInterrupt))), None)
        if interrupt is not None:
            exc = next((e for e in chain if isinstance(e, Preempted)), interrupt)
        if exc is interrupt:
            said = f"{str(exc).rstrip('.')}; {then_at_once}" if then_at_once else str(exc)
            text = said if isinstance(exc, InterruptedAtOnce) else interrupted
            return say("interrupted", EXIT_INTERRUPTED, f"{text.rstrip('.')}.", console)
        lightning = sys.modules.get("lightning.pytorch.utilities.exceptions")  # imported by a training
        if lightning is not None and isinstance(exc, lightning.SIGTERMException):
            # a SIGTERM before prism's Preemption took over: Lightning stopped the run before its first step
            return say("preempted", EXIT_PREEMPTED, SIGTERM_BEFORE_FIRST_STEP, console)
        if isinstance(exc, Preempted):  # a signal (Ctrl-C included), or a stalled data stream
            text = f"{str(exc).rstrip('.')}; {then}" if then else str(exc)
            return say(exc.label, exc.exit_code, text, console)
        if isinstance(exc, PrismError):
            return say("error", exc.exit_code, str(exc), console)
        if isinstance(exc, OSError) and (not crashes or exc.errno in PLACE_ERRNOS):
            return say("error", EXIT_REFUSED, os_error_message(exc), console)  # a full or read-only place
        if not crashes or not isinstance(exc, Exception):
            raise  # a bug: its traceback says where; SystemExit and the like: its code stands
        # anything else crashed (a lost peer, a collective error, a bug): run_all.py retries it
        what = cause(exc, 300)
        sys.stderr.write(
            "".join(traceback.format_exception(exc))
            + f"crashed: {what}; the same command resumes from the newest checkpoint.\n"
        )
        leave_ending("crashed", EXIT_CRASHED, what)
        return EXIT_CRASHED


STYLES = {"error": "bold red", "warning": "bold yellow"}  # their word's colour on a console


def line(kind: str, sentence: str, console: Console | None = None) -> None:
    """`kind: sentence` on stderr, or on `console` (the kind in colour where STYLES has one)."""
    if console is None:
        sys.stderr.write(f"{kind}: {sentence}\n")
    elif kind in STYLES:
        from rich.markup import escape

        console.print(f"[{STYLES[kind]}]{kind}:[/] {escape(sentence)}", highlight=False)
    else:
        console.print(f"{kind}: {sentence}", markup=False, highlight=False, emoji=False)


def say(kind: str, code: int, sentence: str, console: Console | None = None) -> int:
    """line(), left as the ending where the pipeline reads it; `code`."""
    line(kind, sentence, console)
    leave_ending(kind, code, sentence)
    return code
