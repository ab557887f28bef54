"""Cluster-robust inference against statsmodels (OLS and Logit with cov_type="cluster", one- and two-way) and
the Rao-Scott correction against its definition (generalised eigenvalues by scipy, Satterthwaite by hand)."""

from __future__ import annotations

import numpy as np
import pytest
import statsmodels.api as sm
from scipy import linalg, stats

from assay.stats.clustered import (
    cluster_robust_cov,
    clustered_difference,
    design_effects,
    rao_scott_lrtest,
)


@pytest.fixture(scope="module")
def data() -> dict[str, np.ndarray]:
    """Binary outcomes with dialogue effects: 150 dialogues of 2 to 3 ratings from 30 annotators."""
    rng = np.random.default_rng(0)
    dialogue = np.repeat(np.arange(150), rng.integers(2, 4, 150))
    annotator = rng.integers(0, 30, dialogue.size)
    group = rng.integers(0, 2, dialogue.size)
    effect = rng.normal(0, 1.5, 150)[dialogue]
    y = (rng.random(dialogue.size) < 1 / (1 + np.exp(0.5 - effect))).astype(float)
    x = np.column_stack([np.ones(y.size), group, rng.standard_normal(y.size), rng.standard_normal(y.size)])
    return {"y": y, "group": group, "dialogue": dialogue, "annotator": annotator, "x": x}


@pytest.mark.parametrize("two_way", [False, True])
def test_difference_equals_statsmodels_ols_cluster(data: dict, two_way: bool) -> None:
    groups = np.column_stack([data["dialogue"], data["annotator"]]) if two_way else data["dialogue"]
    fit = sm.OLS(data["y"], sm.add_constant(data["group"].astype(float))).fit(
        cov_type="cluster", cov_kwds={"groups": groups}, use_t=True
    )
    test = clustered_difference(data["y"], data["group"], groups)
    assert test.difference == pytest.approx(fit.params[1], abs=1e-12)
    assert test.se == pytest.approx(fit.bse[1], rel=1e-12)
    assert test.p_value == pytest.approx(fit.pvalues[1], rel=1e-10)
    assert test.df == fit.df_resid_inference == (29 if two_way else 149)
    # string labels are the same clusters as integer ones
    labels = np.char.add("d", data["dialogue"].astype(str))
    assert clustered_difference(data["y"], data["group"], labels).se == pytest.approx(
        clustered_difference(data["y"], data["group"], data["dialogue"]).se, rel=1e-14
    )


def test_sandwich_equals_statsmodels_logit_cluster(data: dict) -> None:
    y, x = data["y"], data["x"]
    for groups in (data["dialogue"], np.column_stack([data["dialogue"], data["annotator"]])):
        fit = sm.Logit(y, x).fit(disp=0, cov_type="cluster", cov_kwds={"groups": groups})
        p = fit.predict()
        bread = np.linalg.inv((x * (p * (1 - p))[:, np.newaxis]).T @ x)
        robust = cluster_robust_cov(bread, x * (y - p)[:, np.newaxis], groups)
        np.testing.assert_allclose(robust.cov, fit.cov_params(), rtol=1e-9, atol=1e-14)


def test_rao_scott_against_its_definition(data: dict) -> None:
    y, x = data["y"], data["x"]
    fit = sm.Logit(y, x).fit(disp=0)
    p = fit.predict()
    model = np.linalg.inv((x * (p * (1 - p))[:, np.newaxis]).T @ x)
    robust = cluster_robust_cov(model, x * (y - p)[:, np.newaxis], data["dialogue"])
    tested = [2, 3]
    effects = design_effects(model, robust.cov, tested)
    expected = linalg.eigh(
        robust.cov[np.ix_(tested, tested)], model[np.ix_(tested, tested)], eigvals_only=True
    )
    np.testing.assert_allclose(effects, np.sort(expected), rtol=1e-10)
    lr = 7.5
    test = rao_scott_lrtest(lr, effects, robust.n_clusters[0])
    scale, nu = np.sum(effects**2) / np.sum(effects), np.sum(effects) ** 2 / np.sum(effects**2)
    assert test.df1 == pytest.approx(nu, rel=1e-12) and test.df2 == 149
    assert test.p_value == pytest.approx(stats.f.sf(lr / scale / nu, nu, 149), rel=1e-12)
    # one tested coefficient: LR / d against F(1, G-1), i.e. a squared t on G-1 df
    single = rao_scott_lrtest(4.0, [2.0], 11)
    assert single.p_value == pytest.approx(2 * stats.t.sf(np.sqrt(2.0), 10), rel=1e-12)


def test_refusals(data: dict) -> None:
    with pytest.raises(ValueError, match="no variation"):
        clustered_difference(np.zeros(20), np.tile([0, 1], 10), np.arange(20) // 2)
    with pytest.raises(ValueError, match="both groups"):
        clustered_difference(np.zeros(4), np.ones(4), np.arange(4))
    with pytest.raises(ValueError, match="at least 2 clusters"):
        clustered_difference(np.array([0, 1, 1, 0.0]), np.array([0, 0, 1, 1]), np.zeros(4))
    with pytest.raises(ValueError, match="positive"):
        rao_scott_lrtest(3.0, [1.2, -0.1], 50)
