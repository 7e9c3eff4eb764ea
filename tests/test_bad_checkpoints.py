"""Checkpoints that cannot be opened get the kit's own sentence in every command that opens one
(never torch's advice to retry with weights_only=False); analyze.py reads exported weights with
the run config beside them, as docs/evaluation.md's command passes them; and the dry run plans
under HF_HUB_OFFLINE=1, naming the override that makes training possible there.

train.py and the documented analyze command run as real processes, started together (one module
fixture) so that they cost about the slower of the two; the other commands run in this process
through their scripts' own main(argv), which is what their command line calls."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import load_script, shared_data_dir
from omegaconf import OmegaConf

from prism.config.schema import load_config, to_dict
from prism.core.model import PrismDecoder
from prism.data import heldout_windows
from prism.data.sources import training_data_identity
from prism.measure.analysis.compare import fingerprint
from prism.runs.checkpoint import export_safetensors
from prism.runs.identity import config_hash

ROOT = Path(__file__).resolve().parents[1]
TINY = [
    "model.seq_len=32",
    "train.global_batch_tokens=128",
    "train.micro_batch=2",
    "train.tokens=512",
    "data.val_tokens=256",
    "data.num_workers=0",
]
RUN = ["model.seq_len=32", "data.val_tokens=2048"]  # the exported runs: 64 held-out windows of 33
NOT_TORCHS = ("weights_only", "Traceback", "will likely succeed")
SENTENCE = (
    "cannot be opened: it is not a torch checkpoint (20000 bytes that are not a torch.save zip "
    "archive): it is cut short, corrupt or another kind of file."
)


def export_run(runs: Path, schedule: str) -> Path:
    """A finished run's exported pair and config.yaml, as training writes them (training.finish)."""
    cfg = load_config("tiny", [*RUN, f"schedule={schedule}", "train.seed=0"])
    run_dir = runs / "tiny" / schedule / "seed0"
    sched = cfg.head_schedule()
    meta = {
        "scale": "tiny",
        "schedule": sched.name,
        "heads": list(sched.heads),
        "seed": 0,
        "config_hash": config_hash(cfg),
        "data": training_data_identity(cfg.data),
        "step": 1,
        "tokens_seen": 128,
    }
    export_safetensors(PrismDecoder(cfg.model_config(schedule)), run_dir, meta)
    (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(to_dict(cfg)))
    return run_dir


@pytest.fixture(scope="module")
def ran(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bad_checkpoints")
    rand = tmp / "rand.ckpt"
    rand.write_bytes(np.random.default_rng(0).bytes(20000))
    resumed = tmp / "runs" / "tiny" / "uniform" / "seed0" / "checkpoints"
    resumed.mkdir(parents=True)
    (resumed / "last.ckpt").write_bytes(rand.read_bytes())
    readme = tmp / "readme"
    for schedule in ("uniform", "prism"):
        export_run(readme / "runs", schedule)
    commands = {
        "train": (
            [
                "train.py",
                "--scale",
                "tiny",
                "--schedule",
                "uniform",
                "--seed",
                "0",
                f"runs_dir={tmp / 'runs'}",
            ]
            + TINY,
            tmp,
        ),
        # docs/evaluation.md's command as written (at the tiny scale), in the folder holding runs/
        "readme": (
            [
                "analyze.py",
                "--checkpoints",
                "runs/tiny/uniform/seed0/model.safetensors",
                "runs/tiny/prism/seed0/model.safetensors",
                "--sequences",
                "64",
                "--out",
                "results/tiny/analysis.json",
            ],
            readme,
        ),
    }
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    procs = {
        name: subprocess.Popen(
            [sys.executable, str(ROOT / "reproduce" / argv[0]), *argv[1:]],
            cwd=cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name, (argv, cwd) in commands.items()
    }
    done = {}
    for name, proc in procs.items():
        out, err = proc.communicate(timeout=900)
        done[name] = (proc.returncode, out, err)
    return tmp, done


def only_sentence(err: str) -> str:
    """The error line of a command's stderr (Lightning's banner lines aside), checked to be the
    only line that reports the failure."""
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, err
    assert not any(bad in err for bad in NOT_TORCHS), err
    return errors[0]


@pytest.mark.slow
def test_train_resume_names_a_random_last_ckpt_and_changes_nothing(ran):
    tmp, done = ran
    rc, out, err = done["train"]
    run = tmp / "runs" / "tiny" / "uniform" / "seed0"
    assert rc == 1, err  # a refusal: the run folder holds something that is not this run's checkpoint
    assert only_sentence(err) == (
        f"error: no checkpoint of {run} can be opened ({run / 'checkpoints' / 'last.ckpt'} (it is not a "
        "torch checkpoint (20000 bytes that are not a torch.save zip archive): it is cut short, corrupt "
        "or another kind of file)); move the folder away or pass --overwrite to start again."
    )
    assert (run / "checkpoints" / "last.ckpt").read_bytes() == (tmp / "rand.ckpt").read_bytes()
    assert sorted(p.name for p in run.iterdir()) == ["checkpoints"]  # no config.yaml, no tb/


def test_evaluate_analyze_and_export_name_a_random_ckpt(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    rand = tmp_path / "rand.ckpt"
    rand.write_bytes(np.random.default_rng(0).bytes(20000))
    eval_data = shared_data_dir()
    commands = {
        "evaluate": (
            ["--checkpoint", str(rand), "--tasks", "wikitext"]
            + (["--data-dir", str(eval_data / "eval")] if eval_data else [])
            + ["--out", str(tmp_path / "eval.json")]
        ),
        "analyze": ["--checkpoints", str(rand), str(rand), "--out", str(tmp_path / "analysis.json")],
        "export_hf": ["--checkpoint", str(rand), "--out", str(tmp_path / "hf")],
    }
    for script, argv in commands.items():
        assert load_script(script).main(argv) == 2, script
        assert only_sentence(capsys.readouterr().err) == f"error: checkpoint {rand} {SENTENCE}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rand.ckpt"]  # no output, no .partial


@pytest.mark.slow
def test_analyze_reads_exported_weights_with_the_run_config_beside_them(ran):
    tmp, done = ran
    rc, _, err = done["readme"]
    assert rc == 0, err
    result = json.loads((tmp / "readme" / "results" / "tiny" / "analysis.json").read_text())
    cfg = load_config("tiny", [*RUN, "schedule=uniform", "train.seed=0"])
    # the sequences are the run's own held-out windows, named by the config.yaml beside the weights
    assert result["sequences_sha256"] == fingerprint(heldout_windows(cfg, 64))
    assert result["scale"] == "tiny" and result["seq_len"] == 32
    assert [e["schedule"] for e in result["checkpoints"]] == ["uniform", "prism"]
    assert result["delta"]["prism"]["seeds"] == [0]


def test_analyze_refuses_a_config_yaml_of_another_run(tmp_path, capsys):
    uniform, prism = (export_run(tmp_path / "runs", s) for s in ("uniform", "prism"))
    other = load_config("tiny", [*RUN, "schedule=prism", "train.seed=1"])
    (prism / "config.yaml").write_text(OmegaConf.to_yaml(to_dict(other)))
    out = tmp_path / "analysis.json"
    argv = ["--checkpoints", str(uniform / "model.safetensors"), str(prism / "model.safetensors")]
    assert load_script("analyze").main([*argv, "--sequences", "2", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert (
        f"error: {prism / 'config.yaml'} is not the config of {prism / 'model.safetensors'} (config_hash"
        in err
    )
    assert not out.exists() and not list(tmp_path.glob("analysis.json.partial*"))


@pytest.mark.parametrize("hub_off", [True, False])
@pytest.mark.slow
def test_the_dry_run_plans_with_the_hub_off_and_names_the_override(
    tmp_path, capsys, monkeypatch, request, hub_off
):
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    if hub_off:
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("COLUMNS", "400")  # rich: one line per sentence
    run_all = load_script("run_all").main
    before = signal.getsignal(signal.SIGTERM)  # main() installs its own handler: put pytest's back
    request.addfinalizer(lambda: signal.signal(signal.SIGTERM, before))
    plan = [
        f"runs_dir={tmp_path / 'runs'}",
        f"results_dir={tmp_path / 'results'}",
        f"eval.data_dir={tmp_path}",
    ]
    assert run_all(["--scale", "124m", "--dry-run", *plan]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert ("HF_HUB_OFFLINE=1 switches the hub off" in out) is hub_off
    if hub_off:
        assert (
            "where the hub is reachable run `python reproduce/prepare_fineweb.py --source hub --subset "
            "sample-10BT --out DIR` and pass data.source=shards data.path=DIR, or pass data.source=local "
            "data.path=FILES for a local copy (docs/data.md), or unset HF_HUB_OFFLINE." in out
        )
        assert "its training data cannot be read here" in out
        assert run_all(["--scale", "124m", *plan]) == 2  # the real run: refused before any job
        assert "error: data.source=hub streams" in " ".join(capsys.readouterr().out.split())
        # with the override the sentence gives, the plan trains
        shards = ["data.source=shards", f"data.path={tmp_path}"]
        assert run_all(["--scale", "124m", "--dry-run", *plan, *shards]) == 0
        assert "switches the hub off" not in capsys.readouterr().out
    assert run_all(["--scale", "tiny", "--dry-run", *plan]) == 0  # tiny reads the offline text
    assert "switches the hub off" not in capsys.readouterr().out
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # a plan writes nothing
