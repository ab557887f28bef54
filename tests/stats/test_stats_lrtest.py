"""Likelihood-ratio tests: the statistic and p-value by hand, power against a planted race x gender
interaction, the null rejection rate, and the refusals (bad df, non-nested, separation, non-convergence)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats
from statsmodels.discrete.discrete_model import Logit

from assay.stats import likelihood_ratio_test, nested_logit_lrtest


def _designs(race: np.ndarray, gender: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Main effects (intercept, 2 race dummies, gender) and the same plus the 2 race x gender columns."""
    dummies = np.column_stack([race == 1, race == 2]).astype(float)
    restricted = np.column_stack([np.ones(race.size), dummies, gender])
    return restricted, np.column_stack([restricted, dummies * gender[:, np.newaxis]])


def _simulate(rng: np.random.Generator, n: int, interaction: float) -> tuple[np.ndarray, ...]:
    """Binary outcome from a logistic model with race (3 levels), gender, and an optional interaction."""
    race = rng.integers(0, 3, size=n)
    gender = rng.integers(0, 2, size=n).astype(float)
    restricted, full = _designs(race, gender)
    beta = np.array([-0.5, 0.3, -0.2, 0.4, interaction, -interaction])
    y = (rng.random(n) < 1 / (1 + np.exp(-full @ beta))).astype(float)
    return y, restricted, full


def test_lr_statistic_and_p_value_by_hand() -> None:
    lr, df, p = likelihood_ratio_test(-120.5, -115.25, 2)
    assert lr == pytest.approx(10.5, abs=1e-12) and df == 2
    assert p == stats.chi2.sf(10.5, 2)


def test_nested_logit_matches_hand_computation_from_fits() -> None:
    y, restricted, full = _simulate(np.random.default_rng(0), n=600, interaction=0.5)
    result = nested_logit_lrtest(y, restricted, full)
    llf_r = Logit(y, restricted).fit(disp=0).llf
    llf_f = Logit(y, full).fit(disp=0).llf
    assert result.llf_restricted == pytest.approx(llf_r, abs=1e-9)
    assert result.llf_full == pytest.approx(llf_f, abs=1e-9)
    assert result.lr == pytest.approx(2 * (llf_f - llf_r), abs=1e-8)
    assert result.df == 2
    assert result.p_value == pytest.approx(stats.chi2.sf(result.lr, 2), rel=1e-12)


def test_planted_interaction_is_detected() -> None:
    y, restricted, full = _simulate(np.random.default_rng(1), n=4000, interaction=0.6)
    assert nested_logit_lrtest(y, restricted, full).p_value < 0.01


def test_null_rejection_rate_is_nominal() -> None:
    """200 null data sets at n=400, alpha 0.05: the rejection count must lie in the binomial(200, 0.05) 99.9%
    band (2 to 21 rejections). Observed with this seed: 11/200 = 0.055."""
    rng = np.random.default_rng(2024)
    reps, alpha = 200, 0.05
    rejections = sum(
        nested_logit_lrtest(*_simulate(rng, n=400, interaction=0.0)).p_value < alpha for _ in range(reps)
    )
    low, high = stats.binom.interval(0.999, reps, alpha)
    assert low <= rejections <= high, f"{rejections}/{reps} rejections outside [{low}, {high}]"


@pytest.mark.parametrize("df", [-1, 0, 1.5])
def test_bad_df_raises(df: float) -> None:
    with pytest.raises(ValueError, match="df_diff"):
        likelihood_ratio_test(-10.0, -9.0, df)  # type: ignore[arg-type]


def test_swapped_log_likelihoods_raise_but_rounding_is_clipped() -> None:
    with pytest.raises(ValueError, match="swapped or non-nested"):
        likelihood_ratio_test(-9.0, -10.0, 1)
    lr, _, p = likelihood_ratio_test(-10.0, -10.0 - 1e-12, 1)
    assert lr == 0.0 and p == 1.0


def test_perfect_separation_raises() -> None:
    rng = np.random.default_rng(3)
    x = rng.normal(size=200)
    y = (x > 0).astype(float)
    full = np.column_stack([np.ones(200), x])
    with pytest.raises(ValueError, match="separated"):
        nested_logit_lrtest(y, full[:, :1], full)


def test_quasi_separation_raises() -> None:
    """One group is all ones: its coefficient diverges although the other group is mixed."""
    rng = np.random.default_rng(4)
    group = np.repeat([0.0, 1.0], 100)
    y = np.where(group == 1, 1.0, (rng.random(200) < 0.5).astype(float))
    full = np.column_stack([np.ones(200), group])
    with pytest.raises(ValueError, match="separated"):
        nested_logit_lrtest(y, full[:, :1], full)


def test_design_checks() -> None:
    y, restricted, full = _simulate(np.random.default_rng(5), n=300, interaction=0.0)
    with pytest.raises(ValueError, match="more columns"):
        nested_logit_lrtest(y, full, restricted)
    with pytest.raises(ValueError, match="not nested"):
        unrelated = np.column_stack([np.ones(300), np.random.default_rng(6).normal(size=300)])
        nested_logit_lrtest(y, unrelated, full)
    with pytest.raises(ValueError, match="full column rank"):
        nested_logit_lrtest(y, restricted, np.column_stack([full, full[:, :1]]))
    with pytest.raises(ValueError, match="binary"):
        nested_logit_lrtest(y * 2, restricted, full)
