"""The fixed validation set and the training material left after it is held out.

Rule for every text source: documents are read in the source's natural order (files in name
order, rows in file order; never shuffled, never split by rank), and the first documents whose
tokens fill `data.val_tokens // seq_len` windows of seq_len+1 tokens are the validation set.
Training never sees them: offline and shards simply start after them, hub and local skip every
document whose text fingerprint is in the held-out set. The set therefore depends only on the
data config and seq_len, never on the seed, the model variant or the number of processes, and
`prepare_fineweb.py` writes exactly these windows' documents into its val shard. Each source
builds its own set (`DataSource.build_heldout`); this module holds the rule and the cache.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Protocol

import numpy as np

from prism.data.errors import DataError
from prism.data.text import fingerprint
from prism.data.tokenizer import GPT2Tokenizer


class HeldoutBuilder(Protocol):
    """What the cache needs of a source (prism.data.source.DataSource is one)."""

    data: Any  # the run's data section

    def build_heldout(self, seq_len: int) -> Heldout: ...


@dataclass
class Heldout:
    windows: np.ndarray  # (n, seq_len+1) uint16, the validation windows
    fingerprints: frozenset  # held-out documents (document sources' training skips these)
    n_docs: int  # how many leading documents were held out
    train_tokens: np.ndarray | None  # a source that holds its training tokens in memory: them


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


_CACHE: dict[tuple, Heldout] = {}


def cached_heldout(source: HeldoutBuilder, seq_len: int) -> Heldout:
    """source.build_heldout, memoized per process (the analysis asks once per checkpoint)."""
    d = source.data
    key = (type(source), d.source, d.path, d.hub_name, d.subset, d.revision, d.val_tokens, seq_len)
    if key not in _CACHE:
        _CACHE.clear()
        _CACHE[key] = source.build_heldout(seq_len)
    return _CACHE[key]
