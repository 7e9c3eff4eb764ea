"""What describe.py --json prints of a scale's variants: each variant's description
(prism.config.describe) with the memory plan of its training run."""

from __future__ import annotations

from prism.config.describe import describe_variant
from prism.config.schema import RunConfig
from prism.train.batch import auto_micro_batch, requested_devices


def variant_records(cfg: RunConfig, specs: list[str]) -> list[dict]:
    """One JSON-ready record a variant; the memory plan is the run's on its requested devices
    (with train.micro_batch=auto, the one the plan chooses), every variant's the same (the heads
    change it by less than 0.1 %)."""
    from prism.train.memory import estimate_memory, fit_micro_batch

    devices = requested_devices(cfg) * int(cfg.train.num_nodes)
    plan = fit_micro_batch if auto_micro_batch(cfg) else estimate_memory
    memory = plan(cfg, devices).to_dict()
    return [{**describe_variant(cfg, spec), "memory": memory} for spec in specs]
