"""Proportion tests and intervals against statsmodels (to 1e-12) and an independent odds-ratio computation."""

from __future__ import annotations

import math

import numpy as np
import pytest
from statsmodels.stats.contingency_tables import Table2x2
from statsmodels.stats.proportion import proportion_confint, proportions_ztest

from assay.stats import odds_ratio_ci, proportion_ci, two_proportion_ztest


def _random_pairs(seed: int, cases: int) -> list[tuple[int, int, int, int]]:
    """Random (count1, n1, count2, n2) with a pooled rate strictly inside (0, 1)."""
    rng = np.random.default_rng(seed)
    out = []
    while len(out) < cases:
        n1, n2 = (int(x) for x in rng.integers(1, 5000, size=2))
        c1, c2 = int(rng.integers(0, n1 + 1)), int(rng.integers(0, n2 + 1))
        if 0 < c1 + c2 < n1 + n2:
            out.append((c1, n1, c2, n2))
    return out


def test_ztest_matches_statsmodels_pooled_two_sided() -> None:
    for c1, n1, c2, n2 in _random_pairs(seed=0, cases=500):
        z, p = two_proportion_ztest(c1, n1, c2, n2)
        z_sm, p_sm = proportions_ztest([c1, c2], [n1, n2])
        assert z == pytest.approx(float(z_sm), abs=1e-12, rel=1e-12)
        assert p == pytest.approx(float(p_sm), abs=1e-12)


def test_ztest_small_and_lopsided_cases() -> None:
    for c1, n1, c2, n2 in [(0, 1, 1, 1), (1, 2, 0, 3), (0, 1000, 1, 1000), (999, 1000, 1000, 1000)]:
        z, p = two_proportion_ztest(c1, n1, c2, n2)
        z_sm, p_sm = proportions_ztest([c1, c2], [n1, n2])
        assert (z, p) == pytest.approx((float(z_sm), float(p_sm)), abs=1e-12)


def test_ztest_symmetry() -> None:
    z, p = two_proportion_ztest(30, 100, 45, 120)
    z_swapped, p_swapped = two_proportion_ztest(45, 120, 30, 100)
    assert z == pytest.approx(-z_swapped) and p == pytest.approx(p_swapped)


@pytest.mark.parametrize("args", [(0, 10, 0, 20), (10, 10, 20, 20)])
def test_ztest_without_variance_raises(args: tuple[int, int, int, int]) -> None:
    with pytest.raises(ValueError, match="pooled proportion"):
        two_proportion_ztest(*args)


@pytest.mark.parametrize("args", [(5, 0, 1, 2), (11, 10, 1, 2), (-1, 10, 1, 2)])
def test_ztest_rejects_impossible_counts(args: tuple[int, int, int, int]) -> None:
    with pytest.raises(ValueError, match="group 1"):
        two_proportion_ztest(*args)


@pytest.mark.parametrize("method", ["wilson", "normal"])
@pytest.mark.parametrize("confidence", [0.9, 0.95, 0.99])
def test_proportion_ci_matches_statsmodels(method: str, confidence: float) -> None:
    rng = np.random.default_rng(1)
    ns = rng.integers(1, 3000, size=300)
    cases = [(int(rng.integers(0, n + 1)), int(n)) for n in ns] + [(0, 7), (7, 7), (1, 1), (0, 1)]
    for count, n in cases:
        low, high = proportion_ci(count, n, confidence=confidence, method=method)  # type: ignore[arg-type]
        low_sm, high_sm = proportion_confint(count, n, alpha=1 - confidence, method=method)
        assert low == pytest.approx(float(low_sm), abs=1e-12)
        assert high == pytest.approx(float(high_sm), abs=1e-12)
        assert 0.0 <= low <= count / n <= high <= 1.0


def test_wilson_is_not_degenerate_at_zero() -> None:
    low, high = proportion_ci(0, 50)
    assert low == 0.0 and high > 0.05
    assert proportion_ci(0, 50, method="normal") == (0.0, 0.0)


def test_proportion_ci_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="method"):
        proportion_ci(3, 10, method="exact")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="confidence"):
        proportion_ci(3, 10, confidence=95)
    with pytest.raises(ValueError, match="count"):
        proportion_ci(11, 10)


def _woolf_by_hand(a: float, b: float, c: float, d: float, z: float) -> tuple[float, float, float]:
    estimate = (a * d) / (b * c)
    se = math.sqrt(1 / a + 1 / b + 1 / c + 1 / d)
    return estimate, estimate * math.exp(-z * se), estimate * math.exp(z * se)


def test_odds_ratio_matches_statsmodels_table2x2_without_zeros() -> None:
    rng = np.random.default_rng(2)
    for _ in range(300):
        a, b, c, d = (int(x) for x in rng.integers(1, 500, size=4))
        for confidence in (0.9, 0.95):
            result = odds_ratio_ci(a, b, c, d, confidence=confidence)
            table = Table2x2(np.array([[a, b], [c, d]]))
            low_sm, high_sm = table.oddsratio_confint(alpha=1 - confidence)
            assert not result.corrected
            assert result.odds_ratio == pytest.approx(table.oddsratio, rel=1e-12)
            assert result.low == pytest.approx(low_sm, rel=1e-12)
            assert result.high == pytest.approx(high_sm, rel=1e-12)


def test_odds_ratio_haldane_only_when_a_cell_is_zero() -> None:
    z = 1.959963984540054
    corrected = odds_ratio_ci(0, 10, 5, 20)
    assert corrected.corrected
    assert corrected[:3] == pytest.approx(_woolf_by_hand(0.5, 10.5, 5.5, 20.5, z), rel=1e-12)
    plain = odds_ratio_ci(1, 10, 5, 20)
    assert not plain.corrected
    assert plain[:3] == pytest.approx(_woolf_by_hand(1, 10, 5, 20, z), rel=1e-12)


def test_odds_ratio_rejects_negative_cells() -> None:
    with pytest.raises(ValueError, match="non-negative"):
        odds_ratio_ci(-1, 2, 3, 4)
