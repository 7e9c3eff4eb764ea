"""The one process launcher (prism.processes) that run_all.py's stages and search.py's workers go
through, on real child processes: a signal passed on to every child, or waited out; an interrupt
of the waiting process turned into the stop that checkpoints (SIGTERM, never a second SIGINT);
the exit code a program leaves behind a launcher that hides it; how each process ended."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

from prism import processes

ROOT = Path(__file__).resolve().parents[1]
# A child that says it is ready, then waits; the signal it gets is written down and ends it with 75
# (a worker's or a stage's stop with a checkpoint). SIGINT is written down but waited out.
CHILD = """
import signal, sys, time
from pathlib import Path
out = Path(sys.argv[1])
def stop(signum, frame):
    with out.open("a") as f:
        f.write(signal.Signals(signum).name + "\\n")
    if signum != signal.SIGINT:
        sys.exit(75)
for s in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT):
    signal.signal(s, stop)
out.with_suffix(".ready").touch()
time.sleep(60)
sys.exit(3)
"""


def start_children(tmp_path: Path, n: int) -> tuple[list[processes.Launched], list[Path]]:
    said = [tmp_path / f"child{i}.txt" for i in range(n)]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    started = [processes.start([sys.executable, "-c", CHILD, str(p)], env) for p in said]
    deadline = time.monotonic() + 30
    while not all(p.with_suffix(".ready").exists() for p in said):
        assert time.monotonic() < deadline, "the children did not start"
        time.sleep(0.02)
    return started, said


def signal_self_soon(signum: int) -> None:
    """`signum` to this process once the main thread is inside processes.wait (handlers run in the
    main thread): a fixed delay lost that race on a loaded machine."""
    main = threading.main_thread().ident

    def waiting() -> bool:  # in a call that processes.wait made: its handlers are in place
        frame = sys._current_frames().get(main)
        if frame is None or frame.f_code is processes.wait.__code__:
            return False
        while frame is not None:
            if frame.f_code is processes.wait.__code__:
                return True
            frame = frame.f_back
        return False

    def send() -> None:
        deadline = time.monotonic() + 30
        while not waiting() and time.monotonic() < deadline:
            time.sleep(0.01)
        os.kill(os.getpid(), signum)

    threading.Thread(target=send, daemon=True).start()


def test_a_passed_on_signal_reaches_every_child_and_handlers_are_restored(tmp_path):
    started, said = start_children(tmp_path, 2)
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    signal_self_soon(signal.SIGUSR1)
    codes = processes.wait(started, pass_on=(signal.SIGTERM, signal.SIGUSR1), wait_out=(signal.SIGINT,))
    assert codes == [75, 75]
    assert [p.read_text() for p in said] == ["SIGUSR1\n", "SIGUSR1\n"]
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before


def test_a_waited_out_ctrl_c_is_not_passed_on(tmp_path):
    started, said = start_children(tmp_path, 1)
    signal_self_soon(signal.SIGINT)  # ignored here; the children's own terminal Ctrl-C is theirs
    threading.Timer(0.6, started[0].proc.send_signal, (signal.SIGTERM,)).start()
    assert processes.wait(started, pass_on=(signal.SIGTERM,), wait_out=(signal.SIGINT,)) == [75]
    assert said[0].read_text() == "SIGTERM\n"  # no SIGINT came through


@pytest.mark.slow
def test_an_interrupt_of_the_waiting_process_stops_the_children_with_sigterm(tmp_path):
    """run_all.py's way: the Ctrl-C is this process's KeyboardInterrupt; each child is sent the
    stop that checkpoints (SIGTERM, not a second SIGINT) and waited for, then the interrupt goes on."""
    started, said = start_children(tmp_path, 2)
    signal_self_soon(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt):
        processes.wait(started)
    assert [one.proc.returncode for one in started] == [75, 75]
    assert [p.read_text() for p in said] == ["SIGTERM\n", "SIGTERM\n"]


def test_a_program_behind_a_launcher_leaves_its_own_exit_code(tmp_path):
    leaves = "import sys; from prism import processes; processes.leave_exit_code(75); sys.exit(1)"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    left = processes.start([sys.executable, "-c", leaves], env, code_file=tmp_path / "left")
    killed = processes.start(
        [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"],
        env,
        code_file=tmp_path / "never-written",
    )
    plain = processes.start([sys.executable, "-c", "raise SystemExit(2)"], env)
    assert processes.wait([left, killed, plain]) == [75, -signal.SIGKILL, 2]


@pytest.mark.parametrize(
    "code, said",
    [
        (0, "exit code 0"),
        (75, "exit code 75"),
        (-9, "killed by SIGKILL"),
        (-15, "killed by SIGTERM"),
        (137, "exit code 137 (SIGKILL)"),  # a shell's or srun's code for a task killed by SIGKILL
        (-99, "killed by signal 99"),
    ],
)
def test_how_each_process_ended(code, said):
    assert processes.how_it_ended(code) == said
