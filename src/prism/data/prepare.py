"""Tokenize FineWeb (hub or local files) once into uint16 `.bin` shards for the `shards` source:
the held-out windows, the remaining documents in stream order and a manifest.json that lets a
killed run resume after its last finished shard (docs/data.md, "Preparing shards")."""

from __future__ import annotations

import json
import multiprocessing as mp
import signal
import sys
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import numpy as np

from prism.config.schema import DataSection, load_config
from prism.data import shards as shard_io
from prism.data.errors import DataError
from prism.data.heldout import n_val_windows, split_heldout
from prism.data.sources import source_for
from prism.data.text import fingerprint, iter_text_batches
from prism.data.tokenizer import EOT_TOKEN, GPT2Tokenizer
from prism.io import atomic_write_json

MANIFEST = "manifest.json"
FORMAT = 1


def _ignore_interrupts() -> None:
    # Ctrl-C is left to the parent, which keeps the finished shards; SIGTERM, how the pool ends
    # its workers, must not keep a parent's handler that only records it (training's, say).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _encode(texts: list[str]) -> np.ndarray:
    # module level so a process pool can pickle it; the BPE tables are cached by gpt2_encoding
    return GPT2Tokenizer().encode_documents(texts)


@dataclass
class PrepareOptions:
    """What to tokenize and where (reproduce/prepare_fineweb.py's flags; the data.* and
    model.seq_len ones are the config's keys, checked by its rules: options_for)."""

    source: str  # hub | local
    out: str  # output folder (resumed if it holds a matching manifest)
    path: str | None  # local file(s)/folder (parquet, jsonl, txt) with a text column
    hub_name: str
    subset: str
    revision: str
    seq_len: int  # model.seq_len the val set is cut for
    val_tokens: int
    doc_batch: int
    max_tokens: int | None = None  # stop after this many training tokens
    workers: int = field(default_factory=lambda: max(1, (mp.cpu_count() or 2) - 1))  # tokenizer processes
    shard_tokens: int = 100_000_000  # tokens per train shard

    def __post_init__(self) -> None:
        if self.source == "local" and not self.path:
            raise DataError("--source local needs --path, the file(s) or folder to read.")


def options_for(scale: str | None = None, overrides=(), **given) -> PrepareOptions:
    """The options of a prepare run: each one given (not None), the rest from the config of
    `scale` (124m's without one) and `overrides`, as that scale's runs will read the data."""
    cfg = load_config(scale or "124m", list(overrides))
    d = cfg.data  # the held-out windows' settings and what is read
    keys = dict(path=d.path, hub_name=d.hub_name, subset=d.subset, revision=d.revision, doc_batch=d.doc_batch)
    runs = dict(keys, val_tokens=d.val_tokens, seq_len=cfg.model.seq_len)
    return PrepareOptions(**{**runs, **{name: value for name, value in given.items() if value is not None}})


def _settings(args) -> dict:
    settings = {
        "format": FORMAT,
        "source": args.source,
        "path": args.path if args.source == "local" else None,
        "hub_name": args.hub_name if args.source == "hub" else None,
        "subset": args.subset if args.source == "hub" else None,
        "seq_len": args.seq_len,
        "val_tokens": args.val_tokens,
        "shard_tokens": args.shard_tokens,
        "tokenizer": "gpt2",
        "eot": EOT_TOKEN,
    }
    if args.source == "hub":
        settings["revision"] = args.revision
    return settings


def _load_manifest(out: Path, settings: dict) -> dict | None:
    path = out / MANIFEST
    if not path.exists():
        return None
    try:
        man = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise DataError(
            f"--out {out} holds a {MANIFEST} that cannot be read ({type(exc).__name__}: {exc}); "
            "use a new --out folder or delete that one."
        ) from None
    if not isinstance(man, dict) or not isinstance(man.get("settings"), dict):
        raise DataError(
            f"--out {out} holds a {MANIFEST} that is not prepare_fineweb.py's; use a new --out "
            "folder or delete that one."
        )
    if man.get("settings") != settings:
        diff = sorted(k for k in settings if man["settings"].get(k) != settings[k])
        raise DataError(
            f"--out {out} holds shards prepared with other settings ({', '.join(diff)}); "
            "use a new --out folder or delete that one."
        )
    return man


def prepare(args: PrepareOptions, console=None) -> dict:
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    console = console or Console(stderr=True)
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise DataError(f"--out {str(out)!r} is a file; give a folder for the shards.")
    settings = _settings(args)
    keys = ("source", "path", "hub_name", "subset", "revision", "val_tokens", "doc_batch")
    data = DataSection(**{k: getattr(args, k) for k in keys})
    window = args.seq_len + 1
    man = _load_manifest(out, settings)
    if man and (man.get("exhausted") or (args.max_tokens and man["train_tokens"] >= args.max_tokens)):
        console.print(f"[green]{out} is already complete[/] ({man['train_tokens']:,} train tokens).")
        return man
    source = source_for(data)
    where = source.where() if args.source == "hub" else f"--path {args.path!r}"
    ds = source.open_documents()
    on_error = partial(source.read_error, who=where)

    def batches(ds):
        return iter_text_batches(ds, args.doc_batch, data.stall_timeout_s, where, on_error=on_error)

    if man is None:  # first run: the held-out set, exactly as the streaming sources define it
        console.print(f"Holding out {args.val_tokens:,} validation tokens from {where} ...")
        held, rest = split_heldout(
            batches(ds), n_val_windows(args.val_tokens, args.seq_len), window, where, what="--val-tokens"
        )
        rest.close()
        out.mkdir(parents=True, exist_ok=True)  # only now: bad input leaves nothing behind
        name = "fineweb_val_000000.bin"
        shard_io.write_shard(out / name, held.windows.ravel())
        man = {
            "settings": settings,
            "val_docs": held.n_docs,
            "val_windows": int(len(held.windows)),
            "val_fingerprints": sorted(f.hex() for f in held.fingerprints),
            "shards": [{"name": name, "split": "val", "tokens": int(held.windows.size)}],
            "docs_done": held.n_docs,
            "train_tokens": 0,
            "complete": False,
            "exhausted": False,
        }
        atomic_write_json(out / MANIFEST, man)
    for stale in out.glob("*.tmp"):  # a shard that was being written when the last run died
        stale.unlink()
    skip_fps = {bytes.fromhex(h) for h in man["val_fingerprints"]}
    ds = ds.skip(man["docs_done"])  # exact: the stream is neither split nor shuffled here
    n_train = sum(s["split"] == "train" for s in man["shards"])
    buf, buf_tokens, buf_docs = [], 0, 0
    limit = args.max_tokens

    def flush() -> None:
        nonlocal buf, buf_tokens, buf_docs, n_train
        n_train += 1
        name = f"fineweb_train_{n_train:06d}.bin"
        shard_io.write_shard(out / name, np.concatenate(buf))
        man["shards"].append({"name": name, "split": "train", "tokens": buf_tokens, "docs": buf_docs})
        man["docs_done"] += buf_docs
        man["train_tokens"] += buf_tokens
        atomic_write_json(out / MANIFEST, man)
        buf, buf_tokens, buf_docs = [], 0, 0

    columns = [
        TextColumn("[bold]tokenizing"),
        BarColumn(),
        TextColumn("{task.completed:,.0f} tokens"),
        TextColumn("{task.fields[rate]}"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
    ]
    start = time.perf_counter()
    done_before = man["train_tokens"]
    exhausted = True
    ctx = mp.get_context("spawn" if sys.platform == "darwin" else "fork")
    pool = ctx.Pool(args.workers, initializer=_ignore_interrupts)
    with Progress(*columns, console=console) as progress, pool:
        task = progress.add_task("train", total=limit, completed=done_before, rate="")
        meta = []  # documents in each batch, in the order pool.imap returns results

        def texts_only():
            for texts in batches(ds):
                meta.append(len(texts))
                yield [t for t in texts if fingerprint(t) not in skip_fps]

        for k, tokens in enumerate(pool.imap(_encode, texts_only(), chunksize=1)):
            buf.append(tokens)
            buf_tokens += len(tokens)
            buf_docs += meta[k]
            total = man["train_tokens"] + buf_tokens
            rate = (total - done_before) / max(time.perf_counter() - start, 1e-9)
            progress.update(task, completed=total, rate=f"{rate / 1e6:.2f} M tok/s")
            if buf_tokens >= args.shard_tokens:
                flush()
            if limit is not None and total >= limit:
                exhausted = False
                break
    if buf_tokens:
        flush()
    if n_train == 0:
        raise DataError(f"{where} has no documents left for training after the validation set.")
    man["complete"] = True  # usable as a shards source; a larger --max-tokens extends it
    man["exhausted"] = exhausted
    man["stopped_by"] = "data exhausted" if exhausted else f"--max-tokens {limit}"
    atomic_write_json(out / MANIFEST, man)
    console.print(
        f"[green]wrote[/] {n_train} train shard(s), {man['train_tokens']:,} train tokens and "
        f"{man['val_windows']} val windows to {out}"
    )
    return man
