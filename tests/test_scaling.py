"""The scaling analysis (prism.report.scaling) on synthetic power laws whose truth is known: the fit
recovers E, A and α, and the bootstrap intervals cover the truth about as often as they claim."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import yaml

from prism.report.paper import default_paper_dir
from prism.report.scaling import (
    MIN_SCALES,
    ScalePoint,
    ScalingInputError,
    analyse,
    analyse_paper,
    fit_power_law,
)
from prism.runs.records import ScalingDoc
from prism.stats import t_quantile

# Six sizes like the ladder's (three rungs below 124M and the paper's three); compute = 6·N·D with
# D = 25·N tokens. Along that line the loss-vs-compute law is a power law too, with exponent α/2.
N = np.array([30e6, 50e6, 80e6, 124e6, 354e6, 757e6])
C = 150.0 * N**2
E, A_UNIFORM, A_PRISM, ALPHA = 1.9, 0.5, 0.49, 0.35
SEED_SD = 0.0015  # Table 2's seed s.d. run from 0.0002 to 0.0027
SEEDS = 3


def law(a: float, n) -> np.ndarray:
    return E + a * (np.asarray(n) / 1e9) ** -ALPHA


TRUTH = {
    "alpha": ALPHA,
    "E": E,
    "delta_124m": float(law(A_PRISM, 124e6) - law(A_UNIFORM, 124e6)),
    "delta_1.5b": float(law(A_PRISM, 1.5e9) - law(A_UNIFORM, 1.5e9)),
    # the uniform model reaches Prism's loss with (A_u/A_p)^(1/(α/2)) times the compute, at every C
    "multiplier_124m": (A_UNIFORM / A_PRISM) ** (2 / ALPHA),
}


def draw_points(rng: np.random.Generator, sd: float = SEED_SD, seeds: int = SEEDS) -> list[ScalePoint]:
    return [
        ScalePoint(
            f"s{j}",
            n,
            c,
            {
                "uniform": law(A_UNIFORM, n) + sd * rng.standard_normal(seeds),
                "prism": law(A_PRISM, n) + sd * rng.standard_normal(seeds),
            },
        )
        for j, (n, c) in enumerate(zip(N, C))
    ]


def reported(doc: dict) -> dict:
    fit = doc["fits"]["uniform"]["vs_params"]
    return {
        "alpha": fit["alpha"],
        "E": fit["E"],
        "delta_124m": doc["delta_fit"][3],
        "delta_1.5b": doc["predictions"][0]["delta"],
        "multiplier_124m": doc["multiplier"][3],
    }


def test_t_quantile_matches_closed_forms():
    for p in (0.6, 0.9, 0.975, 0.995):
        assert t_quantile(p, 1) == pytest.approx(math.tan(math.pi * (p - 0.5)), rel=1e-12)
        assert t_quantile(p, 2) == pytest.approx((2 * p - 1) / math.sqrt(2 * p * (1 - p)), rel=1e-12)
        assert t_quantile(1 - p, 2) == pytest.approx(-t_quantile(p, 2), rel=1e-12)
    assert t_quantile(0.975, math.inf) == pytest.approx(1.959963984540054, rel=1e-12)


def test_fit_recovers_a_noiseless_law():
    x = N / 1e9
    y = np.stack([law(A_UNIFORM, N), 2.5 + 0.2 * x**-0.08])
    fits = fit_power_law(x, y)
    assert fits.ok.all()
    # α's grid step after the fine search and parabola is far below these tolerances; E and A
    # follow α in closed form
    assert fits.alpha == pytest.approx([ALPHA, 0.08], rel=1e-5)
    assert fits.E == pytest.approx([E, 2.5], rel=1e-5)
    assert fits.A == pytest.approx([A_UNIFORM, 0.2], rel=1e-4)


@pytest.mark.slow
def test_intervals_cover_the_truth_as_often_as_they_claim():
    """200 synthetic ladders with Table 2-like seed noise: each 95 % interval's coverage. With 200
    draws a coverage's own s.d. is 1.5 points, so [0.92, 0.98] is two s.d. either side of 0.95."""
    rng = np.random.default_rng(2024)
    draws, hits = 200, dict.fromkeys(TRUTH, 0)
    for i in range(draws):
        doc = analyse(draw_points(rng), n_boot=400, rng_seed=i).record.as_json()
        assert doc["status"] == "fit", doc["reason"]
        for key, iv in reported(doc).items():
            hits[key] += iv["lo"] <= TRUTH[key] <= iv["hi"]
    coverage = {k: v / draws for k, v in hits.items()}
    print("coverage of 95 % intervals over", draws, "draws:", coverage)
    for key, c in coverage.items():
        assert 0.92 <= c <= 0.985, (key, coverage)


@pytest.mark.slow
def test_estimates_are_unbiased_on_average():
    rng = np.random.default_rng(5)
    docs = [analyse(draw_points(rng), n_boot=200, rng_seed=i).record.as_json() for i in range(40)]
    for key in ("alpha", "delta_124m", "multiplier_124m"):
        est = np.array([reported(d)[key]["value"] for d in docs])
        # the mean of 40 estimates sits within 4 standard errors of the truth
        assert abs(est.mean() - TRUTH[key]) < 4 * est.std(ddof=1) / math.sqrt(len(est)), key


def test_prediction_interval_widens_outside_the_data():
    doc = analyse(draw_points(np.random.default_rng(1)), n_boot=500).record.as_json()
    inside = doc["delta_fit"][-1]
    widths = [inside["hi"] - inside["lo"]] + [p["delta"]["hi"] - p["delta"]["lo"] for p in doc["predictions"]]
    assert widths == sorted(widths) and widths[-1] > 1.5 * widths[0]
    assert [p["extrapolation"] for p in doc["predictions"]] == pytest.approx(
        [1.5e9 / 757e6, 3e9 / 757e6], rel=1e-5
    )


def test_too_few_scales_or_a_flat_loss_shows_delta_per_scale_only():
    points = draw_points(np.random.default_rng(2))
    few = analyse(points[: MIN_SCALES - 1]).record.as_json()
    assert few["status"] == "per_scale_only" and "at least 3" in few["reason"]
    assert "fits" not in few and "predictions" not in few  # no fitted number without its interval
    assert all(row["delta"]["lo"] < row["delta"]["value"] < row["delta"]["hi"] for row in few["scales"])

    flat = [
        ScalePoint(p.scale, p.n_params, p.compute, {s: [3.0 + 0.001 * k for k in range(3)] for s in p.losses})
        for p in points
    ]
    doc = analyse(flat).record.as_json()
    assert doc["status"] == "per_scale_only" and "ill-conditioned" in doc["reason"]

    one_seed = [
        ScalePoint(p.scale, p.n_params, p.compute, {s: v[:1] for s, v in p.losses.items()}) for p in points
    ]
    doc = analyse(one_seed).record.as_json()
    assert doc["status"] == "per_scale_only" and doc["scales"][0]["delta"] is None


def test_bad_input_is_refused_in_one_sentence():
    points = draw_points(np.random.default_rng(3))
    with pytest.raises(ScalingInputError, match="given twice"):
        analyse([points[0], points[0], *points[1:]])
    with pytest.raises(ScalingInputError, match="n_params=0"):
        analyse([ScalePoint("x", 0, 1.0, points[0].losses), *points[1:]])
    with pytest.raises(ScalingInputError, match="must be finite"):
        analyse(
            [ScalePoint("x", 1e6, 1.0, {"uniform": [float("nan"), 3.0], "prism": [3.0, 3.1]}), *points[1:]]
        )


def test_the_same_results_give_the_same_bytes():
    points = draw_points(np.random.default_rng(4))
    a = json.dumps(analyse(points, n_boot=300).record.as_json(), sort_keys=True)
    assert a == json.dumps(analyse(points, n_boot=300).record.as_json(), sort_keys=True)


def test_the_document_reads_back_as_its_record():
    """scaling.json's analysis is a ScalingDoc: what it writes, the record reads back unchanged
    (key order included), and every number in it is finite (an unbounded side is null)."""
    doc = analyse(draw_points(np.random.default_rng(4)), n_boot=300).record
    written = json.loads(json.dumps(doc.as_json(), allow_nan=False))
    back = ScalingDoc.check(written)
    assert back.fitted and back.as_json() == written
    assert list(back.as_json()) == list(written) and list(back.band.as_json())[-2:] == ["prism", "uniform"]


def test_paper_table2_is_interpolated_exactly_and_predicted_with_intervals():
    table2 = yaml.safe_load((default_paper_dir() / "table2.yaml").read_text())
    sizes = {
        "124m": (123_587_328, 2.4648e18),
        "354m": (355_124_224, 2.5509e19),
        "757m": (756_819_456, 1.0473e20),
    }
    a = analyse_paper(table2, sizes, n_boot=1000)
    doc = a.record.as_json()
    assert doc["status"] == "fit"
    printed = {s: r["prism"]["val_loss"] - r["uniform"]["val_loss"] for s, r in table2["rows"].items()}
    for row in doc["delta_fit"]:  # three points, three numbers: the law passes through them
        assert row["value"] == pytest.approx(printed[row["scale"]], abs=1e-6)
        assert row["lo"] < row["value"] < row["hi"]
    for p in doc["predictions"]:
        assert p["delta"]["lo"] < p["delta"]["value"] < p["delta"]["hi"]
    # a slower schedule sees fewer tokens in the same time: the uniform law says that costs loss
    assert a.loss_shift(2.4648e18, 1.0).value == pytest.approx(0.0, abs=1e-12)
    shift = a.loss_shift(2.4648e18, 0.917)
    assert 0 < shift.lo < shift.value < shift.hi
