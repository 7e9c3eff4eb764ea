"""Describe the variants of a scale, or list its valid schedules (docs/commands.md#describepy)."""

from __future__ import annotations

import sys
from json import dumps
from typing import Annotated, Optional

from prism.cli.command import APPEND, command
from prism.config.values import at_least_zero, positive


def describe(
    scale: str,
    schedule: Annotated[Optional[list[str]], APPEND] = None,
    json: bool = False,
    enumerate: bool = False,
    smooth: bool = False,
    baseline_preservation: bool = False,
    power_of_two: bool = False,
    max_head_dim: Annotated[Optional[int], positive("use a positive head dim")] = None,
    limit: Annotated[int, at_least_zero("use 0 (all) or a positive count")] = 50,
    overrides: list[str] = (),
) -> int:
    """Describe the variants of a scale: heads and d_h per layer, parameters, FLOPs per token and
    the design-rule diagnostics; or list the valid schedules of its shape.

    Args:
        schedule: a schedule name (uniform, prism, config-3, ...) or head list ('3x2,6x2,8x2,12x6');
            repeatable; default: uniform and every named one
        json: one JSON object per variant, one per line
        enumerate: list the valid schedules of this shape under the §2.1 rules
        smooth: --enumerate: early phases of 2-4 layers
        baseline_preservation: --enumerate: at least half the layers at h_base
        power_of_two: --enumerate: early d_h powers of two
        max_head_dim: --enumerate: largest early d_h
        limit: --enumerate: schedules to print (0 = all)
    """
    from prism.config.describe import default_variants, describe_variant, listed_schedules, schedules_counted
    from prism.config.schema import load_config

    cfg = load_config(scale, overrides)
    if enumerate:
        from prism.core.schedule import ScheduleFilter

        rules, shown = ScheduleFilter(smooth, baseline_preservation, power_of_two, max_head_dim), 0
        for line in listed_schedules(cfg, rules, limit):
            print(line)
            shown += 1
        print(schedules_counted(cfg, rules, shown), file=sys.stderr)
        return 0
    specs = schedule or default_variants(cfg)
    if json:
        from prism.train.describe import variant_records

        print("\n".join(dumps(r, sort_keys=True) for r in variant_records(cfg, specs)))
        return 0
    from rich.console import Console

    from prism.config.describe import diagnostic_lines, variants_table

    variants = [describe_variant(cfg, s) for s in specs]
    console = Console()
    console.print(variants_table(cfg, variants))
    for line in diagnostic_lines(variants):
        console.print(line, markup=False, highlight=False)
    return 0


main = command(describe)
