"""Data benchmark: training tokens per second that one worker process delivers, per source.

    python dev/data_benchmark.py [--source offline,local,shards] [--path FILE_OR_DIR]

Each source is read exactly as training reads it (TokenStreamDataModule's stream for rank 0 of 1,
inside this one process, i.e. one DataLoader worker's work) for --seconds after one warm-up
batch. `local` is measured on parquet and jsonl copies of --path (repeated to a few million
tokens so the steady state, not file opening, is timed); `shards` on shards that
prepare_fineweb writes from the same text (its throughput is reported too). --loader-workers N
additionally measures a real DataLoader with N workers. Prints one JSON document.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

SOURCES = ("offline", "local", "shards", "hub")
PAPER_TOKENS_PER_S = 2.9e6  # Table 2: the 124M run consumed 2875K tokens/s on 8 GPUs


def _default_text() -> str | None:
    env = os.environ.get("PRISM_SHARED_DATA")
    for base in ([Path(env)] if env else []) + [Path(__file__).resolve().parents[2] / "shared" / "data"]:
        if (base / "web" / "fineweb-100.parquet").is_file():
            return str(base / "web" / "fineweb-100.parquet")
    return None


def _texts(path: str) -> list[str]:
    import datasets

    from prism.data.sources.local import local_data_files

    builder, files = local_data_files(path)
    ds = datasets.load_dataset(builder, data_files={"train": files}, split="train", streaming=True)
    return [row["text"] for row in ds]


def _write_copies(texts: list[str], folder: Path, min_chars: int) -> dict[str, Path]:
    """The same documents repeated until >= min_chars, as parquet and as jsonl."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    reps = max(1, math.ceil(min_chars / max(1, sum(map(len, texts)))))
    # a suffix per copy keeps documents distinct (identical copies would share a fingerprint)
    docs = [f"{t}\n[{k}]" for k in range(reps) for t in texts]
    pq.write_table(pa.table({"text": docs}), folder / "copy.parquet", row_group_size=1000)
    with open(folder / "copy.jsonl", "w") as f:
        for d in docs:
            f.write(json.dumps({"text": d}) + "\n")
    return {"parquet": folder / "copy.parquet", "jsonl": folder / "copy.jsonl"}


def _measure(cfg, seconds: float, loader_workers: int = 0) -> dict:
    from torch.utils.data import DataLoader

    from prism.data import TokenStreamDataModule

    dm = TokenStreamDataModule(cfg)
    dm.setup()
    ds = dm.train_dataset(0, 1)
    it = iter(
        ds
        if loader_workers == 0
        else DataLoader(ds, batch_size=None, num_workers=loader_workers, prefetch_factor=4)
    )
    next(it)  # warm-up: opens files, builds permutations, starts workers
    tokens, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        x, _ = next(it)
        tokens += x.numel()
    elapsed = time.perf_counter() - start
    rate = tokens / elapsed
    per_worker = rate / max(1, loader_workers)
    return {
        "tokens": tokens,
        "seconds": round(elapsed, 3),
        "tokens_per_s": round(rate),
        "tokens_per_s_per_worker": round(per_worker),
        "workers_for_paper_rate": math.ceil(PAPER_TOKENS_PER_S / per_worker),
    }


def _tokenizer_ceiling(texts: list[str], seconds: float) -> dict:
    """Bare tiktoken encode_ordinary on the same text, one thread: the ceiling for local/hub
    (reported so a loaded machine's numbers can be read as a ratio)."""
    from prism.data.tokenizer import GPT2Tokenizer

    enc = GPT2Tokenizer().enc
    tokens, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        tokens += sum(len(enc.encode_ordinary(t)) for t in texts)
    rate = tokens / (time.perf_counter() - start)
    return {"tokens_per_s": round(rate), "workers_for_paper_rate": math.ceil(PAPER_TOKENS_PER_S / rate)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="data_benchmark.py", description="data pipeline tokens/s per worker")
    p.add_argument(
        "--source",
        default="offline,local,shards",
        help=f"comma-separated, from {', '.join(SOURCES)} (hub needs internet)",
    )
    p.add_argument(
        "--path", default=_default_text(), help="text for local/shards (default: shared FineWeb sample)"
    )
    p.add_argument("--seconds", type=float, default=3.0)
    p.add_argument("--seq-len", type=int, default=1024)
    p.add_argument("--micro-batch", type=int, default=32)
    p.add_argument("--min-tokens", type=int, default=3_000_000, help="size of the local copies")
    p.add_argument("--loader-workers", type=int, default=0, help="also time a DataLoader with N workers")
    p.add_argument("--prepare-workers", type=int, default=1)
    args = p.parse_args(argv)
    if args.prepare_workers < 1:
        p.error(f"--prepare-workers {args.prepare_workers} is invalid: give 1 or more.")
    sources = [s.strip() for s in args.source.split(",") if s.strip()]
    bad = [s for s in sources if s not in SOURCES]
    if bad:
        p.error(f"--source {','.join(bad)} is invalid: choose from {', '.join(SOURCES)}.")
    if any(s in ("local", "shards") for s in sources) and not args.path:
        p.error("--path is needed for local/shards (set PRISM_SHARED_DATA or pass a file or folder).")

    from prism.config.schema import load_config
    from prism.data.errors import DataError

    base = [
        f"model.seq_len={args.seq_len}",
        f"train.micro_batch={args.micro_batch}",
        f"data.val_tokens={args.seq_len * 4}",
        "data.num_workers=0",
    ]
    result = {
        "machine": {
            "cpu": platform.processor() or platform.machine(),
            "cpus": os.cpu_count(),
            "load_avg_1m": round(os.getloadavg()[0], 2),
        },
        "what": "training tokens (micro_batch x seq_len per batch) per second from one process",
        "seq_len": args.seq_len,
        "micro_batch": args.micro_batch,
        "paper_tokens_per_s": PAPER_TOKENS_PER_S,
        "results": {},
    }
    res = result["results"]
    with tempfile.TemporaryDirectory(prefix="prism-data-bench-") as tmp:
        tmp = Path(tmp)
        copies = None
        if any(s in ("local", "shards") for s in sources):
            texts = _texts(args.path)
            copies = _write_copies(texts, tmp, args.min_tokens * 4)
            res["tiktoken_encode_only"] = _tokenizer_ceiling(texts, args.seconds)
        for src in sources:
            try:
                if src == "offline":
                    res["offline"] = _measure(
                        load_config("124m", base + ["data.source=offline"]), args.seconds
                    )
                elif src == "hub":
                    res["hub"] = _measure(load_config("124m", base + ["data.source=hub"]), args.seconds)
                elif src == "local":
                    for fmt, path in copies.items():
                        cfg = load_config("124m", base + ["data.source=local", f"data.path={path}"])
                        res[f"local-{fmt}"] = _measure(cfg, args.seconds)
                        if args.loader_workers:
                            res[f"local-{fmt}-loader{args.loader_workers}"] = _measure(
                                cfg, args.seconds, args.loader_workers
                            )
                elif src == "shards":
                    from rich.console import Console

                    from prism.data.prepare import options_for, prepare

                    out = tmp / "shards"
                    t0 = time.perf_counter()
                    man = prepare(
                        # the data keys as config words: the config's rules check them
                        options_for(
                            source="local",
                            out=str(out),
                            workers=args.prepare_workers,
                            overrides=[*base, f"data.path={copies['parquet']}"],
                        ),
                        console=Console(file=open(os.devnull, "w")),
                    )
                    dt = time.perf_counter() - t0
                    res["prepare_fineweb"] = {
                        "tokens": man["train_tokens"],
                        "seconds": round(dt, 3),
                        "workers": args.prepare_workers,
                        "tokens_per_s": round(man["train_tokens"] / dt),
                    }
                    cfg = load_config("124m", base + ["data.source=shards", f"data.path={out}"])
                    res["shards"] = _measure(cfg, args.seconds)
                    if args.loader_workers:
                        res[f"shards-loader{args.loader_workers}"] = _measure(
                            cfg, args.seconds, args.loader_workers
                        )
            except DataError as exc:
                res[src] = {"error": str(exc)}
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
