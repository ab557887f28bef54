"""Firth's penalised logistic regression against R's logistf (published reference values) and against a second
derivation (root of the modified score with an explicit hat matrix, by scipy), and the automatic fallback from
maximum likelihood to Firth when the MLE does not exist."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import optimize, stats
from scipy.special import expit

from assay.stats.firth import firth_logit, firth_lrtest
from assay.stats.lrtest import FIRTH, MLE, logit_lrtest, nested_logit_lrtest


def _separated(seed: int = 42, n: int = 100) -> tuple[np.ndarray, np.ndarray]:
    """firthmodels' quasi-separated test data (tests/conftest.py there), whose logistf fit is published."""
    rng = np.random.default_rng(seed)
    separator = rng.choice([0, 1], n, p=[0.8, 0.2])
    x1 = rng.standard_normal(n)
    x2 = rng.uniform(-1, 1, n)
    x3 = rng.exponential(scale=2.0, size=n)
    y = rng.binomial(1, expit(-0.5 + 0.8 * x1 - 0.6 * x2 + 0.3 * x3))
    y[separator == 1] = 1
    return y.astype(float), np.column_stack([np.ones(n), separator, x1, x2, x3])


# logistf 1.26 on that data (firthmodels' test_matches_logistf_with_separation), intercept first.
LOGISTF_COEF = np.array([-0.4434562830, 3.6577140153, 0.6759781501, -0.8633119501, 0.3385788510])
LOGISTF_SE = np.array([0.3452906671, 1.4822786334, 0.2687886213, 0.3874453554, 0.1370778814])
LOGISTF_PLR_P = np.array([0.1997147194, 0.0002084147149, 0.0093173148959, 0.0236385713206, 0.0055887969164])


def _modified_score(beta: np.ndarray, y: np.ndarray, x: np.ndarray, fixed: list[int]) -> np.ndarray:
    """U*(b) = X'(y - p + h (1/2 - p)) with h the diagonal of W^1/2 X (X'WX)^-1 X' W^1/2, built in full."""
    p = expit(x @ beta)
    root_w = np.sqrt(p * (1 - p))
    xw = x * root_w[:, np.newaxis]
    hat = np.diag(xw @ np.linalg.inv(xw.T @ xw) @ xw.T)
    score = x.T @ (y - p + hat * (0.5 - p))
    return np.delete(score, fixed)


def _root(y: np.ndarray, x: np.ndarray, fixed: list[int]) -> tuple[np.ndarray, float]:
    """Second derivation: solve U*_free = 0 with scipy's hybrid root finder; the penalised log-likelihood
    computed with slogdet."""
    free = [j for j in range(x.shape[1]) if j not in fixed]

    def full(b: np.ndarray) -> np.ndarray:
        beta = np.zeros(x.shape[1])
        beta[free] = b
        return beta

    found = optimize.root(lambda b: _modified_score(full(b), y, x, fixed), np.zeros(len(free)), tol=1e-13)
    beta = full(found.x)
    assert np.abs(_modified_score(beta, y, x, fixed)).max() < 1e-10, found.message
    eta = x @ beta
    p = expit(eta)
    info = (x * (p * (1 - p))[:, np.newaxis]).T @ x
    penalised = np.sum(y * eta - np.log1p(np.exp(eta))) + 0.5 * np.linalg.slogdet(info)[1]
    return beta, float(penalised)


def test_fit_matches_logistf_on_separated_data() -> None:
    y, x = _separated()
    fit = firth_logit(y, x)
    # logistf's own convergence tolerance leaves its printed coefficients good to about 1e-7 relative.
    np.testing.assert_allclose(fit.coef, LOGISTF_COEF, rtol=5e-7)
    np.testing.assert_allclose(np.sqrt(np.diag(fit.cov)), LOGISTF_SE, rtol=2e-6)
    for column, expected in enumerate(LOGISTF_PLR_P):
        assert firth_lrtest(y, x, [column]).p_value == pytest.approx(expected, rel=1e-9)


def test_fit_and_penalised_lr_match_a_second_derivation() -> None:
    y, x = _separated(seed=7, n=80)
    fit = firth_logit(y, x)
    beta, penalised = _root(y, x, [])
    np.testing.assert_allclose(fit.coef, beta, rtol=1e-9, atol=1e-10)
    assert fit.penalized_llf == pytest.approx(penalised, rel=1e-12)
    test = firth_lrtest(y, x, [2, 3])  # a 2-df joint test: the restricted fit keeps the full penalty
    restricted_beta, restricted_penalised = _root(y, x, [2, 3])
    np.testing.assert_allclose(test.restricted.coef, restricted_beta, rtol=1e-9, atol=1e-10)
    assert test.lr == pytest.approx(2 * (penalised - restricted_penalised), rel=1e-9)
    assert test.df == 2 and test.p_value == pytest.approx(stats.chi2.sf(test.lr, 2), rel=1e-12)


def test_two_by_two_table_gives_the_haldane_odds_ratio() -> None:
    """For a 2x2 table Firth's log odds ratio is the one with 0.5 added to every cell, zero cells included."""
    a, b, c, d = 7, 0, 3, 9  # the group never had a 'not broken': the MLE of the odds ratio is infinite
    group = np.repeat([1.0, 1.0, 0.0, 0.0], [a, b, c, d])
    y = np.repeat([1.0, 0.0, 1.0, 0.0], [a, b, c, d])
    fit = firth_logit(y, np.column_stack([np.ones(y.size), group]))
    haldane = np.log((a + 0.5) * (d + 0.5) / ((b + 0.5) * (c + 0.5)))
    assert fit.coef[1] == pytest.approx(haldane, rel=1e-9)


def test_auto_lrtest_uses_mle_where_it_exists_and_firth_where_it_does_not() -> None:
    rng = np.random.default_rng(3)
    n = 400
    x1, x2 = rng.integers(0, 2, n).astype(float), rng.standard_normal(n)
    y = (rng.random(n) < expit(-0.3 + 0.5 * x1 + 0.4 * x2)).astype(float)
    restricted = np.column_stack([np.ones(n), x1])
    full = np.column_stack([restricted, x2])
    auto = logit_lrtest(y, restricted, full)
    plain = nested_logit_lrtest(y, restricted, full)
    assert auto.method == MLE and auto.lr == pytest.approx(plain.lr, rel=1e-10) and auto.tested == (2,)
    forced = logit_lrtest(y, restricted, full, firth=True)
    assert forced.method == FIRTH and forced.lr == pytest.approx(firth_lrtest(y, full, [2]).lr, rel=1e-12)

    y_sep, x = _separated()
    with pytest.raises(ValueError, match="separated"):
        nested_logit_lrtest(y_sep, x[:, [0, 2, 3, 4]], x[:, [0, 2, 3, 4, 1]])
    fallback = logit_lrtest(y_sep, x[:, [0, 2, 3, 4]], x[:, [0, 2, 3, 4, 1]])
    assert fallback.method == FIRTH and fallback.p_value == pytest.approx(LOGISTF_PLR_P[1], rel=1e-9)
    with pytest.raises(ValueError, match="separated"):
        logit_lrtest(y_sep, x[:, [0, 2, 3, 4]], x[:, [0, 2, 3, 4, 1]], firth=False)


def test_refusals() -> None:
    y, x = _separated(n=30)
    with pytest.raises(ValueError, match="full column rank"):
        firth_logit(y, np.column_stack([x, x[:, 1]]))
    with pytest.raises(ValueError, match="binary"):
        firth_logit(y * 2, x)
    with pytest.raises(ValueError, match="non-empty subset"):
        firth_lrtest(y, x, [])
    with pytest.raises(ValueError, match="followed by"):
        logit_lrtest(y, x[:, 1:3], x)
