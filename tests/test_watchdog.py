"""The hang watchdog's and the straggler line's decision rules on plain numbers, the watchdog's
thread in this process (its report, without the exit), and the ending the pipeline reads. The
real thing, a rank stopped with SIGSTOP on the two-node Slurm cluster: tests/test_slurm.py."""

from __future__ import annotations

import json
import os
import threading
import time

import pytest

from prism import cluster
from prism.errors import ConfigError
from prism.pipeline.crashes import Said, read_ending
from prism.train import stragglers, watchdog
from prism.train.watchdog import COMPUTE, DATA, Beat, hung_ranks

NOW = 1000.0
STALE = 5.0


def beat(rank: int, step: int, phase: str = COMPUTE, age: float = 0.5) -> Beat:
    return Beat(rank, f"node{rank + 1}", 100 + rank, step, phase, NOW - 30, NOW - age)


@pytest.mark.parametrize(
    "beats, ranks, why",
    [
        # a stopped process: its heartbeat went silent, whatever its step
        ({0: beat(0, 10), 1: beat(1, 10, age=20)}, (1,), "stopped"),
        ({0: beat(0, 10), 1: None}, (1,), "missing"),
        # a rank one step behind the others holds them in that step's collective
        ({0: beat(0, 11), 1: beat(1, 10, DATA), 2: beat(2, 11)}, (1,), "behind"),
        # blocked in a read at the same step, while the others wait in the gradient all-reduce
        ({0: beat(0, 10), 1: beat(1, 10, DATA)}, (1,), "holding"),
        ({0: beat(0, 10, "checkpoint"), 1: beat(1, 10)}, (0,), "holding"),
        # every rank alike: all are named
        ({0: beat(0, 10), 1: beat(1, 10)}, (0, 1), "all"),
        ({0: beat(0, 10, DATA), 1: beat(1, 10, DATA)}, (0, 1), "all"),
    ],
)
def test_the_ranks_that_held_the_others_are_named(beats, ranks, why):
    verdict = hung_ranks(beats, NOW, STALE)
    assert (verdict.ranks, verdict.why) == (ranks, why)


def test_the_timeouts_leave_the_watchdog_time_to_act_before_the_collective_fails():
    assert watchdog.collective_timeout(300) == 360 and watchdog.collective_timeout(15) == 30
    assert watchdog.long_allowance(600) == 540 and watchdog.long_allowance(60) == 30
    assert watchdog.beat_interval(300) == 15 and watchdog.beat_interval(15) == 1.5
    assert watchdog.beat_interval(1) == 0.5


@pytest.mark.parametrize(
    "phase, steps_done, allowed",
    [
        # the defaults, 300 s and 600 s: a checkpoint's write or the first steps (compilation)
        # may take 540 s, a minute under the collective timeout they run under
        (watchdog.STARTUP, 0, 540),
        (COMPUTE, 1, 540),  # the second step is still a first step
        (COMPUTE, 2, 300),
        (DATA, 2, 300),
        (watchdog.VALIDATION, 100, 300),  # each validation batch counts as progress
        (watchdog.CHECKPOINT, 100, 540),
    ],
)
def test_each_phase_has_its_allowance(phase, steps_done, allowed):
    assert watchdog.allowance(phase, steps_done, 300, watchdog.long_allowance(600)) == allowed


def test_any_finished_batch_is_progress_and_only_a_step_moves_the_step(tmp_path):
    dog = watchdog.Watchdog(tmp_path, 0, 1, timeout_s=300, long_s=540)
    dog.progress_at = NOW
    dog.progress()  # a validation or zero-shot batch
    assert dog.progress_at > NOW and (dog.step, dog.steps_done) == (0, 0)
    dog.progress(7)
    assert (dog.step, dog.steps_done, dog._phase) == (7, 1, DATA)


def test_the_end_of_a_long_save_is_progress(tmp_path):
    # a save may take up to the long allowance: the next step's shorter one counts from its end
    dog = watchdog.Watchdog(tmp_path, 0, 1, timeout_s=300, long_s=540)
    dog.progress(8)
    dog.phase(watchdog.CHECKPOINT)
    dog.progress_at = NOW
    dog.phase(watchdog.COMPUTE)
    assert dog.progress_at > NOW
    dog.progress_at = NOW
    dog.phase(watchdog.OPTIMIZER)  # between two short phases nothing finished
    assert dog.progress_at == NOW


@pytest.mark.parametrize(
    "hang, ddp, ok", [(0, 600, True), (540, 600, True), (541, 600, False), (300, 120, False)]
)
def test_a_hang_timeout_the_collective_timeout_would_beat_is_refused(hang, ddp, ok):
    if ok:
        watchdog.check_timeouts(hang, ddp)
        return
    with pytest.raises(
        ConfigError, match=rf"train.hang_timeout_s={hang} is invalid: use 0 \(off\) or at most"
    ):
        watchdog.check_timeouts(hang, ddp)


def test_only_the_newest_attempts_folders_stay(tmp_path):
    folders = [tmp_path / f"slurm-7.{i}" for i in range(6)]
    for i, f in enumerate(folders):
        f.mkdir()
        os.utime(f, (NOW + i, NOW + i))
    watchdog.prune_attempts(folders[-1], keep=3)
    assert sorted(p.name for p in tmp_path.iterdir()) == [f.name for f in folders[2:]]


def test_the_watchdog_writes_its_state_names_the_silent_peer_and_leaves_a_hung_ending(tmp_path, monkeypatch):
    endings = tmp_path / "endings"
    endings.mkdir()
    monkeypatch.setenv(cluster.ENDINGS_DIR_ENV, str(endings))
    folder = tmp_path / "diagnostics" / "attempt"
    folder.mkdir(parents=True)
    # rank 1 wrote one heartbeat long ago and nothing since: a stopped process
    old = Beat(1, "node2", 4242, 3, DATA, time.time() - 60, time.time() - 60)
    (folder / "rank1-heartbeat.json").write_text(json.dumps(old.__dict__))
    hung = threading.Event()
    dog = watchdog.Watchdog(folder, 0, 2, timeout_s=1.0, long_s=1.0, on_hang=hung.set)
    dog.start()
    dog.progress(3)
    dog.phase(COMPUTE)
    assert hung.wait(15), "the watchdog did not act"
    report = json.loads((folder / "rank0-hang.json").read_text())
    assert report["hung_ranks"] == [1] and report["why"] == "stopped" and report["step"] == 3
    assert report["phase"] == COMPUTE
    assert "rank 1 on node2 (step 3, data, heartbeat silent for" in dog.report
    assert "test_the_watchdog_writes_its_state" in (folder / "rank0-stacks.txt").read_text()
    [ending] = [json.loads(p.read_text()) for p in endings.glob("*.json")]
    assert ending["kind"] == "hung" and ending["exit_code"] == cluster.EXIT_CRASHED
    # the pipeline gives the watchdog's sentence as the crash's cause, ahead of srun's lines
    said = [Said(ending["kind"], ending["exit_code"], ending["sentence"])]
    end = read_ending(137, "srun: error: node2: task 1: Killed\n", True, said)
    assert end.crashed and end.cause.startswith("hang: no batch finished") and end.node == "node2"


def test_a_watchdog_that_sees_progress_stays_quiet_and_leaves_no_files(tmp_path):
    folder = tmp_path / "diagnostics" / "attempt"
    acted = threading.Event()
    dog = watchdog.Watchdog(folder, 0, 1, timeout_s=1.0, long_s=1.0, on_hang=acted.set)
    dog.start()
    for step in range(1, 8):
        time.sleep(0.3)
        dog.progress(step)
    dog.stop()
    assert not acted.is_set() and not (tmp_path / "diagnostics").exists()


def test_attempts_are_told_apart_by_the_launcher():
    assert cluster.attempt_id({"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "2"}) == "slurm-7.2"
    torchrun = {"TORCHELASTIC_RUN_ID": "abc", "TORCHELASTIC_RESTART_COUNT": "1"}
    assert cluster.attempt_id(torchrun) == "torchrun-abc.1"
    assert cluster.attempt_id({"MASTER_PORT": "29500"}) == "local-29500"


def test_flight_recorder_settings_point_into_the_run_and_keep_the_users(tmp_path):
    env = watchdog.flight_recorder_env(tmp_path, {"TORCH_NCCL_TRACE_BUFFER_SIZE": "20000"})
    assert env["TORCH_NCCL_TRACE_BUFFER_SIZE"] == "20000" and env["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"
    assert env["TORCH_FR_DUMP_TEMP_FILE"] == str(tmp_path / "nccl-flight-recorder-rank")


# ----- the straggler line ------------------------------------------------------------------------
def times(*own: float) -> list[stragglers.RankTimes]:
    return [stragglers.RankTimes(o, o / 10, max(own)) for o in own]


def test_the_slowest_rank_and_the_median():
    interval = stragglers.assess(times(0.2, 0.2, 0.5, 0.2))
    assert (interval.slowest, interval.slowest_s, interval.median_s) == (2, 0.5, 0.2)
    assert interval.slower_pct == pytest.approx(150)
    assert stragglers.assess(times(0.3, 0.3)).slowest == 0  # equals: the first


def test_the_line_comes_after_k_intervals_in_a_row_of_the_same_rank_and_again_every_k():
    rule = stragglers.StragglerRule(slower_pct=20, intervals=3)
    slow1, slow2, even = times(0.2, 0.4), times(0.4, 0.2, 0.2), times(0.2, 0.21)
    said = [rule.update(stragglers.assess(t)) for t in (slow1, slow1, even, slow1, slow1, slow1)]
    assert said == [False, False, False, False, False, True]  # the even interval broke the run
    assert [rule.update(stragglers.assess(slow1)) for _ in range(3)] == [False, False, True]
    # another rank slower resets the count
    assert [rule.update(stragglers.assess(t)) for t in (slow1, slow2, slow2)] == [False, False, False]
    assert (rule.rank, rule.streak) == (0, 2)


def test_a_rank_within_the_threshold_is_never_named():
    rule = stragglers.StragglerRule(slower_pct=20, intervals=1)
    # 0.24 against 0.2: the median of two is 0.22, 9 % below it
    assert not any(rule.update(stragglers.assess(times(0.2, 0.24))) for _ in range(5))
    line = stragglers.line(stragglers.assess(times(0.2, 0.5)), "node2", 3, 50)
    assert line.startswith("straggler: rank 1 on node2 spends 0.5 s per step on its own work")
