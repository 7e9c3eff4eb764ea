"""Shared fixtures. Real public data lives beside the checkout (never committed); its location
comes from PRISM_SHARED_DATA, which .ci/run sets, and tests needing it skip when it is absent."""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest
import torch

from prism.model import ModelConfig, PrismDecoder

torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))

FLOAT32_EPS = torch.finfo(torch.float32).eps  # 2**-23 = 1.19e-7: one float32 rounding, relative


def loglik_tolerance(n_tokens: int, vocab_size: int = 50257) -> float:
    """The largest gap allowed between two float32 scorings of a sum of n_tokens log-probs that
    differ only in batch shape, kernel or code path (log_softmax vs gather - logsumexp).

    Each token's log-prob z_t - logsumexp(z) is a float32 number of size ln(V) (10.8 for GPT-2's
    vocabulary: the test models are random-init, so their softmax is near uniform); one rounding
    there is eps*ln(V) = 1.3e-6. Each path rounds the log-sum-exp and the difference; 4 roundings
    per token for the pair of paths also covers the logits' own GEMM-order error (|z| ~ 0.1, far
    smaller). Tokens add with no cancellation assumed. A wrong, missing or shifted token moves
    the sum by ~0.1 or more, far above this."""
    return 4 * FLOAT32_EPS * math.log(vocab_size) * n_tokens


def shared_data_dir() -> Path | None:
    env = os.environ.get("PRISM_SHARED_DATA")
    if env and Path(env).is_dir():
        return Path(env)
    guess = Path(__file__).resolve().parents[2] / "shared" / "data"
    return guess if guess.is_dir() else None


@pytest.fixture
def one_thread():
    """Tiny matrices on a shared 2-core machine: one thread avoids OpenMP contention."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def shared_data() -> Path:
    path = shared_data_dir()
    if path is None:
        pytest.skip("real test data not found: set PRISM_SHARED_DATA to the shared data folder")
    return path


def tiny_model(heads=(1, 2, 4, 4), d_model=64, h_base=4, seq_len=64, vocab_size=512, seed=0,
               **kw) -> PrismDecoder:
    torch.manual_seed(seed)
    cfg = ModelConfig(n_layer=len(heads), d_model=d_model, h_base=h_base, heads=list(heads),
                      seq_len=seq_len, vocab_size=vocab_size, **kw)
    return PrismDecoder(cfg)
