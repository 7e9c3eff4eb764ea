"""What an offline W&B run's .wandb files (LevelDB logs of wandb.proto Records) hold: each metric's
steps, and whether its last attempt was closed or killed (docs/tracking.md)."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Iterator

from prism.runs.layout import WANDB_DIR

BLOCK = 32 * 1024
HEADER = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4
STEP_KEY = "trainer/global_step"  # Lightning's WandbLogger logs the step under this key


def records(path: str | Path) -> Iterator[bytes]:
    data = Path(path).read_bytes()
    if data[:4] != b":W&B":
        return
    pos, pieces = HEADER, b""
    while pos + HEADER <= len(data):
        left = BLOCK - pos % BLOCK
        if left < HEADER:
            pos += left  # the block's tail is padding
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + HEADER])
        start, end = pos + HEADER, pos + HEADER + length
        if end > len(data) or kind not in (FULL, FIRST, MIDDLE, LAST):
            return
        piece, pos = data[start:end], end
        pieces = piece if kind in (FULL, FIRST) else pieces + piece  # a record's pieces so far
        if kind in (FULL, LAST):
            yield pieces


def parsed(path: str | Path) -> Iterator:
    """The records of one .wandb file as W&B's protobuf messages, up to the first damaged one."""
    from wandb.proto import wandb_internal_pb2 as pb

    for raw in records(path):
        rec = pb.Record()
        try:
            rec.ParseFromString(raw)
        except Exception:  # noqa: BLE001 - a damaged record ends what can be read
            return
        yield rec


def history(path: str | Path) -> Iterator[dict]:
    """The history rows of one .wandb file, as {key: value}."""
    for rec in parsed(path):
        if rec.WhichOneof("record_type") != "history":
            continue
        yield {
            item.key or ".".join(item.nested_key): json.loads(item.value_json)
            for item in rec.history.item
            if item.value_json
        }


def run_files(wandb_root: str | Path, run_id: str) -> list[Path]:
    """The .wandb files of one run id under a W&B dir, oldest attempt first."""
    files = Path(wandb_root).glob(f"{WANDB_DIR}/*-{run_id}/run-{run_id}.wandb")
    return sorted(files, key=lambda p: (p.parent.name.rsplit("-", 2)[-2], p.parent.name))


def exit_code(path: str | Path) -> int | None:
    """The exit code W&B recorded when this attempt finished, or None: a killed one never writes one."""
    code = None
    for rec in parsed(path):
        if rec.WhichOneof("record_type") == "exit":
            code = int(rec.exit.exit_code)
    return code


def floors(wandb_root: str | Path, run_id: str) -> dict[str, int]:
    """Per metric key, the last step the run's files hold."""
    out: dict[str, int] = {}
    for path in run_files(wandb_root, run_id):
        for row in history(path):
            step = row.get(STEP_KEY)
            if not isinstance(step, (int, float)):
                continue
            for key in row:
                if not key.startswith("_") and key != STEP_KEY:
                    out[key] = max(out.get(key, -1), int(step))
    return out
