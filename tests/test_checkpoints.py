"""Checkpoints under the failures long runs meet: a /tmp too small for one checkpoint, a file cut
short, a process killed while writing, and how many files a run keeps."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from test_train import SMALL, CrashAt, reference, small  # noqa: F401 (reference: a fixture)

from prism.callbacks.checkpoint import AtomicCheckpointIO, stale_temporaries
from prism.resume import decide
from prism.training import config_hash, train

ROOT = Path(__file__).resolve().parents[1]


def test_truncated_last_checkpoint_is_named_and_the_newest_intact_one_resumes(reference, tmp_path):
    cfg = small(tmp_path, "schedule=prism")
    with pytest.raises(RuntimeError, match="simulated crash"):
        train(cfg, extra_callbacks=[CrashAt(8)])  # checkpoints at steps 3 and 6, last.ckpt = 6
    out = tmp_path / "tiny" / "prism" / "seed0"
    last = out / "checkpoints" / "last.ckpt"
    with open(last, "r+b") as f:  # cut at half its size, as a kill mid-copy did
        f.truncate(last.stat().st_size // 2)
    decision = decide(out, config_hash(cfg), overwrite=False, resume=None)
    assert decision.kind == "resume" and decision.step == 6
    assert decision.checkpoint == str(out / "checkpoints" / "step-000006.ckpt")
    assert len(decision.skipped) == 1 and decision.skipped[0].startswith(str(last))
    train(cfg)
    resumed = json.loads((out / "train_summary.json").read_text())
    # resumed from the same state at the same step: the same arithmetic as the uninterrupted run
    # (test_train.py's kill-and-resume test holds the same bound)
    assert abs(resumed["final_val_loss"] - reference["summary"]["final_val_loss"]) < 1e-4


def test_keep_checkpoints_leaves_last_plus_the_newest_k(tmp_path):
    out = train(small(tmp_path, "train.keep_checkpoints=1"))
    assert {p.name for p in (out / "checkpoints").iterdir()} == {"last.ckpt", "step-000012.ckpt"}


def _can_mount_tmpfs(path: Path) -> bool:
    if os.geteuid() != 0 or not shutil.which("mount"):
        return False
    return (
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(path)], capture_output=True
        ).returncode
        == 0
    )


def test_a_tmpdir_too_small_for_one_checkpoint_does_not_matter(tmp_path):
    small_tmp = tmp_path / "tmp"
    small_tmp.mkdir()
    if not _can_mount_tmpfs(small_tmp):
        pytest.skip("needs root and tmpfs to make a 64 KiB TMPDIR (CI runs as root)")
    try:
        env = {
            **os.environ,
            "TMPDIR": str(small_tmp),
            "PYTHONPATH": str(ROOT / "src"),
            "OMP_NUM_THREADS": "1",
        }
        proc = subprocess.run(
            [
                sys.executable,
                str(ROOT / "reproduce" / "train.py"),
                "--scale",
                "tiny",
                *SMALL,
                f"runs_dir={tmp_path / 'runs'}",
                "train.accelerator=cpu",
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        ckpts = tmp_path / "runs" / "tiny" / "prism" / "seed0" / "checkpoints"
        # each checkpoint is far larger than the whole TMPDIR
        assert (ckpts / "last.ckpt").stat().st_size > 1000 * 64 * 1024
        torch.load(ckpts / "last.ckpt", map_location="cpu", weights_only=True, mmap=True)
    finally:
        subprocess.run(["umount", str(small_tmp)], capture_output=True)


WRITER = """
import sys, torch
from prism.callbacks.checkpoint import AtomicCheckpointIO
state = {"state_dict": {f"w{i}": torch.full((1 << 20,), float(i)) for i in range(int(sys.argv[2]))},
         "global_step": int(sys.argv[3])}
print("ready", flush=True)
AtomicCheckpointIO().save_checkpoint(state, sys.argv[1])
print("saved", flush=True)
"""


def test_a_process_killed_while_writing_leaves_no_truncated_checkpoint(tmp_path):
    target = tmp_path / "checkpoints" / "last.ckpt"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    script = [sys.executable, "-c", WRITER, str(target)]
    subprocess.run([*script, "2", "5"], env=env, check=True, timeout=120)  # the old checkpoint
    old = target.read_bytes()
    # a new one of 400 MB, killed once its temporary file has started to grow
    proc = subprocess.Popen([*script, "100", "6"], env=env, stdout=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not any(p.stat().st_size > 0 for p in stale_temporaries(target.parent)):
        assert proc.poll() is None and time.monotonic() < deadline, "the writer finished too soon"
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert target.read_bytes() == old  # the final name holds the old, complete checkpoint
    assert torch.load(target, weights_only=True)["global_step"] == 5
    assert stale_temporaries(target.parent)  # the half-written file is a temporary, found as such
