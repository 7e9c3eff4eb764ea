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

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import Callback
from test_train import SMALL, CrashAt, small  # (reference: a session fixture of conftest.py)

from prism.compat import is_step_boundary
from prism.runs.identity import config_hash
from prism.train.callbacks.checkpoint import AtomicCheckpointIO, StepCheckpoint, stale_temporaries, step_of
from prism.train.resume import decide
from prism.train.trainer import train

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
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


@pytest.mark.slow
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


@pytest.mark.slow
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
                "train.tokens=384",  # 3 steps: a step checkpoint and last.ckpt are all it takes
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
from prism.train.callbacks.checkpoint import AtomicCheckpointIO
state = {"state_dict": {f"w{i}": torch.full((1 << 20,), float(i)) for i in range(int(sys.argv[2]))},
         "global_step": int(sys.argv[3])}
print("ready", flush=True)
AtomicCheckpointIO().save_checkpoint(state, sys.argv[1])
print("saved", flush=True)
"""


@pytest.mark.slow
def test_a_process_killed_while_writing_leaves_no_truncated_checkpoint(tmp_path):
    target = tmp_path / "checkpoints" / "last.ckpt"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
    script = [sys.executable, "-c", WRITER, str(target)]
    # the old checkpoint, written whole in this process (only the killed writer needs its own)
    state = {"state_dict": {f"w{i}": torch.full((1 << 20,), float(i)) for i in range(2)}, "global_step": 5}
    AtomicCheckpointIO().save_checkpoint(state, str(target))
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


class _StopAt(Callback):
    """Stops the way Preemption does at a step boundary: save_stop, then an exception, before the
    checkpoint callback's own hook runs (Lightning runs checkpoint callbacks last)."""

    def __init__(self, step):
        self.step = step

    def on_train_batch_end(self, trainer, *args):
        if trainer.global_step == self.step and is_step_boundary(trainer):
            StepCheckpoint.of(trainer).save_stop(trainer)
            raise RuntimeError("stopped")


class _Linear(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        return torch.nn.functional.mse_loss(self.layer(batch[0]), batch[1])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


@pytest.mark.parametrize("stop, files", [(4, {2, 4}), (5, {2, 4})])
def test_a_stop_at_a_due_step_writes_its_step_file_and_last(tmp_path, stop, files):
    """A step that is due a step file gets it even when the run stops there (accumulation 2, a
    step file every 2 steps, keep all); a stop at any other step writes last.ckpt only."""
    ckpt = StepCheckpoint(tmp_path / "checkpoints", every_n_steps=2, val_every_steps=10**6, keep=-1)
    trainer = L.Trainer(
        accelerator="cpu",
        max_steps=10,
        accumulate_grad_batches=2,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[_StopAt(stop), ckpt],
        default_root_dir=str(tmp_path),
    )
    data = torch.utils.data.TensorDataset(torch.randn(40, 4), torch.randn(40, 1))
    with pytest.raises(RuntimeError, match="stopped"):
        trainer.fit(_Linear(), torch.utils.data.DataLoader(data))
    assert {step_of(p) for p in (tmp_path / "checkpoints").glob("step-*.ckpt")} == files
    assert torch.load(ckpt.last_path, weights_only=True)["global_step"] == stop


def test_checking_weights_refuses_what_loading_refuses(tmp_path):
    """check_weights (an extension's plan: header or mapped file only) against load_model (the
    read at the start), on good files and on each kind of bad one."""
    from dataclasses import asdict

    from conftest import tiny_model

    from prism.runs.checkpoint import CheckpointError, check_weights, export_safetensors, load_model

    model = tiny_model()
    good = export_safetensors(model, tmp_path / "good")
    ckpt = tmp_path / "good.ckpt"
    state = {f"model.{k}": v for k, v in model.state_dict().items()}
    torch.save({"hyper_parameters": {"model": asdict(model.cfg)}, "state_dict": state}, ckpt)
    bad = {}
    bad["cut short"] = shutil.copytree(tmp_path / "good", tmp_path / "short") / good.name
    bad["cut short"].write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    bad["other shape"] = export_safetensors(tiny_model(d_model=32), tmp_path / "other")
    shutil.copy(tmp_path / "good" / "model_config.json", tmp_path / "other" / "model_config.json")
    bad["no config"] = shutil.copytree(tmp_path / "good", tmp_path / "bare") / good.name
    (tmp_path / "bare" / "model_config.json").unlink()
    bad["integer weights"] = export_safetensors(
        model,
        tmp_path / "integer",
        state={
            k: v.to(torch.int32) if k.endswith("proj.weight") else v for k, v in model.state_dict().items()
        },
    )
    bad["ckpt cut short"] = tmp_path / "short.ckpt"
    bad["ckpt cut short"].write_bytes(ckpt.read_bytes()[:-100])
    for path in (good, ckpt):
        check_weights(path)
        assert set(load_model(path)[0].state_dict()) == set(model.state_dict())
    for case, path in bad.items():
        with pytest.raises(CheckpointError) as loading:
            load_model(path)
        with pytest.raises(CheckpointError) as checking:
            check_weights(path)
        assert str(checking.value) == str(loading.value), case
