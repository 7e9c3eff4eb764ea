"""Per-document scores and their aggregation, with the harness's formulas (lm_eval.api.metrics;
docs/evaluation.md, "Zero-shot evaluation")."""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from prism.eval.tasks import ChoiceDoc, RollingDoc


def choice_scores(doc: ChoiceDoc, lls: Sequence[float]) -> dict[str, float]:
    lls = np.asarray(lls, dtype=np.float64)
    lengths = np.array([float(len(c)) for c in doc.choices])
    # np.argmax keeps the first of equal maxima, exactly as the harness does.
    return {"acc": float(np.argmax(lls) == doc.gold), "acc_norm": float(np.argmax(lls / lengths) == doc.gold)}


def mean_stderr(values: Sequence[float]) -> float | None:
    n = len(values)
    if n < 2:
        return None
    mu = sum(values) / n
    return math.sqrt(sum((x - mu) ** 2 for x in values) / (n - 1)) / math.sqrt(n)


def aggregate_choice(scores: list[dict[str, float]], metrics: Sequence[str]) -> dict:
    out: dict = {}
    for m in metrics:
        values = [s[m] for s in scores]
        out[m] = sum(values) / len(values)
        out[f"{m}_stderr"] = mean_stderr(values)
    out["n"] = len(scores)
    return out


def aggregate_rolling(docs: Sequence[RollingDoc], lls: Sequence[float]) -> dict:
    total = sum(lls)
    words = sum(d.words for d in docs)
    nbytes = sum(d.bytes for d in docs)
    return {
        "word_perplexity": math.exp(-total / words),
        "word_perplexity_stderr": None,
        "byte_perplexity": math.exp(-total / nbytes),
        "byte_perplexity_stderr": None,
        "bits_per_byte": -total / nbytes / math.log(2),
        "bits_per_byte_stderr": None,
        "n": len(docs),
    }


def aggregate_group(members: dict[str, dict], metrics: Sequence[str]) -> dict:
    out: dict = {}
    k = len(members)
    for m in metrics:
        out[m] = sum(r[m] for r in members.values()) / k
        errs = [r[f"{m}_stderr"] for r in members.values()]
        out[f"{m}_stderr"] = None if any(e is None for e in errs) else math.sqrt(sum(e * e for e in errs)) / k
    out["n"] = sum(r["n"] for r in members.values())
    return out
