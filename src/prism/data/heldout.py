"""The fixed validation set (the rule: docs/data.md, "The held-out validation set") and the
training material left after it; each source builds its own set (`DataSource.build_heldout`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Iterator

import numpy as np

from prism.data.errors import DataError
from prism.data.text import fingerprint
from prism.data.tokenizer import GPT2Tokenizer


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
    keep_rest: bool = False,
    what: str = "data.val_tokens",
) -> tuple[Heldout, Iterator[np.ndarray]]:
    """The held-out part (leading documents until `n_windows` windows are filled) and an iterator over
    the training tokens after it, checked to hold a window (keep_rest: collected into the Heldout)."""
    tok = GPT2Tokenizer()
    need = n_windows * window
    parts: list[np.ndarray] = []
    fps: set[bytes] = set()
    have = 0
    it = iter(batches)
    rest_first: list[np.ndarray] = []
    for texts in it:
        i = 0
        while i < len(texts) and have < need:
            parts.append(tok.encode_documents([texts[i]]))
            have += len(parts[-1])
            fps.add(fingerprint(texts[i]))
            i += 1
        if have >= need:
            rest_first = [tok.encode_documents(texts[i:])]
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
    rest = _chain(rest_first, (tok.encode_documents(texts) for texts in it))
    train = None
    if keep_rest:
        train = np.concatenate([np.zeros(0, np.uint16), *rest])
        have_train = len(train)
    else:  # only make sure at least one training window exists after the held-out documents
        consumed, have_train = [], 0
        for arr in rest:
            consumed.append(arr)
            have_train += len(arr)
            if have_train >= window:
                break
        rest = _chain(consumed, rest)
    if have_train < window:
        raise DataError(
            f"{where} has {have_train} tokens left after the {need}-token validation set, "
            f"fewer than one training window of model.seq_len+1={window}; lower "
            f"{what} or model.seq_len, or use more data."
        )
    return Heldout(val, frozenset(fps), len(parts), train), rest


def _chain(first: list, rest: Iterator) -> Iterator:
    """`first`, then `rest`, as a generator (closing it stops a document reader)."""
    yield from first
    yield from rest


_CACHE: dict[tuple, Heldout] = {}


def cached_heldout(source, seq_len: int) -> Heldout:
    """source.build_heldout, memoized per process (the analysis asks once per checkpoint)."""
    d = source.data
    key = (type(source), d.source, d.path, d.hub_name, d.subset, d.revision, d.val_tokens, seq_len)
    if key not in _CACHE:
        _CACHE.clear()
        _CACHE[key] = source.build_heldout(seq_len)
    return _CACHE[key]
