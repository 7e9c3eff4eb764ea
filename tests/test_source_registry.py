"""The data source registry: a fifth source defined here trains, checkpoints and resumes exactly
through prism.train.trainer.train; config validation and identities ask the registry; the hub's
offline switch is read by one rule, huggingface_hub's, for training and for the dry run."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from lightning.pytorch.callbacks import Callback
from test_train import SMALL as TRAIN_SMALL
from test_train import CrashAt

from prism.config.schema import ConfigError, load_config
from prism.data import DataError, TokenStreamDataModule, check_source_reachable
from prism.data.heldout import Heldout, n_val_windows
from prism.data.hub_offline import hub_offline_switch
from prism.data.source import WindowSource
from prism.data.sources import SOURCES, register_source, training_data_identity, unregister_source
from prism.pipeline.plan import hub_offline
from prism.runs.identity import config_hash, training_identity
from prism.train.plan import plan_run
from prism.train.trainer import train

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "prism"
NAME = "test-array"
# tests/test_train.py's run (12 steps of 4 x 32 tokens, validation at 0, 6, 12, checkpoints
# every 3 steps) without its milestones, on this file's source
SMALL = [*(o for o in TRAIN_SMALL if not o.startswith("train.milestones")), f"data.source={NAME}"]


class ArrayTokens(WindowSource):
    """A fifth source: a token array made here. Ids follow a Zipf-like law over the first 500
    GPT-2 ids, so a model that learns from this data (and only this data) falls far below the
    ln(50257) = 10.8 of a uniform guess."""

    def describe(self) -> str:
        return "a token array made by tests/test_source_registry.py"

    @staticmethod
    def tokens() -> np.ndarray:
        rng = np.random.default_rng(7)
        p = 1.0 / np.arange(1, 501)
        return rng.choice(500, size=6000, p=p / p.sum()).astype(np.uint16)

    def build_heldout(self, seq_len: int) -> Heldout:
        n, window = n_val_windows(self.data.val_tokens, seq_len), seq_len + 1
        tokens = self.tokens()
        return Heldout(tokens[: n * window].reshape(n, window), frozenset(), 0, tokens[n * window :])

    def train_arrays(self, heldout: Heldout) -> list[np.ndarray]:
        return [heldout.train_tokens]


@pytest.fixture(scope="module")
def array_source():
    register_source(NAME, ArrayTokens)
    yield NAME
    unregister_source(NAME)


def small(runs_dir, *extra):
    return load_config("tiny", [*SMALL, f"runs_dir={runs_dir}", *extra])


class Batches(Callback):
    """The first token row of every training micro-batch, with its optimizer step."""

    def __init__(self):
        self.seen = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.seen.append((trainer.global_step, batch[0][0].tolist()))


@pytest.fixture(scope="module")
def uninterrupted(array_source, tmp_path_factory):
    rec = Batches()
    out = train(small(tmp_path_factory.mktemp("runs")), extra_callbacks=[rec])
    return json.loads((out / "train_summary.json").read_text()), rec.seen


@pytest.fixture(scope="module")
def crashed(array_source, tmp_path_factory):
    """The same run dying 2 steps after its step-6 checkpoint: its runs_dir and the micro-batches
    it trained up to that checkpoint. Each resume test resumes a copy of it."""
    runs, first = tmp_path_factory.mktemp("crashed"), Batches()
    with pytest.raises(RuntimeError, match="simulated crash"):
        train(small(runs), extra_callbacks=[first, CrashAt(8)])
    assert not (runs / "tiny" / "prism" / "seed0" / "train_summary.json").exists()
    return runs, [b for b in first.seen if b[0] < 6]


def crash_and_resume(crashed, runs, rewrite=None):
    """Resume a copy (in `runs`) of the crashed run, its checkpoints optionally rewritten first
    (`rewrite(dict)`); returns the summary and the micro-batches of both parts."""
    crashed_runs, before = crashed
    shutil.copytree(crashed_runs, runs, dirs_exist_ok=True)
    out = runs / "tiny" / "prism" / "seed0"
    for path in (out / "checkpoints").glob("*.ckpt") if rewrite else ():
        ckpt = torch.load(path, weights_only=True)
        rewrite(ckpt)
        torch.save(ckpt, path)
    second = Batches()
    train(small(runs), resume=True, extra_callbacks=[second])
    summary = json.loads((out / "train_summary.json").read_text())
    return summary, before + second.seen


def curve(summary: dict) -> list[tuple]:
    """(step, tokens, validation loss) of every validation (wall-clock times differ)."""
    return [(p["step"], p["tokens"], p["val_loss"]) for p in summary["val_curve"]]


@pytest.mark.slow
def test_a_source_defined_in_a_test_trains_on_its_own_data(uninterrupted):
    summary, seen = uninterrupted
    assert summary["data"] == {"source": NAME}
    assert [p["step"] for p in summary["val_curve"]] == [0, 6, 12]
    start, final = summary["val_curve"][0]["val_loss"], summary["final_val_loss"]
    # near-uniform at init; 12 steps on 500 Zipf-distributed ids fall far below it
    assert start > 10.0 and final < start - 2.0, (start, final)
    train_tokens = ArrayTokens.tokens()[8 * 33 :]  # after the 8 held-out windows of 33 tokens
    windows = {tuple(train_tokens[i * 33 : i * 33 + 32].tolist()) for i in range(len(train_tokens) // 33)}
    assert all(tuple(row) in windows for _, row in seen)  # every batch is this source's training data


@pytest.mark.slow
def test_the_fifth_source_resumes_exactly(uninterrupted, crashed, tmp_path):
    ref, ref_seen = uninterrupted
    summary, seen = crash_and_resume(crashed, tmp_path)
    assert seen == ref_seen  # the same micro-batches, in the same order
    # One process, one thread, the same batch shapes and an exact stream resume: the resumed
    # run repeats the uninterrupted computation bit for bit.
    assert curve(summary) == curve(ref) and summary["final_val_loss"] == ref["final_val_loss"]


@pytest.mark.slow
def test_a_checkpoint_with_the_old_data_state_key_resumes_exactly(uninterrupted, crashed, tmp_path):
    ref, ref_seen = uninterrupted
    key = TokenStreamDataModule.__qualname__

    def old_key(ckpt):
        ckpt["FineWebDataModule"] = ckpt.pop(key)

    summary, seen = crash_and_resume(crashed, tmp_path, rewrite=old_key)
    assert seen == ref_seen  # without the data state the stream would restart at its beginning
    assert curve(summary) == curve(ref)


def test_the_run_plan_asks_the_registry(array_source):
    with pytest.raises(ConfigError) as info:
        plan_run(load_config("tiny", ["data.source=ftp"]), launch=False, reach_data=False)
    assert str(info.value) == (
        f"data.source='ftp' is invalid: use one of hub, local, shards, offline, {NAME}."
    )
    assert SOURCES.names()[:4] == ["hub", "local", "shards", "offline"]
    with pytest.raises(ConfigError, match=r"^data.source=shards needs data.path, the folder that "):
        plan_run(load_config("tiny", ["data.source=shards"]), launch=False, reach_data=False)
    cfg = load_config("tiny", [f"data.source={NAME}"])
    assert training_data_identity(cfg.data) == {"source": NAME}
    # only a source that reads a revision keeps it in the identity
    assert "revision" not in training_identity_data(cfg)
    assert training_identity_data(load_config("tiny", ["data.source=hub"]))["revision"] == "cd85054"
    assert config_hash(cfg) != config_hash(load_config("tiny"))


def training_identity_data(cfg) -> dict:
    from prism.config.schema import to_dict

    return training_identity(to_dict(cfg))["data"]


def test_registering_refuses_a_taken_name_and_a_non_source(array_source):
    with pytest.raises(ValueError, match="data source 'local' is already registered"):
        register_source("local", ArrayTokens)
    with pytest.raises(TypeError, match="must subclass prism.data.source.DataSource"):
        register_source("other", dict)
    with pytest.raises(ValueError, match="'hub' is built in"):
        unregister_source("hub")


# ----- the hub's offline switch ----------------------------------------------------------------
SPELLINGS = [
    "1",
    "true",
    "TRUE",
    "True",
    "yes",
    "YES",
    "on",
    "On",
    "0",
    "false",
    "no",
    "off",
    "",
    "2",
    " 1",
    "auto",
]
OFFLINE = {"1", "true", "TRUE", "True", "yes", "YES", "on", "On"}  # 1/true/yes/on, any case


def huggingface_hub_reads(var: str) -> dict[str, bool]:
    """huggingface_hub's own verdict (constants.HF_HUB_OFFLINE, read at import) per spelling of
    `var`, each in a fresh interpreter."""
    code = (
        "import json, os, subprocess, sys\n"
        "out = {}\n"
        "for v in json.loads(sys.argv[1]):\n"
        "    env = {k: x for k, x in os.environ.items() if 'OFFLINE' not in k}\n"
        f"    env[{var!r}] = v\n"
        "    r = subprocess.run([sys.executable, '-c', 'import huggingface_hub.constants as c; "
        "print(c.HF_HUB_OFFLINE)'], env=env, capture_output=True, text=True, check=True)\n"
        "    out[v] = r.stdout.strip() == 'True'\n"
        "print(json.dumps(out))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, json.dumps(SPELLINGS)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.parametrize("var", ["HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"])
def test_the_offline_switch_follows_huggingface_hub(var):
    ours = {v: hub_offline_switch({var: v}) == (var, v) for v in SPELLINGS}
    assert {v for v, off in ours.items() if off} == OFFLINE
    assert all(hub_offline_switch({var: v}) is None for v in SPELLINGS if v not in OFFLINE)
    assert ours == huggingface_hub_reads(var)


def test_the_offline_switch_rules_between_variables():
    # TRANSFORMERS_OFFLINE counts only while HF_HUB_OFFLINE is unset or empty (huggingface_hub
    # reads `HF_HUB_OFFLINE or TRANSFORMERS_OFFLINE`)
    assert hub_offline_switch({"HF_HUB_OFFLINE": "", "TRANSFORMERS_OFFLINE": "1"}) == (
        "TRANSFORMERS_OFFLINE",
        "1",
    )
    assert hub_offline_switch({"HF_HUB_OFFLINE": "0", "TRANSFORMERS_OFFLINE": "1"}) is None
    # datasets' own switch stops a hub stream too
    assert hub_offline_switch({"HF_DATASETS_OFFLINE": "Yes"}) == ("HF_DATASETS_OFFLINE", "Yes")
    assert hub_offline_switch({}) is None


@pytest.mark.parametrize("value", sorted(OFFLINE) + ["0", "off", "false", ""])
def test_training_and_the_dry_run_agree_on_every_spelling(value, monkeypatch):
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", value)

    def refused(*args, **kwargs):  # the machine may have no network: the answer must not depend on it
        raise ConnectionRefusedError("refused")

    monkeypatch.setattr(socket, "create_connection", refused)
    hub = load_config("tiny", ["data.source=hub"]).data
    if value in OFFLINE:
        with pytest.raises(DataError, match=rf"HF_HUB_OFFLINE={value} switches the hub off"):
            check_source_reachable(hub)
        assert hub_offline() == f"the hub is switched off (HF_HUB_OFFLINE={value})"
    else:
        check_source_reachable(hub)  # training's check passes, and the dry run tries the network
        assert hub_offline() == "huggingface.co is unreachable"


def test_production_code_reads_no_fault_injection_switch():
    hits = [str(p.relative_to(ROOT)) for p in SRC.rglob("*.py") if "PRISM_FAULT" in p.read_text()]
    assert hits == []
