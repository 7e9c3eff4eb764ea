"""The streaming sources (local files through `datasets`, the same path the hub uses) on real
FineWeb / FineWeb-Edu / C4 text, prepare_fineweb.py round trips, and bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import load_script, prepare_options
from torch.utils.data import DataLoader

from prism.config.schema import load_config
from prism.data import DataError, GPT2Tokenizer, TokenStreamDataModule, heldout_windows
from prism.data.shards import open_shard
from prism.data.sources import source_for
from prism.data.sources.hub import open_with_backoff
from prism.data.streams import DocumentStream, StreamPosition
from prism.data.text import fingerprint, iter_text_batches

prepare_main = load_script("prepare_fineweb").main  # reproduce/prepare_fineweb.py's

ROOT = Path(__file__).resolve().parents[1]
SHARED = os.environ.get("PRISM_SHARED_DATA")
WEB = Path(SHARED) / "web" if SHARED else None
needs_web = pytest.mark.skipif(
    not (WEB and WEB.is_dir()), reason="PRISM_SHARED_DATA is unset or has no web/ folder"
)


def local_cfg(path, *overrides):
    return load_config(
        "tiny",
        [
            "data.source=local",
            f"data.path={path}",
            "data.val_tokens=2048",
            "data.shuffle_buffer=0",
            *overrides,
        ],
    )


def take(ds, n):
    it = iter(ds)
    return [next(it) for _ in range(n)]


def texts_of(path):
    if str(path).endswith(".parquet"):
        import pyarrow.parquet as pq

        return pq.read_table(path, columns=["text"]).column("text").to_pylist()
    return [json.loads(line)["text"] for line in Path(path).read_text().splitlines() if line.strip()]


@needs_web
@pytest.mark.parametrize("name", ["fineweb-100.parquet", "fineweb-edu-150.jsonl", "c4-sample.jsonl"])
def test_local_source_packs_real_text_in_file_order(name):
    path = WEB / name
    cfg = local_cfg(path, "data.shuffle=false")
    dm = TokenStreamDataModule(cfg)
    docs = texts_of(path)
    stream = GPT2Tokenizer().encode_documents(docs)
    held = heldout_windows(cfg, dm.heldout.windows.shape[0])
    window = cfg.model.seq_len + 1
    assert held.flatten().tolist() == stream[: held.numel()].tolist()  # leading documents
    # training continues with the documents after the held-out ones, EOT-joined and packed
    train = GPT2Tokenizer().encode_documents(docs[dm.heldout.n_docs :])
    batches = take(dm.train_dataset(0, 1), 3)
    flat = torch.cat([torch.cat([x, y[:, -1:]], 1) for x, y in batches]).flatten()
    assert flat.tolist() == train[: len(flat)].tolist()
    assert all(x.shape == (cfg.train.micro_batch, window - 1) for x, _ in batches)


@needs_web
def test_local_streams_over_two_ranks_and_two_workers_are_disjoint_and_complete(tmp_path):
    # four files so that whole files go to readers, and one file split example by example
    docs = texts_of(WEB / "fineweb-edu-150.jsonl")
    folder = tmp_path / "web"
    folder.mkdir()
    for k in range(4):
        (folder / f"part{k}.jsonl").write_text(
            "".join(json.dumps({"text": t, "id": i}) + "\n" for i, t in enumerate(docs[k::4]))
        )
    for path in (folder, WEB / "fineweb-edu-150.jsonl"):
        cfg = local_cfg(path, "data.num_workers=2")
        dm = TokenStreamDataModule(cfg)
        held = dm.heldout.fingerprints
        seen = []
        for reader in range(4):  # rank r, worker w -> reader 2r + w of 4
            ds = dm.source.reader_documents(reader, 4)
            ds.set_epoch(0)
            seen.append([t for batch in iter_text_batches(ds, 64, 60, "test") for t in batch])
        all_seen = [fingerprint(t) for part in seen for t in part]
        assert len(all_seen) == len(set(all_seen)) == len(docs)  # disjoint, each document once
        assert set(all_seen) == {fingerprint(t) for t in docs}
        # and through real DataLoader workers, the two ranks' windows never coincide
        ranks = [
            {
                tuple(x[i].tolist())
                for x, _ in take(
                    DataLoader(
                        DocumentStream(StreamPosition(r, 2, 2), dm.source, cfg.model.seq_len, held),
                        batch_size=None,
                        num_workers=2,
                    ),
                    4,
                )
                for i in range(len(x))
            }
            for r in range(2)
        ]
        assert len(ranks[0]) == len(ranks[1]) == 8 and not ranks[0] & ranks[1]


@needs_web
def test_local_resume_with_workers_gives_the_next_batches():
    cfg = local_cfg(WEB / "fineweb-edu-150.jsonl", "data.num_workers=2", "data.shuffle_buffer=64")
    full = take(TokenStreamDataModule(cfg).train_dataloader(), 12)
    dm = TokenStreamDataModule(cfg)
    for b in take(dm.train_dataloader(), 5):
        dm.on_before_batch_transfer(b, 0)
    again = TokenStreamDataModule(cfg)
    again.load_state_dict(dm.state_dict())
    for (x, y), (xr, yr) in zip(full[5:], take(again.train_dataloader(), 7)):
        assert torch.equal(x, xr) and torch.equal(y, yr)


@needs_web
def test_prepared_shards_equal_the_direct_stream_and_resume(tmp_path, capsys):
    src = WEB / "fineweb-100.parquet"
    out = tmp_path / "shards"
    args = [
        "--source",
        "local",
        "--path",
        str(src),
        "--out",
        str(out),
        "--seq-len",
        "256",
        "--val-tokens",
        "2048",
        "--shard-tokens",
        "30000",
        "--doc-batch",
        "8",
        "--workers",
        "2",
    ]
    assert prepare_main(args + ["--max-tokens", "60000"]) == 0
    first = json.loads((out / "manifest.json").read_text())
    assert first["complete"] and first["train_tokens"] >= 60000
    (out / "fineweb_train_000003.bin.tmp").write_bytes(b"half a shard from a killed run")
    assert prepare_main(args) == 0  # resumes after the finished shards, to the end of the data
    man = json.loads((out / "manifest.json").read_text())
    assert man["shards"][: len(first["shards"])] == first["shards"]
    assert man["docs_done"] == 100 and not list(out.glob("*.tmp"))

    local = local_cfg(src, "data.shuffle=false")
    dm = TokenStreamDataModule(local)
    train = np.concatenate([open_shard(out / s["name"]) for s in man["shards"] if s["split"] == "train"])
    direct = GPT2Tokenizer().encode_documents(texts_of(src)[dm.heldout.n_docs :])
    assert man["train_tokens"] == len(train) and train.tolist() == direct.tolist()
    shards = TokenStreamDataModule(
        load_config("tiny", ["data.source=shards", f"data.path={out}", "data.val_tokens=2048"])
    )
    assert torch.equal(heldout_windows(shards.cfg, 8), heldout_windows(local, 8))
    x, y = take(shards.train_dataset(0, 1), 1)[0]
    assert x.shape == (8, 256) and torch.equal(x[:, 1:], y[:, :-1])
    # different settings into the same folder are refused, not mixed
    assert prepare_main(args[:-6] + ["--val-tokens", "4096", "--shard-tokens", "30000"]) == 2
    assert "other settings (val_tokens)" in capsys.readouterr().err


@needs_web
def test_prepare_with_a_scale_cuts_the_held_out_set_that_scale_s_runs_use(tmp_path, capsys):
    src = WEB / "fineweb-100.parquet"
    args = ["--source", "local", "--path", str(src), "--workers", "1"]
    # without --scale the held-out set is 124m's (10M tokens in 1,025-token windows): refused here
    assert prepare_main([*args, "--out", str(tmp_path / "default")]) == 2
    assert "fewer than the 10496000 that --val-tokens needs" in capsys.readouterr().err
    out = tmp_path / "tiny"
    assert prepare_main([*args, "--scale", "tiny", "--out", str(out)]) == 0
    settings = json.loads((out / "manifest.json").read_text())["settings"]
    tiny = load_config("tiny")
    assert (settings["seq_len"], settings["val_tokens"]) == (tiny.model.seq_len, tiny.data.val_tokens)
    assert (settings["seq_len"], settings["val_tokens"]) == (256, 8192)
    # a tiny run reads the folder with its own settings, and holds out the windows `local` would
    shards = load_config("tiny", ["data.source=shards", f"data.path={out}"])
    local = local_cfg(src, "data.shuffle=false", "data.val_tokens=8192")
    assert torch.equal(heldout_windows(shards, 32), heldout_windows(local, 32))
    # a flag given explicitly wins over the scale's value; the hub subset follows the scale
    options = prepare_options([*args, "--scale", "tiny", "--seq-len", "128", "--out", "x"])
    assert (options.seq_len, options.val_tokens) == (128, 8192)
    assert prepare_options(["--source", "hub", "--scale", "354m", "--out", "x"]).subset == "sample-100BT"
    assert prepare_options(["--source", "hub", "--out", "x"]).subset == "sample-10BT"


def test_local_bad_input_stops_with_one_sentence(tmp_path):
    def error(path, *overrides):
        with pytest.raises(DataError) as info:
            TokenStreamDataModule(local_cfg(path, *overrides)).setup()
        assert "\n" not in str(info.value)
        return str(info.value)

    assert "does not exist" in error(tmp_path / "nope.parquet")
    (tmp_path / "empty").mkdir()
    assert "holds no .parquet" in error(tmp_path / "empty")
    bad = tmp_path / "no_text.jsonl"
    bad.write_text('{"content": "hello", "id": 1}\n')
    assert "has no 'text' column (it has: content, id)" in error(bad)
    small = tmp_path / "small.jsonl"
    small.write_text("".join(json.dumps({"text": f"document number {i} is short."}) + "\n" for i in range(5)))
    assert "fewer than one window of model.seq_len+1=257" in error(small)
    assert "fewer than the" in error(
        small, "model.seq_len=8", "data.val_tokens=4000", "train.global_batch_tokens=64"
    )
    (tmp_path / "mixed").mkdir()
    (tmp_path / "mixed" / "a.jsonl").write_text(small.read_text())
    (tmp_path / "mixed" / "b.txt").write_text("text")
    assert "mixes file types" in error(tmp_path / "mixed")
    assert (
        prepare_main(["--source", "local", "--path", str(tmp_path / "nope"), "--out", str(tmp_path / "o")])
        == 2
    )
    assert not (tmp_path / "o").exists()
    assert prepare_main(["--source", "local", "--path", str(small), "--out", str(tmp_path / "o")]) == 2
    assert not (tmp_path / "o").exists()  # too little data for the val set: nothing written


def test_txt_files_are_one_document_each(tmp_path):
    for k in range(3):
        (tmp_path / f"doc{k}.txt").write_text(f"Line one of file {k}.\nLine two of file {k}.\n" * 40)
    cfg = local_cfg(tmp_path, "model.seq_len=32", "data.val_tokens=64", "train.global_batch_tokens=64")
    ds = source_for(cfg.data).open_documents()
    assert len(list(ds)) == 3


def test_a_stalled_source_raises_instead_of_hanging():
    class Silent:  # a stream that never delivers, as a dead hub connection would
        def iter(self, batch_size):
            time.sleep(30)
            yield {"text": ["late"]}

    start = time.perf_counter()
    with pytest.raises(DataError, match="no data arrived from the hub for 1 s"):
        next(iter_text_batches(Silent(), 8, 1.0, "the hub"))
    assert time.perf_counter() - start < 10


def test_hub_without_network_fails_fast_with_a_clear_error(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    import datasets.config

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True, raising=False)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_OFFLINE", True, raising=False)
    for name in ("STREAMING_READ_MAX_RETRIES", "STREAMING_OPEN_MAX_RETRIES"):
        monkeypatch.setattr(datasets.config, name, getattr(datasets.config, name))
    cfg = load_config("124m", ["data.source=hub", "data.hub_retries=77"])
    with pytest.raises(
        DataError,
        match=r"cannot open HuggingFaceFW/fineweb/sample-10BT@cd85054 on the "
        r"Hugging Face hub after 1 attempt\(s\) .*use data.source=local or "
        "data.source=shards",
    ):  # offline mode: no retry
        heldout_windows(cfg, 1)
    assert datasets.config.STREAMING_READ_MAX_RETRIES == 77  # the long-run retry budget is applied


def test_opening_retries_transient_errors_with_growing_jittered_waits(caplog):
    """The policy itself, on real exceptions: connection errors (also as a cause) are retried
    with waits doubling from the first, each cut by a jitter factor in [0.5, 1]; anything else
    fails at once; the last failure names the attempts."""
    waits, calls = [], []

    def flaky():
        calls.append(1)
        if len(calls) < 4:
            try:
                raise ConnectionResetError("peer reset")
            except ConnectionResetError as exc:  # wrapped, as datasets wraps hub errors
                raise RuntimeError("could not list files") from exc
        return "opened"

    assert (
        open_with_backoff(
            flaky, "the hub", attempts=5, first_delay_s=2.0, max_delay_s=5.0, sleep=waits.append
        )
        == "opened"
    )
    assert len(calls) == 4 and len(waits) == 3
    for wait, cap in zip(waits, [2.0, 4.0, 5.0]):  # 2, 4, then 8 capped at 5
        assert 0.5 * cap <= wait <= cap
    assert "attempt 2 of 5" in caplog.text

    def missing():
        raise FileNotFoundError("no such dataset")

    waits.clear()
    with pytest.raises(DataError, match=r"cannot open the hub \(FileNotFoundError: no such dataset\)\.$"):
        open_with_backoff(missing, "the hub", attempts=5, first_delay_s=1.0, sleep=waits.append)
    assert waits == []

    def down():
        raise TimeoutError("timed out")

    with pytest.raises(DataError, match=r"after 3 attempt\(s\) \(TimeoutError: timed out\)"):
        open_with_backoff(down, "the hub", attempts=3, first_delay_s=1.0, sleep=waits.append)
    assert len(waits) == 2


HUB_TEST = "test_the_real_hub_client_is_retried_when_the_hub_refuses_connections"


@pytest.fixture(scope="module", autouse=True)
def refused_hub(request, tmp_path_factory):
    """The process of the test of that name, started as this module starts: it spends ~45 s in
    huggingface_hub's own waits between retries (each request is retried for ~20 s before it
    fails), which the module's other tests overlap. Yields (process, its stderr file), or None
    when that test is not selected; a process still running at the end is killed."""
    if not any(item.name == HUB_TEST for item in request.session.items):
        yield None
        return
    import socket

    tmp = tmp_path_factory.mktemp("refused_hub")
    with socket.socket() as s:  # a free port, closed again: connections to it are refused
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")}
    env.update(HF_ENDPOINT=f"http://127.0.0.1:{port}", HF_HOME=str(tmp / "hf"), PYTHONPATH=str(ROOT / "src"))
    code = (
        "from prism.config.schema import load_config\n"
        "from prism.data.sources import source_for\n"
        "cfg = load_config('tiny', ['data.source=hub', 'data.hub_open_attempts=2', "
        "'data.hub_retry_interval_s=0.1'])\n"
        "source_for(cfg.data).open_documents()\n"
    )
    err = tmp / "stderr"
    with open(err, "w") as stderr:  # a file, not a pipe: nobody reads it until the test does
        cmd = [sys.executable, "-c", code]
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=stderr)
    yield proc, err
    if proc.poll() is None:
        proc.kill()
        proc.wait()


@pytest.mark.slow  # ~45 s, started with the module (the refused_hub fixture)
def test_the_real_hub_client_is_retried_when_the_hub_refuses_connections(refused_hub):
    """datasets + huggingface_hub for real, against an endpoint that refuses connections (a
    port nothing listens on): the failure is recognised as transient and the open is retried."""
    proc, err = refused_hub
    returncode = proc.wait(timeout=300)
    stderr = err.read_text()
    assert returncode != 0
    assert "opening HuggingFaceFW/fineweb/sample-10BT@cd85054 on the Hugging Face hub failed" in stderr
    assert "attempt 2 of 2" in stderr
    last = stderr.strip().splitlines()[-1]
    assert last.startswith(
        "prism.data.errors.DataError: cannot open HuggingFaceFW/fineweb/sample-10BT"
        "@cd85054 on the Hugging Face hub after 2 attempt(s) (ConnectionError: "
    ), last
