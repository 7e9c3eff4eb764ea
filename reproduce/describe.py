"""Describe the variants of a scale: per-layer heads and d_h, parameters, training FLOPs per
token (6N + 12·L·d·T) and the design-rule diagnostics.

    python reproduce/describe.py --scale 124m
    python reproduce/describe.py --scale 757m --schedule prism --schedule 6x6,16x18 --json
"""

from __future__ import annotations

import argparse
import json
import sys

from rich.console import Console
from rich.table import Table

from prism.config import ConfigError, load_config
from prism.describe import default_variants, describe_variant
from prism.schedule import ScheduleError, compact_text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--scale", required=True, help="tiny, 124m, 354m or 757m")
    parser.add_argument(
        "--schedule",
        action="append",
        default=None,
        help="a schedule name (uniform, prism, config-3, ...) or head list "
        "('3x2,6x2,8x2,12x6'); repeatable; default: uniform and every named one",
    )
    parser.add_argument("--json", action="store_true", help="one JSON object per variant, one per line")
    parser.add_argument("overrides", nargs="*", help="key=value config overrides")
    args = parser.parse_args(argv)
    try:
        cfg = load_config(args.scale, args.overrides)
        specs = args.schedule or default_variants(cfg)
        variants = [describe_variant(cfg, s) for s in specs]
    except (ConfigError, ScheduleError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        for v in variants:
            print(json.dumps(v, sort_keys=True))
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


if __name__ == "__main__":
    sys.exit(main())
