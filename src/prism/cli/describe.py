"""Describe the variants of a scale, or list its valid schedules (docs/commands.md#describepy)."""

from __future__ import annotations

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
    from prism.config.schema import load_config

    cfg = load_config(scale, overrides)
    if enumerate:
        from prism.config.describe import print_schedules
        from prism.core.schedule import ScheduleFilter

        print_schedules(cfg, ScheduleFilter(smooth, baseline_preservation, power_of_two, max_head_dim), limit)
    else:
        from prism.train.describe import print_variants

        print_variants(cfg, schedule, json)
    return 0


main = command(describe)
