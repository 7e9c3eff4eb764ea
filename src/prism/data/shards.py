"""Pre-tokenized token shards in the llm.c `.bin` layout (a 256 x int32 header: magic 20240520,
version 1, token count; then uint16 tokens), read by memory map."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from prism.data.errors import DataError
from prism.io import atomic_path

MAGIC = 20240520
VERSION = 1
HEADER_INTS = 256
HEADER_BYTES = HEADER_INTS * 4


def write_shard(path: str | Path, tokens: np.ndarray) -> None:
    """Write one shard atomically: a temp file in the same folder, fsync, then rename."""
    path = Path(path)
    tokens = np.asarray(tokens)
    if tokens.size and int(tokens.max()) > np.iinfo(np.uint16).max:
        raise DataError(f"token id {int(tokens.max())} does not fit the uint16 shard format.")
    header = np.zeros(HEADER_INTS, dtype="<i4")
    header[:3] = (MAGIC, VERSION, tokens.size)
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        f.write(header.tobytes())
        f.write(tokens.astype("<u2", copy=False).tobytes())
        f.flush()
        os.fsync(f.fileno())


def open_shard(path: str | Path) -> np.ndarray:
    """Memory-map a shard's tokens (read-only uint16 array) once its header and size check out."""
    path = Path(path)
    try:
        size = path.stat().st_size
        header = np.fromfile(path, dtype="<i4", count=HEADER_INTS)
    except OSError as exc:
        raise DataError(f"shard {path} cannot be read ({exc.strerror or type(exc).__name__}).") from None
    if size < HEADER_BYTES:
        raise DataError(
            f"shard {path} is {size} bytes, shorter than the {HEADER_BYTES}-byte header; "
            "it is truncated or not a token shard."
        )
    if header[0] != MAGIC:
        raise DataError(
            f"shard {path} has magic number {int(header[0])}, expected {MAGIC} "
            "(the llm.c uint16 .bin layout)."
        )
    if header[1] != VERSION:
        raise DataError(f"shard {path} has format version {int(header[1])}, expected {VERSION}.")
    n = int(header[2])
    if size != HEADER_BYTES + 2 * n:
        raise DataError(
            f"shard {path} declares {n} tokens ({HEADER_BYTES + 2 * n} bytes) but the file is "
            f"{size} bytes; it is truncated or corrupt, delete it and re-run prepare_fineweb.py."
        )
    if n == 0:
        return np.zeros(0, dtype=np.uint16)
    # a plain ndarray view of the map: slicing an np.memmap builds a memmap object per slice,
    # 4x slower per window; the view keeps the map alive through its .base
    return np.memmap(path, dtype="<u2", mode="r", offset=HEADER_BYTES, shape=(n,)).view(np.ndarray)


def find_shards(folder: str | Path, split: str) -> list[Path]:
    """The `*_{split}_*.bin` shards of a folder in name order (llm.c names: fineweb_train_000001.bin)."""
    folder = Path(folder)
    if not folder.exists():
        raise DataError(
            f"data.path={str(folder)!r} does not exist; point it at a folder written by "
            "reproduce/prepare_fineweb.py."
        )
    if not folder.is_dir():
        raise DataError(
            f"data.path={str(folder)!r} is not a folder; data.source=shards needs the folder "
            "that holds the *_train_*.bin and *_val_*.bin shards."
        )
    found = sorted(p for p in folder.glob(f"*_{split}_*.bin") if p.is_file())
    if not found:
        raise DataError(
            f"no {split} shards (*_{split}_*.bin) in {folder}; write them with reproduce/prepare_fineweb.py."
        )
    return found
