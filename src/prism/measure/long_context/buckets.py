"""Loss by position, averaged over equal-width buckets of the window: a curve short enough to
compare schedules and RoPE choices at 8k tokens without storing every position."""

from __future__ import annotations

import numpy as np


def bucket_edges(length: int, buckets: int) -> list[int]:
    """The 0-based position edges of `buckets` equal-width buckets of a window of `length` tokens
    (bucket b is [edges[b], edges[b+1])); never more buckets than positions."""
    n = max(1, min(int(buckets), int(length)))
    return [i * length // n for i in range(n + 1)]


def bucket_means(position_loss: np.ndarray, edges: list[int]) -> list[float]:
    """The mean of the per-position losses inside each bucket. Every position holds the mean over
    the same documents, so this is also the mean over all (document, position) pairs."""
    loss = np.asarray(position_loss, dtype=np.float64)
    if len(loss) != edges[-1]:
        raise ValueError(f"{len(loss)} positions do not fill buckets ending at {edges[-1]}.")
    return [float(loss[a:b].mean()) for a, b in zip(edges, edges[1:])]
