"""Data pipeline on the offline source and on token shards: tokenizer, packing, held-out set,
distribution over ranks x workers, determinism, DDP/accumulation equivalence and resume."""

from __future__ import annotations

import socket

import numpy as np
import pytest
import torch
from conftest import stream_resume_through_lightning
from torch.utils.data import DataLoader

from prism.config.schema import load_config
from prism.data import EOT_TOKEN, DataError, GPT2Tokenizer, TokenStreamDataModule, heldout_windows
from prism.data.shards import write_shard
from prism.data.sources.offline import offline_documents
from prism.data.windows import IndexPermutation


def tiny(*overrides):
    return load_config("tiny", list(overrides))


def take(loader_or_ds, n):
    it = iter(loader_or_ds)
    return [next(it) for _ in range(n)]


def rows(batches):
    """Every window (x with the last y token) of a list of (x, y) batches, as tuples."""
    return [tuple(torch.cat([x[i], y[i, -1:]]).tolist()) for x, y in batches for i in range(len(x))]


@pytest.fixture
def shard_dir(tmp_path):
    """64 distinct train windows and 8 val windows of seq_len+1 = 17 tokens in two train shards."""
    window = 17
    tokens = np.arange(72 * window + 5, dtype=np.int64) % 50000
    write_shard(tmp_path / "t_val_000000.bin", tokens[: 8 * window])
    write_shard(tmp_path / "t_train_000001.bin", tokens[8 * window : 40 * window + 5])  # 5-token tail
    write_shard(tmp_path / "t_train_000002.bin", tokens[40 * window + 5 :])
    return tmp_path


def shard_cfg(path, *overrides):
    return tiny(
        "data.source=shards",
        f"data.path={path}",
        "model.seq_len=16",
        "data.val_tokens=128",
        "train.global_batch_tokens=64",
        *overrides,
    )


# ----- tokenizer --------------------------------------------------------------------------------
def test_tokenizer_exact_gpt2_ids_and_batch_path():
    tok = GPT2Tokenizer()
    assert tok.encode("Hello world") == [15496, 995]
    assert tok.encode("<|endoftext|>") != [EOT_TOKEN]  # ordinary text never yields the special id
    texts = ["Hello world", " the quick brown fox", "déjà vu 123"]
    singles = [tok.encode(t) for t in texts]
    assert tok.encode_batch(texts, num_threads=2) == singles
    stream = tok.encode_documents(texts, num_threads=2)
    assert stream.dtype == np.uint16
    expected = [t for ids in singles for t in [EOT_TOKEN, *ids]]
    assert stream.tolist() == expected == tok.encode_documents(texts).tolist()
    assert tok.decode(singles[2]) == "déjà vu 123"


def test_index_permutation_is_a_bijection_for_awkward_sizes():
    for n in (1, 2, 7, 1000, 4097):
        perm = IndexPermutation(n, seed=3)(np.arange(n))
        assert sorted(perm.tolist()) == list(range(n))
    a, b = IndexPermutation(1000, 1)(np.arange(1000)), IndexPermutation(1000, 2)(np.arange(1000))
    assert (a != np.arange(1000)).mean() > 0.9 and (a != b).mean() > 0.9


# ----- offline source ---------------------------------------------------------------------------
def test_offline_source_needs_no_network(monkeypatch):
    def no_network(*args, **kwargs):
        raise AssertionError("the offline source opened a network socket")

    monkeypatch.setattr(socket, "socket", no_network)
    monkeypatch.setattr(socket, "create_connection", no_network)
    cfg = tiny()
    assert cfg.data.source == "offline"
    dm = TokenStreamDataModule(cfg)
    ((x, y),) = take(dm.train_dataloader(), 1)
    assert x.shape == y.shape == (cfg.train.micro_batch, cfg.model.seq_len)
    assert x.dtype == y.dtype == torch.int64
    assert torch.equal(x[:, 1:], y[:, :-1])
    val = list(dm.val_dataloader())
    n_val = cfg.data.val_tokens // cfg.model.seq_len
    assert sum(len(vx) for vx, _ in val) == n_val
    # the held-out windows are the leading documents' tokens, joined by EOT
    docs = offline_documents()
    stream = GPT2Tokenizer().encode_documents(docs[:40])
    held = heldout_windows(cfg, n_val)
    assert held.shape == (n_val, cfg.model.seq_len + 1)
    assert held.flatten().tolist() == stream[: held.numel()].tolist()
    assert held[0, 0].item() == EOT_TOKEN
    # ...and never appear in training: no training window is a held-out window
    train = set(rows(take(dm.train_dataset(0, 1), 60)))
    assert not train & {tuple(r) for r in held.tolist()}


def test_same_seed_same_batches_and_independent_of_model_and_train_seed():
    a = take(TokenStreamDataModule(tiny()).train_dataloader(), 6)
    b = take(
        TokenStreamDataModule(tiny("schedule=uniform", "train.seed=7", "train.lr=1e-3")).train_dataloader(), 6
    )
    c = take(TokenStreamDataModule(tiny("data.seed=99")).train_dataloader(), 6)
    for (xa, ya), (xb, yb) in zip(a, b):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)
    assert not all(torch.equal(xa, xc) for (xa, _), (xc, _) in zip(a, c))
    assert torch.equal(
        heldout_windows(tiny(), 8), heldout_windows(tiny("schedule=uniform", "data.seed=5"), 8)
    )


def test_two_ranks_see_the_windows_of_one_rank_with_accumulation():
    dm = TokenStreamDataModule(tiny("data.num_workers=2"))
    single = take(DataLoader(dm.train_dataset(0, 1), batch_size=None, num_workers=2), 8)
    rank0 = take(DataLoader(dm.train_dataset(0, 2), batch_size=None, num_workers=2), 4)
    rank1 = take(DataLoader(dm.train_dataset(1, 2), batch_size=None, num_workers=2), 4)
    for step in range(4):  # optimizer step k: micro-batches 2k, 2k+1 vs rank0[k], rank1[k]
        assert torch.equal(single[2 * step][0], rank0[step][0])
        assert torch.equal(single[2 * step + 1][0], rank1[step][0])


# ----- shards -----------------------------------------------------------------------------------
def test_ranks_times_workers_are_disjoint_and_cover_the_data_exactly_once(shard_dir):
    cfg = shard_cfg(shard_dir, "data.num_workers=2", "train.micro_batch=4")
    dm = TokenStreamDataModule(cfg)
    seen = []
    for rank in range(2):  # 64 windows / 4 per batch = 16 global micro-batches, 8 per rank
        loader = DataLoader(dm.train_dataset(rank, 2), batch_size=None, num_workers=2)
        seen += rows(take(loader, 8))
    tokens = np.arange(72 * 17 + 5) % 50000
    expected = sorted(
        tuple(tokens[s : s + 17].tolist())
        for s in [8 * 17 + 17 * i for i in range(32)] + [40 * 17 + 5 + 17 * i for i in range(32)]
    )
    assert len(set(seen)) == len(seen) == 64
    assert sorted(seen) == expected
    val = torch.cat([x for x, _ in dm.val_dataloader()])
    assert val.shape == (8, 16) and val[0, 0].item() == 0  # val shard windows, in order


def test_val_batches_are_split_evenly_over_ranks(shard_dir):
    dm = TokenStreamDataModule(shard_cfg(shard_dir, "train.micro_batch=2"))
    # 8 windows / 2 = 4 batches: 3 ranks get one each (the 4th would make DDP wait), 2 ranks two
    three = [rows(dm.val_dataset(rank, 3)) for rank in range(3)]
    two = [rows(dm.val_dataset(rank, 2)) for rank in range(2)]
    assert [len(r) for r in three] == [2, 2, 2] and [len(r) for r in two] == [4, 4]
    assert sorted(two[0] + two[1]) == sorted(rows(dm.val_dataset(0, 1)))
    assert len(set(two[0] + two[1])) == 8


@pytest.mark.parametrize("workers", [0, 2])
def test_resume_gives_exactly_the_next_batches(shard_dir, workers):
    cfg = shard_cfg(shard_dir, f"data.num_workers={workers}", "train.micro_batch=3")
    full = take(TokenStreamDataModule(cfg).train_dataloader(), 30)  # crosses an epoch (64 windows)
    dm = TokenStreamDataModule(cfg)
    for batch in take(dm.train_dataloader(), 13):
        dm.on_before_batch_transfer(batch, 0)  # what the trainer calls for every batch it uses
    state = dm.state_dict()
    restored = TokenStreamDataModule(cfg)
    restored.load_state_dict(state)
    for (x, y), (xr, yr) in zip(full[13:], take(restored.train_dataloader(), 17)):
        assert torch.equal(x, xr) and torch.equal(y, yr)


def test_resume_keeps_the_global_position_when_world_size_changes(shard_dir):
    cfg = shard_cfg(shard_dir, "train.micro_batch=2")
    single = take(TokenStreamDataModule(cfg).train_dataset(0, 1), 12)
    dm = TokenStreamDataModule(cfg)
    for b in take(dm.train_dataset(0, 1), 4):
        dm.on_before_batch_transfer(b, 0)
    two = TokenStreamDataModule(cfg)
    two.load_state_dict(dm.state_dict())
    r0, r1 = take(two.train_dataset(0, 2), 2), take(two.train_dataset(1, 2), 2)
    assert [torch.equal(a[0], b[0]) for a, b in zip(single[4:8], [r0[0], r1[0], r0[1], r1[1]])] == [True] * 4


def test_bad_shards_stop_with_one_sentence(tmp_path, shard_dir):
    def error(path, **kw):
        with pytest.raises(DataError) as info:
            TokenStreamDataModule(shard_cfg(path, **kw)).setup()
        msg = str(info.value)
        assert "\n" not in msg
        return msg

    bad = tmp_path / "bad"
    bad.mkdir()
    assert "does not exist" in error(tmp_path / "missing")
    assert "no val shards" in error(bad)
    write_shard(bad / "x_val_000000.bin", np.zeros(400, np.uint16))
    write_shard(bad / "x_train_000001.bin", np.zeros(400, np.uint16))
    raw = bytearray((bad / "x_train_000001.bin").read_bytes())
    raw[:4] = np.int32(12345).tobytes()
    (bad / "x_train_000001.bin").write_bytes(bytes(raw))
    assert "magic number 12345" in error(bad)
    raw[:4] = np.int32(20240520).tobytes()
    (bad / "x_train_000001.bin").write_bytes(bytes(raw[:-10]))
    assert "truncated" in error(bad)
    (bad / "x_train_000001.bin").write_bytes(bytes(raw[:100]))
    assert "shorter than the 1024-byte header" in error(bad)
    with pytest.raises(DataError, match="hold 136 tokens, fewer than one window of model.seq_len"):
        TokenStreamDataModule(
            load_config("tiny", ["data.source=shards", f"data.path={shard_dir}", "data.val_tokens=16"])
        ).setup()


def test_seq_len_larger_than_the_offline_text_is_refused():
    with pytest.raises(DataError, match="fewer than one window of model.seq_len"):
        heldout_windows(
            tiny(
                "model.seq_len=400000",
                "data.val_tokens=400000",
                "train.global_batch_tokens=400000",
                "train.tokens=800000",
            ),
            1,
        )


# ----- through Lightning ------------------------------------------------------------------------
def test_lightning_checkpoint_resume_continues_the_stream(tmp_path):
    cfg = tiny("data.num_workers=0")
    full, first, resumed, state = stream_resume_through_lightning(
        tmp_path,
        lambda: TokenStreamDataModule(cfg),
        steps=6,
        stop=3,
        val_every=2,
        val_batches=2,
        keep=slice(0, 4),
    )
    assert state["rank_batches"] == 3
    assert len(full) == 6 and len(resumed) == 3
    for a, b in zip(full[3:], resumed):
        assert torch.equal(a, b)
    assert all(torch.equal(a, b) for a, b in zip(full[:3], first))


_DDP_SCRIPT = """
import json, os, sys
import lightning as L, torch
from prism.config.schema import load_config
from prism.data import TokenStreamDataModule

class Record(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(50257, 4)
        self.seen = []
    def training_step(self, batch, _):
        self.seen.append(batch[0][:, :8].tolist())
        return self.emb(batch[0]).mean()
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.0)

devices, accum, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
model = Record()
L.Trainer(max_steps=3, accelerator="cpu", devices=devices, strategy="ddp" if devices > 1 else "auto",
          accumulate_grad_batches=accum, logger=False, enable_progress_bar=False,
          enable_checkpointing=False, enable_model_summary=False, limit_val_batches=0,
          ).fit(model, datamodule=TokenStreamDataModule(load_config("tiny", ["data.num_workers=1"])))
with open(f"{out}.{os.environ.get('LOCAL_RANK', '0')}.json", "w") as f:
    json.dump(model.seen, f)
"""


@pytest.mark.slow
def test_real_ddp_two_processes_see_the_windows_of_one_process_with_accumulation(tmp_path):
    """Two gloo DDP processes (rank/world from the trainer) vs one process accumulating 2."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    script = tmp_path / "run.py"
    script.write_text(_DDP_SCRIPT)
    src = str(Path(__file__).resolve().parents[1] / "src")
    env = {**os.environ, "PYTHONPATH": src, "OMP_NUM_THREADS": "1"}  # they share 2 cores with this one
    # the two processes run while this one trains the single-process run beside them
    ddp = subprocess.Popen(
        [sys.executable, str(script), "2", "1", str(tmp_path / "d2")],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        namespace = {"__name__": "ddp_script"}  # the same module, run here as one process
        exec(_DDP_SCRIPT.split("devices, accum, out")[0], namespace)
        import lightning as L

        model = namespace["Record"]()
        L.Trainer(
            max_steps=3,
            accelerator="cpu",
            devices=1,
            accumulate_grad_batches=2,
            logger=False,
            enable_progress_bar=False,
            enable_checkpointing=False,
            enable_model_summary=False,
            limit_val_batches=0,
        ).fit(model, datamodule=TokenStreamDataModule(tiny("data.num_workers=1")))
        single = model.seen
        _, err = ddp.communicate(timeout=240)
    finally:
        if ddp.poll() is None:
            ddp.kill()
            ddp.communicate()
    assert ddp.returncode == 0, err[-3000:]
    ranks = [json.loads((tmp_path / f"d2.{r}.json").read_text()) for r in range(2)]
    assert len(single) == 6 and [len(r) for r in ranks] == [3, 3]
    for step in range(3):
        assert single[2 * step] == ranks[0][step] and single[2 * step + 1] == ranks[1][step]
    assert ranks[0][0] != ranks[1][0]
