"""Describe the variants of a scale: per-layer heads and d_h, parameters, training FLOPs per
token (6N + 12·L·d·T) and the design-rule diagnostics.

    python reproduce/describe.py --scale 124m
    python reproduce/describe.py --scale 757m --schedule prism --schedule 6x6,16x18 --json
    python reproduce/describe.py --scale 124m --enumerate --smooth --max-head-dim 256 --limit 20

--enumerate lists the valid schedules of the scale's shape under the §2.1 rules (and the
optional design filters), for grid searches beyond Table 5.
"""

from __future__ import annotations

import argparse
import json
import sys

from rich.console import Console
from rich.table import Table

from prism.cli.exits import run_command
from prism.config.describe import default_variants, describe_variant
from prism.config.schema import load_config, repeated_keys
from prism.core.schedule import ScheduleFilter, compact_text, count_schedules, iter_schedules
from prism.errors import UsageError


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--scale", required=True, help="any configs/scale/<scale>.yaml, e.g. tiny or 124m")
    parser.add_argument(
        "--schedule",
        action="append",
        default=None,
        help="a schedule name (uniform, prism, config-3, ...) or head list "
        "('3x2,6x2,8x2,12x6'); repeatable; default: uniform and every named one",
    )
    parser.add_argument("--json", action="store_true", help="one JSON object per variant, one per line")
    parser.add_argument("--enumerate", action="store_true", help="list the valid schedules of this shape")
    parser.add_argument("--smooth", action="store_true", help="--enumerate: early phases of 2-4 layers")
    parser.add_argument(
        "--baseline-preservation", action="store_true", help="--enumerate: at least half the layers at h_base"
    )
    parser.add_argument("--power-of-two", action="store_true", help="--enumerate: early d_h powers of two")
    parser.add_argument("--max-head-dim", type=int, default=None, help="--enumerate: largest early d_h")
    parser.add_argument("--limit", type=int, default=50, help="--enumerate: schedules to print (0 = all)")
    parser.add_argument("overrides", nargs="*", help="key=value config overrides")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return run_command(lambda: _describe(args), interrupted="nothing was written; run the same command again")


def _describe(args: argparse.Namespace) -> int:
    for warning in repeated_keys(args.overrides):
        print(f"warning: {warning}", file=sys.stderr)
    if args.enumerate:
        return enumerate_schedules(args)
    cfg = load_config(args.scale, args.overrides)
    specs = args.schedule or default_variants(cfg)
    variants = [describe_variant(cfg, s) for s in specs]
    if args.json:
        from prism.train.batch import auto_micro_batch, requested_devices
        from prism.train.memory import estimate_memory, fit_micro_batch

        devices = requested_devices(cfg) * int(cfg.train.num_nodes)
        plan = fit_micro_batch if auto_micro_batch(cfg) else estimate_memory  # auto: its choice
        memory = plan(cfg, devices).to_dict()  # every variant's (heads change < 0.1 %)
        for v in variants:
            print(json.dumps({**v, "memory": memory}, sort_keys=True))
        return 0
    console = Console()
    m = cfg.model
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


def enumerate_schedules(args) -> int:
    cfg = load_config(args.scale, args.overrides)
    if args.limit < 0 or (args.max_head_dim is not None and args.max_head_dim < 1):
        raise UsageError(f"--limit {args.limit} / --max-head-dim {args.max_head_dim}: use positive numbers.")
    rules = ScheduleFilter(
        smooth=args.smooth,
        baseline_preservation=args.baseline_preservation,
        power_of_two=args.power_of_two,
        max_head_dim=args.max_head_dim,
    )
    total = count_schedules(cfg.shape, rules)
    shown = 0
    for schedule in iter_schedules(cfg.shape, rules):
        if args.limit and shown >= args.limit:
            break
        print(f"{schedule.text()}\td_h {compact_text([cfg.model.d_model // h for h in schedule.heads])}")
        shown += 1
    print(
        f"{total:,} valid schedule(s) of L={cfg.shape.n_layer}, d_model={cfg.shape.d_model}, "
        f"h_base={cfg.shape.h_base} under these rules; {shown} shown",
        file=sys.stderr,
    )
    return 0
