"""The "Across scales" section of RESULTS.md: scaling analyses, then equal compute (docs/report.md)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import partial
from operator import attrgetter
from typing import Callable

from prism.report import equal_compute as EC
from prism.report import fmt
from prism.report import plots as SP
from prism.report.collect import ScaleResults
from prism.report.fmt import NOT_AVERAGED, NOT_RUN, blocks, flops, image, interval, mean_sd, params, signed
from prism.report.paper import PaperTables
from prism.report.part import Part
from prism.report.prose import prose
from prism.report.recipes import Recipes, check_recipes, not_averaged
from prism.report.scaling import C_UNIT, N_UNIT, ScalePoint, ScalingAnalysis, ScalingInputError, analyse
from prism.report.scaling import analyse_paper as _analyse_paper
from prism.runs.layout import SCALING_JSON_NAME, across_plot_name
from prism.runs.records import AtScale, FitDoc, ScalingDoc, ScalingRow

SCHEDULE, BASE = "prism", "uniform"


# ----- inputs: one ScalePoint per scale, and whether the runs share one recipe --------------------
def scale_point(res: ScaleResults) -> ScalePoint | None:
    """The scale's point of the fit (size, base's compute, both schedules' losses), None without one."""
    # a diverged seed (a NaN or infinite loss) is no point of a law: left out, and said so
    losses = {s: [v for v in res.final_losses(s) if math.isfinite(v)] for s in (BASE, SCHEDULE)}
    size = res.run_mean((BASE, SCHEDULE), attrgetter("n_params"))
    compute = EC.run_compute(res, BASE)
    if not all(losses.values()) or size is None or compute is None:
        return None
    return ScalePoint(res.scale, float(size), float(compute), losses)


# ----- the two analyses -----------------------------------------------------------------------------
@dataclass
class Analyses:
    """The reproduced analysis' document and fit (None without one), and the paper's analysis."""

    reproduced_doc: ScalingDoc
    paper: ScalingAnalysis
    recipes: Recipes
    reproduced_fit: ScalingAnalysis | None = None


def paper_sizes(paper: PaperTables, config_dir=None) -> dict[str, tuple[float, float]]:
    """(n_params, training FLOPs of one run) of each Table 2 scale as the kit builds its model."""
    sizes = {s: EC.config_size(s, BASE, config_dir) for s in paper.t2["rows"]}
    return {s: (n, f * t) for s, (n, f, t) in sizes.items()}


def run_analyses(results: list[ScaleResults], paper: PaperTables, config_dir=None) -> Analyses:
    paper_a = _analyse_paper(paper.t2, paper_sizes(paper, config_dir))
    points = [p for p in (scale_point(r) for r in results) if p is not None]
    with_points = [r for r in results if r.scale in {p.scale for p in points}]
    recipes = check_recipes(with_points, (BASE, SCHEDULE))
    if not points:
        reason = prose("across_no_fit", why="no_runs", schedule=SCHEDULE, base=BASE)
        return Analyses(_not_analysed(reason), paper_a, recipes)
    try:
        a = analyse(points)
    except ScalingInputError as exc:  # results that cannot be one analysis: say why, fit nothing
        return Analyses(_not_analysed(str(exc)), paper_a, recipes)
    doc = a.record
    by_scale = {r.scale: r for r in results}
    for row in doc.scales:  # no Δ at a scale whose runs differ in recipe, no mean of runs trained differently
        if row.scale in recipes.mixed_scales:
            row.delta, row.withheld = None, "its runs differ in recipe"
        unlike = [s for s in (BASE, SCHEDULE) if not_averaged(by_scale[row.scale], s)]
        if unlike:
            row.not_averaged = unlike
            row.mean.update(dict.fromkeys(unlike))
            row.sd.update(dict.fromkeys(unlike))
    if recipes.mismatch:
        # the per-scale Δs stand on their own; a law through points of different recipes does not
        kept = {k: getattr(doc, k) for k in ("source", "method", "level", "n_boot", "schedules", "scales")}
        doc = ScalingDoc(**kept, status="per_scale_only", reason=recipes.mismatch)
        return Analyses(doc, paper_a, recipes)
    return Analyses(doc, paper_a, recipes, a if a.record.status == "fit" else None)


def _not_analysed(reason: str) -> ScalingDoc:
    """The reproduced analysis where none could be made: why, and no scale."""
    return ScalingDoc(source="reproduced", status="per_scale_only", reason=reason, scales=[])


# ----- formatting: cell formats (prism.report.fmt.cell) -------------------------------------------
# The header of Δ with its Welch interval at `level` (0.95).
ac_welch_header = fmt.cell(lambda level: f"Δ [{fmt.level_text(level)} Welch interval]", "ac_welch_header")
# The header of A, the fitted loss above E at x (1: at one unit of N or C).
ac_a_header = fmt.cell(lambda x: f"A (loss above E at x = {x:g})", "ac_a_header")
# Δ of the means with no interval: fewer than two seeds on a side.
ac_point_delta = fmt.cell(
    lambda delta: NOT_RUN if delta is None else f"{signed(delta)} (no interval: < 2 seeds)", "ac_point_delta"
)


# What a fit's loss is against, and the unit of its x: `N (x = N / 10^9)`.
ac_axis = fmt.cell(lambda symbol, unit: f"{symbol} (x = {symbol} / 10^{round(math.log10(unit))})", "ac_axis")
# A factor: `2.0×`.
ac_times = fmt.cell(lambda x: "n/a" if x is None else f"{x:.1f}×", "ac_times")


@fmt.cell
def ac_scales(n_params: list) -> str:
    """The scales an analysis rests on, by size: `3: 124M to 757M`."""
    if not n_params:
        return NOT_RUN
    if len(n_params) == 1:
        return f"1: {params(n_params[0])}"
    return f"{len(n_params)}: {params(min(n_params))} to {params(max(n_params))}"


# A compute multiplier ({"value", "lo", "hi"}) with its interval, at a size.
ac_multiplier_at = fmt.cell(
    lambda multiplier, n_params: f"{interval(multiplier, '.3f')} at {params(n_params)}", "ac_multiplier_at"
)
ac_predicted_at = fmt.cell(lambda n_params: f"Δ predicted at {params(n_params)}", "ac_predicted_at")


@fmt.cell
def ac_predicted(delta: dict, extrapolation: float | None) -> str:
    """A predicted Δ with its interval, and how many times the largest measured N it lies at."""
    return interval(delta) + ("" if extrapolation is None else f" ({extrapolation:.1f}× the largest N)")


def _mean_sd(row: ScalingRow, s: str) -> str:
    return NOT_AVERAGED if s in (row.not_averaged or ()) else mean_sd(row.mean.get(s), row.sd.get(s))


def _measured_delta(row: ScalingRow) -> str:
    """The per-scale Δ with its Welch interval; else why it is withheld, or the bare Δ."""
    if row.delta:
        return interval(row.delta.as_json())
    if row.withheld:
        return f"withheld: {row.withheld}"
    a, b = row.mean.get(BASE), row.mean.get(SCHEDULE)
    return ac_point_delta(None if a is None or b is None else b - a)


def per_scale_table(doc: ScalingDoc) -> fmt.Table:
    headers = [
        "Scale",
        "N",
        "C (FLOPs)",
        f"seeds ({BASE} / {SCHEDULE})",
        BASE,
        SCHEDULE,
        ac_welch_header(doc.level),
    ]
    rows = []
    for r in doc.scales:
        seeds = fmt.seed_pair(r.seeds.get(BASE, 0), r.seeds.get(SCHEDULE, 0))
        means = [_mean_sd(r, BASE), _mean_sd(r, SCHEDULE)]
        rows.append([r.scale, params(r.n_params), flops(r.compute), seeds, *means, _measured_delta(r)])
    return fmt.Table(headers, rows, right=[1, 2, 3, 4, 5, 6])


def _law_cells(f: FitDoc) -> list[str]:
    """E, A and α with intervals; A depends on the units of x: fixed digits where it is of order 1."""
    a_spec = ".4f" if 0.01 <= abs(f.A.value or 0.0) < 1000 else ".3e"
    return [interval(iv.as_json(), spec) for iv, spec in ((f.E, ".4f"), (f.A, a_spec), (f.alpha, ".3f"))]


def fit_table(doc: ScalingDoc) -> fmt.Table:
    headers = ["Schedule", "Loss against", "E", ac_a_header(1), "α"]
    rows = [
        [s, ac_axis(symbol, unit), *_law_cells(getattr(doc.fits[s], axis))]
        for s in (BASE, SCHEDULE)
        for axis, symbol, unit in (("vs_params", "N", N_UNIT), ("vs_compute", "C", C_UNIT))
    ]
    return fmt.Table(headers, rows, right=[2, 3, 4])


def delta_table(doc: ScalingDoc) -> fmt.Table:
    measured = {r.scale: r for r in doc.scales}
    mult = {m.scale: m.as_json() for m in doc.multiplier}
    headers = ["Scale", "N", "Δ measured", "Δ(N) from the fits", "compute multiplier (×)"]
    rows = [
        [d.scale, params(d.n_params), _measured_delta(measured[d.scale]) if d.scale in measured else NOT_RUN]
        + [interval(d.as_json()), interval(mult.get(d.scale), ".3f")]
        for d in doc.delta_fit
    ]
    return fmt.Table(headers, rows, right=[1, 2, 3, 4])


def predictions_table(doc: ScalingDoc) -> fmt.Table:
    headers = ["N", "Δ predicted", "extrapolation (N ÷ largest measured N)"]
    rows = [
        [params(p.n_params), interval(p.delta.as_json()), ac_times(p.extrapolation)] for p in doc.predictions
    ]
    return fmt.Table(headers, rows, right=[1, 2])


def analysis_lines(doc: ScalingDoc, name: str, img: Callable[[str, str], list[str]]) -> list[str]:
    """One analysis: its method, and either the fits with intervals or the reason and Δ per scale."""
    if not doc.fitted:  # the method would describe numbers that are not there: the reason, and Δ per scale
        reason = doc.reason or ""
        out = [f"**Δ per scale only.** {reason[:1].upper()}{reason[1:]}", ""]
        out += [per_scale_table(doc), ""] if doc.scales else []
        return out + img(across_plot_name(f"delta-{name}"), f"{name}: Δ per scale")
    values = {"schedule": SCHEDULE, "base": BASE, "level": fmt.level_text(doc.level)}
    out = [doc.method, ""]
    tables = (per_scale_table, fit_table, delta_table, predictions_table)
    for part, table in zip(("per_scale", "fit", "delta", "predictions"), tables):
        out += [prose(f"across_{part}_caption", **values), "", table(doc), ""]
    out += img(across_plot_name(f"delta-{name}"), f"{name}: Δ(N)")
    out += img(across_plot_name(f"multiplier-{name}"), f"{name}: compute multiplier")
    return out


def summary_table(docs: dict[str, ScalingDoc], titles: dict[str, str]) -> fmt.Table:
    """The two analyses side by side: what each rests on and its headline numbers, with intervals."""

    def largest(d: ScalingDoc) -> str:
        if not d.fitted or not d.multiplier:
            return "n/a"
        m: AtScale = max(d.multiplier, key=lambda m: m.n_params or 0)
        return ac_multiplier_at(m.model_dump(include={"value", "lo", "hi"}), m.n_params)

    def predicted(d: ScalingDoc, i: int) -> str:
        if not d.fitted or len(d.predictions or []) <= i:
            return "n/a"
        return ac_predicted(d.predictions[i].delta.as_json(), d.predictions[i].extrapolation)

    ds = list(docs.values())
    rows = [
        # a fit counts the scales it used (two or more seeds a side), not every row
        ["scales (N)", *[ac_scales([r.n_params for r in (d.delta_fit or d.scales)]) for d in ds]],
        ["analysis", *["fit" if d.fitted else "Δ per scale only (reason below)" for d in ds]],
        ["compute multiplier at the largest N", *[largest(d) for d in ds]],
    ]
    for i in range(max(len(d.predictions or []) for d in ds)):
        at = next(d.predictions[i].n_params for d in ds if len(d.predictions or []) > i)
        rows.append([ac_predicted_at(at), *[predicted(d, i) for d in ds]])
    return fmt.Table(["", *[titles[n] for n in docs]], rows)


# ----- the section -------------------------------------------------------------------------------
def section(results: list[ScaleResults], paper: PaperTables, config_dir=None) -> Part:
    """The section's markdown (below its title), its plots and its JSON document (scaling.json)."""
    an = run_analyses(results, paper, config_dir)
    docs = {"reproduced": an.reproduced_doc, "paper": an.paper.record}
    source = paper.t2["source"]
    plots = analysis_plots(docs, source)
    paper_fit = an.paper if an.paper.record.status == "fit" else None
    eq = EC.equal_compute(results, paper, paper_fit, an.reproduced_fit, docs["paper"], config_dir)
    plots.update(eq.plots)
    img = partial(image, plots)
    lines = blocks(
        prose("across_intro", schedule=SCHEDULE, base=BASE),
        summary_table(docs, {"reproduced": "Reproduced", "paper": f"Paper ({source})"}),
        "### Reproduced",
        caveat_lines(results, an.recipes, docs["reproduced"])
        + analysis_lines(docs["reproduced"], "reproduced", img),
        f"### Paper ({source}, {paper.t2['seeds']} seeds per cell)",
        analysis_lines(docs["paper"], "paper", img),
        "### At equal compute",
        eq.lines,
    )
    # scaling.json: each analysis's record as JSON (json_bytes rounds it once, as it writes it)
    doc = {**{k: d.as_json() for k, d in docs.items()}, "equal_compute": eq.json}
    return Part(lines, plots, doc, SCALING_JSON_NAME)


def analysis_plots(docs: dict[str, ScalingDoc], source: str) -> dict[str, bytes]:
    """Δ(N) (or Δ per scale) and the compute multiplier of each analysis, those that can be drawn."""
    plots: dict[str, bytes] = {}
    for name, doc in docs.items():
        title = "reproduced" if name == "reproduced" else f"paper ({source})"
        what = "Δ(N)" if doc.fitted else "Δ per scale (no fit)"
        drawn = {
            f"delta-{name}": SP.delta_plot(doc, f"{what}, {title}", BASE, SCHEDULE),
            f"multiplier-{name}": SP.multiplier_plot(doc, f"compute multiplier, {title}", BASE, SCHEDULE),
        }
        plots.update({across_plot_name(k): png for k, png in drawn.items() if png is not None})
    return plots


def caveat_lines(results: list[ScaleResults], recipes: Recipes, doc: ScalingDoc) -> list[str]:
    """What the reproduced analysis leaves out or cannot check, each a paragraph."""
    runs = [named for r in results for named in r.named_runs((BASE, SCHEDULE))]
    dropped = [name for name, run in runs if not math.isfinite(run.summary.final_val_loss or 0.0)]
    lines = [prose("across_left_out", runs=dropped), ""] if dropped else []
    if len(recipes.subsets) > 1:
        # the held-out tokens come from the start of each subset: a per-scale offset both share
        where = "; ".join(f"{k} for {', '.join(sorted(v))}" for k, v in sorted(recipes.subsets.items()))
        lines += [prose("across_data_subsets", where=where), ""]
    if recipes.unknown and len(doc.scales) > 1:  # a fit could mix recipes
        lines += [prose("across_unchecked_recipes", runs=recipes.unknown), ""]
    return lines


def _rounded(x):
    """Every finite float of a document to 6 significant figures: the same bytes on any CPU."""
    if isinstance(x, float):
        return float(f"{x:.6g}") if math.isfinite(x) else x
    if isinstance(x, dict):
        return {k: _rounded(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_rounded(v) for v in x]
    return x


def json_bytes(doc: dict) -> bytes:
    """The JSON file's bytes, the same for an unchanged report; a non-finite number is refused."""
    return (json.dumps(_rounded(doc), indent=1, ensure_ascii=False, allow_nan=False) + "\n").encode()
