"""run_all over a ladder (configs/ladder/<name>.yaml): every rung's orchestration in turn, with
the same seeds, schedules, stages and overrides, after checking that the rungs share one recipe;
with --dry-run, one table of what each rung costs (docs/scales.md)."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from prism.config.describe import count_params
from prism.config.ladder import check_rung_sizes, ladder_scales
from prism.config.schema import RunConfig, to_dict
from prism.errors import ConfigError
from prism.pipeline import load_run_config, run_all
from prism.pipeline.estimate import estimate, human_bytes
from prism.runs.identity import recipe_differences, recipe_of, training_identity

REPORT_STAGE = "report"
SUMMARY_GPUS = 8  # the paper's node: 8x H100 (Table 2)


def _value(d: dict, dotted: str):
    for part in dotted.split("."):
        d = d.get(part) if isinstance(d, dict) else None
    return d


def check_recipes(ladder: str, configs: dict[str, RunConfig]) -> None:
    """ConfigError (one sentence) when a rung's recipe (prism.runs.identity.recipe_of) differs
    from the first rung's: a fit across scales must compare like with like."""
    recipes = {s: recipe_of(training_identity(to_dict(cfg))) for s, cfg in configs.items()}
    first, *rest = recipes
    for scale in rest:
        diff = recipe_differences(recipes[first], recipes[scale])
        if diff:
            key = diff[0]
            raise ConfigError(
                f"ladder {ladder!r} mixes recipes: rung {scale} has {key}="
                f"{_value(recipes[scale], key)!r} where {first} has {_value(recipes[first], key)!r}; "
                f"rungs may differ only in shape, size, schedule and seed (prism.runs.identity.SCALE_KEYS)."
            )


def run_ladder(
    ladder: str,
    overrides: list[str],
    seeds: list[int] | None = None,
    schedules: list[str] | None = None,
    stages: list[str] | None = None,
    dry_run: bool = False,
    console: Console | None = None,
    **run_all_options,
) -> int:
    """run_all for each rung, smallest first; the report stage (if selected) only after the last
    rung. Stops at the first rung that does not end with 0 and returns its exit code."""
    console = console or Console()
    scales = ladder_scales(ladder)
    configs = {s: load_run_config(s, overrides, seeds, schedules) for s in scales}
    check_rung_sizes(ladder, configs)  # before any rung plans or writes anything
    check_recipes(ladder, configs)
    for i, scale in enumerate(scales):
        last = i == len(scales) - 1
        selected = [s for s in stages or configs[scale].run_all.stages if last or s != REPORT_STAGE]
        if not selected:
            continue
        console.rule(f"[bold]ladder {escape(ladder)}: rung {i + 1} of {len(scales)}, {scale}")
        code = run_all(
            scale, overrides, seeds, schedules, selected, dry_run=dry_run, console=console, **run_all_options
        )
        if code:
            console.print(f"[bold red]ladder {escape(ladder)} stopped at rung {scale}[/] (exit code {code}).")
            return code
    if dry_run:
        show_ladder(ladder, configs, console)
    return 0


def _number(x: float, decimals: int = 1) -> str:
    """`decimals` places, or two significant figures below 1 (a CPU rung's hours are not 0.0)."""
    return f"{x:,.{decimals}f}" if x >= 1 or x == 0 else f"{x:.2g}"


def show_ladder(ladder: str, configs: dict[str, RunConfig], console: Console) -> None:
    """One row per rung: size, tokens, LR, Prism schedule, GPU-hours of all its runs and their
    wall time on 8 GPUs (at the paper's rate, else estimated from FLOPs: marked *), disk."""
    table = Table(title=f"ladder {ladder}: every rung, all its runs")
    columns = ("rung", "params", "tokens", "tokens/param", "peak LR", "Prism schedule", "runs")
    columns += ("GPU-h", f"h on {SUMMARY_GPUS} GPUs", "disk")
    for col in columns:
        table.add_column(col, justify="left" if col in ("rung", "Prism schedule") else "right", no_wrap=True)
    notes: list[str] = []
    for scale, cfg in configs.items():
        costs = estimate(cfg)
        n = count_params(cfg)
        rate = costs.paper_tps_per_gpu or costs.flops_tps_per_gpu  # flops_basis says how that was found
        gpu_h = costs.tokens * len(costs.runs) / rate / 3600 if rate else None
        mark = "" if costs.paper_tps_per_gpu or gpu_h is None else "*"
        if mark:
            notes.append(f"{scale}: {costs.flops_basis}")
        table.add_row(
            scale,
            f"{n / 1e6:,.1f}M",
            f"{costs.tokens:,}",
            _number(costs.tokens / n),
            f"{cfg.train.lr:.1e}",
            cfg.head_schedule("prism").text(),
            str(len(costs.runs)),
            "n/a" if gpu_h is None else f"{_number(gpu_h)}{mark}",
            "n/a" if gpu_h is None else f"{_number(gpu_h / SUMMARY_GPUS, 2)}{mark}",
            human_bytes(costs.disk_max),
        )
    console.print(table)
    console.print("GPU-h: all the rung's runs at the paper's tokens/s per H100 (Table 2 total / 8).")
    if notes:
        console.print("* a scale the paper did not train, its rate estimated from FLOPs (no measurement):")
    for note in notes:
        console.print(f"  * {escape(note)}", highlight=False)
