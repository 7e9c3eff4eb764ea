"""The fixed validation set and the training material left after it is held out.

Rule for every text source: documents are read in the source's natural order (files in name
order, rows in file order; never shuffled, never split by rank), and the first documents whose
tokens fill `data.val_tokens // seq_len` windows of seq_len+1 tokens are the validation set.
Training never sees them: offline and shards simply start after them, hub and local skip every
document whose text fingerprint is in the held-out set. The set therefore depends only on the
data config and seq_len, never on the seed, the model variant or the number of processes, and
`prepare_fineweb.py` writes exactly these windows' documents into its val shard.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Iterable, Iterator

import numpy as np

from prism.data import shards as shard_io
from prism.data.errors import DataError
from prism.data.sources import fingerprint, iter_text_batches, offline_documents, open_text_dataset
from prism.data.tokenizer import GPT2Tokenizer
from prism.data.windows import TokenWindows

log = logging.getLogger(__name__)


@dataclass
class Heldout:
    windows: np.ndarray  # (n, seq_len+1) uint16, the validation windows
    fingerprints: frozenset  # held-out documents (hub/local training skips these)
    n_docs: int  # how many leading documents were held out
    train_tokens: np.ndarray | None  # offline only: the training token stream (in memory)


def n_val_windows(val_tokens: int, seq_len: int) -> int:
    """data.val_tokens counts predicted tokens; each window of seq_len+1 predicts seq_len."""
    return max(1, val_tokens // seq_len)


def split_heldout(
    batches: Iterable[list[str]],
    n_windows: int,
    window: int,
    where: str,
    tok: GPT2Tokenizer | None = None,
    keep_rest: bool = False,
    what: str = "data.val_tokens",
) -> tuple[Heldout, Iterator[np.ndarray]]:
    """Take leading documents until `n_windows` windows are filled; then check (or, with
    keep_rest, collect) the remaining training tokens. Returns the held-out part and an iterator
    over the training tokens of the documents that follow (already consumed ones first)."""
    tok = tok or GPT2Tokenizer()
    need = n_windows * window
    parts: list[np.ndarray] = []
    have = 0
    fps: set[bytes] = set()
    n_docs = 0
    it = iter(batches)
    rest_first: list[np.ndarray] = []
    for texts in it:
        if have >= need:
            rest_first.append(tok.encode_documents(texts))
            break
        for i, text in enumerate(texts):
            if have >= need:
                rest_first.append(tok.encode_documents(texts[i:]))
                break
            ids = tok.encode_documents([text])
            parts.append(ids)
            have += len(ids)
            fps.add(fingerprint(text))
            n_docs += 1
        if rest_first:
            break
    if have < need:
        if have < window:
            raise DataError(
                f"{where} holds {have} tokens, fewer than one window of model.seq_len+1="
                f"{window} tokens; lower model.seq_len or use more data."
            )
        raise DataError(
            f"{where} holds {have} tokens, fewer than the {need} that {what} needs for "
            f"{n_windows} held-out windows of {window} tokens plus training data; lower it "
            "or use more data."
        )
    val = np.concatenate(parts)[:need].reshape(n_windows, window)

    def rest() -> Iterator[np.ndarray]:
        yield from rest_first
        for texts in it:
            yield tok.encode_documents(texts)

    train = None
    rest_iter = rest()
    if keep_rest:
        train = np.concatenate([np.zeros(0, np.uint16), *rest_iter])
        rest_iter = iter(())
        have_train = len(train)
    else:  # only make sure at least one training window exists after the held-out documents
        have_train = 0
        consumed = []
        for arr in rest_iter:
            consumed.append(arr)
            have_train += len(arr)
            if have_train >= window:
                break
        rest_iter = _chain(consumed, rest_iter)
    if have_train < window:
        raise DataError(
            f"{where} has {have_train} tokens left after the {need}-token validation set, "
            f"fewer than one training window of model.seq_len+1={window}; lower "
            f"{what} or model.seq_len, or use more data."
        )
    return Heldout(val, frozenset(fps), n_docs, train), rest_iter


def _chain(first: list, rest: Iterator) -> Iterator:
    yield from first
    yield from rest


def _batched(items: list[str], size: int) -> Iterator[list[str]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


def _where(data) -> str:
    return {
        "hub": f"{data.hub_name} ({data.subset}@{data.revision})",
        "local": f"data.path={data.path!r}",
        "offline": "the offline Python documentation text",
        "shards": f"data.path={data.path!r}",
    }[data.source]


def build_heldout(data, seq_len: int) -> Heldout:
    """The validation windows for this data config (and, offline, the training tokens)."""
    window = seq_len + 1
    n = n_val_windows(data.val_tokens, seq_len)
    if data.source == "shards":
        val_paths = shard_io.find_shards(data.path, "val")
        _check_manifest(data.path, seq_len)
        windows = TokenWindows([shard_io.open_shard(p) for p in val_paths], window)
        total = sum(len(a) for a in windows.arrays)
        if total < window:
            raise DataError(
                f"the val shards in {data.path} hold {total} tokens, fewer than one window of "
                f"model.seq_len+1={window}; lower model.seq_len or prepare with a larger --seq-len."
            )
        if len(windows) < n:
            raise DataError(
                f"the val shards in {data.path} hold {len(windows)} windows of {window} tokens, "
                f"fewer than the {n} that data.val_tokens={data.val_tokens} asks for; lower "
                "data.val_tokens or re-run prepare_fineweb.py with a larger --val-tokens."
            )
        train = TokenWindows(
            [shard_io.open_shard(p) for p in shard_io.find_shards(data.path, "train")], window
        )
        if len(train) == 0:
            raise DataError(
                f"the train shards in {data.path} hold no window of model.seq_len+1={window} "
                "tokens; lower model.seq_len or prepare more data."
            )
        return Heldout(windows.gather(np.arange(n)), frozenset(), 0, None)
    if data.source == "offline":
        batches = _batched(offline_documents(), 64)
        held, _ = split_heldout(batches, n, window, _where(data), keep_rest=True)
        return held
    ds = open_text_dataset(data)
    batches = iter_text_batches(ds, data.doc_batch, data.stall_timeout_s, _where(data))
    held, rest = split_heldout(batches, n, window, _where(data))
    if hasattr(rest, "close"):
        rest.close()  # stops the reader thread
    return held


def _check_manifest(folder, seq_len: int) -> None:
    """Shards prepared for another seq_len still work, but their val windows then differ from
    the ones hub/local would hold out; say so rather than compare silently different numbers."""
    import json
    from pathlib import Path

    path = Path(folder) / "manifest.json"
    if path.is_file():
        prepared = json.loads(path.read_text()).get("settings", {}).get("seq_len")
        if prepared not in (None, seq_len):
            log.warning(
                "data: shards in %s were prepared for seq_len %s, this run uses %s; the held-out "
                "windows are re-cut and differ from the hub/local ones",
                folder,
                prepared,
                seq_len,
            )


_CACHE: dict[tuple, Heldout] = {}


def cached_heldout(data, seq_len: int) -> Heldout:
    """build_heldout, memoized per process (the analysis asks once per checkpoint)."""
    key = (data.source, data.path, data.hub_name, data.subset, data.revision, data.val_tokens, seq_len)
    if key not in _CACHE:
        _CACHE.clear()
        _CACHE[key] = build_heldout(data, seq_len)
    return _CACHE[key]
