"""The kit under a real Slurm scheduler: two slurmd nodes on this machine (dev/slurm-cluster.sh),
CPU, gloo. `.ci/run` installs and starts the cluster; elsewhere these tests are skipped with the
reason. Each job is submitted with sbatch exactly as README.md and docs/cluster.md show it, plus the CPU
overrides and settings that shrink the work."""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import side_by_side

ROOT = Path(__file__).resolve().parents[1]
SBATCH = ROOT / "reproduce" / "slurm" / "run_scale.sbatch"
# the documented CPU-only layout: two nodes, one task (and one fake GPU) each
CPU_LAYOUT = ["--nodes=2", "--ntasks-per-node=1", "--gpus-per-node=1", "--cpus-per-task=1"]


@functools.cache  # sinfo waits ~9 s for a controller that is not there; ask once
def _cluster_up() -> str | None:
    if not shutil.which("sbatch"):
        return "Slurm is not installed (bash dev/slurm-cluster.sh install && bash dev/slurm-cluster.sh start)"
    try:
        out = subprocess.run(
            ["sinfo", "-h", "-N", "-o", "%N %T"], capture_output=True, text=True, timeout=20
        ).stdout
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"sinfo failed ({exc})"
    idle = [line for line in out.splitlines() if line.split()[-1] in ("idle", "mixed")]
    return (
        None
        if len(idle) >= 2
        else f"no two-node Slurm cluster is up (sinfo: {out.strip()!r}); run bash dev/slurm-cluster.sh start"
    )


@pytest.fixture(scope="session")  # before the module fixtures that submit jobs
def slurm_cluster():
    """Skips where no cluster is up. A fixture, not a skipif mark: a mark asks sinfo while the
    module is imported, even when `-m "not slow"` deselects every test in it."""
    reason = _cluster_up()
    if reason is not None:
        pytest.skip(reason)


pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("slurm_cluster")]


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "PYTEST_"))}
    env["OMP_NUM_THREADS"] = "1"
    return env


def submit(workdir: Path, scale_args: list[str]) -> str:
    # submitted from the kit's folder, working in `workdir` (runs/ and results/ land there)
    proc = subprocess.run(
        [
            "sbatch",
            "--parsable",
            *CPU_LAYOUT,
            f"--chdir={workdir}",
            f"--output={workdir}/slurm-%j.out",
            str(SBATCH),
            *scale_args,
            f"runs_dir={workdir}/runs",
            f"results_dir={workdir}/results",
        ],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=60,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip().split(";")[0]


def job_state(job: str) -> dict[str, str]:
    out = subprocess.run(["scontrol", "show", "job", job], capture_output=True, text=True).stdout
    return dict(re.findall(r"(\w+)=(\S+)", out))


def wait_for(job: str, timeout: float) -> dict[str, str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = job_state(job)
        if state.get("JobState") in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL"):
            return state
        time.sleep(1)
    subprocess.run(["scancel", job])
    pytest.fail(f"job {job} did not finish in {timeout:.0f} s: {job_state(job)}")


def output(workdir: Path, job: str) -> str:
    path = workdir / f"slurm-{job}.out"
    return path.read_text(errors="replace") if path.is_file() else ""


def test_run_all_inside_salloc_launches_training_on_both_nodes(tmp_path):
    """run_all.py started by hand inside an allocation (salloc names its job 'interactive')."""
    proc = subprocess.run(
        [
            "salloc",
            *CPU_LAYOUT,
            sys.executable,
            str(ROOT / "reproduce" / "run_all.py"),
            "--scale",
            "tiny",
            "--stages=train",
            "--schedules=prism",
            "train.accelerator=cpu",
            "model.seq_len=32",
            "train.global_batch_tokens=128",
            "train.micro_batch=2",
            "train.tokens=512",
            "train.val_every_steps=4",
            "train.ckpt_every_steps=4",
            "data.val_tokens=256",
            f"runs_dir={tmp_path}/runs",
            f"results_dir={tmp_path}/results",
        ],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=600,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    summary = json.loads((tmp_path / "runs" / "tiny" / "prism" / "seed0" / "train_summary.json").read_text())
    assert summary["throughput"]["num_devices"] == 2 and summary["steps"] == 4
    assert summary["batch_split"] == {"micro_batch": 2, "accumulation": 1, "world_size": 2}


# 24 steps of 4 sequences x 32 tokens; checkpoints every 8 steps, validation every 12: a job
# signalled or killed once the step-8 checkpoint exists has 16 steps left to be caught in
LONG = [
    "model.seq_len=32",
    "train.global_batch_tokens=128",
    "train.micro_batch=2",
    "train.tokens=3072",
    "train.lr=3e-3",
    "train.val_every_steps=12",
    "train.ckpt_every_steps=8",
    "train.log_every_steps=4",
    "data.val_tokens=256",
]
LONG_JOB = ["tiny", "--stages=train", "--schedules=prism", "train.accelerator=cpu", *LONG]
RUN = Path("runs") / "tiny" / "prism" / "seed0"
TRAIN_LOG = Path("results") / "tiny" / "logs" / "train-prism-seed0.log"


class Submitted:
    """One sbatch job of LONG_JOB in its own working folder."""

    def __init__(self, workdir: Path, extra: list[str] = ()):
        workdir.mkdir(parents=True, exist_ok=True)
        self.workdir, self.job = workdir, submit(workdir, [*LONG_JOB, *extra])

    def wait(self, timeout: float) -> dict[str, str]:
        return wait_for(self.job, timeout)

    def output(self) -> str:
        return output(self.workdir, self.job)

    def summary(self) -> dict:
        return json.loads((self.workdir / RUN / "train_summary.json").read_text())


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Submitted:
    """LONG_JOB without interruption, on the same layout as the jobs compared with it (the same
    float32 reduction order: 24 steps at this LR amplify a rounding difference such as that
    between 2 ranks and 1 rank with accumulation far beyond 1e-4 (test_faults' run at this LR
    reaches 2e-3 by step 24 from a thread-count change), so only an identical layout is a fair
    reference). Submitted on first use, shared by the tests that compare with it."""
    return Submitted(tmp_path_factory.mktemp("reference"))


def same_as_reference(summary: dict, reference: Submitted) -> None:
    """The same 24 steps as the uninterrupted job: a resume restores weights, AdamW moments, the
    LR schedule, RNG and data position, and both jobs reduce over the same 2 ranks in the same
    order, so the expected gap is 0.0; 1e-4 (test_faults' bound) lets no lost, replayed or
    reordered step through: one of those moves this 24-step, lr 3e-3 run by 1e-3 or more (its
    validation loss falls by ~0.13 a step around step 14 and still by ~0.02 a step over the
    last four)."""
    state = reference.wait(600)
    assert state["JobState"] == "COMPLETED" and state["Restarts"] == "0", reference.output()[-3000:]
    ref = reference.summary()
    assert abs(summary["final_val_loss"] - ref["final_val_loss"]) < 1e-4
    assert [p["step"] for p in summary["val_curve"]] == [p["step"] for p in ref["val_curve"]] == [0, 12, 24]


def test_a_warned_job_checkpoints_requeues_itself_and_finishes_like_an_uninterrupted_run(
    tmp_path, reference, killed_rank
):
    work = Submitted(tmp_path / "requeued")
    job = work.job
    ckpt = work.workdir / RUN / "checkpoints" / "step-000008.ckpt"
    deadline = time.monotonic() + 600
    while not ckpt.is_file():
        assert time.monotonic() < deadline, work.output()[-3000:]
        assert job_state(job).get("JobState") in ("PENDING", "RUNNING"), work.output()[-3000:]
        time.sleep(0.2)
    # the scheduler's warning signal, as --signal=USR1@300 sends it to the job's steps
    subprocess.run(["scancel", "--signal=USR1", job], check=True)
    # the job with a killed rank, submitted now so that its training overlaps this one's requeue
    killed_rank.submit()
    # a requeued job becomes eligible again after cred_expire (10 s on the test cluster)
    state = work.wait(900)
    log = work.output()
    train_log = (work.workdir / TRAIN_LOG).read_text()
    assert state["JobState"] == "COMPLETED" and state["Restarts"] == "1", log[-4000:]
    # rank 0's line before it asks for the requeue: what any rank prints after the request may be
    # cut off with the job's steps; that nothing else requeued the job is the Restarts count above
    stopped = re.search(
        r"SIGUSR1: stopped at step (\d+) with checkpoint (\S+); requeueing the Slurm job\.", train_log
    )
    assert stopped, train_log[-4000:]
    resumed = re.search(r"resuming from (\S+) \(step (\d+)\)", train_log)
    assert resumed and resumed.group(1) == stopped.group(2), train_log[-4000:]
    # no step is trained twice: the resumed run starts exactly where the signal stopped it
    assert int(resumed.group(2)) == int(stopped.group(1)) >= 8
    summary = work.summary()
    assert summary["finished"] and summary["throughput"]["num_devices"] == 2
    same_as_reference(summary, reference)


class KilledRank:
    """LONG_JOB whose rank 1 is SIGKILLed (as an OOM kill or a segfault would end it) once the
    step-8 checkpoint exists; a thread watches for that file and kills the rank."""

    RETRY_PAUSE_S = 5

    def __init__(self, workdir: Path):
        self.workdir = workdir
        self.work: Submitted | None = None
        self.killed: dict[str, str] = {}  # pid and node of the killed rank, or why not
        self._thread = threading.Thread(target=self._kill_rank_1, daemon=True)

    def submit(self) -> Submitted:
        if self.work is None:
            self.work = Submitted(self.workdir, [f"run_all.retry_pause_s={self.RETRY_PAUSE_S}"])
            self._thread.start()
        return self.work

    def _kill_rank_1(self) -> None:
        ckpt = self.workdir / RUN / "checkpoints" / "step-000008.ckpt"
        deadline = time.monotonic() + 900
        while not ckpt.is_file():
            if time.monotonic() > deadline or job_state(self.work.job).get("JobState") not in (
                "PENDING",
                "RUNNING",
            ):
                self.killed["error"] = f"no step-8 checkpoint: {job_state(self.work.job)}"
                return
            time.sleep(0.2)
        for pid, env in training_ranks(self.work.job):
            if env.get("SLURM_PROCID") == "1":
                os.kill(pid, signal.SIGKILL)
                self.killed = {"pid": str(pid), "node": env.get("SLURMD_NODENAME", "?")}
                return
        self.killed["error"] = "no training process with SLURM_PROCID=1 was found"


def training_ranks(job: str) -> list[tuple[int, dict[str, str]]]:
    """(pid, environment) of every reproduce/train.py process of Slurm job `job` (both nodes of
    the test cluster run on this host)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes().split(b"\0")
            env = dict(
                item.split("=", 1)
                for item in (proc / "environ").read_bytes().decode(errors="replace").split("\0")
                if "=" in item
            )
        except (OSError, ValueError):
            continue
        if any(arg.endswith(b"reproduce/train.py") for arg in cmdline) and env.get("SLURM_JOB_ID") == job:
            found.append((int(proc.name), env))
    return found


@pytest.fixture(scope="module")
def killed_rank(tmp_path_factory) -> KilledRank:
    """Submitted by the first test that calls submit(): the warned-job test does so while its
    job waits out the requeue delay, so that this job's training overlaps that wait."""
    return KilledRank(tmp_path_factory.mktemp("killed"))


def test_a_killed_rank_is_retried_within_the_allocation_and_finishes_like_an_uninterrupted_run(
    reference, killed_rank
):
    work = killed_rank.submit()
    state = work.wait(900)
    log = work.output()
    assert "pid" in killed_rank.killed, killed_rank.killed
    node = killed_rank.killed["node"]
    # the same job, never requeued: the retry is a new job step within the allocation
    assert state["JobState"] == "COMPLETED" and state["Restarts"] == "0", log[-4000:]
    assert state["ExitCode"] == "0:0", log[-4000:]
    train_log = (work.workdir / TRAIN_LOG).read_text()
    # srun's exit code is its tasks' highest: the killed task's 128 + 9, the other one's 70
    retry = re.compile(
        rf"train prism seed0 crashed \(exit code 137: srun: error: {node}: task 1: Killed\); "
        rf"retry 1 of 2 in {KilledRank.RETRY_PAUSE_S} s"
    )
    assert retry.search(train_log), train_log[-4000:]
    assert retry.search(log), log[-4000:]  # on the console (the batch output) as well
    assert "retry 2 of 2" not in train_log
    first, second = train_log.split("===== train prism seed0 (retry 1 of 2): srun ", 1)
    assert f"srun: error: {node}: task 1: Killed" in first
    resumed = re.search(r"resuming from \S+ \(step (\d+)\)", second)
    assert resumed and int(resumed.group(1)) >= 8, second[-4000:]
    assert "done train prism seed0" in log and "after 1 retry" in log
    record = json.loads((work.workdir / "runs" / "tiny" / "prism" / "seed0.stage.json").read_text())
    assert record["status"] == "done" and record["returncode"] == 0
    summary = work.summary()
    assert summary["finished"] and summary["throughput"]["num_devices"] == 2
    same_as_reference(summary, reference)


HANG_TIMEOUT_S = 10  # far above a healthy step here (< 1 s, slowed 2x), and each second is CI time


class SlowThenHung:
    """LONG_JOB whose rank 1 is first slowed (stopped for 20 ms of every 25, as a badly
    throttled GPU would slow it: five times slower, far beyond the noise of other processes on the
    test machine's shared cores) until the straggler line names it and rank 0
    is past the step-8 checkpoint, then stopped for good with SIGSTOP (a hung rank: alive, never in
    the next collective). The hang watchdog must name it, the job retry it and finish it."""

    EXTRA = [
        f"train.hang_timeout_s={HANG_TIMEOUT_S}",
        # a stop that lands in a checkpoint's collective gets the long allowance: 60 s, not 540
        "train.ddp_timeout_s=120",
        "train.straggler_every_steps=2",
        "train.straggler_intervals=2",
        "train.straggler_slower_pct=20",
        "run_all.retry_pause_s=1",
    ]

    def __init__(self, workdir: Path):
        self.workdir = workdir
        self.work = Submitted(workdir, self.EXTRA)
        self.facts: dict = {}
        self._thread = threading.Thread(target=self._drive, daemon=True)
        self._thread.start()

    def _rank1(self, deadline: float) -> int | None:
        while time.monotonic() < deadline:
            for pid, env in training_ranks(self.work.job):
                if env.get("SLURM_PROCID") == "1":
                    self.facts["node"] = env.get("SLURMD_NODENAME", "?")
                    return pid
            if job_state(self.work.job).get("JobState") not in ("PENDING", "RUNNING"):
                return None
            time.sleep(0.2)
        return None

    def _rank0_past(self, ckpts: Path) -> bool:
        if not list(ckpts.glob("step-*.ckpt")):
            return False
        # both ranks past the step-8 checkpoint and out of any checkpoint's write, whose longer
        # allowance would hold the watchdog back
        for beat in (self.workdir / RUN / "diagnostics").glob("*/rank0-heartbeat.json"):
            try:
                docs = [json.loads((beat.parent / f"rank{r}-heartbeat.json").read_text()) for r in (0, 1)]
            except (OSError, ValueError):
                return False
            # and not just before the step-16 checkpoint (a heartbeat is up to a second old)
            return all(doc["step"] % 8 in (1, 2, 3, 4) and doc["phase"] != "checkpoint" for doc in docs)
        return False

    def _drive(self) -> None:
        deadline = time.monotonic() + 600
        pid = self._rank1(deadline)
        if pid is None:
            self.facts["error"] = f"no rank 1: {job_state(self.work.job)}"
            return
        log = self.workdir / TRAIN_LOG
        ckpts = self.workdir / RUN / "checkpoints"
        try:
            # slowed until the straggler line names it and rank 0 is past the step-8 checkpoint
            # (a peer stopped during a checkpoint's write is found after the checkpoint's longer
            # allowance, docs/cluster.md); slowed, the steps left leave time to see both. Stopped
            # 20 ms of every 25, every phase of rank 1 takes ~5x as long, its forward too: a
            # coarser cycle, longer than a fast CPU's step, would often stop it only in the
            # backward's all-reduce, which the straggler line rightly does not count as its own
            named = past = False
            polled = 0.0
            while time.monotonic() < deadline and not past:
                os.kill(pid, signal.SIGSTOP)
                time.sleep(0.02)
                os.kill(pid, signal.SIGCONT)
                time.sleep(0.005)
                if time.monotonic() - polled > 0.5:  # the files, twice a second
                    polled = time.monotonic()
                    said = log.read_text(errors="replace") if log.is_file() else ""
                    named = named or "straggler: rank 1" in said
                    past = named and self._rank0_past(ckpts)
            os.kill(pid, signal.SIGSTOP)
            self.facts["stopped_at"] = time.time()
        except ProcessLookupError:
            self.facts["error"] = "rank 1 ended before it was stopped"
            return
        # the retry's first step: a heartbeat of rank 0 with a step in an attempt's folder made
        # after the stop (the watchdog writes one every second at this timeout)
        diagnostics = self.workdir / RUN / "diagnostics"
        hung = set(diagnostics.iterdir())
        while time.monotonic() < deadline:
            for beat in (b for b in diagnostics.glob("*/rank0-heartbeat.json") if b.parent not in hung):
                try:
                    doc = json.loads(beat.read_text())
                except (OSError, ValueError):
                    continue
                if (beat.parent / "rank0-hang.json").exists() or doc["written_at"] < self.facts["stopped_at"]:
                    continue
                if doc["step"] > 0:  # its first finished step (or, seen late, a step soon after it)
                    self.facts["retry_first_step_at"] = doc["progress_at"]
                    return
            time.sleep(0.2)


def test_a_slowed_rank_is_named_then_a_hung_rank_is_found_named_and_retried_and_the_run_finishes(
    tmp_path, reference
):
    hung = SlowThenHung(tmp_path / "hung")
    state = hung.work.wait(900)
    hung._thread.join(timeout=60)
    log, facts = hung.work.output(), hung.facts
    assert "stopped_at" in facts, (facts, log[-3000:])
    node = facts["node"]
    train_log = (hung.workdir / TRAIN_LOG).read_text()
    # the pre-flight check ran before training, a row per node
    assert "pre-flight check" in train_log, train_log[-4000:]
    assert re.search(r"^node1 +0 ", train_log, re.M) and re.search(r"^node2 +1 ", train_log, re.M)
    # the straggler line named the slowed rank and its node
    slowed = re.compile(rf"straggler: rank 1 on {node} spends .* % above the median")
    assert slowed.search(train_log), train_log[-4000:]
    # the hang: found, named with its node, every running rank's state written, retried in the job
    assert state["JobState"] == "COMPLETED" and state["Restarts"] == "0", log[-4000:]
    named = re.compile(rf"hang: no batch finished for \d+ s; no progress from rank 1 on {node} \(")
    assert named.search(train_log), train_log[-4000:]
    retry = re.compile(rf"train prism seed0 crashed \(exit code \d+: hang: .*rank 1 on {node}.*; retry 1 of")
    assert retry.search(" ".join(log.split())), log[-4000:]  # on the console too
    [folder] = [p.parent for p in (hung.workdir / RUN / "diagnostics").glob("*/rank0-hang.json")]
    report = json.loads((folder / "rank0-hang.json").read_text())
    assert report["hung_ranks"] == [1] and report["why"] == "stopped"
    stacks = (folder / "rank0-stacks.txt").read_text()
    assert "Thread MainThread" in stacks and "prism-hang-watchdog" in stacks
    if (folder / "rank1-hang.json").exists():  # woken by srun to be ended, it says it was stopped
        assert json.loads((folder / "rank1-hang.json").read_text())["hung_ranks"] == [1]
    found_s = report["at"] - facts["stopped_at"]
    assert found_s < HANG_TIMEOUT_S + 60, found_s
    assert "retry_first_step_at" in facts, facts
    recovered_s = facts["retry_first_step_at"] - facts["stopped_at"]
    print(f"\nhang found {found_s:.1f} s after the stop; the retry's first step {recovered_s:.1f} s after it")
    summary = hung.work.summary()
    assert summary["finished"] and [r["rank"] for r in summary["per_rank"]] == [0, 1]
    same_as_reference(summary, reference)


def test_evaluate_under_srun_shards_over_the_tasks_of_the_step(tmp_path):
    import torch

    from prism.core.model import ModelConfig, PrismDecoder
    from prism.runs.checkpoint import export_safetensors

    torch.manual_seed(0)
    model = PrismDecoder(
        ModelConfig(n_layer=2, d_model=64, h_base=4, heads=[2, 4], seq_len=32, schedule_name="prism")
    ).eval()
    export_safetensors(model, tmp_path / "ckpt", {"scale": "tiny", "schedule": "prism", "seed": 1})
    fixtures = ROOT / "tests" / "fixtures" / "eval"
    # batch size 1: every request is scored in the same shape however the requests are sharded
    args = [
        str(ROOT / "reproduce" / "evaluate.py"),
        "--checkpoint",
        str(tmp_path / "ckpt"),
        "--tasks",
        "piqa,arc_easy,hellaswag",
        "--data-dir",
        str(fixtures),
        "--batch-size",
        "1",
        "--device",
        "cpu",
        "--no-progress",
    ]
    env = {**_env(), "PYTHONPATH": str(ROOT / "src")}

    def start(cmd: list[str]) -> subprocess.Popen:
        pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True}
        return subprocess.Popen(cmd, env=env, cwd=tmp_path, **pipes)

    srun = ["srun", "--nodes=2", "--ntasks=2", "--ntasks-per-node=1", "--cpus-per-task=1"]
    srun.append("--kill-on-bad-exit=1")
    # the one-process scoring outside Slurm, side by side with the job step (independent runs)
    two, one = side_by_side(
        start([*srun, sys.executable, *args, "--out", str(tmp_path / "two.json")]),
        start([sys.executable, *args, "--out", str(tmp_path / "one.json")]),
        timeout=600,
    )
    assert two.returncode == 0, two.stderr[-3000:]
    assert "requests sharded over 2 ranks" in two.stderr
    assert one.returncode == 0 and "sharded" not in one.stderr, one.stderr[-3000:]
    got, want = (json.loads((tmp_path / f"{n}.json").read_text())["tasks"] for n in ("two", "one"))
    assert got.keys() == want.keys()
    for task in want:  # the same scores in the same shapes; only the gather order differs
        for metric, value in want[task].items():
            assert got[task][metric] == pytest.approx(value, rel=1e-12, abs=1e-12), (task, metric)


# smaller than tiny's defaults, same pipeline: 4 steps of 8 sequences of 64 tokens
WHOLE_SCALE = [
    "tiny",
    "train.accelerator=cpu",
    "model.seq_len=64",
    "train.global_batch_tokens=512",
    "train.tokens=2048",
    "train.val_every_steps=4",
    "train.ckpt_every_steps=4",
    "data.val_tokens=512",
    "bench.steps=2",
    "bench.warmup=1",
    "bench.micro_batch=2",
    "analysis.sequences=2",
]
WHOLE_SCALE_TEST = "test_sbatch_runs_the_whole_scale_across_two_nodes"


@pytest.fixture(scope="module", autouse=True)
def whole_scale(request, tmp_path_factory):
    """The whole-scale job of the test of that name, submitted as this module starts so that it
    runs beside the other tests' jobs (the test cluster fits two jobs of CPU_LAYOUT); the test,
    last in the module, waits for it. Yields (working folder, job id, whether eval runs), or None
    when that test is not selected; a job still running at the end is cancelled."""
    if not any(item.name == WHOLE_SCALE_TEST for item in request.session.items):
        yield None
        return
    shared = os.environ.get("PRISM_SHARED_DATA")
    evaluation = (
        [f"eval.data_dir={shared}/eval", "eval.limit=3", "eval.tasks=[piqa,arc_easy]"]
        if shared
        else ["--stages=train,bench,analyze,report"]
    )
    workdir = tmp_path_factory.mktemp("whole_scale")
    job = submit(workdir, [*WHOLE_SCALE, *evaluation])
    yield workdir, job, bool(shared)
    if job_state(job).get("JobState") in ("PENDING", "RUNNING"):
        subprocess.run(["scancel", job])


def test_sbatch_runs_the_whole_scale_across_two_nodes(whole_scale):
    """train (DDP over both nodes) -> eval -> bench -> analyze -> report, RESULTS.md written."""
    tmp_path, job, shared = whole_scale
    state = wait_for(job, 900)
    log = output(tmp_path, job)
    assert state["JobState"] == "COMPLETED" and state["ExitCode"] == "0:0", log[-4000:]
    for sched in ("uniform", "prism"):
        summary = json.loads(
            (tmp_path / "runs" / "tiny" / sched / "seed0" / "train_summary.json").read_text()
        )
        assert summary["finished"] and summary["steps"] == 4
        assert summary["throughput"]["num_devices"] == 2
        assert summary["batch_split"] == {"micro_batch": 4, "accumulation": 1, "world_size": 2}
        train_log = (tmp_path / "results" / "tiny" / "logs" / f"train-{sched}-seed0.log").read_text()
        assert "srun --nodes=2 --ntasks=2 --ntasks-per-node=1 --cpus-per-task=1" in train_log
    if shared:
        for sched in ("uniform", "prism"):
            doc = json.loads((tmp_path / "results" / "tiny" / "eval" / sched / "seed0.json").read_text())
            assert set(doc["tasks"]) == {"piqa", "arc_easy"}
    assert (tmp_path / "results" / "tiny" / "bench.json").is_file()
    assert (tmp_path / "results" / "tiny" / "analysis.json").is_file()
    assert "Table 2" in (tmp_path / "results" / "RESULTS.md").read_text()
