"""What describe.py prints of a scale's variants: each variant's description (prism.config.describe),
as a table with its design-rule diagnostics, or as JSON with the memory plan of its training run."""

from __future__ import annotations

import json

from prism.config.describe import default_variants, describe_variant, diagnostic_lines, variants_table
from prism.config.schema import RunConfig
from prism.train.batch import auto_micro_batch, world_size


def variant_records(cfg: RunConfig, specs: list[str]) -> list[dict]:
    """One JSON-ready record a variant, with the memory plan of the run on its requested devices."""
    from prism.train.memory import estimate_memory, fit_micro_batch

    plan = fit_micro_batch if auto_micro_batch(cfg) else estimate_memory
    memory = plan(cfg, world_size(cfg)).to_dict()
    return [{**describe_variant(cfg, spec), "memory": memory} for spec in specs]


def print_variants(cfg: RunConfig, specs: list[str] | None, as_json: bool) -> None:
    """The variants `specs` (default: uniform and every named one): a JSON record a line, or a table
    and the diagnostics."""
    specs = specs or default_variants(cfg)
    if as_json:
        print("\n".join(json.dumps(r, sort_keys=True) for r in variant_records(cfg, specs)))
        return
    from rich.console import Console

    variants, console = [describe_variant(cfg, s) for s in specs], Console()
    console.print(variants_table(cfg, variants))
    for line in diagnostic_lines(variants):
        console.print(line, markup=False, highlight=False)
