"""prism.cli.exits.run_command, the one way every command ends: each kind of ending gives its one
line and exit code, and leaves the same ending in the folder a pipeline runner names; a bug is
not swallowed. And run_all.py's --seeds are refused by its parser, not by reading an error's text."""

from __future__ import annotations

import errno
import json
from pathlib import Path

import pytest
from conftest import load_script

from prism.cli.command import parse
from prism.cli.exits import run_command
from prism.cluster import ENDINGS_DIR_ENV, Interrupted, InterruptedAtOnce, Preempted
from prism.data import DataError
from prism.errors import ConfigError, PrismError
from prism.pipeline.crashes import Said, read_said
from prism.runs.lock import LockHeld
from prism.train.resume import RunExistsError


def raising(exc: BaseException):
    def work() -> int:
        raise exc

    return work


@pytest.mark.parametrize(
    "exc, code, line",
    [
        (ConfigError("train.lr=abc is invalid."), 2, "error: train.lr=abc is invalid."),
        (DataError("data file a.jsonl is empty."), 2, "error: data file a.jsonl is empty."),
        (RunExistsError("runs/x holds a finished run."), 1, "error: runs/x holds a finished run."),
        (LockHeld(Path("x.lock"), ""), 1, "error: x.lock is held by holder unknown"),
        (Preempted("stopped by SIGTERM at step 3"), 75, "preempted: stopped by SIGTERM at step 3"),
        (Interrupted("stopped at step 3"), 130, "interrupted: stopped at step 3"),
        (InterruptedAtOnce("a second Ctrl-C stopped it"), 130, "interrupted: a second Ctrl-C stopped it."),
        (KeyboardInterrupt(), 130, "interrupted: run it again."),
        (OSError(errno.ENOSPC, "No space left on device"), 1, "error: no space left on device while writing"),
    ],
)
def test_each_ending_is_one_line_and_its_code_and_is_left_for_the_runner(
    exc, code, line, capsys, tmp_path, monkeypatch
):
    monkeypatch.setenv(ENDINGS_DIR_ENV, str(tmp_path))
    assert run_command(raising(exc), interrupted="run it again") == code
    err = capsys.readouterr().err
    assert err.startswith(line) and err.count("\n") == 1, err
    (said,) = read_said(tmp_path)
    assert said == Said(line.split(":")[0], code, err.split(": ", 1)[1].rstrip("\n"))
    assert isinstance(exc, (PrismError, Preempted, InterruptedAtOnce, KeyboardInterrupt, OSError))


def test_a_stop_gets_what_the_command_adds_and_a_ctrl_c_that_cut_a_call_short_is_the_interrupt(capsys):
    assert run_command(raising(Preempted("stopped.")), interrupted="-", then="go on.") == 75
    assert capsys.readouterr().err == "preempted: stopped; go on.\n"
    try:
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt:
            raise RuntimeError("unexpected pos")  # noqa: B904 - torch.save cut short raises so
    except RuntimeError as exc:
        cut_short = exc
    assert run_command(raising(cut_short), interrupted="nothing lost", crashes=True) == 130
    assert capsys.readouterr().err == "interrupted: nothing lost.\n"


def test_a_bug_surfaces_and_a_crash_is_exit_70_with_its_traceback(capsys, tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="a bug"):
        run_command(raising(ValueError("a bug")), interrupted="-")
    monkeypatch.setenv(ENDINGS_DIR_ENV, str(tmp_path))
    assert run_command(raising(RuntimeError("NCCL aborted\nmore")), interrupted="-", crashes=True) == 70
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err
    assert err.endswith(
        "crashed: RuntimeError: NCCL aborted; the same command resumes from the newest checkpoint.\n"
    )
    assert read_said(tmp_path) == [Said("crashed", 70, "RuntimeError: NCCL aborted")]
    # a process that ends well leaves nothing; an unreadable file is skipped
    (tmp_path / "other.json").write_text("{")
    assert json.loads(next(tmp_path.glob("*-*.json")).read_text())["kind"] == "crashed"
    assert len(read_said(tmp_path)) == 1


def test_run_all_refuses_a_seed_that_is_no_integer_in_its_parser(capsys):
    run_all = load_script("run_all")
    with pytest.raises(SystemExit) as exited:
        parse(run_all.run_all_command, ["--scale", "tiny", "--seeds", "0", "x1"], None, run_all.EXCLUSIVE)
    assert exited.value.code == 2
    assert "argument --seeds: 'x1' is not a seed: give integers" in capsys.readouterr().err
    args = parse(
        run_all.run_all_command,
        ["--scale", "tiny", "--seeds", "0,1", "2", "train.lr=1e-3"],
        None,
        run_all.EXCLUSIVE,
    )
    # the seeds are the config key `seeds`, as a word before the command line's own
    assert args["seeds"] is None and args["overrides"] == ["seeds=[0,1,2]", "train.lr=1e-3"]


SCRIPTS = sorted(p.name for p in (Path(__file__).resolve().parents[1] / "reproduce").glob("*.py"))


@pytest.mark.parametrize("script", SCRIPTS)
@pytest.mark.slow
def test_every_script_runs_its_command(script):
    """The shims themselves (their import guards, their main call) run, not just prism.cli."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    done = subprocess.run(
        [sys.executable, str(root / "reproduce" / script), "--help"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: ") and script in done.stdout.splitlines()[0]


def small_command(tmp_path: Path, ran: list):
    """A command made the way analyze.py, evaluate.py and the other small ones are: a typed work
    function, run by prism.cli.command.run."""
    from prism.cli.command import run

    def small(out: str, overrides: list[str] = ()) -> int:
        ran.append(out)
        if out.endswith("stop.json"):
            raise KeyboardInterrupt
        return 0

    def main(argv):
        return run(
            small,
            argv,
            interrupted=lambda args: f"what was done is kept beside {args['out']}",
            out="out",
        )

    return main


def test_a_small_command_warns_checks_its_output_first_and_ends_in_one_line(tmp_path, capsys):
    ran: list = []
    main = small_command(tmp_path, ran)
    twice = ["train.lr=1", "train.lr=2"]
    assert main(["--out", str(tmp_path / "a.json"), *twice]) == 0 and ran == [str(tmp_path / "a.json")]
    assert capsys.readouterr().err == (
        "warning: config key train.lr is given twice (train.lr=1, then train.lr=2); the last, train.lr=2, "
        "is used.\n"
    )
    ran.clear()
    assert main(["--out", str(tmp_path)]) == 2 and ran == []  # refused before the work starts
    assert capsys.readouterr().err == (
        f"error: --out {tmp_path} is an existing folder; give the path of a file to write.\n"
    )
    assert main(["--out", str(tmp_path / "stop.json")]) == 130
    assert capsys.readouterr().err == f"interrupted: what was done is kept beside {tmp_path / 'stop.json'}.\n"
    with pytest.raises(SystemExit) as parsed:  # argparse's own refusal: its usage line, exit 2
        main([])
    assert parsed.value.code == 2 and "the following arguments are required: --out" in capsys.readouterr().err
