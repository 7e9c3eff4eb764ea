"""Bad data files get one sentence that names the file and what is wrong with it: empty,
corrupt, truncated or unreadable local files (train.py and prepare_fineweb.py, exit 2, nothing
written), a bad file met mid-stream by a DataLoader worker, and broken token shards."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import load_script, shared_data_dir

from prism.config.schema import load_config
from prism.data import DataError, TokenStreamDataModule
from prism.data.shards import write_shard

ROOT = Path(__file__).resolve().parents[1]
prepare_main = load_script("prepare_fineweb").main
TINY = [  # the smallest run train.py accepts (tests/conftest.py's sizes)
    "model.seq_len=32",
    "train.global_batch_tokens=128",
    "train.micro_batch=2",
    "train.tokens=512",
    "data.val_tokens=256",
    "data.num_workers=0",
]


def documents(n: int = 60) -> list[str]:
    """Real prose: FineWeb-Edu documents when the shared data is here, else the offline text."""
    shared = shared_data_dir()
    path = shared / "web" / "fineweb-edu-150.jsonl" if shared else None
    if path is not None and path.is_file():
        return [json.loads(line)["text"] for line in path.read_text().splitlines()[:n]]
    from prism.data.sources.offline import offline_documents

    return offline_documents()[:n]


def jsonl(texts: list[str]) -> str:
    return "".join(json.dumps({"text": t}) + "\n" for t in texts)


def local_error(path, *overrides) -> str:
    cfg = load_config(
        "tiny", ["data.source=local", f"data.path={path}", "data.shuffle_buffer=0", *TINY, *overrides]
    )
    with pytest.raises(DataError) as info:
        dm = TokenStreamDataModule(cfg)
        dm.setup()
        it = iter(dm.train_dataloader())
        for _ in range(200):
            next(it)
    message = str(info.value)
    assert "\n" not in message and "Traceback" not in message
    return message


@pytest.mark.slow
def test_train_and_prepare_name_an_empty_and_a_corrupt_file_and_write_nothing(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"")
    corrupt = tmp_path / "web.jsonl.gz"
    corrupt.write_bytes(np.random.default_rng(0).bytes(4096))
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
    procs = {  # both at once: the cost is two interpreter starts, not two in a row
        path: subprocess.Popen(
            [
                sys.executable,
                str(ROOT / "reproduce" / "train.py"),
                "--scale",
                "tiny",
                f"runs_dir={tmp_path / ('runs-' + path.name)}",
                "data.source=local",
                f"data.path={path}",
                *TINY,
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for path in (empty, corrupt)
    }
    what = {empty: "is empty (0 bytes)", corrupt: "is not gzip data although its name ends in .gz"}
    for path, proc in procs.items():
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 2, err
        assert err.strip().splitlines()[-1].startswith(f"error: data file {path} {what[path]}"), err
        assert "Traceback" not in err and "StopIteration" not in err and "zlib" not in err
        assert not (tmp_path / f"runs-{path.name}").exists()  # refused before any folder was made

    for path in (empty, corrupt):
        out = tmp_path / f"shards-{path.name}"
        code = prepare_main(["--source", "local", "--path", str(path), "--out", str(out), "--workers", "1"])
        assert code == 2 and not out.exists()


def test_prepare_names_a_file_that_breaks_mid_stream_and_keeps_no_half_shard(tmp_path, capsys):
    docs = documents()
    folder = tmp_path / "web"
    folder.mkdir()
    (folder / "a.jsonl").write_text(jsonl(docs))
    raw = gzip.compress(jsonl(docs).encode())
    (folder / "b.jsonl.gz").write_bytes(raw[: len(raw) // 2])  # a download cut short
    out = tmp_path / "shards"
    args = ["--source", "local", "--path", str(folder), "--out", str(out), "--workers", "1"]
    code = prepare_main([*args, "--seq-len", "32", "--val-tokens", "256", "--shard-tokens", "100000000"])
    err = capsys.readouterr().err
    assert code == 2
    assert f"error: data file {folder / 'b.jsonl.gz'} ends early: its compressed data is cut short" in err
    assert "--path=" in err and "data.path" not in err  # this command's own flag
    # the val shard and manifest may stand (a resumable start); no train shard, no temp file
    assert not list(out.glob("*_train_*")) and not list(out.glob("*.tmp"))


def test_each_kind_of_bad_local_file_is_named(tmp_path):
    docs = documents()
    good = jsonl(docs)
    cases = {
        "trunc.jsonl.gz": gzip.compress(good.encode())[:2000],
        "badline.jsonl": (jsonl(docs[:40]) + "{not json\n" + jsonl(docs[40:])).encode(),
        "notext.jsonl": (jsonl(docs[:40]) + '{"content": "x"}\n' + jsonl(docs[40:])).encode(),
        "first.jsonl": b'{"content": "no text field"}\n',
        "array.jsonl": b"[1, 2, 3]\n",
        "blank.jsonl": b"\n\n   \n",
        "latin1.jsonl": json.dumps({"text": "x"}).encode() + b"\n" + b'{"text": "caf\xe9"}\n' * 500,
    }
    for name, data in cases.items():
        (tmp_path / name).write_bytes(data)
    expect = {
        "trunc.jsonl.gz": "ends early: its compressed data is cut short",
        "badline.jsonl": "holds a line that is not JSON (ArrowInvalid: JSON parse error",
        "notext.jsonl": "holds a record whose 'text' is missing or null",
        "first.jsonl": "has no 'text' column (it has: content) in its first record",
        "array.jsonl": "has a first line that is a JSON list, not an object",
        "blank.jsonl": "holds no records (only blank lines)",
        "latin1.jsonl": "",  # whatever pyarrow says, the file is named
    }
    for name, what in expect.items():
        message = local_error(tmp_path / name)
        assert message.startswith(f"data file {tmp_path / name} {what}"), message
        assert message.endswith(f"point data.path='{tmp_path / name}' elsewhere."), message
    # parquet cut short, and a folder whose second file is broken (read by a DataLoader worker
    # process: its error arrives as the same sentence, not torch's wrapped traceback)
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": docs}), tmp_path / "ok.parquet")
    whole = (tmp_path / "ok.parquet").read_bytes()
    (tmp_path / "cut.parquet").write_bytes(whole[: len(whole) // 2])
    assert local_error(tmp_path / "cut.parquet").startswith(
        f"data file {tmp_path / 'cut.parquet'} is not a readable parquet file (ArrowInvalid: Parquet magic"
    )
    folder = tmp_path / "two"
    folder.mkdir()
    (folder / "a.jsonl").write_text(good)
    (folder / "b.jsonl").write_text(jsonl(docs[:30]) + "{not json\n" + jsonl(docs[30:]))
    # one document per read: the held-out set (a.jsonl's first documents) never reaches b.jsonl
    cfg = load_config(
        "tiny",
        ["data.source=local", f"data.path={folder}", *TINY, "data.num_workers=1", "data.doc_batch=1"],
    )
    dm = TokenStreamDataModule(cfg)
    dm.setup()
    with pytest.raises(DataError) as info:
        for _ in zip(range(10_000), dm.train_dataloader()):
            pass
    assert str(info.value) == (
        f"data file {folder / 'b.jsonl'} holds a line that is not JSON (ArrowInvalid: JSON parse "
        f"error: Missing a name for object member.); fix or remove it, or point data.path='{folder}' "
        "elsewhere."
    )
    (tmp_path / "holes").mkdir()
    (tmp_path / "holes" / "a.jsonl").write_text(good)
    (tmp_path / "holes" / "b.jsonl").write_bytes(b"")
    assert local_error(tmp_path / "holes").startswith(f"data file {tmp_path / 'holes' / 'b.jsonl'} is empty")


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads a file whatever its mode")
def test_an_unreadable_file_is_named(tmp_path):
    path = tmp_path / "locked.jsonl"
    path.write_text(jsonl(documents()))
    path.chmod(0)
    assert local_error(path) == (
        f"data file {path} cannot be read (Permission denied); fix or remove it, or point "
        f"data.path='{path}' elsewhere."
    )


@pytest.mark.slow
def test_broken_shards_and_manifest_are_named(tmp_path):
    rng = np.random.default_rng(0)
    write_shard(tmp_path / "fw_val_000000.bin", rng.integers(0, 50000, 4096, dtype=np.uint16))
    write_shard(tmp_path / "fw_train_000001.bin", rng.integers(0, 50000, 4096, dtype=np.uint16))

    def error() -> str:
        cfg = load_config("tiny", ["data.source=shards", f"data.path={tmp_path}", *TINY])
        with pytest.raises(DataError) as info:
            TokenStreamDataModule(cfg).setup()
        return str(info.value)

    train = tmp_path / "fw_train_000001.bin"
    train.write_bytes(train.read_bytes()[:5000])  # cut short
    assert error().startswith(f"shard {train} declares 4096 tokens (9216 bytes) but the file is 5000 bytes")
    train.write_bytes(b"")
    assert error().startswith(f"shard {train} is 0 bytes, shorter than the 1024-byte header")
    write_shard(train, rng.integers(0, 50000, 4096, dtype=np.uint16))
    (tmp_path / "manifest.json").write_text('{"settings": ')
    assert error().startswith(f"{tmp_path / 'manifest.json'} cannot be read (JSONDecodeError")


def test_a_file_the_error_names_is_not_read_again_and_a_lookup_out_of_time_says_so(tmp_path):
    """Finding the bad file mid-stream, cheapest first: a failure of the machine names no file and
    reads nothing again; the one file the exception names is that file; otherwise the files are
    read again one by one, within a budget, and past it the sentence says the file is not known."""
    import errno

    from prism.data.sources import source_for

    docs = documents()
    folder = tmp_path / "web"
    folder.mkdir()
    for name in ("a.jsonl", "b.jsonl"):
        (folder / name).write_text(jsonl(docs))
    (folder / "c.jsonl").write_text(jsonl(docs[:30]) + "{not json\n" + jsonl(docs[30:]))

    def source(*overrides):
        cfg = load_config("tiny", ["data.source=local", f"data.path={folder}", *TINY, *overrides])
        return source_for(cfg.data)

    def failure(src) -> BaseException:  # what datasets itself raises at the bad file
        with pytest.raises(Exception) as info:
            for _ in src.open_documents().iter(batch_size=8):
                pass
        assert not isinstance(info.value, DataError)
        return info.value

    who = "data reader 0 of 1"
    named = f"data file {folder / 'c.jsonl'} holds a line that is not JSON (ArrowInvalid: JSON parse error"
    # no file named: the files are read again, a, b, then c, which fails as the stream did
    roomy = source()
    assert roomy.read_error(failure(roomy), who).args[0].startswith(named)
    # a budget of ~0 (a quarter of data.stall_timeout_s): the re-reads stop at once
    hurried = source("data.stall_timeout_s=1e-6")
    exc = failure(hurried)
    assert hurried.read_error(exc, who).args[0] == (
        f"reading {who} failed: {type(exc).__name__}: {str(exc).splitlines()[0].rstrip('.')}; which "
        "of its 3 files this came from could not be pinned down within 0 s of reading them again "
        "one by one; point data.path at fewer files to find it."
    )
    # the exception names a file (b.jsonl removed while the stream read a.jsonl): that file, with
    # no time to read anything again
    ds = hurried.open_documents().iter(batch_size=8)
    next(ds)
    (folder / "b.jsonl").unlink()
    with pytest.raises(FileNotFoundError) as info:
        for _ in ds:
            pass
    assert hurried.read_error(info.value, who).args[0] == (
        f"data file {folder / 'b.jsonl'} is gone: it was removed or moved while the data was being "
        f"read; fix or remove it, or point data.path='{folder}' elsewhere."
    )
    # a failure of the machine names no file, even one it mentions, and reads nothing again
    (folder / "b.jsonl").write_text(jsonl(docs))
    for machine in (
        OSError(errno.EMFILE, "Too many open files", str(folder / "c.jsonl")),
        MemoryError(),
    ):
        said = roomy.read_error(machine, who).args[0]
        assert said.startswith(f"reading {who} failed: {type(machine).__name__}") and "data file" not in said


def test_finding_the_bad_file_cannot_count_as_a_stall():
    """The reader's failure is handed over before the file is looked for: a lookup longer than
    data.stall_timeout_s ends with its sentence, never as a stalled stream (exit 75, a requeue)."""
    import time

    from prism.data.text import iter_text_batches

    class Broken:  # fails at once, as a stream meeting a bad file does
        def iter(self, batch_size):
            raise ValueError("JSON parse error")
            yield

    def slow_lookup(exc):
        time.sleep(1.0)  # five stall timeouts
        return DataError(f"data file x.jsonl is bad ({exc})")

    with pytest.raises(DataError) as info:
        next(iter_text_batches(Broken(), 8, 0.2, "data reader 0 of 1", on_error=slow_lookup))
    assert str(info.value) == "data file x.jsonl is bad (JSON parse error)"
