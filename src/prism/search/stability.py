"""How far the ranking at one rung predicts the next: each schedule's rank at every rung (and at
the full budget), Spearman's ρ between consecutive rungs, and SEARCH.md's two plots (drawn with
prism.report.plots, so the same data gives the same bytes). A schedule's loss at a rung is the mean
over its trials that reached it."""

from __future__ import annotations

from prism.stats import mean, spearman

FULL = "full"  # the column of the full-budget runs
MAX_LABELLED = 8  # schedules named in a plot's legend (uniform and the best of the last rung)


def rank_table(trials: list[dict], rungs: list[int], full: dict[str, float]) -> dict[str, dict]:
    """schedule -> column (rung tokens, or FULL) -> rank there; 1 = lowest loss, equal losses
    ordered by name (a plot needs one rank each)."""
    seen: dict[str, dict[int, list[float]]] = {}
    for t in trials:
        for tokens, loss in t["rungs"].items():
            seen.setdefault(t["schedule"], {}).setdefault(int(tokens), []).append(loss)
    out: dict[str, dict] = {s: {} for s in seen}
    for col in [*rungs, *([FULL] if full else [])]:
        # a schedule's loss at a rung: the mean over its trials that reached it
        at = full if col == FULL else {s: mean(by[col]) for s, by in seen.items() if col in by}
        for i, (s, _) in enumerate(sorted(at.items(), key=lambda kv: (kv[1], kv[0])), 1):
            out.setdefault(s, {})[col] = i
    return out


def correlations(trials: list[dict], rungs: list[int], last_rung: dict[str, float], full: dict) -> list[dict]:
    """Spearman's ρ between consecutive rungs over the trials that reached both, and between the
    last rung and the full budget over the schedules re-run there (each a mean over seeds)."""
    out = []
    for a, b in zip(rungs, rungs[1:]):
        pairs = [
            (t["rungs"][str(a)], t["rungs"][str(b)]) for t in trials if {str(a), str(b)} <= set(t["rungs"])
        ]
        out.append({"from": a, "to": b, "over": "trials", "n": len(pairs), "rho": _rho(pairs)})
    if full:
        pairs = [(last_rung[s], full[s]) for s in sorted(full) if s in last_rung]
        out.append({"from": rungs[-1], "to": FULL, "over": "schedules", "n": len(pairs), "rho": _rho(pairs)})
    return out


def _rho(pairs: list[tuple[float, float]]) -> float | None:
    return spearman([a for a, _ in pairs], [b for _, b in pairs]) if pairs else None


def _labelled(order: list[str], base: str) -> list[str]:
    return [base, *[s for s in order if s != base][: MAX_LABELLED - 1]]


def loss_plot(trials: list[dict], order: list[str], base: str, scale: str) -> bytes | None:
    """Each trial's validation loss against rung tokens; `order`: the last rung's ranking."""
    if not any(t["rungs"] for t in trials):
        return None
    from prism.report.plots import render_png

    named = _labelled(order, base)

    def draw(ax):
        labelled: set[str] = set()
        for t in sorted(trials, key=lambda t: (t["schedule"] in named, t["number"])):  # named on top
            points = sorted((int(k), v) for k, v in t["rungs"].items())
            s = t["schedule"]
            style = (
                {"color": "black", "lw": 2.0, "marker": "o", "zorder": 3}
                if s == base
                else {"lw": 1.2, "marker": "o", "ms": 3}
                if s in named
                else {"color": "0.75", "lw": 0.8, "marker": ".", "zorder": 1}
            )
            key = s if s in named else "other schedules"  # one legend entry each
            label = None if key in labelled else key
            labelled.add(key)
            ax.plot([p for p, _ in points], [v for _, v in points], label=label, **style)
        ax.set_xscale("log")  # geometric rungs, evenly spaced
        rungs = sorted({int(k) for t in trials for k in t["rungs"]})
        ax.set_xticks(rungs, [f"{r:,}" for r in rungs])
        ax.minorticks_off()

    return render_png(f"{scale}: validation loss per rung", "tokens (rung)", "validation loss", draw)


def rank_plot(table: dict[str, dict], columns: list, order: list[str], base: str, scale: str) -> bytes | None:
    """Each schedule's rank at every rung (and at the full budget): lines that cross are ranks
    that changed."""
    if len(columns) < 2 or not table:
        return None
    from prism.report.plots import render_png

    named = _labelled(order, base)
    xs = {col: i for i, col in enumerate(columns)}

    def draw(ax):
        other = False
        for s in sorted(table, key=lambda s: (s in named, s)):
            points = [(xs[c], r) for c, r in table[s].items() if c in xs]
            if s in named:
                style = {"color": "black", "lw": 2.0} if s == base else {"lw": 1.2}
                ax.plot(*zip(*points), marker="o", label=s, **style)
            else:
                ax.plot(*zip(*points), color="0.75", lw=0.8, marker=".", label=None if other else "other")
                other = True
        ax.set_xticks(range(len(columns)), [f"{c:,}" if c != FULL else "full budget" for c in columns])
        ax.yaxis.get_major_locator().set_params(integer=True)  # ranks are whole numbers
        ax.invert_yaxis()  # rank 1 on top

    return render_png(f"{scale}: rank per rung (1 = lowest loss)", "rung (tokens)", "rank", draw)
