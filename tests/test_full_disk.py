"""Full disks, for real: a tmpfs of a few MB (or just too small for one more checkpoint) under a
run, a result file and an export. Every command ends in one sentence naming the file and the
space left, exits 1, deletes its temporary, and leaves what was there before intact; the run
continues once there is space."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import load_script

from prism.config.schema import load_config
from prism.core.model import ModelConfig, PrismDecoder
from prism.io import atomic_write_json, os_error_message
from prism.pipeline.plan import build_plan, default_scripts, job_state
from prism.runs.checkpoint import export_safetensors, load_model
from prism.runs.identity import config_hash
from prism.train.callbacks.checkpoint import AtomicCheckpointIO, stale_temporaries
from prism.train.resume import decide

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).parent / "fixtures" / "eval"
ENV = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
# Two optimizer steps of 128 tokens, a checkpoint (last.ckpt only) and a validation after each.
TWO_STEPS = [
    "model.seq_len=32",
    "train.global_batch_tokens=128",
    "train.micro_batch=2",
    "train.tokens=256",
    "train.val_every_steps=1",
    "train.ckpt_every_steps=1",
    "train.keep_checkpoints=0",
    "train.log_every_steps=1",
    "data.val_tokens=256",
    "data.source=offline",
    "train.accelerator=cpu",
]


def mount(cmd: list[str]) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"`{' '.join(cmd)}` was refused ({proc.stderr.strip()}); these tests need root and tmpfs")


@pytest.fixture
def small_disk(tmp_path):
    """mount_at(folder, size) puts a fresh tmpfs of `size` (e.g. "2m") at folder; resize(folder,
    size) grows it keeping its files; fill(folder) takes every free byte. Unmounted at the end."""
    if os.geteuid() != 0 or not shutil.which("mount"):
        pytest.skip("needs root and mount to make a small tmpfs (CI runs as root)")
    mounted: list[Path] = []

    class Disk:
        @staticmethod
        def mount_at(folder: Path, size: str) -> Path:
            folder.mkdir(parents=True, exist_ok=True)
            mount(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)])
            mounted.append(folder)
            return folder

        @staticmethod
        def resize(folder: Path, size: str) -> None:
            mount(["mount", "-o", f"remount,size={size}", str(folder)])

        @staticmethod
        def fill(folder: Path) -> None:
            with open(folder / "filler", "wb", buffering=0) as f:  # unbuffered: nothing left to flush
                try:
                    while True:
                        f.write(b"\0" * 4096)
                except OSError:
                    pass
            assert shutil.disk_usage(folder).free == 0

    yield Disk
    for folder in reversed(mounted):
        subprocess.run(["umount", str(folder)], capture_output=True)


def script(name: str, *args, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "reproduce" / f"{name}.py"), *map(str, args)],
        env=ENV,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
    )


def in_process(name: str, *args, cwd: Path, capfd, monkeypatch) -> subprocess.CompletedProcess:
    """The script's main() in this process, run from `cwd`: what `script` returns, without an
    interpreter start-up (capfd holds every write to fd 1 and 2, as a process's pipes would).
    train.py and report.py meet a full disk here as real processes; evaluate.py's and
    export_hf.py's start-up and exit codes as processes are test_eval_cli's and test_export_hf's."""
    monkeypatch.chdir(cwd)
    capfd.readouterr()  # only what the script writes
    rc = load_script(name).main([str(a) for a in args])
    out, err = capfd.readouterr()
    return subprocess.CompletedProcess([name, *map(str, args)], rc, out, err)


def one_sentence(proc: subprocess.CompletedProcess, start: str) -> str:
    """The error line, which starts with `start`; no traceback."""
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, proc.stderr[-3000:]
    assert lines[0].startswith(start), lines[0]
    assert lines[0].endswith(" on that filesystem)."), lines[0]
    return lines[0]


@pytest.fixture(scope="module")
def weights(tmp_path_factory) -> Path:
    """A small model over GPT-2's vocabulary, exported (13 MB): what evaluate and export read."""
    torch.manual_seed(0)
    model = PrismDecoder(
        ModelConfig(n_layer=2, d_model=64, h_base=4, heads=[2, 4], seq_len=32, schedule_name="prism")
    )
    out = tmp_path_factory.mktemp("weights")
    export_safetensors(model, out, {"scale": "tiny", "schedule": "prism", "seed": 1})
    return out / "model.safetensors"


@pytest.mark.slow
def test_a_run_whose_first_checkpoint_does_not_fit_stops_in_one_sentence_and_starts_again(
    small_disk, tmp_path
):
    runs = small_disk.mount_at(tmp_path / "runs", "2m")  # not even one 95 MB checkpoint fits
    run = runs / "tiny" / "prism" / "seed0"
    ckpts = run / "checkpoints"
    train = ("train", "--scale", "tiny", *TWO_STEPS, f"runs_dir={runs}")
    proc = script(*train, cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr[-3000:]
    one_sentence(proc, f"error: no space left on device while writing {ckpts}/last.ckpt (")
    assert not list(ckpts.glob("*.ckpt")) and not stale_temporaries(ckpts)
    assert not (run / "train_summary.json").exists() and not (run / "model.safetensors").exists()
    # What the failed run left is not mistaken for something to resume, by train.py or run_all.py.
    cfg = load_config("tiny", [*TWO_STEPS, f"runs_dir={runs}", f"results_dir={tmp_path / 'results'}"])
    assert decide(run, config_hash(cfg), overwrite=False, resume=None).kind == "fresh"
    plan = build_plan(cfg, [], ["train"], default_scripts(ROOT / "reproduce"), sys.executable)
    status, reason = job_state(next(j for j in plan.jobs if j.label == "train prism seed0"))
    assert status == "run" and "without a checkpoint" in reason, reason

    small_disk.resize(runs, "400m")  # the same command, once there is space
    proc = script(*train, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"training -> {run}: 2 steps" in proc.stdout + proc.stderr
    summary = json.loads((run / "train_summary.json").read_text())
    assert summary["finished"] and [point["step"] for point in summary["val_curve"]] == [0, 1, 2]


def test_a_checkpoint_that_does_not_fit_leaves_the_previous_one_whole(small_disk, tmp_path):
    """AtomicCheckpointIO (every checkpoint a run writes goes through it) on a 2 MiB disk: torch's
    "unexpected pos" RuntimeError becomes an OSError naming the checkpoint."""
    disk = small_disk.mount_at(tmp_path / "ckpts", "2m")
    last = disk / "last.ckpt"
    AtomicCheckpointIO().save_checkpoint({"global_step": 1, "w": torch.ones(250_000)}, last)  # 1 MB
    with pytest.raises(OSError) as failed:  # 1.5 MB more while the old file is still there
        AtomicCheckpointIO().save_checkpoint({"global_step": 2, "w": torch.ones(375_000)}, last)
    assert failed.value.errno == errno.ENOSPC and failed.value.filename == str(last)
    assert os_error_message(failed.value).startswith(f"no space left on device while writing {last} (")
    assert torch.load(last, weights_only=True)["global_step"] == 1
    assert [p.name for p in disk.iterdir()] == ["last.ckpt"]  # the temporary is gone


def test_json_and_safetensors_writes_that_do_not_fit_leave_the_previous_files(small_disk, tmp_path, weights):
    disk = small_disk.mount_at(tmp_path / "out", "2m")
    atomic_write_json(disk / "result.json", {"previous": True})
    with pytest.raises(OSError) as failed:
        atomic_write_json(disk / "result.json", {"big": "x" * 3_000_000})
    assert failed.value.errno == errno.ENOSPC and failed.value.filename == str(disk / "result.json")
    assert json.loads((disk / "result.json").read_text()) == {"previous": True}
    model, _ = load_model(weights)  # 13 MB of weights through safetensors' own writer
    with pytest.raises(OSError) as failed:
        export_safetensors(model, disk)
    assert failed.value.errno == errno.ENOSPC and failed.value.filename == str(disk / "model.safetensors")
    assert sorted(p.name for p in disk.iterdir()) == ["result.json"]


def test_an_evaluation_on_a_full_disk_keeps_the_previous_result(
    small_disk, tmp_path, weights, capfd, monkeypatch
):
    disk = small_disk.mount_at(tmp_path / "results", "64k")
    out = disk / "seed1.json"
    out.write_text('{"previous": "result"}\n')
    small_disk.fill(disk)
    proc = in_process(
        "evaluate",
        *("--checkpoint", weights, "--tasks", "piqa", "--data-dir", FIXTURES, "--no-progress"),
        *("--out", out),
        cwd=tmp_path,
        capfd=capfd,
        monkeypatch=monkeypatch,
    )
    assert proc.returncode == 1, proc.stderr[-3000:]
    line = one_sentence(proc, f"error: no space left on device while writing {out}.partial.json (")
    assert "0 kB free of 66 kB" in line
    assert out.read_text() == '{"previous": "result"}\n'
    assert sorted(p.name for p in disk.iterdir()) == ["filler", "seed1.json"]  # no temporary, no partial


@pytest.mark.slow
def test_a_report_on_a_full_disk_keeps_the_previous_report(small_disk, tmp_path):
    disk = small_disk.mount_at(tmp_path / "results", "64k")
    (disk / "RESULTS.md").write_text("the previous report\n")
    small_disk.fill(disk)
    (tmp_path / "runs").mkdir()  # empty: a --runs-dir that is not a folder is refused first
    proc = script(
        "report", "--scales", "tiny", "--runs-dir", tmp_path / "runs", "--results-dir", disk, cwd=tmp_path
    )
    assert proc.returncode == 1, proc.stderr[-3000:]
    # the report's first file is a plot: the paper's scaling analysis has plots even with no runs
    one_sentence(proc, f"error: no space left on device while writing {disk / 'plots'}/across-scales-")
    assert (disk / "RESULTS.md").read_text() == "the previous report\n"
    assert sorted(p.name for p in disk.iterdir()) == ["RESULTS.md", "filler", "plots"]
    assert list((disk / "plots").iterdir()) == []  # no temporary left behind


def test_an_export_on_a_full_disk_leaves_the_previous_export(
    small_disk, tmp_path, weights, capfd, monkeypatch
):
    pytest.importorskip("transformers")
    disk = small_disk.mount_at(tmp_path / "hf", "2m")  # the weights alone are 13 MB
    out = disk / "prism-tiny"
    out.mkdir()
    (out / "README.md").write_text("the previous export\n")
    argv = ("--checkpoint", weights, "--out", out, "--overwrite")
    proc = in_process("export_hf", *argv, cwd=tmp_path, capfd=capfd, monkeypatch=monkeypatch)
    assert proc.returncode == 1, proc.stderr[-3000:]
    one_sentence(proc, f"error: no space left on device while writing {out / 'model.safetensors'} (")
    assert [p.name for p in disk.iterdir()] == ["prism-tiny"]  # no staging folder left beside it
    assert [p.name for p in out.iterdir()] == ["README.md"]
    assert (out / "README.md").read_text() == "the previous export\n"
