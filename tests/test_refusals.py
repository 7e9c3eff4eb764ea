"""Bad input to the command lines is refused in one sentence with exit code 2, before any step: a
strategy name no Trainer accepts and a GPU this machine does not have, each of which used to end as
a crash (exit 70) that run_all.py retried. No command's refusal of its arguments or config imports
Lightning (seconds of a refusal otherwise), except a train.strategy outside auto, ddp and fsdp,
which is asked of Lightning's own registry. A config key given twice is
warned about, and its last value counts (docs/training.md#overrides).

In-process, as the other bad-input tests; the import check runs in one fresh process of its own,
since this one has imported Lightning long before."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys

import pytest
import torch
from conftest import ROOT, load_script
from rich.console import Console

from prism import cluster
from prism.config.schema import ConfigError, load_config
from prism.pipeline import run_all, trains_here

STRATEGY = (
    "train.strategy='bogus_strategy' is invalid: use auto, ddp or fsdp (the kit's FSDP2; docs/cluster.md), "
    "or another of Lightning's strategy names: ddp_fork, ddp_notebook, ddp_spawn, deepspeed,"
)
NO_GPU = (
    "train.accelerator=gpu asks for a GPU, but no GPU is visible on this machine; set "
    "train.accelerator=auto (a GPU where there is one, else the CPU) or train.accelerator=cpu."
)
TWICE = (
    "config key train.lr is given twice (train.lr=abc, then train.lr=1e-3); the last, train.lr=1e-3, is used."
)
# Were a refusal lost, what it let through stays short: two steps of a shrunken tiny model, run_all's
# training stage alone and never retried, and a dry run where the refusal does not depend on it.
QUICK = ["model.seq_len=32", "train.global_batch_tokens=128", "train.micro_batch=2", "train.tokens=256"]
RUN_ALL_QUICK = ["--stages", "train", "run_all.train_retries=0", *QUICK]
CASES = {
    "strategy": (["train.strategy=bogus_strategy"], STRATEGY),
    "gpu": (["train.accelerator=gpu"], NO_GPU),
}


@pytest.fixture
def no_gpu(monkeypatch):
    """This machine as one without a GPU, whatever it has."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


@pytest.mark.parametrize("case", CASES)
def test_train_py_refuses_in_one_sentence_with_exit_2(case, no_gpu, tmp_path, capsys):
    overrides, sentence = CASES[case]
    argv = ["--scale", "tiny", "--schedule", "prism", "--seed", "0", *QUICK, *overrides]
    assert load_script("train").main([*argv, f"runs_dir={tmp_path}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {sentence}"), err
    assert not any(tmp_path.iterdir())  # nothing written


@pytest.mark.parametrize("case", CASES)
def test_run_all_py_refuses_in_one_sentence_with_exit_2(case, no_gpu, tmp_path, capsys):
    overrides, sentence = CASES[case]
    dirs = [f"runs_dir={tmp_path}/runs", f"results_dir={tmp_path}/results"]
    dry = [] if case == "gpu" else ["--dry-run"]  # a dry run is refused the same, but for a GPU
    assert load_script("run_all").main(["--scale", "tiny", *RUN_ALL_QUICK, *dry, *overrides, *dirs]) == 2
    out = " ".join(capsys.readouterr().out.split())  # rich wraps a long sentence at 160 columns
    assert out.startswith(f"error: {sentence}"), out
    assert not any(tmp_path.iterdir())


def test_a_key_given_twice_is_warned_about_and_its_last_value_counts(tmp_path, capsys):
    # train.lr=abc would be refused; the strategy's refusal after the warning shows it was not read
    twice = ["train.lr=abc", "train.lr=1e-3", "train.strategy=bogus_strategy"]
    argv = ["--scale", "tiny", "--schedule", "prism", "--seed", "0", *QUICK, *twice, f"runs_dir={tmp_path}"]
    assert load_script("train").main(argv) == 2
    warning, error = capsys.readouterr().err.strip().splitlines()
    assert warning == f"warning: {TWICE}" and error.startswith(f"error: {STRATEGY}"), (warning, error)
    assert not any(tmp_path.iterdir())
    dirs = [f"runs_dir={tmp_path}/runs", f"results_dir={tmp_path}/results"]
    argv = ["--scale", "tiny", "--dry-run", *RUN_ALL_QUICK, *twice[:2], *dirs]
    assert load_script("run_all").main(argv) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert out.startswith(f"warning: {TWICE}"), out
    assert not any(tmp_path.iterdir())


def test_the_gpu_check_names_a_hiding_mask_and_passes_a_visible_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError, match=r"visible on this machine \(CUDA_VISIBLE_DEVICES=''\); set"):
        cluster.check_accelerator_visible("cuda", env={"CUDA_VISIBLE_DEVICES": ""})
    cluster.check_accelerator_visible("cpu")  # and auto: Lightning picks what there is
    cluster.check_accelerator_visible("auto")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    cluster.check_accelerator_visible("gpu")


def test_a_dry_run_plans_gpus_on_a_machine_without_one(no_gpu, tmp_path):
    # a plan is made on a login node; only a run that trains here needs the GPU here
    base = [f"runs_dir={tmp_path}/runs", f"results_dir={tmp_path}/results", "train.accelerator=gpu"]
    console = Console(file=io.StringIO(), width=200)
    assert run_all("tiny", base, seeds=[0], stages=["train"], dry_run=True, console=console) == 0
    with pytest.raises(ConfigError, match="no GPU is visible"):
        run_all("tiny", base, seeds=[0], stages=["train"], console=console)
    assert not (tmp_path / "runs").exists()
    # srun starts training on the allocation's nodes, where train.py checks; torchrun starts it here
    for launcher, stages, here in (
        ("", ["train"], True),
        ("torchrun --nproc-per-node=2", ["train", "eval"], True),
        ("srun --ntasks-per-node=8", ["train"], False),
        ("", ["eval", "report"], False),
    ):
        cfg = load_config("tiny", [f"run_all.launcher.train='{launcher}'"])
        assert trains_here(cfg, stages) is here, (launcher, stages)


# The refusals of each command, in one process: after each, whether Lightning has been imported.
DRIVER = """
import importlib.util, json, sys

seen = []
for script, argv in json.loads(sys.argv[2]):
    spec = importlib.util.spec_from_file_location(f"cli_{script}", f"{sys.argv[1]}/reproduce/{script}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    try:
        code = module.main(argv)
    except SystemExit as exc:  # argparse's refusals
        code = exc.code
    seen.append([script, argv, code, "lightning" in sys.modules])
print(json.dumps(seen))
"""


@pytest.mark.slow
def test_no_refusal_imports_lightning(tmp_path):
    dirs = [f"runs_dir={tmp_path}/runs", f"results_dir={tmp_path}/results"]
    out = str(tmp_path / "out.json")
    cases = [
        ("train", ["--scale", "nosuch"]),
        ("train", ["--scale", "tiny", "--schedule", "prism", "--seed", "0", "train.lr=abc", *dirs]),
        ("train", ["--scale", "tiny", *QUICK, *CASES["gpu"][0], *dirs]),
        ("run_all", ["--scale", "nosuch"]),
        ("run_all", ["--scale", "tiny", "--dry-run", "train.lr=abc", *dirs]),
        ("run_all", ["--scale", "tiny", *RUN_ALL_QUICK, *CASES["gpu"][0], *dirs]),
        ("evaluate", ["--checkpoint", str(tmp_path / "none.safetensors"), "--tasks", "nosuch", "--out", out]),
        ("evaluate", ["--checkpoint", str(tmp_path / "none.safetensors"), "--batch-size", "0", "--out", out]),
        ("report", ["--scales", "nosuch"]),
        ("report", ["--results-dir", str(tmp_path / "missing")]),
        ("search", ["--scale", "tiny", "--rungs", "768", "train.lr=abc", *dirs]),
        ("benchmark", ["--scale", "tiny", "train.lr=abc", "--out", out]),
        ("analyze", ["--checkpoints", str(tmp_path / "none.ckpt"), "--batch-size", "0", "--out", out]),
    ]
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "HF_HUB_OFFLINE": "1"}  # no GPU, no network
    proc = subprocess.run(
        [sys.executable, "-c", DRIVER, str(ROOT), json.dumps(cases)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert [(s, a, code) for s, a, code, _ in seen] == [(s, a, 2) for s, a in cases], proc.stderr
    assert [(s, a) for s, a, _, lightning in seen if lightning] == [], "a refusal imported Lightning"
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # and none wrote anything
