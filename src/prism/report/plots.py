"""PNG plots for the report: validation loss vs tokens, Δ loss vs tokens (Figure 3a) and ΔD_l per
layer (Figure 4). Rendered with matplotlib's Agg backend and no `Software` metadata so the same
data always gives the same bytes."""

from __future__ import annotations

import io

from prism.report.collect import ScaleResults
from prism.report.dynamics import delta_curve, mean_curve
from prism.report.paper import PaperTables

COLORS = {"uniform": "#4d4d4d", "prism": "#d62728"}


def _seeds(n: int) -> str:
    return f"{n} seed" if n == 1 else f"{n} seeds"


def _figure():
    import matplotlib
    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt
    return plt, plt.figure(figsize=(6.4, 4.0), dpi=100)


def _png(plt, fig) -> bytes:
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", metadata={"Software": None})
    plt.close(fig)
    return buf.getvalue()


def _style():
    import matplotlib.style
    # matplotlib's built-in defaults, not whatever a machine's matplotlibrc says; DejaVu Sans
    # ships with matplotlib, so the glyphs are the same everywhere.
    return matplotlib.style.context(["default", {"font.family": "DejaVu Sans"}])


def val_loss_plot(res: ScaleResults) -> bytes | None:
    curves = {s: mean_curve(res, s) for s in sorted(res.runs, key=lambda s: (s != "uniform", s != "prism", s))}
    curves = {s: c for s, c in curves.items() if c}
    if not curves:
        return None
    with _style():
        plt, fig = _figure()
        ax = fig.add_subplot()
        for s, c in curves.items():
            ax.plot([t for t, _, _ in c], [v for _, v, _ in c], label=f"{s} ({_seeds(c[0][2])})",
                    color=COLORS.get(s), lw=1.5)
        ax.set_xlabel("tokens seen")
        ax.set_ylabel("validation loss (mean over seeds)")
        ax.set_title(f"{res.scale}: validation loss")
        ax.grid(alpha=0.3)
        ax.legend()
        return _png(plt, fig)


def delta_loss_plot(res: ScaleResults, tables: PaperTables) -> bytes | None:
    curve = delta_curve(res)
    if not curve:
        return None
    with _style():
        plt, fig = _figure()
        ax = fig.add_subplot()
        ax.plot([t for t, _, _ in curve], [d for _, d, _ in curve], color=COLORS["prism"],
                lw=1.5, label=f"reproduced ({_seeds(curve[0][2])})")
        paper = tables.delta_loss_points(res.scale)
        if paper:
            ax.scatter([p["tokens"] for p in paper], [p["delta"] for p in paper], marker="x",
                       color="black", zorder=3, label="paper Fig. 3a (read off the plot)")
        ax.axhline(0.0, color="black", lw=0.8)
        ax.set_xlabel("tokens seen")
        ax.set_ylabel("Δ validation loss (Prism − uniform)")
        ax.set_title(f"{res.scale}: Δ validation loss (cf. Figure 3a)")
        ax.grid(alpha=0.3)
        ax.legend()
        return _png(plt, fig)


def delta_distance_plot(res: ScaleResults, tables: PaperTables) -> bytes | None:
    a = res.analysis or {}
    deltas = {k: v for k, v in sorted((a.get("delta") or {}).items()) if v.get("mean")}
    if not deltas:
        return None
    with _style():
        plt, fig = _figure()
        ax = fig.add_subplot()
        for s, d in deltas.items():
            layers = list(range(len(d["mean"])))
            err = d.get("std") if len(d.get("seeds") or []) > 1 else None
            ax.errorbar(layers, d["mean"], yerr=err, marker="o", ms=4, capsize=3, lw=1.2,
                        color=COLORS.get(s), label=f"{s} ({_seeds(len(d.get('seeds') or []))})")
        paper = tables.delta_distance(res.scale)
        if paper:
            ax.scatter(sorted(paper), [paper[l]["delta_D"] for l in sorted(paper)], marker="x",
                       color="black", zorder=3, label="paper Fig. 4 (read off the plot)")
        ax.axhline(0.0, color="black", lw=0.8)
        ax.set_xlabel("layer")
        ax.set_ylabel("ΔD_l = D_l(schedule) − D_l(uniform), tokens")
        ax.set_title(f"{res.scale}: attention distance change (cf. Figure 4)")
        ax.grid(alpha=0.3)
        ax.legend()
        return _png(plt, fig)


def all_plots(res: ScaleResults, tables: PaperTables) -> dict[str, bytes]:
    """file name -> PNG bytes for the plots this scale has data for."""
    out = {}
    for name, png in ((f"{res.scale}-val-loss.png", val_loss_plot(res)),
                      (f"{res.scale}-delta-loss.png", delta_loss_plot(res, tables)),
                      (f"{res.scale}-delta-distance.png", delta_distance_plot(res, tables))):
        if png is not None:
            out[name] = png
    return out
