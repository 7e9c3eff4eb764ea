"""PNG plots of the "Across scales" section: Δ(N) and the compute multiplier (points with error
bars, the fit and its band, log N axis) and validation loss against GPU-hours. Rendered by
prism.report.plots.render_png, so the same numbers always give the same bytes."""

from __future__ import annotations

from prism.report.collect import schedule_order
from prism.report.fmt import level_text, seeds_text
from prism.report.plots import COLORS, render_png
from prism.runs.records import AtScale, Curve, IntervalDoc, ScalingDoc


def _nan(xs: list) -> list[float]:
    """An unbounded side of an interval (null) as NaN: matplotlib leaves a gap there."""
    return [float("nan") if x is None else float(x) for x in xs]


def _errors(points: list[IntervalDoc | AtScale]) -> list[list[float]]:
    """Asymmetric error bars; an unbounded side draws no bar (the table says ∞)."""
    return [
        [p.value - p.lo if p.lo is not None else 0.0 for p in points],
        [p.hi - p.value if p.hi is not None else 0.0 for p in points],
    ]


def _fit(ax, doc: ScalingDoc, curve: Curve, color: str) -> None:
    """The fitted curve along the band's grid of N, with its band."""
    grid = doc.band.n_params
    ax.plot(grid, _nan(curve.value), color=color, lw=1.5, label=f"fit, {level_text(doc.level)} band")
    ax.fill_between(grid, _nan(curve.lo), _nan(curve.hi), color=color, alpha=0.2, lw=0)


def _measured(ax, n_params: list, points: list[IntervalDoc | AtScale], label: str) -> None:
    """Measured values with their interval as error bars, in black beside the fit's colour."""
    values = [p.value for p in points]
    ax.errorbar(n_params, values, yerr=_errors(points), fmt="o", ms=5, capsize=3, color="black", label=label)


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
            label = f"measured, {level_text(doc.level)} Welch interval"
            _measured(ax, [n for n, _ in with_iv], [d for _, d in with_iv], label)
        if bare:
            ax.scatter(
                [n for n, _ in bare],
                [d for _, d in bare],
                marker="o",
                facecolors="none",
                edgecolors="black",
                label="measured, < 2 seeds a side (no interval)",
            )
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


def gpu_hours_plot(scale: str, curves: dict[str, tuple[int, list[tuple[float, float]]]]) -> bytes | None:
    """Mean validation loss of each schedule against the GPU-hours its tokens took:
    `curves[schedule]` = (seeds, [(GPU-hours, loss)])."""
    drawn = sorted((s for s, (_, pts) in curves.items() if pts), key=schedule_order)
    if not drawn:
        return None

    def draw(ax):
        for s in drawn:
            n, pts = curves[s]
            ax.plot(
                [h for h, _ in pts],
                [v for _, v in pts],
                lw=1.5,
                color=COLORS.get(s),
                label=f"{s} ({seeds_text(n)})",
            )

    return render_png(
        f"{scale}: validation loss vs GPU-hours",
        "GPU-hours (one run)",
        "validation loss (mean over seeds)",
        draw,
    )
