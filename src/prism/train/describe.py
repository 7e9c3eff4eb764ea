"""What describe.py --json prints of a scale's variants: each variant's description
(prism.config.describe) with the memory plan of its training run."""

from __future__ import annotations

from prism.config.describe import describe_variant
from prism.config.schema import RunConfig
from prism.train.batch import auto_micro_batch, world_size


def variant_records(cfg: RunConfig, specs: list[str]) -> list[dict]:
    """One JSON-ready record a variant, with the memory plan of the run on its requested devices."""
    from prism.train.memory import estimate_memory, fit_micro_batch

    plan = fit_micro_batch if auto_micro_batch(cfg) else estimate_memory
    memory = plan(cfg, world_size(cfg)).to_dict()
    return [{**describe_variant(cfg, spec), "memory": memory} for spec in specs]
