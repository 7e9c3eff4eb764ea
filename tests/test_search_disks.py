"""A search's study folder on disks that refuse it, for real: a folder that cannot be made (a file
in the way, /proc, a read-only tmpfs) is refused in train.py's sentence before anything is
written; the trials' tmpfs is full as a trial starts, then too small for its checkpoint. A full
disk is no property of a schedule, so the worker stops with train.py's sentence and exit code,
its trial is not recorded failed, and the same command resumes the search once there is space."""

from __future__ import annotations

import json
from pathlib import Path

import optuna
import pytest
from conftest import SEARCH_TINY, load_script
from test_full_disk import mount, small_disk  # noqa: F401 (small_disk: a fixture)

from prism.search.study import STOPPED_ATTR, STUDY_NAME, storage
from prism.train.callbacks.checkpoint import stale_temporaries

ARGS = ["--scale", "tiny", "--space", "prism", "--rungs", "128", *SEARCH_TINY]


def run(capfd, *args: str) -> tuple[int, str]:
    capfd.readouterr()
    code = load_script("search").main(list(args))
    return code, capfd.readouterr().err


@pytest.mark.parametrize("where", ["through-a-file", "under-proc", "read-only"])
def test_a_study_dir_that_cannot_be_made_is_refused_in_one_sentence(tmp_path, capfd, request, where):
    if where == "through-a-file":
        (tmp_path / "afile").write_text("")
        study = tmp_path / "afile" / "study"
        said = f"cannot create {study}: {tmp_path / 'afile'} is a file where a folder is needed"
    elif where == "under-proc":
        study = Path("/proc/prism-search-study")
        said = f"{study} does not exist"
    else:
        disk = request.getfixturevalue("small_disk").mount_at(tmp_path / "ro", "1m")
        mount(["mount", "-o", "remount,ro", str(disk)])
        study = disk / "study"
        said = f"cannot write {study}: it is on a read-only filesystem"
    before = sorted(tmp_path.rglob("*"))
    code, err = run(capfd, *ARGS, "--study-dir", str(study))
    assert code == 2, err[-3000:]
    assert err == f"error: {said}; give --study-dir a folder this user can create and write.\n"
    assert not study.exists() and sorted(tmp_path.rglob("*")) == before


def stopped_on_a_full_disk(capfd, args: list[str], written: Path) -> list[str]:
    """search.py stops with train.py's sentence naming `written` and exits 1, its trial left
    running and marked; the states of the study's trials."""
    code, err = run(capfd, *args)
    assert code == 1, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    (line,) = [x for x in err.splitlines() if x.startswith("error:")]
    assert line.startswith(f"error: no space left on device while writing {written} ("), line
    then = "; free some space and run the same command to continue the search."
    assert line.endswith(f" on that filesystem){then}"), line
    study = Path(args[args.index("--study-dir") + 1])
    trials = optuna.load_study(study_name=STUDY_NAME, storage=storage(study)).get_trials()
    (running,) = [t for t in trials if t.state.name == "RUNNING"]
    assert running.user_attrs[STOPPED_ATTR] == "the disk was full"
    return [t.state.name for t in trials]


@pytest.mark.slow
def test_a_full_disk_stops_the_search_and_the_same_command_resumes_it_once_there_is_space(
    small_disk,  # noqa: F811
    tmp_path,
    capfd,
):
    """The trials' disk is full as the trial starts (its run lock cannot be written), then has room
    for all but a 95 MB checkpoint, then has room: the search stops twice, each time leaving the
    trial running and marked, and then completes it; neither stop counts as an attempt."""
    study = tmp_path / "study"
    runs = small_disk.mount_at(study / "runs", "64k")
    small_disk.fill(runs)
    args = [*ARGS, "--trials", "1", "--study-dir", str(study)]  # uniform alone: one trial to train
    uniform = runs / "tiny" / "uniform"
    assert stopped_on_a_full_disk(capfd, args, uniform / ".seed0.lock") == ["RUNNING"]
    small_disk.resize(runs, "2m")
    # the stopped attempt is told failed as its retry (a new trial) is queued, which then stops
    states = stopped_on_a_full_disk(capfd, args, uniform / "seed0" / "checkpoints" / "last.ckpt")
    assert states == ["FAIL", "RUNNING"]
    assert not stale_temporaries(uniform / "seed0" / "checkpoints")

    small_disk.resize(runs, "400m")
    code, err = run(capfd, *args)
    assert code == 0, err[-3000:]
    doc = json.loads((study / "search.json").read_text())
    assert [(t["slot"], t["state"]) for t in doc["trials"]] == [(0, "complete")] and not doc["failed"]
    assert len(doc["restarted"]) == 2
    for attempt in doc["restarted"]:
        assert "(the disk was full); started again from its run's checkpoints" in attempt["reason"], attempt
    trials = optuna.load_study(study_name=STUDY_NAME, storage=storage(study)).get_trials()
    assert [(t.user_attrs["attempt"], t.user_attrs.get("deaths", 0)) for t in trials] == [
        (1, 0),
        (2, 0),
        (3, 0),
    ]


def test_the_parent_of_local_workers_exits_1_when_a_worker_met_a_full_disk():
    """search.py --workers K: a worker that stopped on a full disk exits 1 (train.py's code), and so
    does its parent, unless a Ctrl-C came too; a complete study is 0 whatever its workers met."""
    from prism.search.session import exit_code

    assert exit_code(False, [1, 75]) == 1 and exit_code(False, [0, 1]) == 1
    assert exit_code(False, [130, 1]) == 130 and exit_code(False, [70, 75]) == 70
    assert exit_code(True, [1, 0]) == 0
