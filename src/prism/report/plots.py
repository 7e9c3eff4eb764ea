"""PNG plots for the report: validation loss vs tokens, Δ loss vs tokens (Figure 3a), zero-shot
scores vs tokens and ΔD_l per layer (Figure 4). Rendered with matplotlib's Agg backend and no
`Software` metadata so the same data always gives the same bytes."""

from __future__ import annotations

import io
from typing import Callable

from prism.report.collect import ScaleResults, schedule_order
from prism.report.dynamics import delta_curve, mean_curve
from prism.report.fmt import seeds_text
from prism.report.paper import PaperTables
from prism.report.recipes import runs_differ
from prism.report.tables import main_schedules
from prism.report.zeroshot_curve import (
    Curves,
    Point,
    curves,
    metric_for,
    schedule_points,
    task_title,
    unit,
    zeroshot_plot_name,
)
from prism.runs.layout import plot_name

COLORS = {"uniform": "#4d4d4d", "prism": "#d62728"}
LINE_STYLES = {"uniform": {"marker": "o", "ms": 7, "ls": "-"}, "prism": {"marker": "s", "ms": 4, "ls": "--"}}


def render_png(title: str, xlabel: str, ylabel: str, draw: Callable) -> bytes:
    """One PNG: matplotlib's default style (not a machine's matplotlibrc; DejaVu Sans ships with
    matplotlib, so glyphs match everywhere), Agg, and no `Software` metadata, so the same data
    always gives the same bytes. `draw(ax)` puts the data on the axes."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt
    import matplotlib.style

    with matplotlib.style.context(["default", {"font.family": "DejaVu Sans"}]):
        fig = plt.figure(figsize=(6.4, 4.0), dpi=100)
        ax = fig.add_subplot()
        draw(ax)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend()
        buf = io.BytesIO()
        fig.tight_layout()
        fig.savefig(buf, format="png", metadata={"Software": None})
        plt.close(fig)
        return buf.getvalue()


def _paper_points_and_zero(ax, xs: list, ys: list, label: str) -> None:
    """The paper's points read off its figure (black crosses) and the zero line of a Δ plot."""
    if xs:
        ax.scatter(xs, ys, marker="x", color="black", zorder=3, label=label)
    ax.axhline(0.0, color="black", lw=0.8)


def val_loss_plot(res: ScaleResults) -> bytes | None:
    curves = {s: mean_curve(res, s) for s in sorted(res.runs, key=schedule_order)}
    curves = {s: c for s, c in curves.items() if c}
    if not curves:
        return None

    def draw(ax):
        for s, c in curves.items():
            ax.plot(
                [t for t, _, _ in c],
                [v for _, v, _ in c],
                label=f"{s} ({seeds_text(c[0][2])})",
                color=COLORS.get(s),
                lw=1.5,
            )

    return render_png(
        f"{res.scale}: validation loss", "tokens seen", "validation loss (mean over seeds)", draw
    )


def delta_loss_plot(res: ScaleResults, tables: PaperTables) -> bytes | None:
    curve = delta_curve(res)
    if not curve:
        return None
    paper = tables.delta_loss_points(res.scale)

    def draw(ax):
        ax.plot(
            [t for t, _, _ in curve],
            [d for _, d, _ in curve],
            color=COLORS["prism"],
            lw=1.5,
            label=f"reproduced ({seeds_text(curve[0][2])})",
        )
        _paper_points_and_zero(
            ax, [p["tokens"] for p in paper], [p["delta"] for p in paper], "paper Fig. 3a (read off the plot)"
        )

    return render_png(
        f"{res.scale}: Δ validation loss (cf. Figure 3a)",
        "tokens seen",
        "Δ validation loss (Prism − uniform)",
        draw,
    )


def _documents(limit) -> str:
    return "all documents" if limit is None else f"first {limit} documents per task"


def _spread_label(schedule: str, seeds: int) -> str:
    return f"{schedule} (mean ± s.d. of {seeds} seeds)" if seeds > 1 else f"{schedule} (1 seed)"


def zeroshot_plot(res: ScaleResults, c: Curves, task: str, metric: str, title: str) -> bytes:
    """One task's score vs tokens: a line per schedule through the seed means, with a ±1 s.d.
    band where the schedule has two or more seeds."""

    def draw(ax):
        for s in c.schedules():
            pts = [p for p in schedule_points(c, s, task, metric).values() if isinstance(p, Point)]
            if not pts:
                continue
            x, y = [p.tokens for p in pts], [p.mean for p in pts]
            color = COLORS.get(s)
            # equal scores are common (a multiple of 1/limit), so each schedule keeps its own marker
            # and line style and a line drawn over another stays visible
            style = LINE_STYLES.get(s, {"marker": "^", "ms": 5, "ls": ":"})
            line = ax.plot(x, y, lw=1.5, color=color, label=_spread_label(s, pts[0].seeds), **style)
            if pts[0].seeds > 1:
                ax.fill_between(
                    x,
                    [p.mean - p.sd for p in pts],
                    [p.mean + p.sd for p in pts],
                    color=line[0].get_color(),
                    alpha=0.2,
                    lw=0,
                )

    return render_png(
        f"{res.scale}: {title} {metric} vs tokens ({_documents(c.settings['limit'])})",
        "tokens seen",
        f"{metric.replace('_', ' ')} ({unit(metric)})",
        draw,
    )


def zeroshot_plots(res: ScaleResults, tables: PaperTables) -> dict[str, bytes]:
    c = curves(res, main_schedules(res, tables))
    if c is None:
        return {}
    out = {}
    for task in c.settings["tasks"]:
        metric = metric_for(task, c)
        if metric is not None:
            out[zeroshot_plot_name(res.scale, task)] = zeroshot_plot(
                res, c, task, metric, task_title(task, tables)
            )
    return out


def delta_distance_plot(res: ScaleResults, tables: PaperTables) -> bytes | None:
    a = res.analysis
    deltas = {
        k: v
        for k, v in sorted(((a.delta if a else None) or {}).items())
        if v.mean and not runs_differ(res, ("uniform", k))  # unlike runs are not compared
    }
    if not deltas:
        return None
    paper = tables.delta_distance(res.scale)

    def draw(ax):
        for s, d in deltas.items():
            seeds = len(d.seeds or [])
            layers = list(range(len(d.mean)))
            err = d.std if seeds > 1 else None
            ax.errorbar(
                layers,
                d.mean,
                yerr=err,
                marker="o",
                ms=4,
                capsize=3,
                lw=1.2,
                color=COLORS.get(s),
                label=f"{s} ({seeds_text(seeds)})",
            )
        _paper_points_and_zero(
            ax,
            sorted(paper),
            [paper[l]["delta_D"] for l in sorted(paper)],
            "paper Fig. 4 (read off the plot)",
        )

    return render_png(
        f"{res.scale}: attention distance change (cf. Figure 4)",
        "layer",
        "ΔD_l = D_l(schedule) − D_l(uniform), tokens",
        draw,
    )


def all_plots(res: ScaleResults, tables: PaperTables) -> dict[str, bytes]:
    """file name -> PNG bytes for the plots this scale has data for."""
    out = {}
    for name, png in (
        (plot_name(res.scale, "val-loss"), val_loss_plot(res)),
        (plot_name(res.scale, "delta-loss"), delta_loss_plot(res, tables)),
        (plot_name(res.scale, "delta-distance"), delta_distance_plot(res, tables)),
    ):
        if png is not None:
            out[name] = png
    out.update(zeroshot_plots(res, tables))
    return out
