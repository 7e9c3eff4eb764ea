"""The report's PNG plots, rendered by render_png so that the same data always gives the same bytes."""

from __future__ import annotations

import io
from typing import Callable

from prism.report.collect import ScaleResults, schedule_order
from prism.report.dynamics import delta_curve, mean_curve
from prism.report.fmt import level_text, seeds_text
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
from prism.runs.records import AtScale, Curve, IntervalDoc, ScalingDoc
from prism.stats import mean

COLORS = {"uniform": "#4d4d4d", "prism": "#d62728"}
LINE_STYLES = {"uniform": {"marker": "o", "ms": 7, "ls": "-"}, "prism": {"marker": "s", "ms": 4, "ls": "--"}}


def render_png(title: str, xlabel: str, ylabel: str, draw: Callable) -> bytes:
    """One PNG, `draw(ax)` putting the data on the axes: matplotlib's default style and DejaVu Sans
    (shipped with matplotlib, so the glyphs match everywhere; not a machine's matplotlibrc), Agg, no
    `Software` metadata: the same data, the same bytes."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt
    import matplotlib.style

    with matplotlib.style.context(["default", {"font.family": "DejaVu Sans"}]):
        fig = plt.figure(figsize=(6.4, 4.0), dpi=100)
        ax = fig.add_subplot()
        draw(ax)
        ax.set(xlabel=xlabel, ylabel=ylabel, title=title)
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


def loss_lines_plot(
    title: str, xlabel: str, curves: dict[str, list[tuple[float, float, int]]]
) -> bytes | None:
    """Mean validation loss of each schedule through [(x, loss, seeds)]; None without a point."""
    curves = {s: c for s, c in curves.items() if c}
    if not curves:
        return None

    def draw(ax):
        for s, c in curves.items():
            x, y = [x for x, _, _ in c], [v for _, v, _ in c]
            ax.plot(x, y, label=f"{s} ({seeds_text(c[0][2])})", color=COLORS.get(s), lw=1.5)

    return render_png(title, xlabel, "validation loss (mean over seeds)", draw)


def val_loss_plot(res: ScaleResults) -> bytes | None:
    curves = {s: mean_curve(res, s) for s in sorted(res.runs, key=schedule_order)}
    return loss_lines_plot(f"{res.scale}: validation loss", "tokens seen", curves)


def delta_loss_plot(res: ScaleResults, tables: PaperTables) -> bytes | None:
    curve = delta_curve(res)
    if not curve:
        return None
    paper = tables.delta_loss_points(res.scale)

    def draw(ax):
        x, y = [t for t, _, _ in curve], [d for _, d, _ in curve]
        ax.plot(x, y, color=COLORS["prism"], lw=1.5, label=f"reproduced ({seeds_text(curve[0][2])})")
        xs, ys = [p["tokens"] for p in paper], [p["delta"] for p in paper]
        _paper_points_and_zero(ax, xs, ys, "paper Fig. 3a (read off the plot)")

    title = f"{res.scale}: Δ validation loss (cf. Figure 3a)"
    return render_png(title, "tokens seen", "Δ validation loss (Prism − uniform)", draw)


def zeroshot_plot(res: ScaleResults, c: Curves, task: str, metric: str, title: str) -> bytes:
    """One task's score vs tokens: a line per schedule through the seed means, ±1 s.d. band."""

    def draw(ax):
        for s in c.runs:
            pts = [p for p in schedule_points(c, s, task, metric).values() if isinstance(p, Point)]
            if not pts:
                continue
            x, y = [p.tokens for p in pts], [p.mean for p in pts]
            # equal scores are common (a multiple of 1/limit), so each schedule keeps its own marker
            # and line style and a line drawn over another stays visible
            style = LINE_STYLES.get(s, {"marker": "^", "ms": 5, "ls": ":"})
            n = pts[0].seeds
            label = f"{s} (mean ± s.d. of {n} seeds)" if n > 1 else f"{s} (1 seed)"
            line = ax.plot(x, y, lw=1.5, color=COLORS.get(s), label=label, **style)
            if n > 1:
                lo, hi = [p.mean - p.sd for p in pts], [p.mean + p.sd for p in pts]
                ax.fill_between(x, lo, hi, color=line[0].get_color(), alpha=0.2, lw=0)

    limit = c.settings["limit"]
    documents = "all documents" if limit is None else f"first {limit} documents per task"
    ylabel = f"{metric.replace('_', ' ')} ({unit(metric)})"
    return render_png(f"{res.scale}: {title} {metric} vs tokens ({documents})", "tokens seen", ylabel, draw)


def zeroshot_plots(res: ScaleResults, tables: PaperTables) -> dict[str, bytes]:
    c = curves(res, main_schedules(res, tables))
    if c is None:
        return {}
    metrics = {task: metric_for(task, c) for task in c.settings["tasks"]}
    return {
        zeroshot_plot_name(res.scale, t): zeroshot_plot(res, c, t, m, task_title(t, tables))
        for t, m in metrics.items()
        if m is not None
    }


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
            seeds, layers = len(d.seeds or []), list(range(len(d.mean)))
            style = {"marker": "o", "ms": 4, "capsize": 3, "lw": 1.2, "color": COLORS.get(s)}
            ax.errorbar(
                layers, d.mean, yerr=d.std if seeds > 1 else None, label=f"{s} ({seeds_text(seeds)})", **style
            )
        layers = sorted(paper)
        _paper_points_and_zero(
            ax, layers, [paper[l]["delta_D"] for l in layers], "paper Fig. 4 (read off the plot)"
        )

    title = f"{res.scale}: attention distance change (cf. Figure 4)"
    return render_png(title, "layer", "ΔD_l = D_l(schedule) − D_l(uniform), tokens", draw)


def all_plots(res: ScaleResults, tables: PaperTables) -> dict[str, bytes]:
    """file name -> PNG bytes for the plots this scale has data for."""
    out = {
        plot_name(res.scale, "val-loss"): val_loss_plot(res),
        plot_name(res.scale, "delta-loss"): delta_loss_plot(res, tables),
        plot_name(res.scale, "delta-distance"): delta_distance_plot(res, tables),
    }
    return {name: png for name, png in out.items() if png is not None} | zeroshot_plots(res, tables)


# ----- Across scales -----------------------------------------------------------------------------
def _nan(xs: list) -> list[float]:
    """An unbounded side of an interval (null) as NaN: matplotlib leaves a gap there."""
    return [float("nan") if x is None else float(x) for x in xs]


def _fit(ax, doc: ScalingDoc, curve: Curve, color: str) -> None:
    """The fitted curve along the band's grid of N, with its band."""
    grid = doc.band.n_params
    ax.plot(grid, _nan(curve.value), color=color, lw=1.5, label=f"fit, {level_text(doc.level)} band")
    ax.fill_between(grid, _nan(curve.lo), _nan(curve.hi), color=color, alpha=0.2, lw=0)


def _measured(ax, n_params: list, points: list[IntervalDoc | AtScale], label: str) -> None:
    """Measured values with their interval as error bars, in black; none on an unbounded side."""
    lo = [p.value - p.lo if p.lo is not None else 0.0 for p in points]
    hi = [p.hi - p.value if p.hi is not None else 0.0 for p in points]
    ys = [p.value for p in points]
    ax.errorbar(n_params, ys, yerr=[lo, hi], fmt="o", ms=5, capsize=3, color="black", label=label)


def delta_plot(doc: ScalingDoc, title: str, base: str, schedule: str) -> bytes | None:
    """Δ per scale (mean difference with its Welch interval) and, with a fit, Δ(N) and its band."""
    with_iv = [(r.n_params, r.delta) for r in doc.scales if r.delta]
    bare = [
        (r.n_params, r.mean[schedule] - r.mean[base])
        for r in doc.scales
        if not r.delta and r.mean.get(schedule) is not None and r.mean.get(base) is not None
    ]
    if not with_iv and not bare:
        return None

    def draw(ax):
        if doc.fitted:
            _fit(ax, doc, doc.band.delta, COLORS[schedule])
        if with_iv:
            _measured(ax, *zip(*with_iv), f"measured, {level_text(doc.level)} Welch interval")
        if bare:
            label = "measured, < 2 seeds a side (no interval)"
            ax.scatter(*zip(*bare), marker="o", facecolors="none", edgecolors="black", label=label)
        ax.axhline(0.0, color="black", lw=0.8)
        ax.set_xscale("log")

    return render_png(title, "parameters N", f"Δ validation loss ({schedule} − {base})", draw)


def multiplier_plot(doc: ScalingDoc, title: str, base: str, schedule: str) -> bytes | None:
    """The effective compute multiplier at each measured N and along the fit, with its band."""
    if not doc.fitted or not doc.multiplier:
        return None
    pts = [p for p in doc.multiplier if p.value is not None]

    def draw(ax):
        _fit(ax, doc, doc.band.multiplier, COLORS[schedule])
        label = f"at the measured scales, {level_text(doc.level)} interval"
        _measured(ax, [p.n_params for p in pts], pts, label)
        ax.axhline(1.0, color="black", lw=0.8)
        ax.set_xscale("log")

    return render_png(title, "parameters N", f"compute {base} needs for {schedule}'s loss (×)", draw)


# ----- beyond the training context (`lc`: a prism.report.long_context.LongContextResults) ----------
CHOICE_COLORS = {"none": "#4d4d4d", "linear": "#1f77b4", "ntk": "#2ca02c", "yarn": "#d62728"}
SCHEDULE_STYLES = {"uniform": {"ls": "-", "marker": "o"}, "prism": {"ls": "--", "marker": "s"}}


def _seed_mean(per_seed: dict[int, list[float]]) -> list[float] | None:
    rows = list(per_seed.values())
    if not rows or len({len(r) for r in rows}) != 1:
        return None
    return [mean(col) for col in zip(*rows)]


def _loss_line(lc, s: str, c: str, length: int) -> tuple | None:
    """(schedule, choice, x, y, seeds) of one line of the loss plot, None where it has none."""
    # the position buckets of the first of the schedule's results at `length` tokens
    edges = next(
        (e.bucket_edges for d in lc.runs.get(s, {}).values() for e in d.results if e.length == length), None
    )
    # seeds are averaged only over the same buckets of the same documents (the tables' rule)
    shas = set(lc.values(s, length, c, lambda e: e.documents.sha256).values())
    per_seed = lc.values(s, length, c, lambda e: e.bucket_loss if e.bucket_edges == edges else None)
    y = _seed_mean(per_seed) if len(shas) <= 1 else None
    if y is None or edges is None:
        return None
    x = [(a + b - 1) / 2 for a, b in zip(edges, edges[1:])]
    return (s, c, x, y, len(per_seed))


def lc_loss_plot(lc, length: int, schedules: tuple[str, ...]) -> bytes | None:
    """Mean loss per position bucket (x: the bucket's middle position) at `length` tokens."""
    found = (_loss_line(lc, s, c, length) for s in schedules for c in lc.choices())
    lines = [line for line in found if line is not None]
    if not lines:
        return None
    seq_lens = lc.seq_lens()

    def draw(ax):
        for s, c, x, y, n in lines:
            style = SCHEDULE_STYLES.get(s, {"ls": ":", "marker": "^"})
            ax.plot(
                x, y, color=CHOICE_COLORS.get(c), lw=1.2, ms=3, label=f"{s}, {c} ({seeds_text(n)})", **style
            )
        for t in seq_lens:
            ax.axvline(t, color="black", lw=0.8, ls=":")

    title = f"{lc.scale}: loss by position at {length} tokens (trained at {', '.join(map(str, seq_lens))})"
    return render_png(title, "token position (bucket middle)", "loss (nats per token)", draw)


def lc_distance_plot(lc, choice: str, schedules: tuple[str, ...]) -> bytes | None:
    """D_l per layer under RoPE `choice`, a line per schedule and length."""
    lengths = lc.lengths()
    found = ((s, n, _seed_mean(lc.values(s, n, choice, lambda e: e.D))) for s in schedules for n in lengths)
    lines = [line for line in found if line[2] is not None]
    if not lines:
        return None

    def draw(ax):
        import matplotlib

        cmap = matplotlib.colormaps["viridis"]
        for s, n, y in lines:
            shade = cmap(lengths.index(n) / max(1, len(lengths) - 1) * 0.85)
            style = SCHEDULE_STYLES.get(s, {"ls": ":", "marker": "^"})
            color = shade if len(lengths) > 1 else COLORS.get(s)
            ax.plot(range(len(y)), y, color=color, lw=1.2, ms=4, label=f"{s}, {n} tokens", **style)
        ax.xaxis.get_major_locator().set_params(integer=True)  # layers are whole numbers

    title = f"{lc.scale}: attention distance per layer, RoPE {choice}"
    return render_png(title, "layer", "D_l (tokens, mean over seeds)", draw)
