"""Starting the kit's own processes (run_all.py's stages, search.py's workers) and waiting for them:
how a signal reaches them and what each exited with (docs/design.md, "The kit's own processes")."""

from __future__ import annotations

import os
import signal
import subprocess
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Iterable

SIGNAL_BASE = 128  # a shell's or srun's exit code for a process killed by signal N is 128 + N
# Where a program started under a launcher (torchrun exits 1 whatever its ranks said) leaves its own code
EXIT_CODE_FILE_ENV = "PRISM_SEARCH_EXIT_CODE_FILE"


def signal_of(returncode: int) -> int | None:
    """The signal that killed the process, read from its exit code, else None."""
    if returncode < 0:
        return -returncode
    if SIGNAL_BASE < returncode <= SIGNAL_BASE + 64:
        return returncode - SIGNAL_BASE
    return None


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def how_it_ended(returncode: int) -> str:
    """'exit code 75', 'killed by SIGKILL' (Popen's negative code) or 'exit code 137 (SIGKILL)'."""
    if returncode < 0:
        return f"killed by {signal_name(-returncode)}"
    signum = signal_of(returncode)
    return f"exit code {returncode}" + (f" ({signal_name(signum)})" if signum else "")


@dataclass
class Launched:
    """One started process; `code_file`: where its program leaves its own exit code, when a
    launcher between them would hide it."""

    proc: subprocess.Popen
    code_file: Path | None = None

    def exit_code(self, returncode: int) -> int:
        """The program's own exit code where it left one, else the process's."""
        if self.code_file is None:
            return returncode
        try:
            return int(self.code_file.read_text())
        except (OSError, ValueError):  # killed before it could leave one
            return returncode


def start(
    argv: list[str], env: dict[str, str], output: IO | None = None, code_file: Path | None = None
) -> Launched:
    """Start `argv` in this process's session (a terminal's Ctrl-C reaches it too), its output to
    `output` (else this process's own), told where to leave its exit code with `code_file`."""
    if code_file is not None:
        env = {**env, EXIT_CODE_FILE_ENV: str(code_file)}
    stderr = subprocess.STDOUT if output is not None else None
    return Launched(subprocess.Popen(argv, stdout=output, stderr=stderr, env=env), code_file)


def leave_exit_code(code: int) -> None:
    """Leave `code` where the process that started this one under a launcher reads it, if asked."""
    where = os.environ.get(EXIT_CODE_FILE_ENV)
    if where:
        with suppress(OSError):  # the starter falls back on the launcher's code
            Path(where).write_text(str(code))


def wait(launched: list[Launched], pass_on: Iterable[int] = (), wait_out: Iterable[int] = ()) -> list[int]:
    """Wait for every process and return their exit codes (Launched.exit_code), passing the
    `pass_on` signals on and ignoring the `wait_out` ones meanwhile (docs/design.md)."""
    procs = [one.proc for one in launched]

    def forward(signum, _frame):
        for p in procs:
            if p.poll() is None:
                p.send_signal(signum)

    previous = {s: signal.signal(s, forward) for s in pass_on}
    previous.update({s: signal.signal(s, signal.SIG_IGN) for s in wait_out})
    try:
        codes = [p.wait() for p in procs]
    except BaseException as exc:
        _stop(procs, getattr(exc, "signum", signal.SIGINT))
        raise
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    return [one.exit_code(code) for one, code in zip(launched, codes)]


def _stop(procs: list[subprocess.Popen], signum: int) -> None:
    """Pass a stop on (SIGTERM for a Ctrl-C, never a second SIGINT) and wait; kill on a second."""
    running = [p for p in procs if p.poll() is None]
    try:
        for p in running:
            p.send_signal(signal.SIGTERM if signum == signal.SIGINT else signum)
        for p in running:
            p.wait()
    except BaseException:
        for p in running:
            p.kill()
        for p in running:
            p.wait()
        raise
