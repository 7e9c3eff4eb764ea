"""The schedule search's fault paths, each on the real component: Optuna's journal storage and
successive-halving pruner, the kit's training with its Preemption callback, real signals sent to
this process, and reproduce/search.py stopped by a Ctrl-C sent to its process group, as a
terminal sends it."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from conftest import SEARCH_TIMEOUT, SEARCH_TINY, load_script, search_args, search_py
from lightning.pytorch.callbacks import Callback
from optuna.trial import TrialState

from prism.cluster import Interrupted, InterruptedAtOnce, Preempted
from prism.config.schema import ConfigError, SearchSection
from prism.search.budget import Rungs
from prism.search.stops import WorkerStop, at_once
from prism.search.study import open_study, pruner, storage, work
from prism.search.trial import RungReporter
from prism.search.trial_config import trial_config

ROOT = Path(__file__).resolve().parents[1]
RUNGS = Rungs(tokens=(128, 256), factor=2, global_batch_tokens=64)  # steps 2 and 4 at tiny


# ----- the pruner ----------------------------------------------------------------------------
def halving(kit: bool) -> optuna.pruners.BasePruner:
    if kit:
        return pruner(RUNGS)
    return optuna.pruners.SuccessiveHalvingPruner(
        min_resource=128, reduction_factor=2, min_early_stopping_rate=0
    )


@pytest.mark.parametrize("kit, z_stops", [(True, True), (False, False)], ids=["kit", "optuna-alone"])
def test_a_retried_attempts_rung_loss_competes_once(tmp_path, kit, z_stops):
    """A worker dies after its trial reported 9.0 at the first rung, and the trial's retry reports
    9.0 again (prism.search.trial.run_trial replays it). Then A reports 1.0 and Z 2.0. Among three
    losses (9.0 once, 1.0, 2.0) halving by 2 promotes only the best one, so Z stops. Optuna alone
    also counts the dead attempt: with four losses it promotes the best two, Z among them."""
    study = optuna.create_study(study_name="s", storage=storage(tmp_path), pruner=halving(kit))
    study.enqueue_trial({}, user_attrs={"slot": 0, "attempt": 1})  # as open_study does
    dead = study.ask()
    dead.report(9.0, step=128)
    assert not dead.should_prune()
    # as reap_dead does, before the tell: the same slot, the next attempt
    study.enqueue_trial({}, user_attrs={"slot": 0, "attempt": 2, "retry_of": dead.number})
    study.tell(dead.number, state=TrialState.FAIL)
    retry = study.ask()
    assert retry.user_attrs["retry_of"] == dead.number
    retry.report(9.0, step=128)
    assert not retry.should_prune()
    a = study.ask()
    a.report(1.0, step=128)
    assert not a.should_prune()
    z = study.ask()
    z.report(2.0, step=128)
    assert z.should_prune() is z_stops


def test_a_dead_attempts_rung_loss_competes_until_its_retry_reports_it_again(tmp_path):
    """The same slot's retry waits behind trials already running: until it reports the dead
    attempt's 9.0 again, that loss still competes. With 9.0, 1.0, 3.0 and Z's 2.0 (four losses),
    halving by 2 promotes the best two, Z among them; left out, Z would be compared with 1.0 and
    3.0 alone and stop."""
    study = optuna.create_study(study_name="s", storage=storage(tmp_path), pruner=pruner(RUNGS))
    for slot in range(4):
        study.enqueue_trial({}, user_attrs={"slot": slot, "attempt": 1})
    dead, a, b, z = (study.ask() for _ in range(4))  # four workers take four trials
    dead.report(9.0, step=128)
    assert not dead.should_prune()
    study.enqueue_trial({}, user_attrs={"slot": 0, "attempt": 2, "retry_of": dead.number})
    study.tell(dead.number, state=TrialState.FAIL)
    for trial, loss in ((a, 1.0), (b, 3.0)):
        trial.report(loss, step=128)
        trial.should_prune()
    z.report(2.0, step=128)
    assert not z.should_prune()


# ----- a stop signal at a rung's step --------------------------------------------------------
class SignalAt(Callback):
    """Sends `signum` to this process during the optimizer step that ends at `step`."""

    def __init__(self, step: int, signum: int) -> None:
        self.step, self.signum, self.sent = step, signum, False

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_step == self.step - 1 and not self.sent:
            self.sent = True
            os.kill(os.getpid(), self.signum)


def test_a_stop_at_a_rung_step_reports_the_rung_before_it_stops(tmp_path):
    """SIGTERM during the step that ends at the first rung: Preemption stops after that step's
    validation, with a checkpoint; the rung's loss is reported to the trial before it stops. (Had
    it not been, the resumed run, which starts after that validation, would never be judged at
    that rung.)"""
    from prism.runs.layout import run_dir
    from prism.train.trainer import train

    cfg = trial_config("tiny", SEARCH_TINY, RUNGS, tmp_path / "runs", "uniform", 0)
    study = optuna.create_study(study_name="s", storage=storage(tmp_path), pruner=pruner(RUNGS))
    trial = study.ask()
    reporter = RungReporter(trial, RUNGS, protected=True, reported=set())
    with pytest.raises(Preempted, match="stopped by SIGTERM at step 2 of 4 with checkpoint"):
        train(cfg, extra_callbacks=[reporter, SignalAt(2, signal.SIGTERM)])
    assert list(study.trials[0].intermediate_values) == [128]
    assert (run_dir(cfg) / "checkpoints" / "last.ckpt").is_file()


# ----- signals outside training ----------------------------------------------------------------
def handled(signum: int) -> None:
    """Send `signum` to this process and let Python run its handler (at the sleep's return)."""
    os.kill(os.getpid(), signum)
    time.sleep(0.05)


@pytest.mark.slow
def test_a_signal_that_came_while_a_trial_was_starting_stops_it_at_its_first_step(tmp_path):
    """The worker's handler only records a SIGTERM that comes before training (here before the
    run is even planned); SignalRelay hands it to Preemption at the first micro-batch, which
    stops at the first step boundary with a checkpoint."""
    from prism.runs.layout import run_dir
    from prism.search.stops import STOP
    from prism.search.trial import SignalRelay
    from prism.train.trainer import train

    cfg = trial_config("tiny", SEARCH_TINY, RUNGS, tmp_path / "runs", "uniform", 0)
    with STOP:
        handled(signal.SIGTERM)
        assert STOP.received == signal.SIGTERM
        with pytest.raises(Preempted, match="stopped by SIGTERM at step 1 of 4 with checkpoint"):
            train(cfg, extra_callbacks=[SignalRelay()])
    assert (run_dir(cfg) / "checkpoints" / "last.ckpt").is_file()


def test_the_workers_handler_outside_training(capfd):
    # a shell starts a background job with SIGINT ignored: what is put back is what was there
    before = signal.getsignal(signal.SIGINT)
    stop = WorkerStop()
    with stop:
        handled(signal.SIGINT)  # while a trial starts: recorded, said once
        assert stop.received == signal.SIGINT
        assert "Ctrl-C: this worker stops at its trial's first step boundary" in capfd.readouterr().err
        handled(signal.SIGTERM)  # the scheduler's signal outranks a Ctrl-C
        with pytest.raises(InterruptedAtOnce):
            handled(signal.SIGINT)  # and a second Ctrl-C still stops at once...
        assert stop.received == signal.SIGTERM  # ...leaving SIGTERM the signal of record
        with pytest.raises(Preempted, match="stopped by SIGTERM between trials") as stopped:
            stop.stop()
        assert not isinstance(stopped.value, Interrupted)
    assert signal.getsignal(signal.SIGINT) is before  # put back
    with stop:  # a new loop: nothing recorded
        assert stop.received == 0
        handled(signal.SIGINT)
        with pytest.raises(Interrupted, match="stopped by SIGINT between trials"):
            stop.stop()
        with pytest.raises(InterruptedAtOnce, match="a second Ctrl-C stopped this worker at once"):
            handled(signal.SIGINT)
    with stop:
        stop.idle = True  # waiting for trials: a Ctrl-C stops at once
        with pytest.raises(Interrupted, match="stopped by SIGINT between trials"):
            handled(signal.SIGINT)


def test_slurms_warning_between_trials_is_said_before_the_requeue_is_asked(capfd, monkeypatch):
    """A requeue ends the job's steps at once, so the worker's line comes before the request; its
    outcome ends the stop's own sentence (here not under Slurm: nothing to requeue)."""
    for name in ("SLURM_JOB_ID", "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID"):
        monkeypatch.delenv(name, raising=False)
    stop = WorkerStop()
    with stop:
        handled(signal.SIGUSR1)
        with pytest.raises(
            Preempted, match="SIGUSR1 between trials .*not under Slurm, so nothing was requeued"
        ):
            stop.stop()
    said = "SIGUSR1: no trial of this worker was running; requeueing the Slurm job.\n"
    assert capfd.readouterr().err == said


def test_a_second_ctrl_c_is_found_behind_the_error_of_the_call_it_cut_short():
    try:
        try:
            raise InterruptedAtOnce("a second Ctrl-C")
        except InterruptedAtOnce:
            # as torch.save raises when the signal cut its write short: implicitly chained
            raise RuntimeError("PytorchStreamWriter failed writing file data/0")  # noqa: B904
    except RuntimeError as exc:
        assert str(at_once(exc)) == "a second Ctrl-C"
    assert at_once(RuntimeError("a crash")) is None


def test_a_second_ctrl_c_in_a_trial_is_a_stop_and_its_retry_is_not_counted_a_death(tmp_path):
    """work() turns the InterruptedAtOnce of a trial (Preemption's, or WorkerStop's, on a second
    Ctrl-C) into Interrupted (search.py exits 130) and marks the trial stopped; the next worker
    starts it again as attempt 2 with no death counted."""
    order = [{"schedule": "uniform", "seed": 0}]
    study = open_study(tmp_path, {"study_seed": 0}, RUNGS, order)
    settings = SearchSection(idle_poll_s=0.01)

    def interrupted(trial) -> None:
        raise InterruptedAtOnce("a second Ctrl-C stopped training at once")

    with pytest.raises(Interrupted, match="a second Ctrl-C stopped training at once"):
        work(study, tmp_path, interrupted, settings)
    assert study.trials[0].user_attrs["stopped"] == "interrupted at once"
    taken = []

    def finish(trial) -> None:
        taken.append(dict(trial.user_attrs))
        study.tell(trial, 1.0)

    assert work(study, tmp_path, finish, settings) == 1
    assert (taken[0]["attempt"], taken[0]["deaths"], taken[0]["retry_of"]) == (2, 0, 0)


def test_a_study_made_but_not_yet_described_is_taken_not_refused(tmp_path):
    """Two workers of a Slurm array start together: one has made the study and not yet recorded
    its definition (or died in between) when the other looks. The other waits for the maker's lock
    and then takes the study with its own definition, never "--scale changed: made with None"."""
    from prism.search.study import STUDY_NAME

    optuna.create_study(study_name=STUDY_NAME, storage=storage(tmp_path), pruner=pruner(RUNGS))
    order = [{"schedule": "uniform", "seed": 0}, {"schedule": "prism", "seed": 0}]
    study = open_study(tmp_path, {"study_seed": 0, "scale": "tiny"}, RUNGS, order)
    assert study.user_attrs["definition"] == {"study_seed": 0, "scale": "tiny"}
    assert [t.params or t.system_attrs["fixed_params"] for t in study.trials] == order
    with pytest.raises(ConfigError, match="--scale changed: the study was made with tiny, not 124m"):
        open_study(tmp_path, {"study_seed": 0, "scale": "124m"}, RUNGS, order)


# ----- Ctrl-C, end to end ----------------------------------------------------------------------
@pytest.mark.slow
def test_a_ctrl_c_stops_the_search_with_a_checkpoint_and_the_same_command_resumes_it(tmp_path):
    """A Ctrl-C to search.py's process group (a terminal sends it to every process of the job)
    while its first trial starts: it stops at that trial's first step boundary with a checkpoint
    and exits 130; the same command finishes the study, resuming that trial from its step."""
    study = tmp_path / "study"
    args = ["--scale", "tiny", "--space", "2x2,4x6", "--trials", "1", "--rungs", "128,256", *SEARCH_TINY]
    args += ["--study-dir", str(study)]
    log = tmp_path / "first.log"
    with log.open("w") as out:
        first = subprocess.Popen(
            [sys.executable, str(ROOT / "reproduce" / "search.py"), *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"},
            start_new_session=True,  # its own process group, as a terminal's foreground job
        )
        deadline = time.monotonic() + SEARCH_TIMEOUT
        while not list(study.glob("runs/tiny/*/seed0/config.yaml")):  # the first trial is starting
            assert first.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.1)
        os.killpg(first.pid, signal.SIGINT)
        code = first.wait(timeout=SEARCH_TIMEOUT)
    text = log.read_text()
    assert code == 130, text[-3000:]
    assert "interrupted: stopped at step" in text and "run the same command to continue the search" in text
    again = search_py(*args)
    assert again.returncode == 0, again.stderr[-3000:]
    doc = json.loads((study / "search.json").read_text())
    assert [t["slot"] for t in doc["trials"]] == [0]  # the trial once, uniform's
    (stopped,) = doc["restarted"]
    assert "(interrupted on a signal); started again" in stopped["reason"], stopped
    assert stopped["next_resumed_from_step"] >= 1, stopped


# ----- --gpu-hours across a benchmark ------------------------------------------------------------
def trials_line(capsys, search, args: list[str]) -> str:
    assert search.main([*args, "--dry-run"]) == 0
    return next(line for line in capsys.readouterr().out.splitlines() if line.startswith("seeds: "))


def test_a_gpu_hours_study_keeps_its_trial_count_once_a_benchmark_gives_another_rate(tmp_path, capsys):
    """--gpu-hours buys trials at the paper's rate until results/<scale>/bench.json exists, then at
    the measured one. The study made before the benchmark keeps its count, so that the same
    command continues it; a new study counts at the measured rate."""
    from prism.search.plan import Search

    search = load_script("search")
    results = tmp_path / "results"
    common = ["--scale", "124m", "--space", "table5", "--gpu-hours", "0.3", "--rungs", "1%,3%"]
    made = [*common, f"results_dir={results}", "--study-dir", str(tmp_path / "made")]
    before = trials_line(capsys, search, made)
    assert before.startswith("seeds: 0; trials: 7 (--gpu-hours 0.3 = ")
    plan = Search(search_args([*made, "--dry-run"]))
    open_study(plan.study_dir, plan.definition, plan.rungs, plan.order)  # what its first run makes
    rate = {"uniform": {"train_tokens_per_s": 179_687.5}}  # half the paper's
    bench = {"num_devices": 1, "hardware": "a test", "schedules": rate}
    (results / "124m").mkdir(parents=True)
    (results / "124m" / "bench.json").write_text(json.dumps(bench))
    new = [*common, f"results_dir={results}", "--study-dir", str(tmp_path / "new")]
    fresh = trials_line(capsys, search, new)
    assert "at 179,688 tokens/s per GPU" in fresh and not fresh.startswith("seeds: 0; trials: 7 ")
    kept = trials_line(capsys, search, made)
    assert kept.startswith("seeds: 0; trials: 7 ") and kept.endswith("; 7 as when the study was made)"), kept
