"""The paper's optimizer (§3.1): AdamW with decay on matrices only, and linear warmup into a cosine
decay; the one factory of every training loop (PrismLM, the overhead check, the benchmark)."""

from __future__ import annotations

import math

import torch

from prism.core.model import param_groups


def warmup_steps(max_steps: int, warmup_frac: float) -> int:
    """Warmup over the first `warmup_frac` of tokens; every step holds the same number of tokens,
    so that is the same fraction of steps (2.5 % of 11,000 = 275 at 124M)."""
    return int(round(warmup_frac * max_steps))


def lr_factor(step: int, max_steps: int, warmup: int, min_ratio: float) -> float:
    """Multiplier of the peak LR for optimizer step `step` (0-based): linear warmup to the peak
    at step `warmup - 1`, then a half cosine from the peak down to `min_ratio` at the last step."""
    if step < warmup:
        return (step + 1) / warmup
    span = max(1, max_steps - 1 - warmup)
    progress = min(1.0, (step - warmup) / span)
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def auto_flag(setting: bool | None, device: torch.device) -> bool:
    """A switch that is true, false, or None for auto = on for CUDA (train.compile, train.fused)."""
    return device.type == "cuda" if setting is None else bool(setting)


def make_optimizer(model: torch.nn.Module, train: dict, max_steps: int, device: torch.device):
    """AdamW (fused on CUDA unless train.fused says otherwise) and the warmup + cosine LambdaLR, from
    the `train` section as a plain dict (lr, weight_decay, beta1, beta2, eps, warmup_frac, min_lr_ratio,
    fused)."""
    optimizer = torch.optim.AdamW(
        param_groups(model, train["weight_decay"]),
        lr=train["lr"],
        betas=(train["beta1"], train["beta2"]),
        eps=train["eps"],
        fused=auto_flag(train.get("fused"), device),
    )
    warmup = warmup_steps(max_steps, train["warmup_frac"])
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_factor(step, max_steps, warmup, train["min_lr_ratio"])
    )
    return optimizer, scheduler
