"""What a scale's variants look like: heads and d_h per layer, parameters, FLOPs, design rules;
models are built on the meta device, so even 757M is described in well under a second."""

from __future__ import annotations

import sys
from itertools import islice

import torch

from prism.config.schema import RunConfig, load_config
from prism.core.model import PrismDecoder, flops_per_token
from prism.core.schedule import compact_text, count_schedules, iter_schedules


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
    """The description of one variant: its heads and d_h per layer, parameters, FLOPs and diagnostics."""
    model = meta_model(cfg, spec)
    model_cfg, sched = model.cfg, model.cfg.schedule
    return {
        "scale": cfg.scale,
        "schedule_name": sched.name,
        "schedule_text": sched.text(),
        "heads": list(sched.heads),
        "head_dims": list(sched.head_dims),
        "n_params": model.num_params(),
        "n_params_non_embedding": model.num_params(include_embedding=False),
        "flops_per_token": flops_per_token(model_cfg, model.flop_params()),
        "seq_len": model_cfg.seq_len,
        "diagnostics": [d.to_dict() for d in sched.diagnostics()],
    }


def default_variants(cfg: RunConfig) -> list[str]:
    """uniform first, then every named schedule of this shape (Table 4's prism, Table 5's configs)."""
    return list(dict.fromkeys(["uniform", *cfg.schedules]))


def variants_table(cfg: RunConfig, variants: list[dict]):
    """The described variants as a rich table: heads, d_h, parameters, GFLOPs/token, rules broken."""
    from rich.table import Table

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
    return table


def diagnostic_lines(variants: list[dict]) -> list[str]:
    """`<variant>: <severity>: <message>`, one per design-rule diagnostic of each variant."""
    return [
        f"{v['schedule_name']}: {d['severity']}: {d['message']}" for v in variants for d in v["diagnostics"]
    ]


def print_schedules(cfg: RunConfig, rules, limit: int) -> None:
    """The first `limit` (0: all) valid schedules of the scale's shape under `rules`
    (prism.core.schedule.ScheduleFilter), a line each with their d_h as they are found; then their
    count on stderr."""
    shape, shown = cfg.shape, 0
    for s in islice(iter_schedules(shape, rules), limit or None):
        print(f"{s.text()}\td_h {compact_text([cfg.model.d_model // h for h in s.heads])}")
        shown += 1
    print(
        f"{count_schedules(shape, rules):,} valid schedule(s) of L={shape.n_layer}, "
        f"d_model={shape.d_model}, h_base={shape.h_base} under these rules; {shown} shown",
        file=sys.stderr,
    )
