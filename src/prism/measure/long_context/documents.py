"""Held-out documents at least as long as an evaluation window: the run's own validation
documents, or those of a long-document file (jsonl) given by path. Each document is its GPT-2
tokens after an EOT, as training packs them, so a window of L tokens reads the first L+1."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from prism.data.tokenizer import EOT_TOKEN, GPT2Tokenizer
from prism.io import json_lines
from prism.measure.long_context.settings import LongContextError, Settings


@dataclass
class DocumentSet:
    where: str  # what was read, in words
    docs: list[np.ndarray]  # token ids, each starting with EOT


def own_documents(run) -> DocumentSet:
    """The run's validation documents. The held-out windows are consecutive slices of the
    held-out documents' token stream (prism.data.heldout), so splitting that stream at each EOT
    gives the documents back, the last one possibly cut where the set ends."""
    from prism.data.heldout import cached_heldout
    from prism.data.sources import source_for

    source = source_for(run.data)
    stream = np.asarray(cached_heldout(source, run.model.seq_len).windows).reshape(-1)
    starts = np.flatnonzero(stream == EOT_TOKEN).tolist()
    if not starts or starts[0] != 0:
        starts = [0, *starts]
    ends = [*starts[1:], len(stream)]
    docs = [stream[a:b].astype(np.int64) for a, b in zip(starts, ends) if b - a > 1]
    return DocumentSet(f"the validation documents of {source.where()}", docs)


def path_documents(path: str, text_field: str) -> DocumentSet:
    """The documents of a jsonl file, one per row, read from `text_field`, in file order."""
    lines = json_lines(
        path,
        lambda: LongContextError(
            f"long_context.path={path!r} is not a file; give a jsonl file of long documents, e.g. "
            f"the WikiText-2 test pages (eval/wikitext/test.jsonl, long_context.text_field=page)."
        ),
        lambda n, _why: LongContextError(
            f"line {n} of {path} is not JSON; give a jsonl file, one document a line."
        ),
    )
    texts = []
    for n, row in lines:
        text = row.get(text_field) if isinstance(row, dict) else None
        if not isinstance(text, str):
            fields = ", ".join(sorted(row)) if isinstance(row, dict) else "none"
            raise LongContextError(
                f"line {n} of {path} has no text field {text_field!r} (its fields: {fields}); set "
                f"long_context.text_field to the field that holds the document."
            )
        texts.append(text)
    tok = GPT2Tokenizer()
    return DocumentSet(str(path), [tok.encode_documents([t]).astype(np.int64) for t in texts])


@dataclass
class Picked:
    """The documents one length reads, and where they come from."""

    origin: str
    where: str
    windows: np.ndarray  # (n, length + 1) token ids
    available: int  # documents of that source long enough

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.windows.astype(np.int64).tobytes()).hexdigest()

    def describe(self) -> dict:
        return {
            "origin": self.origin,
            "where": self.where,
            "count": int(len(self.windows)),
            "available": self.available,
            "sha256": self.sha256,
        }


class Documents:
    """The document sets of one evaluation, each read once and only when a length needs it."""

    def __init__(self, settings: Settings, run) -> None:
        self.settings, self.run = settings, run
        self._sets: dict[str, DocumentSet] = {}

    def _set(self, origin: str) -> DocumentSet:
        if origin not in self._sets:
            s = self.settings
            self._sets[origin] = (
                own_documents(self.run) if origin == "own" else path_documents(s.path, s.text_field)
            )
        return self._sets[origin]

    def candidates(self) -> list[str]:
        s = self.settings
        if s.source == "auto":
            return ["own", "path"] if s.path else ["own"]
        return [s.source]

    def pick(self, length: int) -> Picked:
        """The first `documents` documents at least `length` tokens long: the run's own where it
        has that many (source auto), else the source with the most; refused when none has one."""
        n, best = self.settings.documents, None
        for origin in self.candidates():
            # the documents that fill a window of `length` inputs and its `length` targets
            found = [d for d in self._set(origin).docs if len(d) >= length + 1]
            if best is None or len(found) > len(best[1]):
                best = (origin, found)
            if len(found) >= n:
                break
        origin, found = best
        if not found:
            seen = "; ".join(  # the longest in text tokens, its EOT not counted
                f"{d.where}: {len(d.docs)} documents, the longest "
                f"{max(map(len, d.docs), default=1) - 1} tokens"
                for d in map(self._set, self.candidates())
            )
            raise LongContextError(
                f"no held-out document is at least {length} tokens long ({seen}); give shorter "
                f"long_context.lengths or a file of longer documents as long_context.path."
            )
        windows = np.stack([d[: length + 1] for d in found[:n]])
        return Picked(origin, self._set(origin).where, windows, len(found))
