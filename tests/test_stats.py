"""prism.stats with huge finite values: a loss or perplexity of 1e308 (valid JSON, finite, >= 0)
gives a mean, s.d. and Welch test instead of an OverflowError, and ordinary values keep the bits
of the plain formulas. tests/test_report.py checks the same statistics on ordinary values."""

from __future__ import annotations

import math

import pytest

from prism.stats import mean, sample_sd, welch_from_summary, welch_test

HUGE = 1e308


def test_mean_and_sd_of_huge_finite_values():
    assert mean([HUGE, HUGE, HUGE]) == HUGE  # math.fsum alone overflows
    assert mean([1.7e308, 1.7e308]) == 1.7e308
    assert mean([HUGE, -HUGE]) == 0.0
    assert sample_sd([HUGE, HUGE]) == 0.0
    assert sample_sd([HUGE, 0.5 * HUGE]) == pytest.approx(0.5 * HUGE / math.sqrt(2), rel=1e-15)
    assert sample_sd([HUGE, -HUGE]) == pytest.approx(math.sqrt(2) * HUGE, rel=1e-15)
    assert sample_sd([1.7e308, -1.7e308]) == math.inf  # the s.d. itself (2.4e308) is past any float


def test_welch_of_huge_values_is_the_test_in_small_units():
    a, b = [3.3800, 3.3760, 3.3720], [3.3650, 3.3630, 3.3610]
    small, huge = welch_test(a, b), welch_test([x * 1e307 for x in a], [x * 1e307 for x in b])
    assert huge.delta == pytest.approx(small.delta * 1e307, rel=1e-9)
    assert (huge.t, huge.df, huge.p) == pytest.approx((small.t, small.df, small.p), rel=1e-9)
    # means and s.d.s of either sign near the largest float: only the difference itself overflows
    w = welch_test([HUGE, -HUGE, HUGE], [-HUGE, HUGE, -HUGE])
    assert w.delta == pytest.approx(-2 / 3 * HUGE) and w.t == pytest.approx(-1 / math.sqrt(2))
    w = welch_from_summary(HUGE, HUGE, 3, -HUGE, HUGE, 3)
    assert w.delta == -math.inf and (w.t, w.df) == pytest.approx((-math.sqrt(6), 4.0))
    assert w.p == pytest.approx(welch_from_summary(1.0, 1.0, 3, -1.0, 1.0, 3).p)
    # huge means, ordinary spread
    w = welch_from_summary(HUGE, 1.0, 3, HUGE, 1.0, 3)
    assert (w.delta, w.t, w.p) == (0.0, 0.0, 1.0)
    assert welch_test([HUGE, HUGE], [HUGE, HUGE]) is None  # no spread, no test


def test_ordinary_values_keep_the_bits_of_the_plain_formulas():
    xs, ys = [3.3800, 3.3760, 3.3720], [3.3650, 3.3630, 3.3610, 3.3702]
    m = math.fsum(xs) / len(xs)
    assert mean(xs) == m
    assert sample_sd(xs) == math.sqrt(math.fsum((x - m) ** 2 for x in xs) / (len(xs) - 1))
    sa, sb = sample_sd(xs), sample_sd(ys)
    va, vb = sa * sa / len(xs), sb * sb / len(ys)
    w = welch_test(xs, ys)
    assert w.delta == mean(ys) - mean(xs)
    assert w.t == (mean(ys) - mean(xs)) / math.sqrt(va + vb)
    assert w.df == (va + vb) * (va + vb) / (va * va / (len(xs) - 1) + vb * vb / (len(ys) - 1))
