"""RoPE frequencies, and how a decoder trained at `train_len` positions reads longer inputs
(docs/evaluation.md): each scaling is a pure function (base, head_dim, train_len, factor, knobs)
-> (inv_freq, attention_factor), as transformers computes it; `rope_frequencies` gives plain RoPE
for every choice at factor 1."""

from __future__ import annotations

import math

import torch


def plain_inv_freq(base: float, head_dim: int) -> torch.Tensor:
    """base^(-2i/d) for i < d/2, float32 on the CPU: the frequencies the model trains with."""
    return 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))


def no_scaling(base: float, head_dim: int, train_len: int, factor: float, *_) -> tuple[torch.Tensor, float]:
    """Plain extrapolation: positions past train_len rotate at the trained frequencies, so the
    slow pairs reach angles the model never saw."""
    return plain_inv_freq(base, head_dim), 1.0


def linear_scaling(
    base: float, head_dim: int, train_len: int, factor: float, *_
) -> tuple[torch.Tensor, float]:
    """Position interpolation (Chen et al. 2023): position p is read as p / factor, so factor x
    train_len positions span the trained angles. Dividing the frequencies is the same thing."""
    return plain_inv_freq(base, head_dim) / factor, 1.0


def ntk_scaling(base: float, head_dim: int, train_len: int, factor: float, *_) -> tuple[torch.Tensor, float]:
    """NTK-aware scaling (bloc97, 2023), static: the base grows by factor^(d/(d-2)), which keeps
    the fastest pair and slows the slowest by exactly `factor` (so each head width its own base)."""
    return plain_inv_freq(base * factor ** (head_dim / (head_dim - 2)), head_dim), 1.0


def yarn_scaling(
    base: float,
    head_dim: int,
    train_len: int,
    factor: float,
    beta_fast: float = 32.0,
    beta_slow: float = 1.0,
) -> tuple[torch.Tensor, float]:
    """YaRN (Peng et al. 2023): pairs turning more than beta_fast times within train_len keep their
    frequency, pairs turning fewer than beta_slow times are interpolated by `factor`, a linear ramp
    between; attention sharpened by 0.1 ln(factor) + 1 (transformers' _compute_yarn_parameters)."""

    def pair_turning(rotations: float) -> float:
        """The (fractional) pair index whose frequency turns `rotations` times in train_len."""
        return head_dim * math.log(train_len / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low = max(math.floor(pair_turning(beta_fast)), 0)
    high = min(math.ceil(pair_turning(beta_slow)), head_dim - 1)
    if low == high:
        high += 0.001  # a one-pair ramp would divide by zero
    ramp = ((torch.arange(head_dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    keep = 1 - ramp  # 1: extrapolate (keep the trained frequency), 0: interpolate by `factor`
    wavelength = base ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    inv_freq = 1.0 / (factor * wavelength) * (1 - keep) + 1.0 / wavelength * keep
    attention_factor = 0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0
    return inv_freq, attention_factor


SCALINGS = {"none": no_scaling, "linear": linear_scaling, "ntk": ntk_scaling, "yarn": yarn_scaling}


def check_scaling(scaling: str, factor: float, beta_fast: float = 32.0, beta_slow: float = 1.0) -> None:
    """Raise ValueError, in one sentence naming the config key, for a choice the decoder cannot use."""
    if scaling not in SCALINGS:
        raise ValueError(f"model.rope_scaling={scaling!r} is invalid: use one of {', '.join(SCALINGS)}.")
    for key, value, valid in (
        ("rope_factor", factor, "use a positive factor, e.g. 2 to read twice model.seq_len"),
        ("rope_beta_fast", beta_fast, "it must be positive and finite"),
        ("rope_beta_slow", beta_slow, "it must be positive and finite"),
    ):
        if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
            raise ValueError(f"model.{key}={value!r} is invalid: {valid}.")


# NTK keeps the fastest pair (i = 0) as trained and slows the slowest (i = d/2 - 1) by the factor;
# at width 2 the one pair is both, and the base's exponent d/(d-2) divides by zero
NTK_MIN_HEAD_DIM = 4


def check_head_width(scaling: str, factor: float, head_dim: int, key: str = "model.rope_scaling") -> None:
    """Raise ValueError, in one sentence naming `key`, for a scaling that heads of width `head_dim`
    cannot use (at factor 1 every choice is plain RoPE and every width can)."""
    if scaling == "ntk" and factor != 1 and head_dim < NTK_MIN_HEAD_DIM:
        raise ValueError(
            f"{key}=ntk cannot scale heads of width {head_dim} (model.d_model / heads): NTK keeps "
            f"the fastest pair and slows the slowest by the RoPE factor, so it needs at least two "
            f"pairs, heads of width {NTK_MIN_HEAD_DIM} or more; use linear or yarn, or fewer heads."
        )


def rope_frequencies(
    scaling: str,
    base: float,
    head_dim: int,
    train_len: int,
    factor: float = 1.0,
    beta_fast: float = 32.0,
    beta_slow: float = 1.0,
) -> tuple[torch.Tensor, float]:
    """(inv_freq, attention_factor) of one head width under the named scaling (the betas: yarn's);
    at factor 1 every choice is plain RoPE (ntk would have no exponent, yarn's blend only roundings)."""
    check_scaling(scaling, factor, beta_fast, beta_slow)
    if factor == 1:
        return plain_inv_freq(base, head_dim), 1.0
    return SCALINGS[scaling](base, head_dim, train_len, factor, beta_fast, beta_slow)
