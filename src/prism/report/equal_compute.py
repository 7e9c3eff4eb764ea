"""Prism against uniform at equal compute: loss vs GPU-hours, Δ at equal tokens, FLOPs, wall-clock."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from operator import attrgetter

from prism.config.describe import describe_variant
from prism.config.schema import load_config
from prism.report import fmt
from prism.report.collect import ScaleResults, schedule_order
from prism.report.dynamics import mean_curve
from prism.report.fmt import Table, drawn, paragraph
from prism.report.paper import PAPER_SCALES, PaperTables
from prism.report.part import Part
from prism.report.plots import loss_lines_plot
from prism.report.prose import prose
from prism.report.recipes import not_averaged, not_compared
from prism.report.scaling import Interval, ScalingAnalysis, _num
from prism.runs.layout import plot_name
from prism.runs.records import (
    BenchSchedule,
    EqualComputeDoc,
    EqualComputeRow,
    GpuHoursCurve,
    GpuHoursPoint,
    ScalingDoc,
    Throughput,
)
from prism.stats import mean

SCHEDULE, BASE = "prism", "uniform"


# ----- sizes -----------------------------------------------------------------------------------
def run_compute(res: ScaleResults, schedule: str) -> float | None:
    """Mean training FLOPs of one run of `schedule` (flops_per_token × tokens seen), None without."""
    return res.run_mean(
        [schedule], lambda summary: (summary.flops_per_token or 0) * (summary.tokens_seen or 0)
    )


@lru_cache(maxsize=64)
def config_size(scale: str, schedule: str, config_dir=None) -> tuple[float, float, float]:
    """(n_params, FLOPs per token, tokens of one run) of a schedule at a scale, as the kit builds it."""
    cfg = load_config(scale, config_dir=config_dir)
    d = describe_variant(cfg, schedule)
    return float(d["n_params"]), float(d["flops_per_token"]), float(cfg.train.tokens)


# ----- throughput: which figure gives each schedule's tokens/s ----------------------------------------
@dataclass(frozen=True)
class Rate:
    """Training tokens/s per device, and where the figure comes from (shown beside it)."""

    per_device: float
    figure: str


def paper_rate(scale: str, schedule: str, paper: PaperTables) -> float | None:
    """The paper's tokens/s per GPU: Table 2's row, else Table 5's change applied to its baseline."""
    row = paper.val_loss(scale, schedule)
    if row and row.get("tokens_per_s"):
        return row["tokens_per_s"] / paper.t2["num_devices"]
    base = paper.tokens_per_s_per_gpu(scale)
    t5 = {r["kit"]: r for r in paper.ablation()} if paper.t5["scale"] == scale else {}
    if base is None or schedule not in t5:
        return None
    return base * (1 + (t5[schedule]["tok_s_change_pct"] or 0.0) / 100)


@fmt.cell
def ec_figure(source: str, devices: list) -> str:
    """Where a tokens/s figure comes from, and the [count, hardware] it ran on: `benchmark (2× H200)`."""
    on = "; ".join(fmt.on_devices(n, hardware) for n, hardware in devices)
    texts = {"benchmark": f"benchmark ({on})", "runs": f"runs' own ({on}; no benchmark)"}
    return texts.get(source, f"the paper's (Table 2/5, {on}); no benchmark or measured run")


def rate(res: ScaleResults, schedule: str, paper: PaperTables) -> Rate | None:
    """The benchmark's tokens/s, else the runs' own, else the paper's figure (docs/report.md)."""
    b, s = res.bench, _benched(res, schedule)
    if s is not None and s.train_tokens_per_s:
        n = b.num_devices or 1
        return Rate(s.train_tokens_per_s / n, ec_figure("benchmark", [[n, fmt.recorded(b.hardware)]]))
    tps, where = [], set()
    for r in res.runs.get(schedule, {}).values():
        t = r.summary.throughput or Throughput()
        per = t.tokens_per_s_per_device
        if per is None and t.tokens_per_s:
            per = t.tokens_per_s / (t.num_devices or 1)
        if per:
            tps.append(per)
            where.add((fmt.recorded(t.num_devices, 1), fmt.recorded(t.hardware)))
    if tps:
        on = sorted(where, key=lambda d: f"{d[0]}× {d[1]}")  # in the order of their text
        return Rate(mean(tps), ec_figure("runs", [list(d) for d in on]))
    p = paper_rate(res.scale, schedule, paper)
    on = [[paper.t2["num_devices"], paper.t2["hardware"].split("x ", 1)[-1]]]
    return Rate(p, ec_figure("paper", on)) if p else None


def _benched(res: ScaleResults, schedule: str) -> BenchSchedule | None:
    """What the benchmark (bench.json) measured of `schedule` at this scale, if it timed it."""
    return res.bench.schedules.get(schedule) if res.bench else None


def throughput_ratio(res: ScaleResults, schedule: str, paper: PaperTables) -> tuple[float | None, str]:
    """(tokens/s of `schedule` ÷ tokens/s of uniform, the figure used) for a reproduced row."""
    s = _benched(res, schedule)
    if s is not None and s.ratio_to_uniform is not None:
        return float(s.ratio_to_uniform), "benchmark"
    a, b = rate(res, schedule, paper), rate(res, BASE, paper)
    if a and b and a.figure == b.figure:
        return a.per_device / b.per_device, a.figure.split(" (")[0]
    a, b = paper_rate(res.scale, schedule, paper), paper_rate(res.scale, BASE, paper)
    return (a / b, "paper") if a and b else (None, "no figure")


# ----- loss against GPU-hours -----------------------------------------------------------------------
@dataclass
class HoursCurve:
    scale: str
    schedule: str
    rate: Rate | None
    tokens: float | None  # tokens of one run
    points: list[tuple[float, float]]  # (GPU-hours, mean val loss)
    seeds: int
    not_averaged: str | None = None  # why the runs' tokens, throughput and curve are not averaged

    def record(self) -> GpuHoursCurve:
        return GpuHoursCurve(
            scale=self.scale,
            schedule=self.schedule,
            tokens_per_s_per_device=None if self.rate is None else _num(self.rate.per_device),
            figure=None if self.rate is None else self.rate.figure,
            gpu_hours_per_run=_num(self.gpu_hours(self.tokens)),
            seeds=self.seeds,
            curve=[GpuHoursPoint(gpu_hours=_num(h), val_loss=_num(v)) for h, v in self.points],
        )

    def gpu_hours(self, tokens: float | None) -> float | None:
        """GPU-hours of `tokens`: tokens ÷ (tokens/s per device × devices) ÷ 3600 × devices."""
        return None if self.rate is None or tokens is None else tokens / self.rate.per_device / 3600


def hours_curves(res: ScaleResults, paper: PaperTables) -> list[HoursCurve]:
    out = []
    for s in sorted(res.runs, key=schedule_order):
        c = HoursCurve(res.scale, s, None, None, [], 0, not_averaged(res, s))
        curve = mean_curve(res, s)  # none where not averaged
        if not c.not_averaged:
            c.rate, c.tokens = rate(res, s, paper), res.run_mean([s], attrgetter("tokens_seen"))
        if curve and c.rate is not None:
            c.points, c.seeds = [(c.gpu_hours(t), v) for t, v, _ in curve], curve[0][2]
        out.append(c)
    return out


# ----- Δ at equal tokens, FLOPs and wall-clock ------------------------------------------------------
@dataclass
class Row:
    """One row of Δ, its fields named as the EqualComputeRow record it writes."""

    table: str  # whose rows: "Table 2" or "Table 5"
    scale: str
    schedule: str
    source: str  # "paper" or "reproduced"
    tokens_per_s_ratio_from: str = ""
    delta_equal_tokens: float | None = None
    flops_per_token_ratio: float | None = None  # FLOPs per token of the schedule ÷ uniform's
    delta_equal_flops: Interval | None = None
    tokens_per_s_ratio: float | None = None  # tokens/s of the schedule ÷ uniform's
    delta_equal_wall_clock: Interval | None = None
    fit: str | None = None  # whose loss-vs-compute fit gave the shifts
    compute_beyond_fit: float | None = None  # C ÷ the nearest end of that fit's compute range
    why_flops: fmt.Cell | None = None  # why delta_equal_flops is None (an ec_why cell)
    why_wall: fmt.Cell | None = None  # why delta_equal_wall_clock is None (an ec_why cell)
    withheld: str | None = None  # the sentence saying why the row has no Δ at all

    def record(self) -> EqualComputeRow:
        doc = {k: getattr(self, k) for k in EqualComputeRow.model_fields}
        return EqualComputeRow(**{k: v.doc() if isinstance(v, Interval) else v for k, v in doc.items()})


def _factor(beyond: float) -> str:
    """C ÷ the nearest end of a range: `2.8e7× below` or `30× above`."""
    factor = 1 / beyond if beyond < 1 else beyond
    return f"{factor:.2g}".replace("e+0", "e").replace("e+", "e") + ("× below" if beyond < 1 else "× above")


@fmt.cell
def ec_fit(fit: str | None, beyond: float | None = None, r: float | None = None) -> str:
    """The fit that gave a row's shifts and how far outside its compute range the row lies (beyond:
    C ÷ the nearest end); without a fit, the tokens/s ratio r of 1 that needed none."""
    if fit is None:
        return "none" if r is None else f"none (r = {r:g})"
    if beyond is None or max(beyond, 1 / beyond) < 1.05:  # inside, or at its edge (the runs' tokens)
        return fit
    return f"{fit} (C {_factor(beyond)} its range)"


@fmt.cell
def ec_why(reasons: list, prefix: str = "") -> str:
    """Why a Δ has no shift, after `prefix`: sentences, or {"beyond", "fit"} outside a fit's range."""
    why = (
        r if isinstance(r, str) else f"C {_factor(r['beyond'])} the {r['fit']} fit's range" for r in reasons
    )
    return prefix + "; ".join(why)


MAX_BEYOND = 10.0  # a law is not read farther outside the compute it was fitted on (docs/report.md)


def shifted(
    delta: float,
    compute: float | None,
    ratio: float | None,
    fits: list[tuple[str, ScalingAnalysis | None]],
    ranges: dict[str, tuple[float, float] | None] | None = None,
) -> tuple[Interval | None, str | None, str | None]:
    """(Δ + L_base(compute·ratio) − L_base(compute) with its interval, the fit's name, None) from the
    first fit within MAX_BEYOND of its compute range (`ranges`); else (None, None, an ec_why cell)."""
    if ratio is None:
        return None, None, ec_why(["no ratio"])
    why: list = []
    for name, a in fits:
        span = (ranges or {}).get(name)
        if span and compute and not span[0] / MAX_BEYOND <= compute <= span[1] * MAX_BEYOND:
            why.append({"beyond": _beyond(compute, span), "fit": name})
            continue
        s = a.loss_shift(compute, ratio) if a is not None and compute else None
        if s is not None and _num(s.value) is not None:
            bounds = (s.value, _num(s.lo), _num(s.hi))
            return Interval(*(None if v is None else delta + v for v in bounds)), name, None
    if ratio == 1.0:
        return Interval(delta, delta, delta), None, None
    if not compute:
        return None, None, ec_why(["no training compute recorded"])
    return None, None, ec_why(why or ["no fit"])


def _beyond(compute: float | None, span: tuple[float, float] | None) -> float | None:
    if compute is None or span is None:
        return None
    return compute / span[0] if compute < span[0] else compute / span[1] if compute > span[1] else 1.0


def _compute_range(fit: ScalingAnalysis | None) -> tuple[float, float] | None:
    """The compute a fit's scales span (where its law is measured, not extrapolated), or None."""
    computes = [s.compute for s in getattr(fit, "scales", None) or [] if s.compute]
    return (min(computes), max(computes)) if computes else None


def _shift_row(row: Row, delta, f_s, f_u, compute, r, fits: list, ranges: dict) -> Row:
    """`row` with Δ at equal tokens, FLOPs (FLOPs per token `f_s` of the schedule, `f_u` of uniform)
    and wall-clock (tokens/s ratio `r`), shifted at `compute` by the first of `fits` that can."""
    f_ratio = f_s / f_u if f_s and f_u else None
    row.delta_equal_tokens, row.flops_per_token_ratio = _num(delta), _num(f_ratio)
    row.tokens_per_s_ratio = _num(r)
    if row.delta_equal_tokens is None:  # no Δ, nothing to shift
        return row
    # at equal FLOPs the schedule sees uniform's FLOPs ÷ its own per token, times the tokens
    flops_ratio = None if f_ratio is None else 1.0 / f_ratio
    row.delta_equal_flops, fit_f, why_f = shifted(row.delta_equal_tokens, compute, flops_ratio, fits, ranges)
    row.delta_equal_wall_clock, fit_w, why_w = shifted(row.delta_equal_tokens, compute, r, fits, ranges)
    row.fit = fit_w or fit_f
    row.compute_beyond_fit = _beyond(compute, ranges.get(row.fit))
    row.why_flops = ec_why(["no FLOPs per token"]) if f_ratio is None else why_f
    row.why_wall = ec_why(["no tokens/s ratio"]) if r is None else why_w
    return row


@dataclass
class _Sizes:
    """Each scale's size and each schedule's FLOPs per token; the scales from small to large."""

    by_scale: dict[str, ScaleResults]
    config_dir: object = None

    def size(self, scale: str, schedule: str, i: int = 1, missing: float | None = None) -> float | None:
        """config_size's `i`th number (default: FLOPs per token); `missing` where the configs lack it."""
        try:
            return config_size(scale, schedule, self.config_dir)[i]
        except Exception:  # a scale or schedule this checkout's configs lack
            return missing

    def n_params(self, scale: str) -> float:
        """The runs' own count, else the kit's model of the scale (last where the configs lack it)."""
        res = self.by_scale.get(scale, ScaleResults(scale))
        return res.run_mean(res.runs, attrgetter("n_params")) or self.size(scale, BASE, 0, float("inf"))

    def scales(self) -> list[str]:
        names = [*self.by_scale, *[s for s in PAPER_SCALES if s not in self.by_scale]]
        return sorted(names, key=lambda s: (self.n_params(s), s))


def _reproduced_row(table: str, res: ScaleResults, schedule: str, paper: PaperTables, fits, ranges):
    """The row of `schedule` against uniform where runs of both finished (withheld: not alike)."""
    a, b = res.final_losses(BASE), res.final_losses(schedule)
    if not a or not b:
        return None
    row = Row(table, res.scale, schedule, "reproduced", withheld=not_compared(res, schedule, BASE))
    if row.withheld:
        return row
    r, row.tokens_per_s_ratio_from = throughput_ratio(res, schedule, paper)
    f_s, f_u = (res.run_mean([s], attrgetter("flops_per_token")) for s in (schedule, BASE))
    return _shift_row(row, mean(b) - mean(a), f_s, f_u, run_compute(res, BASE), r, fits, ranges)


def equal_rows(
    results: list[ScaleResults],
    paper: PaperTables,
    paper_fit: ScalingAnalysis | None,
    repro_fit: ScalingAnalysis | None,
    paper_doc: ScalingDoc,
    config_dir=None,
) -> list[Row]:
    """Table 2's rows (prism vs uniform) and Table 5's (ablations vs uniform), paper and reproduced."""
    sizes = _Sizes({r.scale: r for r in results}, config_dir)
    paper_c = {s.scale: s.compute for s in paper_doc.scales}
    fits = [("reproduced", repro_fit), ("paper", paper_fit)]
    ranges = {name: _compute_range(fit) for name, fit in fits}

    def paper_row(table: str, scale: str, schedule: str, delta: float, r: float) -> Row:
        f_s, f_u = sizes.size(scale, schedule), sizes.size(scale, BASE)
        row = Row(table, scale, schedule, "paper", "paper")
        return _shift_row(row, delta, f_s, f_u, paper_c.get(scale), r, fits[1:], ranges)

    rows: list[Row | None] = []
    for scale in sizes.scales():
        pu, pp = paper.val_loss(scale, BASE), paper.val_loss(scale, SCHEDULE)
        if pu and pp:
            r = pp["tokens_per_s"] / pu["tokens_per_s"]
            rows.append(paper_row("Table 2", scale, SCHEDULE, pp["val_loss"] - pu["val_loss"], r))
        if scale in sizes.by_scale:
            rows.append(_reproduced_row("Table 2", sizes.by_scale[scale], SCHEDULE, paper, fits, ranges))
    t5 = paper.t5["scale"]
    for p in paper.ablation():
        if p["kit"] in (BASE, SCHEDULE):  # the baseline, and Prism's own row, which Table 2 has
            continue
        # the paper prints baseline − config
        rows.append(paper_row("Table 5", t5, p["kit"], -p["delta"], 1 + (p["tok_s_change_pct"] or 0.0) / 100))
        if t5 in sizes.by_scale:
            rows.append(_reproduced_row("Table 5", sizes.by_scale[t5], p["kit"], paper, fits, ranges))
    return [r for r in rows if r is not None]


@fmt.cell
def ec_shift(shift: dict | None, r: float | None) -> str:
    """Δ at equal wall-clock minus Δ at equal tokens, with its interval; none where r is 1."""
    if r == 1.0 and shift is not None:
        return f"none (r = {r:g})"
    return fmt.interval(shift)


def _cells(r: Row) -> list:
    """A row's cells from Δ on; a Δ that cannot be computed says why in its cell."""
    if r.withheld:
        return ["withheld (see above)", "n/a", "n/a", "n/a", "n/a", "n/a", "n/a", "none"]
    f_ratio, r_ratio = fmt.ratio(r.flops_per_token_ratio), fmt.ratio(r.tokens_per_s_ratio)
    if r.delta_equal_tokens is None:  # a loss that is not a number: nothing to shift either
        measured = [f_ratio, "n/a", r_ratio, r.tokens_per_s_ratio_from]
        return ["n/a: a loss is not finite", *measured, "n/a", "n/a", "none"]
    # a Δ with no shift: n/a and why (the ec_why cell's reasons)
    f, w = r.delta_equal_flops, r.delta_equal_wall_clock
    flops = fmt.interval(f.doc().as_json()) if f else ec_why(r.why_flops.values[0], "n/a: ")
    wall = fmt.signed(w.value) if w else ec_why(r.why_wall.values[0], "n/a: ")
    measured = [fmt.signed(r.delta_equal_tokens), f_ratio, flops, r_ratio, r.tokens_per_s_ratio_from]
    # Δ at equal wall-clock minus Δ at equal tokens: the fitted law's part, with its interval
    shift = w and {k: None if v is None else v - r.delta_equal_tokens for k, v in vars(w).items()}
    # without a fit, the tokens/s ratio of 1 that needed none
    one = r.tokens_per_s_ratio if r.tokens_per_s_ratio == 1.0 and w is not None else None
    fit = ec_fit(None, None, one) if r.fit is None else ec_fit(r.fit, r.compute_beyond_fit)
    return [*measured, wall, ec_shift(shift, r.tokens_per_s_ratio), fit]


def rows_table(rows: list[Row]) -> fmt.Table:
    headers = [
        "Rows of",
        "Scale",
        "Schedule",
        "Source",
        "Δ equal tokens",
        "FLOPs/token ÷ uniform",
        "Δ equal FLOPs",
        "tok/s ÷ uniform (r)",
        "r from",
        "Δ equal wall-clock",
        "its shift [interval of the shift alone]",
        "shift from fit",
    ]
    body = [[r.table, r.scale, r.schedule, r.source, *_cells(r)] for r in rows]
    return Table(headers, body, right=[4, 5, 6, 7, 9, 10])


# ----- the part of the section ------------------------------------------------------------------------
def _rate_lines(curves: list[HoursCurve]) -> list[str]:
    """Each curve's tokens/s, its figure and one run's GPU-hours, after the runs not trained alike."""
    if not curves:
        return []
    rows = []
    for c in curves:
        figure = "none (no benchmark, measured run or paper figure)" if c.rate is None else c.rate.figure
        cells = [fmt.tokens_per_s(c.rate and c.rate.per_device), figure, fmt.hours(c.gpu_hours(c.tokens))]
        rows.append([c.scale, c.schedule, *([fmt.NOT_AVERAGED] * 3 if c.not_averaged else cells)])
    headers = ["Scale", "Schedule", "tokens/s per device", "figure used", "GPU-hours per run"]
    return [*paragraph([c.not_averaged for c in curves if c.not_averaged]), Table(headers, rows, [2, 4]), ""]


def part(curves: dict[str, list[HoursCurve]], rows: list[Row], paper_fit: bool, repro_fit: bool) -> Part:
    """The part's markdown (below its `###` heading), its plots and its JSON document."""
    plots: dict[str, bytes] = {}
    out = [prose("equal_compute_gpu_hours"), "", *_rate_lines([c for cs in curves.values() for c in cs])]
    for scale, cs in curves.items():
        lines = {c.schedule: [(h, v, c.seeds) for h, v in c.points] for c in cs}
        png = loss_lines_plot(f"{scale}: validation loss vs GPU-hours", "GPU-hours (one run)", lines)
        name = plot_name(scale, "val-loss-gpu-hours")
        out += drawn(plots, name, png, f"{scale} validation loss vs GPU-hours")
    out += [prose("equal_compute_delta", repro_fit=repro_fit, paper_fit=paper_fit), ""]
    out += paragraph([r.withheld for r in rows if r.withheld])
    out += [rows_table(rows), ""] if rows else [prose("equal_compute_no_rows"), ""]
    gpu_hours = {s: [c.record() for c in cs] for s, cs in curves.items()}
    return Part(out, plots, EqualComputeDoc(gpu_hours=gpu_hours, rows=[r.record() for r in rows]).as_json())


def equal_compute(
    results: list[ScaleResults],
    paper: PaperTables,
    paper_fit: ScalingAnalysis | None,
    repro_fit: ScalingAnalysis | None,
    paper_doc: ScalingDoc,
    config_dir=None,
) -> Part:
    """The "At equal compute" part of the Across-scales section."""
    curves = {r.scale: hours_curves(r, paper) for r in results if r.runs}
    rows = equal_rows(results, paper, paper_fit, repro_fit, paper_doc, config_dir)
    return part(curves, rows, paper_fit is not None, repro_fit is not None)
