"""The kit under a real Slurm scheduler: two slurmd nodes on this machine (dev/slurm-cluster.sh),
CPU, gloo. `.ci/run` installs and starts the cluster; elsewhere these tests are skipped with the
reason. Each job is submitted with sbatch exactly as README.md and docs/cluster.md show it, plus the CPU
overrides and settings that shrink the work."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SBATCH = ROOT / "reproduce" / "slurm" / "run_scale.sbatch"
# the documented CPU-only layout: two nodes, one task (and one fake GPU) each
CPU_LAYOUT = ["--nodes=2", "--ntasks-per-node=1", "--gpus-per-node=1", "--cpus-per-task=1"]


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


pytestmark = [pytest.mark.slow, pytest.mark.skipif(_cluster_up() is not None, reason=str(_cluster_up()))]


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


def test_sbatch_runs_the_whole_scale_across_two_nodes(tmp_path):
    """train (DDP over both nodes) -> eval -> bench -> analyze -> report, RESULTS.md written."""
    shared = os.environ.get("PRISM_SHARED_DATA")
    evaluation = (
        [f"eval.data_dir={shared}/eval", "eval.limit=3", "eval.tasks=[piqa,arc_easy]"]
        if shared
        else ["--stages=train,bench,analyze,report"]
    )
    job = submit(
        tmp_path,
        [
            "tiny",
            "train.accelerator=cpu",
            *evaluation,
            # smaller than tiny's defaults, same pipeline
            "train.tokens=16384",
            "train.val_every_steps=4",
            "train.ckpt_every_steps=4",
            "bench.steps=2",
            "bench.warmup=1",
            "analysis.sequences=2",
        ],
    )
    state = wait_for(job, 900)
    log = output(tmp_path, job)
    assert state["JobState"] == "COMPLETED" and state["ExitCode"] == "0:0", log[-4000:]
    for sched in ("uniform", "prism"):
        summary = json.loads(
            (tmp_path / "runs" / "tiny" / sched / "seed0" / "train_summary.json").read_text()
        )
        assert summary["finished"] and summary["steps"] == 8
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
            "train.tokens=1536",
            "train.val_every_steps=6",
            "train.ckpt_every_steps=3",
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
    assert summary["throughput"]["num_devices"] == 2 and summary["steps"] == 12
    assert summary["batch_split"] == {"micro_batch": 2, "accumulation": 1, "world_size": 2}


# 48 steps of 4 sequences x 32 tokens; checkpoints every 8 steps, validation every 12
LONG = [
    "model.seq_len=32",
    "train.global_batch_tokens=128",
    "train.micro_batch=2",
    "train.tokens=6144",
    "train.lr=3e-3",
    "train.val_every_steps=12",
    "train.ckpt_every_steps=8",
    "train.log_every_steps=4",
    "data.val_tokens=256",
]


def test_a_warned_job_checkpoints_requeues_itself_and_finishes_like_an_uninterrupted_run(tmp_path):
    args = ["tiny", "--stages=train", "--schedules=prism", "train.accelerator=cpu", *LONG]
    # the same job without interruption, on the same layout (the same float32 reduction order:
    # 48 steps at this LR amplify the rounding difference between 2 ranks and 1 rank with
    # accumulation far beyond 1e-4, so only an identical layout is a fair reference)
    ref_dir, work = tmp_path / "reference", tmp_path / "requeued"
    ref_dir.mkdir()
    work.mkdir()
    ref_job = submit(ref_dir, args)
    job = submit(work, args)
    ckpt = work / "runs" / "tiny" / "prism" / "seed0" / "checkpoints" / "step-000008.ckpt"
    deadline = time.monotonic() + 600
    while not ckpt.is_file():
        assert time.monotonic() < deadline, output(work, job)[-3000:]
        assert job_state(job).get("JobState") in ("PENDING", "RUNNING"), output(work, job)[-3000:]
        time.sleep(0.2)
    # the scheduler's warning signal, as --signal=USR1@300 sends it to the job's steps
    subprocess.run(["scancel", "--signal=USR1", job], check=True)
    # a requeued job becomes eligible again after Slurm's fixed delay (about two minutes)
    state = wait_for(job, 900)
    log = output(work, job)
    train_log = (work / "results" / "tiny" / "logs" / "train-prism-seed0.log").read_text()
    assert state["JobState"] == "COMPLETED" and state["Restarts"] == "1", log[-4000:]
    stopped = re.search(r"stopped by SIGUSR1 at step (\d+) of 48 with checkpoint (\S+);", train_log)
    assert stopped and "was requeued" in train_log, train_log[-4000:]
    resumed = re.search(r"resuming from (\S+) \(step (\d+)\)", train_log)
    assert resumed and resumed.group(1) == stopped.group(2), train_log[-4000:]
    # no step is trained twice: the resumed run starts exactly where the signal stopped it
    assert int(resumed.group(2)) == int(stopped.group(1)) >= 8
    summary = json.loads((work / "runs" / "tiny" / "prism" / "seed0" / "train_summary.json").read_text())
    assert summary["finished"] and summary["throughput"]["num_devices"] == 2

    ref_state = wait_for(ref_job, 600)
    assert ref_state["JobState"] == "COMPLETED" and ref_state["Restarts"] == "0", output(ref_dir, ref_job)[
        -3000:
    ]
    ref = json.loads((ref_dir / "runs" / "tiny" / "prism" / "seed0" / "train_summary.json").read_text())
    assert abs(summary["final_val_loss"] - ref["final_val_loss"]) < 1e-4
    assert (
        [p["step"] for p in summary["val_curve"]]
        == [p["step"] for p in ref["val_curve"]]
        == [0, 12, 24, 36, 48]
    )


def test_evaluate_under_srun_shards_over_the_tasks_of_the_step(tmp_path):
    import torch

    from prism.checkpoint import export_safetensors
    from prism.model import ModelConfig, PrismDecoder

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
    two = subprocess.run(
        [
            "srun",
            "--nodes=2",
            "--ntasks=2",
            "--ntasks-per-node=1",
            "--cpus-per-task=1",
            "--kill-on-bad-exit=1",
            sys.executable,
            *args,
            "--out",
            str(tmp_path / "two.json"),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        cwd=tmp_path,
    )
    assert two.returncode == 0, two.stderr[-3000:]
    assert "requests sharded over 2 ranks" in two.stderr
    one = subprocess.run(
        [sys.executable, *args, "--out", str(tmp_path / "one.json")],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        cwd=tmp_path,
    )
    assert one.returncode == 0 and "sharded" not in one.stderr, one.stderr[-3000:]
    got, want = (json.loads((tmp_path / f"{n}.json").read_text())["tasks"] for n in ("two", "one"))
    assert got.keys() == want.keys()
    for task in want:  # the same scores in the same shapes; only the gather order differs
        for metric, value in want[task].items():
            assert got[task][metric] == pytest.approx(value, rel=1e-12, abs=1e-12), (task, metric)
