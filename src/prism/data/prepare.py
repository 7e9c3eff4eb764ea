"""Tokenize FineWeb (hub or local files) once into uint16 `.bin` shards for the `shards` source.

Layout of --out:
  fineweb_val_000000.bin     the held-out windows (identical to what hub/local would hold out)
  fineweb_train_000001.bin…  the remaining documents in stream order, EOT before each document;
                             a shard closes at the first document boundary past --shard-tokens
  manifest.json              settings, val fingerprints, finished shards, stream position
Each shard is written to a temp file and renamed, then the manifest is rewritten (atomically), so a
killed run resumes after its last finished shard and never reads a half-written one.
"""

from __future__ import annotations

import argparse
import logging
import multiprocessing as mp
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from prism.config import DataSection
from prism.data import shards as shard_io
from prism.data.errors import DataError
from prism.data.heldout import n_val_windows, split_heldout
from prism.data.sources import fingerprint, iter_text_batches, open_text_dataset
from prism.data.tokenizer import EOT_TOKEN, GPT2Tokenizer
from prism.io import atomic_write_json
from prism.model import ModelConfig

MANIFEST = "manifest.json"
FORMAT = 1


def _encode(texts: list[str]) -> np.ndarray:
    # module level so a process pool can pickle it; the BPE tables are cached by gpt2_encoding
    return GPT2Tokenizer().encode_documents(texts)


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="prepare_fineweb.py", description=__doc__.splitlines()[0])
    p.add_argument("--source", choices=["hub", "local"], required=True)
    p.add_argument("--path", help="local file(s)/folder (parquet, jsonl, txt) with a text column")
    p.add_argument("--hub-name", default=DataSection.hub_name)
    p.add_argument(
        "--subset", default=DataSection.subset, help="FineWeb config, e.g. sample-10BT, sample-100BT"
    )
    p.add_argument(
        "--revision",
        default=DataSection.revision,
        help=f"hub commit, branch or tag (default {DataSection.revision}, as data.revision)",
    )
    p.add_argument("--out", required=True, help="output folder (resumed if it holds a matching manifest)")
    p.add_argument("--max-tokens", type=int, default=None, help="stop after this many training tokens")
    p.add_argument(
        "--workers",
        type=int,
        default=max(1, (mp.cpu_count() or 2) - 1),
        help="tokenizer processes (default: CPUs - 1)",
    )
    p.add_argument(
        "--seq-len", type=int, default=ModelConfig.seq_len, help="model.seq_len the val set is cut for"
    )
    p.add_argument(
        "--val-tokens",
        type=int,
        default=DataSection.val_tokens,
        help=f"data.val_tokens: held-out predicted tokens (default {DataSection.val_tokens})",
    )
    p.add_argument("--shard-tokens", type=int, default=100_000_000, help="tokens per train shard")
    p.add_argument(
        "--doc-batch", type=int, default=DataSection.doc_batch, help="documents per tokenizer task"
    )
    args = p.parse_args(argv)
    for name in ("workers", "seq_len", "val_tokens", "shard_tokens", "doc_batch"):
        if getattr(args, name) <= 0:
            p.error(f"--{name.replace('_', '-')}={getattr(args, name)} is invalid: it must be positive.")
    if args.max_tokens is not None and args.max_tokens <= 0:
        p.error(f"--max-tokens={args.max_tokens} is invalid: it must be positive.")
    if args.source == "local" and not args.path:
        p.error("--source local needs --path, the file(s) or folder to read.")
    return args


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


def _data_section(args) -> DataSection:
    return replace(
        DataSection(),
        source=args.source,
        path=args.path,
        hub_name=args.hub_name,
        subset=args.subset,
        revision=args.revision,
        val_tokens=args.val_tokens,
        doc_batch=args.doc_batch,
    )


def _load_manifest(out: Path, settings: dict) -> dict | None:
    path = out / MANIFEST
    if not path.exists():
        return None
    import json

    man = json.loads(path.read_text())
    if man.get("settings") != settings:
        diff = sorted(k for k in settings if man.get("settings", {}).get(k) != settings[k])
        raise DataError(
            f"--out {out} holds shards prepared with other settings ({', '.join(diff)}); "
            "use a new --out folder or delete that one."
        )
    return man


def prepare(args, console=None) -> dict:
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    console = console or Console(stderr=True)
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise DataError(f"--out {str(out)!r} is a file; give a folder for the shards.")
    settings = _settings(args)
    data = _data_section(args)
    window = args.seq_len + 1
    man = _load_manifest(out, settings)
    if man and (man.get("exhausted") or (args.max_tokens and man["train_tokens"] >= args.max_tokens)):
        console.print(f"[green]{out} is already complete[/] ({man['train_tokens']:,} train tokens).")
        return man
    where = (
        f"{args.hub_name} ({args.subset}@{args.revision})"
        if args.source == "hub"
        else f"--path {args.path!r}"
    )
    ds = open_text_dataset(data)
    if man is None:  # first run: the held-out set, exactly as the streaming sources define it
        console.print(f"Holding out {args.val_tokens:,} validation tokens from {where} ...")
        held, rest = split_heldout(
            iter_text_batches(ds, args.doc_batch, data.stall_timeout_s, where),
            n_val_windows(args.val_tokens, args.seq_len),
            window,
            where,
            what="--val-tokens",
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
    buf: list[np.ndarray] = []
    buf_tokens = 0
    buf_docs = 0
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

    def batches():
        for texts in iter_text_batches(ds, args.doc_batch, data.stall_timeout_s, where):
            yield len(texts), [t for t in texts if fingerprint(t) not in skip_fps]

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
    with Progress(*columns, console=console) as progress, ctx.Pool(args.workers) as pool:
        task = progress.add_task("train", total=limit, completed=done_before, rate="")
        meta = []  # (documents in the batch) in the order pool.imap returns results

        def texts_only():
            for n_docs, texts in batches():
                meta.append(n_docs)
                yield texts

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


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING)
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        prepare(args)
    except DataError as exc:  # the library names config keys; on this command line it is --path
        print(f"error: {str(exc).replace('data.path', '--path')}", file=sys.stderr)
        return 2
    return 0
