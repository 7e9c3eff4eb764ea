"""Exact and cheap resume of the hub/local document streams (local parquet stands in for the
hub: both are read through `datasets` streaming). A resumed stream must give exactly the batches
an uninterrupted run gives, for every ranks x workers layout, and start from where each reader
stood instead of re-reading what it had consumed: at most one row group per reader."""

from __future__ import annotations

import gc
import importlib
import io
import logging
from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from conftest import side_by_side, stream_resume_through_lightning

from prism.config.schema import load_config
from prism.data import DataError, TokenStreamDataModule

ROW_GROUP = 6  # documents per parquet row group: many small row groups, one shard each
WORDS = (
    "the of and to in a is that for it as was with be by on not he this are or his from at "
    "which but have an they you were her she there been one all we their has would when if "
    "so no what up out who them some could more into time only new about than other then "
    "river stone garden window engine letter market winter silver button ladder candle"
).split()


@pytest.fixture
def parquet(tmp_path):
    """240 short, distinct documents (~17 tokens each) in row groups of 6: one epoch of one
    reader is ~60 micro-batches of 2 x 33 tokens."""
    rng = np.random.default_rng(0)
    docs = [
        f"Document {i}. " + " ".join(rng.choice(WORDS, size=int(rng.integers(4, 17)))) for i in range(240)
    ]
    path = tmp_path / "docs.parquet"
    pq.write_table(pa.table({"text": docs, "id": list(range(len(docs)))}), path, row_group_size=ROW_GROUP)
    return path


def cfg_for(path, workers, *overrides):
    return load_config(
        "tiny",
        [
            "data.source=local",
            f"data.path={path}",
            "model.seq_len=32",
            "data.val_tokens=64",
            "train.global_batch_tokens=64",
            "train.micro_batch=2",
            "data.doc_batch=4",
            "data.shuffle_buffer=8",
            "data.prefetch_factor=2",
            f"data.num_workers={workers}",
            *overrides,
        ],
    )


def take(loader, n):
    it = iter(loader)
    return [next(it) for _ in range(n)]


def consume(dm, n):
    """What the trainer does: fetch one batch ahead, pass each used batch through the hook."""
    it = iter(dm.train_dataloader())
    used, ahead = [], next(it)
    for _ in range(n):
        batch, ahead = ahead, next(it)
        dm.on_before_batch_transfer(batch, 0)
        used.append(batch)
    del it
    gc.collect()  # shut persistent workers down now (the row-group test counts their reads)
    return used


def through_file(state):
    """As the Lightning checkpoint stores it: torch.save, then a weights_only load."""
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


def same(a, b):
    assert len(a) == len(b)
    for i, ((x, y), (xr, yr)) in enumerate(zip(a, b)):
        assert torch.equal(x, xr) and torch.equal(y, yr), f"batch {i} differs"


def on_rank(dm, rank, world):
    """A data module that sees itself on `rank` of `world` (as under a DDP trainer)."""
    dm.trainer = SimpleNamespace(global_rank=rank, world_size=world, training=True, sanity_checking=False)
    return dm


@pytest.mark.parametrize("workers", [0, 1, 2])
@pytest.mark.slow
def test_resume_gives_the_uninterrupted_batches(parquet, workers):
    cfg = cfg_for(parquet, workers)
    full = take(TokenStreamDataModule(cfg).train_dataloader(), 110)
    dm = TokenStreamDataModule(cfg)
    same(consume(dm, 80), full[:80])  # past the first epoch of every reader
    state = through_file(dm.state_dict())
    assert state["format"] == 2 and state["rank_batches"] == 80
    assert sorted(state["readers"]) == list(range(max(1, workers)))
    assert all(s["position"]["epoch"] == 1 for s in state["readers"].values())
    assert all(s["shuffle"]["windows"].shape == (8, 33) for s in state["readers"].values())
    again = TokenStreamDataModule(cfg)
    again.load_state_dict(state)
    same(consume(again, 12), full[80:92])
    twice = TokenStreamDataModule(cfg)  # a resumed run checkpoints and resumes again
    twice.load_state_dict(through_file(again.state_dict()))
    same(take(twice.train_dataloader(), 18), full[92:110])


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.slow
def test_two_ranks_resume_their_own_readers(parquet, workers):
    cfg = cfg_for(parquet, workers)
    full = [take(on_rank(TokenStreamDataModule(cfg), r, 2).train_dataloader(), 30) for r in range(2)]
    assert not torch.equal(full[0][0][0], full[1][0][0])
    ranks = [on_rank(TokenStreamDataModule(cfg), r, 2) for r in range(2)]
    for r, dm in enumerate(ranks):
        same(consume(dm, 21), full[r][:21])
    # Lightning calls state_dict on every rank and pools the readers (all_gather); rank 0 writes
    parts = [dm.state_dict() for dm in ranks]
    n = max(1, workers)
    assert [sorted(p["readers"]) for p in parts] == [list(range(n)), list(range(n, 2 * n))]
    state = through_file({**parts[0], "readers": {**parts[0]["readers"], **parts[1]["readers"]}})
    for r in range(2):
        resumed = on_rank(TokenStreamDataModule(cfg), r, 2)
        resumed.load_state_dict(state)
        same(take(resumed.train_dataloader(), 9), full[r][21:])


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.slow
def test_resume_reads_at_most_one_row_group_per_reader(parquet, tmp_path, monkeypatch, workers):
    """Count the parquet row groups the resumed readers read (datasets' parquet builder, also in
    the forked DataLoader workers): before the one it stands in, none; that one, once."""
    reads = tmp_path / "row_groups_read.txt"
    builder = importlib.import_module("datasets.packaged_modules.parquet.parquet").Parquet
    generate = builder._generate_tables

    def counted(self, files, row_groups_list):
        for key, table in generate(self, files, row_groups_list):
            if row_groups_list[0] is not None:  # (None: a whole file, as the held-out set reads)
                with open(reads, "a") as f:
                    f.write(f"{row_groups_list[0][0]}\n")
            yield key, table

    monkeypatch.setattr(builder, "_generate_tables", counted)

    def read_since(start):
        reads.write_text("")
        start()
        return [int(g) for g in reads.read_text().split()]

    cfg = cfg_for(parquet, workers, "data.shuffle=false")  # reader r's row groups: r, r+n, ...
    n = max(1, workers)
    dm = TokenStreamDataModule(cfg)
    full = take(dm.train_dataloader(), 21)
    consume(dm, 20)
    state = through_file(dm.state_dict())
    here = {r: r + n * s["position"]["unit"] for r, s in state["readers"].items()}
    assert all(s["position"]["epoch"] == 0 for s in state["readers"].values())
    assert all(g >= 2 * n for g in here.values())  # each reader is past >= 2 whole row groups

    def first_batch(st):
        resumed = TokenStreamDataModule(cfg)
        resumed.load_state_dict(st)
        batch = take(resumed.train_dataloader(), 1)
        gc.collect()
        return batch

    got = []
    reread = read_since(lambda: got.extend(first_batch(state)))
    same(got, full[20:])
    for r, g in here.items():  # anything later is new data an uninterrupted run reads too
        assert [x for x in reread if x % n == r and x <= g] == [g]
    # the old way (format 1: no reader states) re-reads every row group up to the same place
    old = {k: v for k, v in state.items() if k != "readers"} | {"format": 1}
    reread = read_since(lambda: first_batch(old))
    for r, g in here.items():
        assert [x for x in reread if x % n == r and x <= g] == list(range(r, g + 1, n))


def test_changed_layout_and_foreign_formats(parquet, caplog):
    cfg = cfg_for(parquet, 2)
    dm = TokenStreamDataModule(cfg)
    consume(dm, 10)
    state = through_file(dm.state_dict())
    one = TokenStreamDataModule(cfg_for(parquet, 1))
    with caplog.at_level(logging.WARNING, logger="prism.data.module"):
        one.load_state_dict(state)
    assert "1 x 1 x 2 instead of 1 x 2 x 2" in caplog.text and "re-reading" in caplog.text
    assert len(take(one.train_dataloader(), 2)) == 2
    with pytest.raises(DataError, match=r"data state format 3 is not one of \(1, 2\)"):
        TokenStreamDataModule(cfg).load_state_dict({**state, "format": 3})


def test_lightning_checkpoint_resume_of_a_local_stream_with_workers(parquet, tmp_path):
    cfg = cfg_for(parquet, 2)
    full, first, resumed, state = stream_resume_through_lightning(
        tmp_path, lambda: TokenStreamDataModule(cfg), steps=9, stop=5, val_every=3, val_batches=1
    )
    assert state["rank_batches"] == 5 and sorted(state["readers"]) == [0, 1]
    same([(x, x) for x in first + resumed], [(x, x) for x in full])


_DDP_SCRIPT = """
import glob, json, sys
import lightning as L, torch
from prism.config.schema import load_config
from prism.data import TokenStreamDataModule

class Record(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(50257, 4)
        self.seen = []
    def training_step(self, batch, _):
        self.seen.append(batch[0].tolist())
        return self.emb(batch[0]).mean()
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.0)

mode, data = sys.argv[1], sys.argv[2]
cfg = load_config("tiny", ["data.source=local", f"data.path={data}", "model.seq_len=32",
                           "data.val_tokens=64", "train.global_batch_tokens=64", "train.micro_batch=2",
                           "data.doc_batch=4", "data.shuffle_buffer=8", "data.prefetch_factor=2",
                           "data.num_workers=2"])
save = [L.pytorch.callbacks.ModelCheckpoint(dirpath="ck", every_n_train_steps=5, save_top_k=-1)]
model = Record()
trainer = L.Trainer(max_steps=5 if mode == "first" else 12, accelerator="cpu", devices=2, strategy="ddp",
                    logger=False, enable_progress_bar=False, enable_model_summary=False,
                    limit_val_batches=0, enable_checkpointing=mode == "first",
                    callbacks=save if mode == "first" else [])
ckpt = glob.glob("ck/*step=5*.ckpt")[0] if mode == "resume" else None
trainer.fit(model, datamodule=TokenStreamDataModule(cfg), ckpt_path=ckpt)
with open(f"{mode}.{trainer.global_rank}.json", "w") as f:
    json.dump(model.seen, f)
"""


@pytest.mark.slow
def test_real_ddp_resume_pools_every_ranks_readers(parquet, tmp_path):
    """Two gloo DDP processes x 2 workers: state_dict gathers the 4 readers' states into rank
    0's checkpoint, and each rank resumes its own readers exactly."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    script = tmp_path / "run.py"
    script.write_text(_DDP_SCRIPT)
    # one OpenMP thread per process: 2 runs x 2 ranks x 2 workers share 2 cores
    src = str(Path(__file__).resolve().parents[1] / "src")
    env = {**os.environ, "PYTHONPATH": src, "OMP_NUM_THREADS": "1"}

    def run(*modes):  # side by side; each records what it saw
        procs = [
            subprocess.Popen(
                [sys.executable, str(script), mode, str(parquet)],
                env=env,
                cwd=tmp_path,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for mode in modes
        ]
        for mode, done in zip(modes, side_by_side(*procs, timeout=480)):
            assert done.returncode == 0, (mode, done.stderr[-3000:])

    run("full", "first")  # independent: the uninterrupted run, and the one checkpointed at step 5
    run("resume")
    state = torch.load(next(tmp_path.glob("ck/*step=5*.ckpt")), weights_only=True)["TokenStreamDataModule"]
    assert sorted(state["readers"]) == [0, 1, 2, 3] and state["rank_batches"] == 5
    seen = {
        m: [json.loads((tmp_path / f"{m}.{r}.json").read_text()) for r in range(2)]
        for m in ("full", "first", "resume")
    }
    for r in range(2):
        assert len(seen["first"][r]) == 5 and seen["first"][r] + seen["resume"][r] == seen["full"][r]
    assert seen["full"][0][0] != seen["full"][1][0]
