"""The figures of the "Beyond the training context" section: loss by position at one length (a
line per schedule and RoPE choice) and attention distance per layer under one RoPE choice (a
line per schedule and length). Rendered by prism.report.plots.render_png, so the same numbers
always give the same bytes. `lc` is a prism.report.long_context.LongContextResults (not imported:
that module imports this one)."""

from __future__ import annotations

from prism.report.fmt import seeds_text
from prism.report.plots import COLORS, render_png
from prism.stats import mean

CHOICE_COLORS = {"none": "#4d4d4d", "linear": "#1f77b4", "ntk": "#2ca02c", "yarn": "#d62728"}
SCHEDULE_STYLES = {"uniform": {"ls": "-", "marker": "o"}, "prism": {"ls": "--", "marker": "s"}}


def _seed_mean(per_seed: dict[int, list[float]]) -> list[float] | None:
    rows = list(per_seed.values())
    if not rows or len({len(r) for r in rows}) != 1:
        return None
    return [mean(col) for col in zip(*rows)]


def _bucket_edges(lc, schedule: str, length: int) -> list[int] | None:
    """The position buckets of the first of `schedule`'s results at `length` tokens."""
    return next(
        (e.bucket_edges for d in lc.runs.get(schedule, {}).values() for e in d.results if e.length == length),
        None,
    )


def _loss_line(lc, s: str, c: str, length: int) -> tuple | None:
    """(schedule, choice, x, y, seeds) of one line of the loss plot, None where it has none."""
    edges = _bucket_edges(lc, s, length)
    # seeds are averaged only over the same buckets of the same documents (the tables' rule)
    shas = set(lc.values(s, length, c, lambda e: e.documents.sha256).values())
    losses = lc.values(s, length, c, lambda e: e.bucket_loss if e.bucket_edges == edges else None)
    per_seed = {k: v for k, v in losses.items() if v is not None}
    y = _seed_mean(per_seed) if len(shas) <= 1 else None
    if y is None or edges is None:
        return None
    x = [(a + b - 1) / 2 for a, b in zip(edges, edges[1:])]
    return (s, c, x, y, len(per_seed))


def loss_plot(lc, length: int, schedules: tuple[str, ...]) -> bytes | None:
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
                x,
                y,
                color=CHOICE_COLORS.get(c),
                lw=1.2,
                ms=3,
                label=f"{s}, {c} ({seeds_text(n)})",
                **style,
            )
        for t in seq_lens:
            ax.axvline(t, color="black", lw=0.8, ls=":")

    return render_png(
        f"{lc.scale}: loss by position at {length} tokens (trained at {', '.join(map(str, seq_lens))})",
        "token position (bucket middle)",
        "loss (nats per token)",
        draw,
    )


def distance_plot(lc, choice: str, schedules: tuple[str, ...]) -> bytes | None:
    """D_l per layer under RoPE `choice`, a line per schedule and length."""
    lines = []
    for s in schedules:
        for n in lc.lengths():
            y = _seed_mean(lc.values(s, n, choice, lambda e: e.D))
            if y is not None:
                lines.append((s, n, y))
    if not lines:
        return None
    lengths = lc.lengths()

    def draw(ax):
        import matplotlib

        cmap = matplotlib.colormaps["viridis"]
        for s, n, y in lines:
            shade = cmap(lengths.index(n) / max(1, len(lengths) - 1) * 0.85)
            style = SCHEDULE_STYLES.get(s, {"ls": ":", "marker": "^"})
            color = shade if len(lengths) > 1 else COLORS.get(s)
            ax.plot(range(len(y)), y, color=color, lw=1.2, ms=4, label=f"{s}, {n} tokens", **style)
        ax.xaxis.get_major_locator().set_params(integer=True)  # layers are whole numbers

    return render_png(
        f"{lc.scale}: attention distance per layer, RoPE {choice}",
        "layer",
        "D_l (tokens, mean over seeds)",
        draw,
    )
