"""Outputs and numbers are checked first: an --out that cannot be written (an existing folder, a
path through a file, a read-only filesystem) and a value out of range are refused in one sentence
with exit code 2, before any checkpoint is opened or anything computed, and nothing is written:
no result, no `<out>.partial(.json)`, no folder."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import load_script

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}


def files_under(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


def refusal_case(tmp_path: Path, name: str, out_kind: str) -> tuple[list[str], str]:
    """The arguments and the expected sentence. The checkpoint (or scale) does not exist either:
    the --out sentence comes first, so --out was checked before any input was opened."""
    missing = str(tmp_path / "no-such-run" / "model.safetensors")
    inputs = {
        "evaluate": ["--checkpoint", missing, "--tasks", "piqa", "--no-progress"],
        "analyze": ["--checkpoints", missing],
        "benchmark": ["--scale", "no-such-scale"],
        "export_hf": ["--checkpoint", missing],
    }[name]
    (tmp_path / "taken").mkdir()
    (tmp_path / "a-file").write_text("not a folder\n")
    if out_kind == "folder":
        out = tmp_path / "taken"
        expected = f"error: --out {out} is an existing folder; give the path of a file to write."
    else:
        out = tmp_path / "a-file" / "out"
        expected = f"error: --out {out} cannot be created: {tmp_path / 'a-file'} is a file, not a folder."
    return [*inputs, "--out", str(out)], expected


@pytest.mark.parametrize("name", ["evaluate", "analyze"])
@pytest.mark.slow
def test_out_an_existing_folder_is_refused_before_anything_is_read(tmp_path, name):
    """A real process, as a user runs it."""
    argv, expected = refusal_case(tmp_path, name, "folder")
    before = files_under(tmp_path)
    proc = subprocess.run(
        [sys.executable, str(ROOT / "reproduce" / f"{name}.py"), *argv],
        env=ENV,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines()[-1] == expected
    assert "Traceback" not in proc.stderr
    assert files_under(tmp_path) == before  # no result, no partial


@pytest.mark.parametrize("name", ["evaluate", "analyze", "benchmark", "export_hf"])
def test_out_through_a_file_is_refused_before_anything_is_read(tmp_path, capsys, name):
    argv, expected = refusal_case(tmp_path, name, "through_a_file")
    before = files_under(tmp_path)
    assert load_script(name).main(argv) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == expected
    assert files_under(tmp_path) == before  # no result, no partial, no staging folder


@pytest.fixture
def read_only_folder(tmp_path):
    """A folder on a read-only tmpfs (chmod does not stop root)."""
    if os.geteuid() != 0 or not shutil.which("mount"):
        pytest.skip("needs root and mount to make a read-only tmpfs (CI runs as root)")
    folder = tmp_path / "ro"
    folder.mkdir()
    mount = ["mount", "-t", "tmpfs", "-o", "size=64k,ro", "tmpfs", str(folder)]
    made = subprocess.run(mount, capture_output=True)
    if made.returncode != 0:
        pytest.skip(f"mount refused a read-only tmpfs: {made.stderr.decode().strip()}")
    yield folder
    subprocess.run(["umount", str(folder)], capture_output=True)


@pytest.mark.parametrize(
    "name, args, out_name",
    [
        ("evaluate", ["--checkpoint", "missing.safetensors", "--tasks", "piqa"], "eval/seed0.json"),
        ("analyze", ["--checkpoints", "missing.ckpt"], "analysis.json"),
        ("benchmark", ["--scale", "tiny"], "bench.json"),
        ("export_hf", ["--checkpoint", "missing.ckpt"], "hf-export"),
        ("report", ["--scales", "tiny"], "RESULTS.md"),
    ],
)
def test_an_out_on_a_read_only_filesystem_is_refused(read_only_folder, capsys, name, args, out_name):
    out = read_only_folder / out_name
    assert load_script(name).main([*args, "--out", str(out)]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"error: --out {out} cannot be written: {read_only_folder} is on a read-only filesystem."
    )


@pytest.mark.parametrize(
    "name, args, expected",
    [
        ("evaluate", ["--batch-size", "0"], "error: eval.batch_size=0 is invalid: it must be positive."),
        (
            "evaluate",
            ["--limit", "-1"],
            "error: eval.limit=-1 is invalid: use null (every example), a whole number of documents (>= 1) "
            "or a fraction between 0 and 1.",
        ),
        (
            "evaluate",
            ["--limit", "nan"],
            "error: eval.limit='nan' is invalid: use null (every example), a whole number of documents "
            "(>= 1) or a fraction between 0 and 1.",
        ),
        ("analyze", ["--batch-size", "0"], "error: --batch-size=0 is invalid: it must be at least 1."),
        ("analyze", ["--sequences", "-1"], "error: --sequences=-1 is invalid: it must be at least 1."),
        ("benchmark", ["--micro-batch", "0"], "error: --micro-batch=0 is invalid: it must be at least 1."),
        ("benchmark", ["--seq-len", "0"], "error: --seq-len=0 is invalid: it must be at least 1."),
        ("benchmark", ["--steps", "0"], "error: --steps=0 is invalid: it must be at least 1."),
        ("benchmark", ["--warmup", "-1"], "error: --warmup=-1 is invalid: it must be at least 0."),
        (
            "benchmark",
            ["--peak-tflops", "nan"],
            "error: --peak-tflops=nan is invalid: it must be a positive number.",
        ),
        (
            "benchmark",
            ["--seed", "-1"],
            "error: --seed=-1 is invalid: it must be a whole number from 0 to 2**63-1.",
        ),
    ],
)
def test_a_number_out_of_range_is_one_sentence_and_writes_nothing(tmp_path, capsys, name, args, expected):
    out = tmp_path / "results" / "out.json"
    inputs = {
        "evaluate": ["--checkpoint", str(tmp_path / "missing.safetensors"), "--tasks", "piqa"],
        "analyze": ["--checkpoints", str(tmp_path / "missing.ckpt")],
        "benchmark": ["--scale", "tiny"],
    }[name]
    assert load_script(name).main([*inputs, *args, "--out", str(out)]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == expected
    assert files_under(tmp_path) == []
