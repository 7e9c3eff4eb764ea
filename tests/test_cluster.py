"""Launch layouts and their hazards: the batch split, what the scheduler's variables mean, and the
wrong launches that must stop with one sentence before any training step."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import load_script
from test_train import SMALL, CrashAt, small

from prism import cluster
from prism.config.schema import ConfigError
from prism.data import DataError
from prism.pipeline import run_all
from prism.pipeline.layout import resolve_layout
from prism.train.batch import split, split_table
from prism.train.trainer import train

main = load_script("train").main  # reproduce/train.py's

ROOT = Path(__file__).resolve().parents[1]
BATCH_ENV = {
    "SLURM_JOB_ID": "77",
    "SLURM_JOB_NAME": "prism",
    "SLURM_NTASKS": "16",
    "SLURM_NTASKS_PER_NODE": "8",
    "SLURM_JOB_NUM_NODES": "2",
    "SLURM_GPUS_PER_NODE": "h100:8",
    "SLURM_CPUS_ON_NODE": "64",
    "SLURM_PROCID": "0",
}


def test_micro_batch_is_the_largest_divisor_under_the_ceiling():
    assert split(256, 32, 8) == (32, 1)
    assert split(256, 16, 8) == (16, 2)
    assert split(256, 48, 8) == (32, 1)  # the ceiling need not divide anything
    assert split(256, 24, 16) == (16, 1)
    assert split(512, 16, 64) == (8, 1)
    assert split(8, 3, 1) == (2, 4)
    assert split(256, 16, 24) is None  # 24 devices cannot share 256 sequences


def test_documented_split_table_is_the_one_the_code_computes():
    page = (ROOT / "docs" / "cluster.md").read_text()
    table = split_table()
    assert table in page, (
        "docs/cluster.md's batch-split table is stale; paste prism.train.batch.split_table()"
    )
    assert "| 354m | 256 × 1024 | 16 | 16 × 2 | 16 × 1 | 8 × 1 | 4 × 1 |" in table


def test_allocation_and_srun_lines_come_from_the_batch_environment():
    alloc = cluster.allocation(BATCH_ENV)
    assert (alloc.nodes, alloc.gpus_per_node, alloc.procs_per_node, alloc.cpus_per_proc) == (2, 8, 8, 8)
    assert alloc.srun(2, 8) == (
        "srun --nodes=2 --ntasks=16 --ntasks-per-node=8 --cpus-per-task=8 "
        "--gpus-per-node=8 --kill-on-bad-exit=1"
    )
    assert cluster.allocation({**BATCH_ENV, "SLURM_STEP_ID": "0"}) is None  # inside a step
    layout = resolve_layout([], alloc=alloc)
    assert layout.overrides == ["train.devices=8", "train.num_nodes=2"]
    assert layout.launchers["eval"].startswith("srun --nodes=1 --ntasks=8 ")
    with pytest.raises(ConfigError, match="train.devices=4 contradicts the layout"):
        resolve_layout(["train.devices=4"], alloc=alloc)


def test_a_stage_not_started_by_srun_does_not_look_like_a_task():
    env = cluster.single_process_env({**BATCH_ENV, "PATH": "/bin"})
    assert "SLURM_NTASKS" not in env and "SLURM_PROCID" not in env
    assert env["SLURM_JOB_ID"] == "77" and env["PATH"] == "/bin"  # requeue still finds its job
    assert cluster.this_launch(env).kind == "plain" and cluster.inherited_tasks(env) == 0


def test_launch_kinds_follow_the_step_not_the_job_name():
    step = {
        "SLURM_JOB_ID": "5",
        "SLURM_STEP_ID": "0",
        "SLURM_NTASKS": "2",
        "SLURM_PROCID": "1",
        "SLURM_LOCALID": "0",
    }
    # salloc calls its jobs 'interactive': a step of two tasks is still srun's
    assert cluster.this_launch({**step, "SLURM_JOB_NAME": "interactive"}) == cluster.Launch("srun", 1, 2, 0)
    # `srun --pty bash` then python: one task, Lightning starts the ranks itself
    shell = {**step, "SLURM_NTASKS": "1", "SLURM_PROCID": "0", "SLURM_JOB_NAME": "bash"}
    assert cluster.this_launch(shell).kind == "plain"
    assert cluster.this_launch(
        {"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4", "TORCHELASTIC_RUN_ID": "x"}
    ) == cluster.Launch("torchrun", 3, 4, 1)


@pytest.mark.parametrize(
    "env, message",
    [
        # run_all.py or train.py started by hand inside `salloc --ntasks-per-node=8` / a batch script
        (BATCH_ENV, "inside a Slurm allocation of 16 tasks (SLURM_NTASKS=16) outside any job step"),
        # srun started 2 tasks, the config asks for 1 device on 1 node
        (
            {
                "SLURM_JOB_ID": "77",
                "SLURM_JOB_NAME": "prism",
                "SLURM_STEP_ID": "0",
                "SLURM_NTASKS": "2",
                "SLURM_PROCID": "0",
                "SLURM_LOCALID": "0",
            },
            "started 2 tasks of an srun step but the config asks for 1",
        ),
    ],
)
def test_wrong_launches_stop_with_one_sentence_before_any_step(tmp_path, capsys, monkeypatch, env, message):
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert main(["--scale", "tiny", *SMALL, f"runs_dir={tmp_path}", "train.accelerator=cpu"]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1, err
    assert not any(tmp_path.iterdir())


@pytest.mark.slow
def test_a_one_process_stage_refuses_to_run_as_many_tasks(tmp_path):
    env = {
        **os.environ,
        "SLURM_JOB_ID": "77",
        "SLURM_STEP_ID": "3",
        "SLURM_NTASKS": "8",
        "SLURM_PROCID": "0",
        "SLURM_JOB_NAME": "prism",
    }
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "reproduce" / "benchmark.py"),
            "--scale",
            "tiny",
            "--out",
            str(tmp_path / "b.json"),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        "error: benchmark.py runs as one process but was started as 8 "
        "tasks of an srun step; start it once (srun --ntasks=1, or "
        "without a launcher)."
    )
    assert not (tmp_path / "b.json").exists()


@pytest.mark.slow
def test_dry_run_plans_a_layout_and_stops_on_a_split_or_hub_that_cannot_work(tmp_path, monkeypatch):
    import io

    from rich.console import Console

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    out = io.StringIO()
    base = [f"runs_dir={tmp_path}/runs", f"results_dir={tmp_path}/results", "eval.data_dir=" + str(tmp_path)]
    assert run_all("354m", base, dry_run=True, nodes=4, console=Console(file=out, width=200)) == 0
    shown = " ".join(out.getvalue().split())
    assert "micro_batch 8 x accumulation 1 x 32 device(s)" in shown
    # the hang watchdog (what counts as progress, its allowances), the straggler line, the pre-flight check
    assert (
        "hangs: a rank that finishes no batch (training, validation or zero-shot) for "
        "train.hang_timeout_s=300 s (540 s in its first steps and while a checkpoint is written)"
    ) in shown
    assert "collectives between checkpoints then time out after 360 s" in shown
    assert "stragglers: every 50 steps" in shown
    assert "pre-flight: a matmul per rank and an all-reduce before training" in shown
    with pytest.raises(ConfigError, match="which 24 device.s. cannot share evenly"):
        run_all("354m", base, dry_run=True, nodes=3, console=Console(file=io.StringIO()))
    # a hang timeout the collective timeout would always beat: refused in the plan
    with pytest.raises(
        ConfigError, match=r"train.hang_timeout_s=300.0 is invalid: use 0 \(off\) or at most 60 s"
    ):
        run_all(
            "354m",
            [*base, "train.ddp_timeout_s=120"],
            dry_run=True,
            nodes=4,
            console=Console(file=io.StringIO()),
        )
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # the dry run plans without the hub, and says what to pass
    out = io.StringIO()
    assert run_all("354m", base, dry_run=True, nodes=4, console=Console(file=out, width=400)) == 0
    assert "HF_HUB_OFFLINE=1 switches the hub off" in out.getvalue()
    assert "data.source=shards data.path=DIR" in out.getvalue()
    assert not (tmp_path / "runs").exists()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_ranks_that_see_different_run_folders_stop_together(tmp_path):
    """Two torchrun 'nodes' whose relative runs_dir are different folders (node-local disks):
    rank 0 finds a partial run and resumes it, rank 1 cannot read that checkpoint. Both stop with
    the same sentence before any step instead of diverging or hanging."""
    node0, node1 = tmp_path / "node0", tmp_path / "node1"
    node1.mkdir()
    with pytest.raises(RuntimeError, match="simulated crash"):
        train(small(node0 / "runs"), extra_callbacks=[CrashAt(4)])
    ckpts = node0 / "runs" / "tiny" / "prism" / "seed0" / "checkpoints"
    before = {p.name: p.stat().st_mtime_ns for p in ckpts.iterdir()}
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT / "src"))
    procs = []
    try:
        for rank, cwd in ((0, node0), (1, node1)):
            cmd = [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nnodes=2",
                "--nproc-per-node=1",
                f"--node-rank={rank}",
                "--master-addr=127.0.0.1",
                f"--master-port={port}",
                str(ROOT / "reproduce" / "train.py"),
                "--scale",
                "tiny",
                *SMALL,
                "runs_dir=runs",
                "train.accelerator=cpu",
                "train.devices=1",
                "train.num_nodes=2",
            ]
            procs.append(
                subprocess.Popen(
                    cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
                )
            )
        outs = [p.communicate(timeout=300)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    sentence = "rank 0 resumes from runs/tiny/prism/seed0/checkpoints/last.ckpt but rank(s) 1 cannot read it"
    for p, out in zip(procs, outs):
        assert p.returncode != 0
        assert sentence in out, out[-3000:]
    assert not (node1 / "runs").exists()
    assert {p.name: p.stat().st_mtime_ns for p in ckpts.iterdir()} == before  # no step ran
