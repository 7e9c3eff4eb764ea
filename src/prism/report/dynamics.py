"""Training dynamics and attention distance: milestones, Δ loss vs tokens (Fig. 3a), D_l (Fig. 4)."""

from __future__ import annotations

from prism.report import fmt
from prism.report.collect import ScaleResults, schedule_order
from prism.report.fmt import NO_PAPER, NOT_AVERAGED, NOT_COMPARED, NOT_RUN, Table, recorded
from prism.report.paper import PaperTables
from prism.report.prose import prose
from prism.report.recipes import not_averaged, pair_unlike, runs_differ
from prism.runs.records import Analysis, DistanceDelta, Heads
from prism.stats import mean

# ----- cells: their numbers in report.json (prism.report.fmt.Cell) ------------------------------
# A milestone's validation loss: `≤ 3.45`.
dyn_threshold = fmt.cell(lambda loss: f"≤ {loss:g}", "dyn_threshold")
# Mean tokens of the seeds that reached a milestone, when not all did: `1.2B (2 of 3 seeds)`.
dyn_tokens_of_seeds = fmt.cell(
    lambda tokens, reached, seeds: f"{fmt.tokens(tokens)} ({reached} of {seeds} seeds)", "dyn_tokens_of_seeds"
)
# Where the lowest validation loss was, and that loss: `2.88B (loss 3.3630)`.
dyn_tokens_loss = fmt.cell(lambda tokens, loss: f"{fmt.tokens(tokens)} (loss {loss:.4f})", "dyn_tokens_loss")


@fmt.cell
def dyn_distance(d: float | str, heads: int | None = None) -> str:
    """D_l in tokens (or why there is none: a string), with the layer's heads: `131.0 (12)`."""
    shown = d if isinstance(d, str) else f"{d:.1f}"
    return shown if heads is None else f"{shown} ({heads})"


@fmt.cell
def dyn_paper_distance(delta_d: int, layers: list[int]) -> str:
    """A Figure 4 reading: `≈ −110`, `≈ +48 (layers 5–6)` where it spans layers."""
    span = f" (layers {layers[0]}–{layers[-1]})" if len(layers) > 1 else ""
    return f"≈ {_signed_int(delta_d)}{span}"


# ----- curves -----------------------------------------------------------------------------------
def _curve(run) -> dict[int, tuple[int, float]]:
    """step -> (tokens, val_loss) of one run's validation curve."""
    points = [p for p in run.summary.val_curve or [] if p.val_loss is not None]
    return {int(p.step): (int(p.tokens), float(p.val_loss)) for p in points}


def mean_curve(res: ScaleResults, schedule: str) -> list[tuple[int, float, int]]:
    """(tokens, mean val loss, seeds) at every step all finished seeds evaluated; none when not alike."""
    curves = [_curve(r) for _, r in sorted(res.runs.get(schedule, {}).items())]
    if not curves or not_averaged(res, schedule):
        return []
    steps = sorted(set.intersection(*(set(c) for c in curves)))
    return [(curves[0][s][0], mean([c[s][1] for c in curves]), len(curves)) for s in steps]


def delta_curve(res: ScaleResults) -> list[tuple[int, float, int]]:
    """(tokens, mean over seeds of loss(prism) − loss(uniform), seeds), paired by seed and step."""
    a, b = res.runs.get("uniform", {}), res.runs.get("prism", {})
    if runs_differ(res, ("uniform", "prism")):
        return []
    seeds = sorted(set(a) & set(b))
    pairs = [(_curve(a[s]), _curve(b[s])) for s in seeds]
    if not pairs:
        return []
    steps = sorted(set.intersection(*(set(ca) & set(cb) for ca, cb in pairs)))
    return [(pairs[0][0][s][0], mean([cb[s][1] - ca[s][1] for ca, cb in pairs]), len(pairs)) for s in steps]


def interpolate(curve: list[tuple[int, float, int]], tokens: float) -> float | None:
    """Linear interpolation of a curve at `tokens`; None outside the measured range."""
    for (t0, v0, _), (t1, v1, _) in zip(curve, curve[1:]):
        if t0 <= tokens <= t1:
            return v0 if t1 == t0 else v0 + (v1 - v0) * (tokens - t0) / (t1 - t0)
    return curve[-1][1] if curve and curve[-1][0] == tokens else None


def delta_table(res: ScaleResults, tables: PaperTables) -> Table | None:
    curve = delta_curve(res)
    missing = NOT_COMPARED if pair_unlike(res, "prism", "uniform") else NOT_RUN
    paper = {int(p["tokens"]): p["delta"] for p in tables.delta_loss_points(res.scale)}
    if not curve and not paper:
        return None
    points = set(paper) | ({curve[-1][0] // k for k in (4, 2, 1)} if curve else set())
    rows, seeds = [], curve[0][2] if curve else 0
    for t in sorted(points):
        rep = interpolate(curve, t) if curve else None
        shown = fmt.signed(rep) if rep is not None else (missing if not curve else "outside run")
        rows.append([fmt.tokens(t), fmt.signed(paper[t], 4) if t in paper else NO_PAPER, shown, seeds])
    return Table(
        ["Tokens seen", "Δ paper (Fig. 3a, read off the plot)", "Δ reproduced (Prism − uniform)", "seeds"],
        rows,
        right=[1, 2, 3],
    )


# ----- milestones -------------------------------------------------------------------------------
def _milestone_tokens(res: ScaleResults, schedule: str, threshold: float) -> list[int | None] | None:
    """Each seed's tokens at the milestone (None: not reached); None when not averaged."""
    if not_averaged(res, schedule):
        return None
    runs = [run for _, run in sorted(res.runs.get(schedule, {}).items())]
    hits = ([m.tokens for m in _milestones(r) if abs(float(m.threshold) - threshold) < 1e-12] for r in runs)
    return [h[0] if h else None for h in hits]


def _milestones(run) -> list:
    """The milestones a run recorded (milestones.json), none when it wrote no file."""
    return (run.milestones.milestones if run.milestones else None) or []


def _tokens_cell(vals: list[int | None] | None) -> tuple[str, float | None]:
    if vals is None:
        return NOT_AVERAGED, None
    if not vals:
        return NOT_RUN, None
    reached = [v for v in vals if v is not None]
    if not reached:
        return "not reached", None
    m = mean(reached)
    if len(reached) < len(vals):
        return dyn_tokens_of_seeds(m, len(reached), len(vals)), None
    return fmt.tokens(m), m


def _min_loss_cell(res: ScaleResults, s: str) -> tuple[str, float | None]:
    """Schedule `s`'s minimum val loss and the tokens at which it was reached, mean over seeds."""
    toks = [r.summary.min_val_tokens for r in res.runs.get(s, {}).values()]
    losses = [r.summary.min_val_loss for r in res.runs.get(s, {}).values()]
    if not_averaged(res, s):
        return NOT_AVERAGED, None
    ok = toks and None not in toks and None not in losses
    return (dyn_tokens_loss(mean(toks), mean(losses)), mean(toks)) if ok else (NOT_RUN, None)


def milestone_table(res: ScaleResults) -> Table | None:
    scheds = [s for s in ("uniform", "prism") if s in res.runs]
    thresholds = sorted(
        {float(m.threshold) for s in scheds for r in res.runs[s].values() for m in _milestones(r)},
        reverse=True,
    )
    if not thresholds:
        return None
    unlike = pair_unlike(res, "prism", "uniform")
    pair = ("uniform", "prism")
    cells = [
        (dyn_threshold(th), [_tokens_cell(_milestone_tokens(res, s, th)) for s in pair]) for th in thresholds
    ]
    cells.append(("minimum val loss", [_min_loss_cell(res, s) for s in pair]))
    rows = [
        [name, u_txt, p_txt, NOT_COMPARED if unlike else fmt.ratio(p / u) if u and p else "n/a"]
        for name, ((u_txt, u), (p_txt, p)) in cells
    ]
    headers = [
        "Val loss",
        "Tokens, uniform (mean over seeds)",
        "Tokens, prism (mean over seeds)",
        "prism / uniform",
    ]
    return Table(headers, rows, right=[1, 2, 3])


# ----- attention distance -----------------------------------------------------------------------
def distance_by_schedule(analysis: Analysis | None) -> dict[str, list[list[float]]]:
    """schedule -> list over seeds of per-layer D_l (none without analysis.json)."""
    out: dict[str, list[list[float]]] = {}
    for c in sorted(analysis.checkpoints if analysis else [], key=lambda c: (c.schedule, c.seed)):
        if c.D:
            out.setdefault(c.schedule, []).append([float(x) for x in c.D])
    return out


def _distance_cell(runs: list[list[float]], heads: Heads | None, layer: int, unlike: bool):
    """D_l of one schedule at `layer`: the mean over its seeds, with its heads where it has them."""
    vals = [d[layer] for d in runs if layer < len(d)]
    d_l = NOT_AVERAGED if unlike else mean(vals) if vals else NOT_RUN
    h = heads[layer] if heads and layer < len(heads) else None
    return d_l if isinstance(d_l, str) and h is None else dyn_distance(d_l, h)


def _delta_cell(d: DistanceDelta, layer: int, uncompared: bool) -> str:
    """ΔD_l of one schedule against uniform at `layer`: mean ± s.d. over seeds."""
    if uncompared:
        return NOT_COMPARED
    seeds, m, sd = len(d.seeds or []), d.mean or [], d.std or []
    if layer >= len(m) or m[layer] is None:
        return NOT_RUN
    sd_l = sd[layer] if layer < len(sd) and seeds > 1 else None  # an s.d. of 2 seeds or more
    return fmt.signed_sd(m[layer], sd_l, seeds, 1)


def distance_table(res: ScaleResults, tables: PaperTables) -> Table | None:
    a = res.analysis
    if not a or not a.checkpoints:
        return None
    by_sched = distance_by_schedule(a)
    deltas = {k: v for k, v in sorted((a.delta or {}).items())}
    n_layer = max(len(d) for runs in by_sched.values() for d in runs)
    heads = {
        s: (next(iter(res.runs[s].values())).summary.heads if res.runs.get(s) else None) for s in by_sched
    }
    # the paper's ΔD_l readings (Fig. 4) by layer, empty where it gives none
    paper = {
        n: dyn_paper_distance(r["delta_D"], list(r["layers"]))
        for n, r in tables.delta_distance(res.scale).items()
    }
    order = sorted(by_sched, key=schedule_order)
    headers = ["Layer", *[f"D_l {s}" + (" (heads)" if heads.get(s) else "") for s in order]]
    headers += [f"ΔD_l {s} (mean ± s.d., seeds)" for s in deltas]
    if paper:
        headers.append("ΔD_l paper (Fig. 4, read off the plot)")
    unlike = {s for s in order if not_averaged(res, s)}  # their seeds were not trained alike
    uncompared = {s for s in deltas if runs_differ(res, ("uniform", s))}
    rows = [
        [layer]
        + [_distance_cell(by_sched[s], heads.get(s), layer, s in unlike) for s in order]
        + [_delta_cell(d, layer, s in uncompared) for s, d in deltas.items()]
        + ([paper.get(layer, "")] if paper else [])
        for layer in range(n_layer)
    ]
    return Table(headers, rows, right=list(range(1, len(headers))))


def distance_note(res: ScaleResults, tables: PaperTables) -> str:
    a = res.analysis
    base = distance_by_schedule(a).get("uniform")
    d0 = fmt.num(mean([d[0] for d in base]), 1) if base else NOT_RUN
    return prose(
        "dynamics_distance_note",
        sequences=recorded(getattr(a, "sequences", None)),
        seq_len=recorded(getattr(a, "seq_len", None)),
        d0=tables.baseline_d0(res.scale),
        no_paper=NO_PAPER,
        reproduced=NOT_AVERAGED if not_averaged(res, "uniform") else d0,
    )


def _signed_int(n: int) -> str:
    """A whole number with its sign: `+48`, `−110`."""
    return f"{n:+d}".replace("-", "−")


def distance_paper_line(scale: str, tables: PaperTables) -> str | None:
    """The paper's Figure 4 readings in words, for a scale without reproduced analysis."""
    readings = tables.fig4["readings"].get(scale)
    if not readings:
        return None
    return prose(
        "dynamics_distance_paper",
        readings=[{"delta": _signed_int(r["delta_D"]), "layers": list(r["layers"])} for r in readings],
        d0=tables.baseline_d0(scale),
    )
