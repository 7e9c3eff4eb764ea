"""Describe the variants of a scale: per-layer heads and d_h, parameters, training FLOPs per
token (6N + 12·L·d·T) and the design-rule diagnostics (docs/commands.md#describepy)."""

from __future__ import annotations

import json
import sys
from typing import Annotated, Optional

from prism.cli.command import APPEND, run
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
        scale: any configs/scale/<scale>.yaml, e.g. tiny or 124m
        schedule: a schedule name (uniform, prism, config-3, ...) or head list ('3x2,6x2,8x2,12x6');
            repeatable; default: uniform and every named one
        json: one JSON object per variant, one per line
        enumerate: list the valid schedules of this shape under the §2.1 rules
        smooth: --enumerate: early phases of 2-4 layers
        baseline_preservation: --enumerate: at least half the layers at h_base
        power_of_two: --enumerate: early d_h powers of two
        max_head_dim: --enumerate: largest early d_h
        limit: --enumerate: schedules to print (0 = all)
        overrides: key=value config overrides
    """
    from prism.config.schema import load_config

    cfg = load_config(scale, overrides)
    if enumerate:
        from prism.core.schedule import ScheduleFilter

        rules = ScheduleFilter(smooth, baseline_preservation, power_of_two, max_head_dim)
        return enumerate_schedules(cfg, rules, limit)
    from prism.config.describe import default_variants, describe_variant

    variants = [describe_variant(cfg, s) for s in schedule or default_variants(cfg)]
    if json:
        return print_json(cfg, variants)
    from rich.console import Console
    from rich.table import Table

    from prism.core.schedule import compact_text

    console, m = Console(), cfg.model
    table = Table(
        title=f"scale {cfg.scale}: L={m.n_layer}, d_model={m.d_model}, h_base={m.h_base}, T={m.seq_len}"
    )
    for col in ("variant", "heads", "d_h", "params", "GFLOPs/token", "design rules"):
        table.add_column(col, overflow="fold")
    for v in variants:
        rules = ", ".join(sorted({d["rule"] for d in v["diagnostics"]})) or "all met"
        table.add_row(
            v["schedule_name"],
            v["schedule_text"],
            compact_text(v["head_dims"]),
            f"{v['n_params']:,}",
            f"{v['flops_per_token'] / 1e9:.3f}",
            rules,
        )
    console.print(table)
    for v in variants:
        for d in v["diagnostics"]:
            console.print(
                f"{v['schedule_name']}: {d['severity']}: {d['message']}", markup=False, highlight=False
            )
    return 0


def print_json(cfg, variants: list[dict]) -> int:
    from prism.train.batch import auto_micro_batch, requested_devices
    from prism.train.memory import estimate_memory, fit_micro_batch

    devices = requested_devices(cfg) * int(cfg.train.num_nodes)
    plan = fit_micro_batch if auto_micro_batch(cfg) else estimate_memory  # auto: its choice
    memory = plan(cfg, devices).to_dict()  # every variant's (heads change < 0.1 %)
    for v in variants:
        print(json.dumps({**v, "memory": memory}, sort_keys=True))
    return 0


def enumerate_schedules(cfg, rules, limit: int) -> int:
    from itertools import islice

    from prism.core.schedule import compact_text, count_schedules, iter_schedules

    shown = 0
    for schedule in islice(iter_schedules(cfg.shape, rules), limit or None):
        print(f"{schedule.text()}\td_h {compact_text([cfg.model.d_model // h for h in schedule.heads])}")
        shown += 1
    print(
        f"{count_schedules(cfg.shape, rules):,} valid schedule(s) of L={cfg.shape.n_layer}, "
        f"d_model={cfg.shape.d_model}, h_base={cfg.shape.h_base} under these rules; {shown} shown",
        file=sys.stderr,
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    return run(describe, argv, "describe.py", interrupted="nothing was written; run the same command again")
