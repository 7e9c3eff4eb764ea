"""Small-sample statistics for the report: mean, sample s.d., Welch's t-test, Student's t
quantiles, Spearman's rho. Pure Python: Student's t CDF is a regularized incomplete beta function
(its standard continued fraction, by modified Lentz), and three seeds do not justify SciPy."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, replace
from statistics import NormalDist
from typing import Sequence


def _scale(xs: Sequence[float]) -> float:
    """A power of two within a factor 2 of the largest |x| (1 for all zeros). Dividing by it is
    exact, so sums and squares of huge finite values (1e308) cannot overflow, and the result,
    multiplied back, is bit for bit the unscaled one wherever that did not overflow."""
    big = max((abs(x) for x in xs), default=0.0)
    return math.ldexp(1.0, math.frexp(big)[1] - 1) if big else 1.0


def mean(xs: Sequence[float]) -> float:
    s = _scale(xs)
    return math.fsum(x / s for x in xs) / len(xs) * s


def sample_sd(xs: Sequence[float]) -> float | None:
    """Standard deviation with n - 1 in the denominator (the paper's "sample s.d."); None if n < 2.
    inf only where the s.d. itself exceeds the largest float (e.g. of 1.7e308 and -1.7e308)."""
    if len(xs) < 2:
        return None
    try:
        sd = _sd(xs)
    except OverflowError:
        sd = math.inf
    if math.isinf(sd):  # a square overflowed (values near 1e308): again in units of a power of two
        s = _scale(xs)
        sd = _sd([x / s for x in xs]) * s
    return sd


def mean_and_sd(xs: Sequence[float]) -> tuple[float | None, float | None]:
    """(mean, sample s.d.) of `xs`: the s.d. None with fewer than two values, both None without any."""
    return (mean(xs), sample_sd(xs)) if xs else (None, None)


def _sd(xs: Sequence[float]) -> float:
    m = mean(xs)
    # ** 2 rather than x * x: pow rounds differently in the last bit, and results stay as they were
    return math.sqrt(math.fsum((x - m) ** 2 for x in xs) / (len(xs) - 1))


def _beta_cf(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta function (converges for x < (a+1)/(a+b+2))."""
    tiny, eps = 1e-300, 1e-15
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 10_000):
        m2 = 2 * m
        for num in (
            m * (b - m) * x / ((qam + m2) * (a + m2)),
            -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2)),
        ):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < eps:
            return h
    raise ArithmeticError(f"incomplete beta continued fraction did not converge (a={a}, b={b}, x={x}).")


def betainc(a: float, b: float, x: float) -> float:
    """Regularized incomplete beta I_x(a, b) for a, b > 0 and 0 <= x <= 1."""
    if not 0.0 <= x <= 1.0:
        raise ValueError(f"x={x} is outside [0, 1].")
    if x in (0.0, 1.0):
        return x
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _beta_cf(a, b, x) / a
    return 1.0 - math.exp(log_front) * _beta_cf(b, a, 1.0 - x) / b


def t_two_sided_p(t: float, df: float) -> float:
    """P(|T| >= |t|) for Student's t with `df` (possibly fractional) degrees of freedom."""
    if df <= 0:
        raise ValueError(f"degrees of freedom {df} must be positive.")
    if math.isinf(t):
        return 0.0
    return betainc(df / 2.0, 0.5, df / (df + t * t))


def t_quantile(p: float, df: float) -> float:
    """The p-quantile of Student's t with `df` (possibly fractional, or inf) degrees of freedom,
    by bisection on the CDF above: 60 halvings reach double precision for any useful p."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"quantile level {p} must lie strictly between 0 and 1.")
    if p == 0.5:
        return 0.0
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    if math.isinf(df):
        return NormalDist().inv_cdf(p)
    tail = 2.0 * (1.0 - p)  # the two-sided p-value of the quantile sought
    lo, hi = 0.0, 1.0
    while t_two_sided_p(hi, df) > tail:
        hi *= 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if t_two_sided_p(mid, df) > tail else (lo, mid)
        if hi - lo <= 1e-15 * hi:
            break
    return 0.5 * (lo + hi)


@dataclass(frozen=True)
class Welch:
    delta: float  # mean(b) - mean(a)
    t: float
    df: float
    p: float  # two-sided


def welch_test(a: Sequence[float], b: Sequence[float]) -> Welch | None:
    """Welch's unequal-variance t-test for mean(b) - mean(a). None when either side has fewer
    than two values or both have zero spread (no test is possible)."""
    if len(a) < 2 or len(b) < 2:
        return None
    sd_a, sd_b = sample_sd(a), sample_sd(b)
    if math.isinf(sd_a) or math.isinf(sd_b):  # e.g. of 1.7e308 and -1.7e308: t, df are scale invariant
        s = _scale([*a, *b])
        w = welch_test([x / s for x in a], [x / s for x in b])
        return w and replace(w, delta=mean(b) - mean(a))
    return welch_from_summary(mean(a), sd_a, len(a), mean(b), sd_b, len(b))


def welch_from_summary(
    mean_a: float, sd_a: float, n_a: int, mean_b: float, sd_b: float, n_b: int
) -> Welch | None:
    """The same test from published summaries (mean, sample s.d., n), e.g. the paper's Table 2."""
    if n_a < 2 or n_b < 2:
        return None
    # t and df are scale invariant: in units of the larger s.d. no square overflows, and the
    # means' difference in units of the larger mean cannot overflow either (1e308 - -1e308)
    s, m = _scale([sd_a, sd_b]), _scale([mean_a, mean_b])
    a, b = sd_a / s, sd_b / s
    va, vb = a * a / n_a, b * b / n_b
    se2 = va + vb
    if se2 == 0.0:
        return None
    diff = mean_b / m - mean_a / m
    t = diff / math.sqrt(se2) * (m / s) if diff else 0.0  # m / s may overflow: then t is inf
    df = se2 * se2 / (va * va / (n_a - 1) + vb * vb / (n_b - 1))
    return Welch(mean_b - mean_a, t, df, t_two_sided_p(t, df))


def ranks(xs: Sequence[float]) -> list[float]:
    """1-based ranks, ties sharing the mean of the ranks they span."""
    out = [0.0] * len(xs)
    i = 0
    for _, tied in itertools.groupby(sorted(range(len(xs)), key=lambda k: xs[k]), key=lambda k: xs[k]):
        tied = list(tied)
        for k in tied:
            out[k] = (2 * i + len(tied) - 1) / 2 + 1
        i += len(tied)
    return out


def spearman(a: Sequence[float], b: Sequence[float]) -> float | None:
    """Spearman's rank correlation of paired values (Pearson's r of their tie-averaged ranks).
    None with fewer than three pairs (two always give +-1) or when either side is constant."""
    if len(a) != len(b):
        raise ValueError(f"spearman needs paired values: {len(a)} and {len(b)} given.")
    if len(a) < 3:
        return None
    ra, rb = ranks(a), ranks(b)
    ma, mb = mean(ra), mean(rb)
    cov = math.fsum((x - ma) * (y - mb) for x, y in zip(ra, rb))
    va = math.fsum((x - ma) ** 2 for x in ra)
    vb = math.fsum((y - mb) ** 2 for y in rb)
    if va == 0.0 or vb == 0.0:
        return None
    return cov / math.sqrt(va * vb)
