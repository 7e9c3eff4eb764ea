"""data.source=offline: the English reference text every CPython ships, for smoke runs."""

from __future__ import annotations

import numpy as np

from prism.data.heldout import Heldout, n_val_windows, split_heldout
from prism.data.source import WindowSource


def offline_documents() -> list[str]:
    """`pydoc_data.topics` (~110k GPT-2 tokens): real prose and code that needs no network and
    no files. Sorted by topic for a fixed order."""
    from pydoc_data.topics import topics

    return [topics[k] for k in sorted(topics)]


class OfflineSource(WindowSource):
    """Python's own documentation text, tokenized in memory: no network, no files."""

    def describe(self) -> str:
        return "offline built-in text (no network; for smoke runs only)"

    def where(self) -> str:
        return "the offline Python documentation text"

    def build_heldout(self, seq_len: int) -> Heldout:
        docs = offline_documents()
        batches = (docs[i : i + 64] for i in range(0, len(docs), 64))
        n = n_val_windows(self.data.val_tokens, seq_len)
        held, _ = split_heldout(batches, n, seq_len + 1, self.where(), keep_rest=True)
        return held

    def train_arrays(self, heldout: Heldout) -> list[np.ndarray]:
        return [heldout.train_tokens]
