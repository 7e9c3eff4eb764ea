"""A ladder of scales, configs/ladder/<name>.yaml, and the rules that size a rung from its
parameter count: peak LR 6e-4 x (124M / N)^0.5 and 25 training tokens per parameter (docs/scales.md)."""

from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf

from prism.config.describe import by_size, count_params
from prism.config.schema import RunConfig, available_scales, default_config_dir, load_yaml
from prism.errors import ConfigError

LR_AT_REFERENCE = 6.0e-4  # Table 1, 124M
REFERENCE_PARAMS = 124_000_000  # Table 1's 124M as printed
LR_EXPONENT = 0.5  # the fitted slope is -0.49 (docs/scales.md)
TOKENS_PER_PARAM = 25  # Table 1: 23.3 (124M), 29.6 (354M), 27.7 (757M)
TOKENS_PER_PARAM_RANGE = (23, 30)
MIN_RUNGS = 3  # E, A and alpha of L(N) = E + A * N^-alpha


def peak_lr(n_params: int) -> float:
    """The peak LR for `n_params` parameters (count_params), to 2 significant figures:
    6e-4 x (124M / N)^0.5."""
    return float(f"{LR_AT_REFERENCE * (REFERENCE_PARAMS / n_params) ** LR_EXPONENT:.2g}")


def training_tokens(n_params: int, global_batch_tokens: int) -> int:
    """25 tokens per parameter, rounded to whole steps of `global_batch_tokens` (at least one)."""
    return max(1, round(TOKENS_PER_PARAM * n_params / global_batch_tokens)) * global_batch_tokens


def ladder_scales(name: str, config_dir: Path | str | None = None) -> list[str]:
    """The rungs of ladder `name`, smallest first as its file lists them; ConfigError (one sentence)
    for an unknown ladder, a rung without a scale file, or rungs that cannot be fitted."""
    config_dir = Path(config_dir or default_config_dir())
    ladders = sorted(p.stem for p in (config_dir / "ladder").glob("*.yaml"))
    if name not in ladders:
        valid = ", ".join(ladders) or f"none (no {config_dir / 'ladder'}/*.yaml)"
        raise ConfigError(f"unknown ladder {name!r}: valid ladders are {valid}.")
    path = config_dir / "ladder" / f"{name}.yaml"
    doc = load_yaml(path)
    scales = doc.get("scales") if OmegaConf.is_dict(doc) else None
    if not OmegaConf.is_list(scales) or not all(isinstance(s, str) for s in scales):
        raise ConfigError(f"ladder file {path} needs `scales: [...]`, a list of scale names, smallest first.")
    scales = [str(s) for s in scales]
    if len(scales) < MIN_RUNGS:
        raise ConfigError(
            f"ladder {name!r} has {len(scales)} scale(s) ({', '.join(scales) or 'none'}); a fit of E, "
            f"A and α needs at least three scales."
        )
    twice = [s for i, s in enumerate(scales) if s in scales[:i]]
    if twice:
        raise ConfigError(f"ladder {name!r} lists scale {twice[0]!r} twice; give each rung once.")
    valid = available_scales(config_dir)
    for scale in scales:
        if scale not in valid:
            raise ConfigError(
                f"ladder {name!r} has rung {scale!r}, which has no file {config_dir / 'scale'}/"
                f"{scale}.yaml; valid scales are {', '.join(valid)}."
            )
    ordered = by_size(scales, config_dir)
    if ordered != scales:  # the rungs run, and tables list them, in the file's order
        raise ConfigError(
            f"ladder {name!r} lists {', '.join(scales)}; list them smallest first: {', '.join(ordered)}."
        )
    return scales


def check_rung_sizes(name: str, configs: dict[str, RunConfig]) -> None:
    """ConfigError naming the first rung whose resolved model (overrides applied) is not larger than
    the one before it: the fit across scales would refuse it only after every rung had trained."""
    sizes = {scale: count_params(cfg) for scale, cfg in configs.items()}
    for before, rung in zip(sizes, list(sizes)[1:]):
        if sizes[rung] <= sizes[before]:
            shape = ", ".join(
                f"{s} {configs[s].model.n_layer} x {configs[s].model.d_model} = {sizes[s]:,} parameters"
                for s in (before, rung)
            )
            raise ConfigError(
                f"ladder {name!r} has rung {rung} no larger than the rung before it ({shape}); every "
                f"rung must be larger than the one before, so give each rung its own size (model.* "
                f"overrides apply to every rung)."
            )
