"""Shared fixtures. Real public data lives beside the checkout (never committed); its location
comes from PRISM_SHARED_DATA, which .ci/run sets, and tests needing it skip when it is absent."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from prism.model import ModelConfig, PrismDecoder

torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))


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
