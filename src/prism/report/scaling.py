"""Scaling fits across scales: L(N) = E + A·N^(−α) per schedule, Δ(N), the effective compute
multiplier and predictions, each with a bootstrap interval over seeds (docs/report.md, "Across
scales"). numpy alone: α on a grid, (E, A) in closed form, for every resample at once."""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Mapping, Sequence

import numpy as np

from prism.errors import UsageError
from prism.report.prose import prose
from prism.runs.records import (
    AtScale,
    Band,
    Curve,
    FitDoc,
    IntervalDoc,
    LawsDoc,
    Prediction,
    ScalingDoc,
    ScalingRow,
    ScheduleNames,
)
from prism.stats import mean, sample_sd, t_quantile

N_UNIT = 1e9  # A is the loss above E at 1B parameters
C_UNIT = 1e18  # ... and at 10^18 training FLOPs
ALPHA_RANGE = (1e-3, 3.0)  # exponents outside it are not a power law these points can tell
MAX_FAILED = 0.05  # more bootstrap fits than this on the grid's edge: the fit is not determined
MIN_SCALES = 3  # E, A and α are three numbers
PREDICT_AT = (1.5e9, 3e9)
LEVEL = 0.95  # of every interval
SCHEDULES = ("prism", "uniform")  # (schedule, base): Δ is schedule − base
MAX_LOSS = 1e50  # Welch's df squares s²/n: far larger losses overflow a float (real ones are < 100)


class ScalingInputError(UsageError):
    """Results that cannot go into one scaling analysis."""


@dataclass(frozen=True)
class Interval:
    value: float
    lo: float
    hi: float

    def doc(self) -> IntervalDoc:
        return IntervalDoc(**{k: _num(v) for k, v in vars(self).items()})


@dataclass(frozen=True)
class ScalePoint:
    """One scale's results: its size, its training compute, and each schedule's seed losses."""

    scale: str
    n_params: float
    compute: float  # training FLOPs of one run: flops_per_token x tokens
    losses: Mapping[str, Sequence[float]]  # schedule -> final val loss of each seed


@dataclass(frozen=True)
class _Cell:
    """A (scale, schedule) mean and how it is resampled: seed values, or a printed mean ± s.d."""

    mean: float
    var_of_mean: float  # s²/n
    n: int
    values: tuple[float, ...] = ()  # empty: parametric (printed mean ± s.d.)

    def draw(self, rng: np.random.Generator, b: int) -> np.ndarray:
        if not self.values:
            return self.mean + math.sqrt(self.var_of_mean) * rng.standard_normal(b)
        v = np.asarray(self.values)
        widened = self.mean + math.sqrt(self.n / (self.n - 1)) * (v - self.mean)
        return widened[rng.integers(0, self.n, size=(b, self.n))].mean(axis=1)


# ----- the fit ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Fits:
    """Many fits of one law at once: arrays of shape (B,)."""

    E: np.ndarray
    A: np.ndarray  # at x = 1 (x in N_UNIT or C_UNIT)
    alpha: np.ndarray
    ok: np.ndarray  # α inside the range and A > 0 (a loss that falls with scale)

    def at(self, x: np.ndarray) -> np.ndarray:
        """Loss at x (shape (G,)) for every fit: (B, G)."""
        return self.E[:, None] + self.A[:, None] * np.power(x[None, :], -self.alpha[:, None])

    def inverse(self, loss: np.ndarray) -> np.ndarray:
        """x at which each fit reaches `loss` (shape (B, G)); inf at or below its E."""
        gap = loss - self.E[:, None]
        with np.errstate(divide="ignore", invalid="ignore"):
            x = np.power(gap / self.A[:, None], -1.0 / self.alpha[:, None])
        return np.where(gap > 0, x, np.inf)


def _sse_grid(logx: np.ndarray, y: np.ndarray, alphas: np.ndarray) -> tuple[np.ndarray, ...]:
    """(SSE, A, mean z) of the least-squares fit for each row of y (B, S) and each row of alphas (B, G)."""
    z = np.exp(-alphas[..., None] * (logx - logx.mean()))  # (B, G, S), centred for conditioning
    zc = z - z.mean(axis=-1, keepdims=True)
    yc = (y - y.mean(axis=-1, keepdims=True))[:, None, :]
    szz = (zc * zc).sum(axis=-1)
    syz = (yc * zc).sum(axis=-1)
    a = syz / szz
    sse = (yc * yc).sum(axis=-1) - syz * a
    return np.where(a > 0, sse, np.inf), a, z.mean(axis=-1)


def fit_power_law(x: np.ndarray, y: np.ndarray) -> _Fits:
    """Least-squares E + A·x^(−α) through each row of y (B, S) at the S points x: α on a log grid,
    a fine grid around the best, then one parabola step."""
    x, y = np.asarray(x, float), np.atleast_2d(np.asarray(y, float))
    logx = np.log(x)
    lo, hi = ALPHA_RANGE
    coarse = np.geomspace(lo, hi, 240)
    sse = _sse_grid(logx, y, np.broadcast_to(coarse, (len(y), len(coarse))))[0]
    best = np.argmin(sse, axis=1)
    edge = (best == 0) | (best == len(coarse) - 1) | ~np.isfinite(sse.min(axis=1))
    left = coarse[np.maximum(best - 1, 0)]
    right = coarse[np.minimum(best + 1, len(coarse) - 1)]
    fine = left[:, None] + (right - left)[:, None] * np.linspace(0.0, 1.0, 41)[None, :]
    sse_f = _sse_grid(logx, y, fine)[0]
    k = np.clip(np.argmin(sse_f, axis=1), 1, 39)
    rows = np.arange(len(y))
    s0, s1, s2 = sse_f[rows, k - 1], sse_f[rows, k], sse_f[rows, k + 1]
    step = fine[:, 1] - fine[:, 0]
    with np.errstate(divide="ignore", invalid="ignore"):  # inf SSE where A <= 0
        curv = s0 - 2 * s1 + s2
        shift = np.where(np.isfinite(curv) & (curv > 0), 0.5 * (s0 - s2) / curv, 0.0)
    alpha = fine[rows, k] + np.clip(shift, -1.0, 1.0) * step
    # (E, A) in closed form at the chosen α, in the centred coordinates, then back to x = 1
    _, a_c, z_mean = (v[:, 0] for v in _sse_grid(logx, y, alpha[:, None]))
    e = y.mean(axis=1) - a_c * z_mean
    a = a_c * np.exp(alpha * logx.mean())
    ok = ~edge & (a_c > 0) & np.isfinite(e)
    return _Fits(e, a, alpha, ok)


# ----- intervals --------------------------------------------------------------------------------
@dataclass
class _Resampled:
    """The bootstrap's resampled cell means (B, J) and what the intervals need from them."""

    means: np.ndarray
    cells: list[_Cell]

    def __post_init__(self) -> None:
        centred = self.means - self.means.mean(axis=0)
        self._pinv = np.linalg.pinv(centred)  # one regression design for every quantity
        self._var = np.array([c.var_of_mean for c in self.cells])
        self._df = np.array([c.n - 1 for c in self.cells], float)

    def interval(self, est: float, boot: np.ndarray) -> Interval:
        """Width from the linearised variance and t_ν, shape from the bootstrap (templates/
        across_method.md); `boot`: NaN where a refit failed, ±inf where unbounded."""
        est = float(est)
        failed = np.isnan(boot)
        if not math.isfinite(est) or failed.mean() > MAX_FAILED:  # no fitted number without its interval
            return Interval(math.nan, math.nan, math.nan)
        finite = np.isfinite(boot)
        if finite.all():
            w = self._pinv @ (boot - boot.mean())
        else:
            m, b = self.means[finite], boot[finite]
            w = np.linalg.lstsq(m - m.mean(axis=0), b - b.mean(), rcond=None)[0]
        v = w * w * self._var
        if v.sum() <= 0:
            return Interval(est, est, est)
        nu = v.sum() ** 2 / (v * v / self._df).sum()
        half = _t_cached(round(max(nu, 1.0), 2)) * math.sqrt(v.sum())
        # actual resampled values (infinite ones included), so an unbounded side stays unbounded
        q_lo, q_hi = np.quantile(boot[~failed], [(1 - LEVEL) / 2, (1 + LEVEL) / 2], method="nearest")
        below, above = max(est - q_lo, 0.0), max(q_hi - est, 0.0)
        if math.isinf(below) or math.isinf(above):
            return Interval(
                est,
                -math.inf if math.isinf(below) else est - half,
                math.inf if math.isinf(above) else est + half,
            )
        # an estimate at the edge of its bootstrap would get a one-sided interval: keep a tenth a side
        share = 0.5 if below + above == 0 else min(max(below / (below + above), 0.1), 0.9)
        return Interval(est, est - 2 * half * share, est + 2 * half * (1 - share))

    def masked(self, est: float, boot: np.ndarray, ok: np.ndarray) -> Interval:
        """interval() with the resamples whose fits do not hold (not `ok`) counted as failed."""
        return self.interval(est, np.where(ok, boot, np.nan))

    def columns(self, est_boot: tuple[np.ndarray, np.ndarray], ok: np.ndarray) -> list[Interval]:
        """masked() of each column: est (G,), boot (B, G)."""
        return [self.masked(e, b, ok) for e, b in zip(est_boot[0], est_boot[1].T)]


@lru_cache(maxsize=4096)
def _t_cached(nu: float) -> float:
    return t_quantile((1 + LEVEL) / 2, nu)


def _num(x: float) -> float | None:
    """A number as a float, unrounded; a missing or non-finite one (an unbounded side) as None."""
    return None if x is None or not math.isfinite(x) else float(x)


# ----- the analysis -----------------------------------------------------------------------------
@dataclass
class ScalingAnalysis:
    """An analysis' record (scaling.json) and, with a fit, the base's loss-vs-compute fits."""

    record: ScalingDoc
    _base_compute: tuple | None = None  # (point fit, bootstrap fits, resampled means)

    @property
    def scales(self) -> list[ScalingRow]:
        return self.record.scales

    def loss_shift(self, compute: float, ratio: float) -> Interval | None:
        """L_base(compute·ratio) − L_base(compute), with its interval: what `ratio` × the tokens gives."""
        if self._base_compute is None:
            return None
        point, boot, resampled = self._base_compute
        x = np.array([compute / C_UNIT, compute * ratio / C_UNIT])
        return resampled.masked(np.diff(point.at(x))[0, 0], np.diff(boot.at(x))[:, 0], boot.ok)


def _check(points: Sequence[ScalePoint]) -> None:
    names = [p.scale for p in points]
    if len(set(names)) != len(names):
        dup = next(n for n in names if names.count(n) > 1)
        raise ScalingInputError(f"scale {dup!r} is given twice: give each scale's results once.")
    for p in points:
        for name in ("n_params", "compute"):
            v = getattr(p, name)
            if not (isinstance(v, (int, float)) and v > 0 and math.isfinite(v)):
                raise ScalingInputError(f"scale {p.scale!r} has {name}={v!r}: it must be positive.")
        for s in SCHEDULES:
            bad = [v for v in p.losses.get(s, ()) if not (math.isfinite(v) and abs(v) <= MAX_LOSS)]
            if bad:
                raise ScalingInputError(
                    f"scale {p.scale!r}, schedule {s!r} has a loss of {bad[0]!r}: every loss must be finite "
                    f"and at most {MAX_LOSS:g}."
                )


def _scale_row(p: ScalePoint, cells: Mapping[str, _Cell]) -> ScalingRow:
    return ScalingRow(
        scale=p.scale,
        n_params=_num(p.n_params),
        compute=_num(p.compute),
        seeds={s: cells[s].n if s in cells else 0 for s in SCHEDULES},
        mean={s: _num(cells[s].mean) if s in cells else None for s in SCHEDULES},
        sd={
            s: _num(math.sqrt(cells[s].var_of_mean * cells[s].n)) if s in cells and cells[s].n > 1 else None
            for s in SCHEDULES
        },
        delta=_welch(cells.get(SCHEDULES[1]), cells.get(SCHEDULES[0])),
    )


def _welch(a: _Cell | None, b: _Cell | None) -> IntervalDoc | None:
    """Δ = b − a with its Welch interval; None with fewer than two seeds a side (or no spread)."""
    if not (a and b and a.n > 1 and b.n > 1):
        return None
    va, vb, d = a.var_of_mean, b.var_of_mean, b.mean - a.mean
    se2 = va + vb
    if se2 <= 0:
        return None
    nu = se2 * se2 / (va * va / (a.n - 1) + vb * vb / (b.n - 1))
    h = t_quantile((1 + LEVEL) / 2, nu) * math.sqrt(se2)
    return Interval(d, d - h, d + h).doc()


def _why_no_fit(usable: Sequence[ScalePoint]) -> str | None:
    """Why the scales with two or more seeds of both schedules cannot be fitted, or None."""
    on = {"schedule": SCHEDULES[0], "base": SCHEDULES[1]}
    if len(usable) < MIN_SCALES:
        return prose("across_no_fit", why="few_scales", usable=len(usable), needed=MIN_SCALES, **on)
    if len({p.n_params for p in usable}) < len(usable):
        return prose("across_no_fit", why="same_size", **on)
    return None


@dataclass
class _Laws:
    """Each schedule's law against N and against C, at the means and at every resample."""

    usable: list[ScalePoint]
    law: dict  # schedule -> axis -> (point fit, bootstrap fits)
    cells: list[_Cell]  # in the order (scale, schedule) of `means`' columns
    means: np.ndarray  # (B, 2S) resampled cell means
    y: np.ndarray  # the cells' means, a row of the usable scales per schedule
    n_x: np.ndarray
    c_x: np.ndarray

    def ill_conditioned(self) -> str | None:
        """Why one of the four fits does not determine its law (point fit or bootstrap), or None."""
        for s in SCHEDULES:
            for axis, (pt, bt) in self.law[s].items():
                on = {"schedule": s, "axis": axis[3:]}
                if not pt.ok[0]:
                    why, bound = _why_edge(pt)
                    return prose("across_no_fit", why=why, bound=bound, **on)
                failed = 1.0 - bt.ok.mean()
                if failed > MAX_FAILED:
                    rates = {"failed": f"{failed:.0%}", "max_failed": f"{MAX_FAILED:.0%}"}
                    return prose("across_no_fit", why="bootstrap", **rates, **on)
        return None

    def delta(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        (p_pt, p_bt), (u_pt, u_bt) = (self.law[s]["vs_params"] for s in SCHEDULES)
        return (p_pt.at(x) - u_pt.at(x))[0], p_bt.at(x) - u_bt.at(x)

    def multiplier(self, c: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The compute the base needs to reach the schedule's fitted loss at c, over c."""
        (pc_pt, pc_bt), (uc_pt, uc_bt) = (self.law[s]["vs_compute"] for s in SCHEDULES)
        return uc_pt.inverse(pc_pt.at(c))[0] / c, uc_bt.inverse(pc_bt.at(c)) / c[None, :]

    def ok(self, axis: str) -> np.ndarray:
        """The resamples where both schedules' fits against `axis` hold."""
        return self.law[SCHEDULES[0]][axis][1].ok & self.law[SCHEDULES[1]][axis][1].ok


def _why_edge(pt: _Fits) -> tuple[str, str | None]:
    """Why a point fit fails: (its reason in templates/across_no_fit.md, the bound of α it sits at)."""
    lo, hi = ALPHA_RANGE
    if pt.A[0] <= 0 or not np.isfinite(pt.E[0]):
        return "no_fall", None
    if pt.alpha[0] <= lo * 1.5:
        return "lower_bound", f"{lo:g}"
    return "upper_bound", f"{hi:g}"


def _fit_laws(usable: list[ScalePoint], cells, n_boot: int, rng_seed: int) -> _Laws:
    rng = np.random.default_rng(rng_seed)
    cell_list = [cells[p.scale][s] for s in SCHEDULES for p in usable]
    means = np.stack([c.draw(rng, n_boot) for c in cell_list], axis=1)  # (B, 2S)
    n_x = np.array([float(p.n_params) for p in usable]) / N_UNIT
    c_x = np.array([float(p.compute) for p in usable]) / C_UNIT
    y = np.array([c.mean for c in cell_list]).reshape(len(SCHEDULES), -1)
    boot = means.reshape(n_boot, len(SCHEDULES), -1)
    law = {
        s: {axis: (fit_power_law(x, y[i]), fit_power_law(x, boot[:, i])) for axis, x in _axes(n_x, c_x)}
        for i, s in enumerate(SCHEDULES)
    }
    return _Laws(usable, law, cell_list, means, y, n_x, c_x)


def _axes(n_x: np.ndarray, c_x: np.ndarray) -> tuple:
    return (("vs_params", n_x), ("vs_compute", c_x))


def _fits_and_residuals(laws: _Laws, interval) -> tuple[dict[str, LawsDoc], list[str]]:
    """Each law's E, A and α with intervals and its rms residual; the residuals as text."""
    fits: dict[str, LawsDoc] = {}
    residuals = []
    for i, s in enumerate(SCHEDULES):
        axes = {}
        for axis, x in _axes(laws.n_x, laws.c_x):
            pt, bt = laws.law[s][axis]
            rms = float(np.sqrt(np.mean((pt.at(x)[0] - laws.y[i]) ** 2)))
            ivs = {k: interval(getattr(pt, k)[0], getattr(bt, k), bt.ok).doc() for k in ("E", "A", "alpha")}
            axes[axis] = FitDoc(**ivs, rms_residual=_num(rms))
            residuals.append(f"{s} vs {axis[3:]} {rms:.2g}")
        fits[s] = LawsDoc(**axes)
    return fits, residuals


def method_text(parametric: bool, scales: int = 0, residuals: Sequence[str] = ()) -> str:
    """The method paragraph (templates/across_method.md); once fitted, its scales and residuals."""
    exact = scales == MIN_SCALES  # the law passes through three means: no residual is left
    return prose("across_method", parametric=parametric, exact=exact, scales=scales, residuals=[*residuals])


def _measured_scales(laws: _Laws, intervals) -> tuple[list[AtScale], list[AtScale]]:
    """Δ(N) and the compute multiplier at each measured scale, with intervals."""
    at = [{"scale": p.scale, "n_params": _num(p.n_params)} for p in laws.usable]
    delta = intervals(laws.delta(laws.n_x), laws.ok("vs_params"))
    mult = intervals(laws.multiplier(laws.c_x), laws.ok("vs_compute"))
    compute = [_num(p.compute) for p in laws.usable]
    return [AtScale(**a, **i.doc().as_json()) for a, i in zip(at, delta)], [
        AtScale(**a, compute=c, **i.doc().as_json()) for a, c, i in zip(at, compute, mult)
    ]


def _predictions(laws: _Laws, intervals) -> list[Prediction]:
    largest = max(p.n_params for p in laws.usable)
    ivs = intervals(laws.delta(np.array(PREDICT_AT, float) / N_UNIT), laws.ok("vs_params"))
    return [
        Prediction(n_params=_num(n), delta=i.doc(), extrapolation=_num(n / largest))
        for n, i in zip(PREDICT_AT, ivs)
    ]


def _bands(laws: _Laws, intervals) -> Band:
    """Curves for the plots over N past the last prediction; C follows N on the scales' log-log line."""
    xs = np.array(PREDICT_AT, float) / N_UNIT
    grid = np.geomspace(min(laws.n_x) / 1.5, max([*xs, *laws.n_x]) * 1.25, 48)
    slope, icept = np.polyfit(np.log(laws.n_x), np.log(laws.c_x), 1)
    grid_c = np.exp(icept + slope * np.log(grid))

    def band(est: np.ndarray, boot: np.ndarray, ok: np.ndarray) -> Curve:
        iv = intervals((est, boot), ok)
        return Curve(**{k: [_num(getattr(i, k)) for i in iv] for k in ("value", "lo", "hi")})

    fits_n = {s: laws.law[s]["vs_params"] for s in SCHEDULES}  # each schedule's L(N), by name
    laws_n = {s: band(pt.at(grid)[0], bt.at(grid), bt.ok) for s, (pt, bt) in fits_n.items()}
    return Band(
        n_params=[_num(g * N_UNIT) for g in grid],
        delta=band(*laws.delta(grid), laws.ok("vs_params")),
        multiplier=band(*laws.multiplier(grid_c), laws.ok("vs_compute")),
        **laws_n,
    )


def _analyse(
    points: Sequence[ScalePoint],
    cells: dict[str, dict[str, _Cell]],
    source: str,
    parametric: bool,
    n_boot: int = 2000,
    rng_seed: int = 0,
) -> ScalingAnalysis:
    """Δ per scale always; the laws, Δ(N), the multiplier and predictions where they can be fitted."""
    points = sorted(points, key=lambda p: p.n_params)
    rows = [_scale_row(p, cells[p.scale]) for p in points]
    # before its fit: its method and Δ per scale; a fit sets its status and fields
    out = ScalingDoc(
        source=source,
        method=method_text(parametric),
        level=LEVEL,
        n_boot=n_boot,
        status="per_scale_only",
        reason=None,
        schedules=ScheduleNames(schedule=SCHEDULES[0], base=SCHEDULES[1]),
        scales=rows,
    )
    usable = [p for p in points if all(cells[p.scale].get(s) and cells[p.scale][s].n > 1 for s in SCHEDULES)]
    out.reason = _why_no_fit(usable)
    laws = None if out.reason else _fit_laws(usable, cells, n_boot, rng_seed)
    out.reason = out.reason or laws.ill_conditioned()
    if out.reason:
        return ScalingAnalysis(out)
    resampled = _Resampled(laws.means, laws.cells)
    out.status = "fit"
    out.fits, residuals = _fits_and_residuals(laws, resampled.masked)
    out.method = method_text(parametric, len(usable), residuals)
    out.delta_fit, out.multiplier = _measured_scales(laws, resampled.columns)
    out.predictions = _predictions(laws, resampled.columns)
    out.band = _bands(laws, resampled.columns)
    return ScalingAnalysis(out, (*laws.law[SCHEDULES[1]]["vs_compute"], resampled))


def analyse(points: Sequence[ScalePoint], **kwargs) -> ScalingAnalysis:
    """The scaling analysis of reproduced results, seeds resampled (`kwargs`: see _analyse)."""
    _check(points)
    cells = {
        p.scale: {s: _seed_cell(p.losses[s]) for s in SCHEDULES if len(p.losses.get(s, ()))} for p in points
    }
    return _analyse(points, cells, "reproduced", False, **kwargs)


def _seed_cell(losses: Sequence[float]) -> _Cell:
    vals = tuple(map(float, losses))
    sd = sample_sd(vals)
    return _Cell(mean(vals), sd * sd / len(vals) if sd else 0.0, len(vals), vals)


def analyse_paper(table2: Mapping, sizes: Mapping[str, tuple[float, float]], **kwargs) -> ScalingAnalysis:
    """The same analysis of Table 2's printed mean ± s.d.; `sizes`: each scale's (n_params, FLOPs)."""
    n = int(table2.get("seeds", 3))
    points, cells = [], {}
    for scale, row in table2["rows"].items():
        if scale not in sizes:
            raise ScalingInputError(
                f"no size given for the paper's scale {scale!r}: give (n_params, compute)."
            )
        n_params, compute = sizes[scale]
        points.append(ScalePoint(scale, n_params, compute, {s: (row[s]["val_loss"],) for s in SCHEDULES}))
        cells[scale] = {
            s: _Cell(float(row[s]["val_loss"]), float(row[s]["val_loss_sd"]) ** 2 / n, n) for s in SCHEDULES
        }
    _check(points)
    return _analyse(points, cells, f"paper {table2.get('source', 'Table 2')}", True, **kwargs)
