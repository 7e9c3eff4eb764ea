"""What a scale's variants look like: heads and d_h per layer, parameters, FLOPs, design rules.

Models are built on the meta device, so even 757M is described in well under a second."""

from __future__ import annotations

import torch

from prism.config.schema import RunConfig, load_config
from prism.core.model import PrismDecoder, flops_per_token


def meta_model(cfg: RunConfig, spec: str = "uniform") -> PrismDecoder:
    """The decoder of a variant on the meta device: shapes only, no memory, no init."""
    with torch.device("meta"):
        return PrismDecoder(cfg.model_config(spec))


def count_params(cfg: RunConfig) -> int:
    """Unique parameters of the scale's model (the same for every schedule)."""
    return meta_model(cfg).num_params()


def by_size(scales: list[str], config_dir=None) -> list[str]:
    """Scale names ordered small to large by parameter count (the name breaks a tie), so that
    tables and fits list any scales, not only the paper's, in order of size."""
    return sorted(scales, key=lambda s: (count_params(load_config(s, config_dir=config_dir)), s))


def describe_variant(cfg: RunConfig, spec: str) -> dict:
    model = meta_model(cfg, spec)
    model_cfg = model.cfg
    n_params = model.num_params()
    sched = model_cfg.schedule
    return {
        "scale": cfg.scale,
        "schedule_name": sched.name,
        "schedule_text": sched.text(),
        "heads": list(sched.heads),
        "head_dims": list(sched.head_dims),
        "n_params": n_params,
        "n_params_non_embedding": model.num_params(include_embedding=False),
        "flops_per_token": flops_per_token(model_cfg, model.flop_params()),
        "seq_len": model_cfg.seq_len,
        "diagnostics": [d.to_dict() for d in sched.diagnostics()],
    }


def default_variants(cfg: RunConfig) -> list[str]:
    """uniform first, then every named schedule of this shape (Table 4's prism, Table 5's configs)."""
    names = ["uniform", *cfg.schedules]
    return list(dict.fromkeys(names))
