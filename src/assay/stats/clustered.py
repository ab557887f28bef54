"""Inference that respects clustering: STAR ratings come two or three to a dialogue and many to an annotator,
so they are not independent units, and tests that treat them as such reject a true null too often.

* ``cluster_robust_cov``: the CR1 sandwich covariance, one-way or two-way (Cameron, Gelbach and Miller 2011:
  ``V_a + V_b - V_ab``), with statsmodels' small-sample factor ``G/(G-1) * (N-1)/(N-K)`` per dimension.
* ``clustered_difference``: difference of two shares (the slope of a linear probability model on a 0/1
  indicator) with a cluster-robust standard error and a t reference on ``G - 1`` degrees of freedom, G the
  smaller number of clusters. It stays defined when a share is 0% or 100%, where a logistic MLE does not.
* ``rao_scott_lrtest``: the likelihood-ratio statistic of a logistic fit divided by its design effects (Rao
  and Scott 1984; the "working likelihood ratio" of Lumley and Scott 2014): under clustering ``LR`` behaves as
  ``sum_j d_j chi2_1`` with ``d_j`` the eigenvalues of ``V_model^-1 V_robust`` on the tested coefficients; a
  Satterthwaite match ``LR / a ~ chi2_nu`` and an F reference on ``G - 1`` denominator degrees of freedom.
  It works with penalised (Firth) fits too, so separation and clustering are handled together.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import numpy.typing as npt
from scipy import stats


class ClusteredCov(NamedTuple):
    """Cluster-robust covariance and the cluster counts behind it (one per dimension)."""

    cov: np.ndarray
    n_clusters: tuple[int, ...]

    @property
    def df(self) -> int:
        """Degrees of freedom for t and F references: fewest clusters minus one."""
        return min(self.n_clusters) - 1


class DifferenceTest(NamedTuple):
    """Difference of two shares (group 1 minus group 0), its robust SE, t statistic, df and p-value."""

    difference: float
    se: float
    statistic: float
    df: int
    p_value: float
    n_clusters: tuple[int, ...]


class RaoScottTest(NamedTuple):
    """Design-effect corrected LR test: F statistic with (df1, df2), p-value, and the design effects."""

    statistic: float
    df1: float
    df2: int
    p_value: float
    design_effects: tuple[float, ...]


def _labels(groups: npt.ArrayLike, n: int) -> np.ndarray:
    """Cluster labels as an n x d array of integer codes (d = 1 or 2 dimensions)."""
    raw = np.asarray(groups)
    if raw.ndim == 1:
        raw = raw[:, np.newaxis]
    if raw.ndim != 2 or raw.shape[0] != n or raw.shape[1] not in (1, 2):
        raise ValueError(f"groups must have {n} rows and 1 or 2 columns, got shape {raw.shape}")
    if raw.dtype.kind not in "iub":  # any labels: compare them as text, so 1 and "1" are one cluster
        raw = raw.astype(str)
    return np.column_stack(
        [np.unique(raw[:, j], return_inverse=True)[1].ravel() for j in range(raw.shape[1])]
    )


def _one_way(bread: np.ndarray, scores: np.ndarray, codes: np.ndarray) -> tuple[np.ndarray, int]:
    n, k = scores.shape
    n_groups = int(codes.max()) + 1
    if n_groups < 2:
        raise ValueError("cluster-robust inference needs at least 2 clusters")
    sums = np.column_stack([np.bincount(codes, weights=scores[:, j], minlength=n_groups) for j in range(k)])
    factor = n_groups / (n_groups - 1) * (n - 1) / (n - k)
    return factor * bread @ (sums.T @ sums) @ bread, n_groups


def cluster_robust_cov(bread: npt.ArrayLike, scores: npt.ArrayLike, groups: npt.ArrayLike) -> ClusteredCov:
    """CR1 sandwich ``bread @ meat @ bread`` from per-row score contributions (n x k) and cluster labels
    (n, or n x 2 for two-way clustering). ``bread`` is the model's inverse information (or (X'X)^-1 for OLS).

    Two-way clustering can give a covariance that is not positive semi-definite; callers check the variances
    they use, as this function returns the matrix as computed.
    """
    bread_ = np.asarray(bread, dtype=float)
    scores_ = np.asarray(scores, dtype=float)
    if scores_.ndim != 2 or bread_.shape != (scores_.shape[1], scores_.shape[1]):
        raise ValueError(f"scores must be n x k and bread k x k, got {scores_.shape} and {bread_.shape}")
    codes = _labels(groups, scores_.shape[0])
    if scores_.shape[0] <= scores_.shape[1]:
        raise ValueError("cluster-robust inference needs more rows than parameters")
    if codes.shape[1] == 1:
        cov, g = _one_way(bread_, scores_, codes[:, 0])
        return ClusteredCov(cov, (g,))
    cov_a, g_a = _one_way(bread_, scores_, codes[:, 0])
    cov_b, g_b = _one_way(bread_, scores_, codes[:, 1])
    both = np.unique(codes, axis=0, return_inverse=True)[1].ravel()
    cov_ab, _ = _one_way(bread_, scores_, both)
    return ClusteredCov(cov_a + cov_b - cov_ab, (g_a, g_b))


def clustered_difference(y: npt.ArrayLike, group: npt.ArrayLike, groups: npt.ArrayLike) -> DifferenceTest:
    """Share of ``y`` where ``group`` is 1 minus the share where it is 0, tested with a cluster-robust SE.

    Equal to statsmodels ``OLS(y, [1, group]).fit(cov_type="cluster", use_t=True)`` on the slope. Raises
    ValueError when a group is empty or the SE is 0 (no variation within either group).
    """
    outcome = np.asarray(y, dtype=float).ravel()
    indicator = np.asarray(group, dtype=float).ravel()
    if outcome.shape != indicator.shape:
        raise ValueError(f"y and group differ in length: {outcome.size} vs {indicator.size}")
    if not np.isin(indicator, (0.0, 1.0)).all():
        raise ValueError("group must be 0/1")
    if indicator.min() == indicator.max():
        raise ValueError("both groups need observations")
    x = np.column_stack([np.ones_like(indicator), indicator])
    bread = np.linalg.inv(x.T @ x)
    beta = bread @ (x.T @ outcome)
    robust = cluster_robust_cov(bread, x * (outcome - x @ beta)[:, np.newaxis], groups)
    variance = robust.cov[1, 1]
    if not np.isfinite(variance) or variance <= 1e-14 * max(1.0, abs(beta[1])):
        raise ValueError("the robust standard error is 0: no variation within either group")
    se = float(np.sqrt(variance))
    t = float(beta[1] / se)
    return DifferenceTest(
        float(beta[1]), se, t, robust.df, float(2 * stats.t.sf(abs(t), robust.df)), robust.n_clusters
    )


def design_effects(cov_model: npt.ArrayLike, cov_robust: npt.ArrayLike, tested: Sequence[int]) -> np.ndarray:
    """Eigenvalues of ``V_model^-1 V_robust`` on the tested coefficients: how much clustering inflates (or,
    below 1, deflates) the variance of each tested direction."""
    idx = np.asarray(sorted(tested), dtype=int)
    model = np.asarray(cov_model, dtype=float)[np.ix_(idx, idx)]
    robust = np.asarray(cov_robust, dtype=float)[np.ix_(idx, idx)]
    chol = np.linalg.cholesky(model)
    inv_chol = np.linalg.inv(chol)
    return np.sort(np.linalg.eigvalsh(inv_chol @ robust @ inv_chol.T))


def rao_scott_lrtest(lr: float, effects: npt.ArrayLike, n_clusters: int) -> RaoScottTest:
    """Second-order Rao-Scott correction: ``LR / a`` against ``nu * F(nu, G-1)`` with ``a = sum d^2 / sum d``
    and ``nu = (sum d)^2 / sum d^2`` (Satterthwaite); with one tested coefficient this is ``LR / d`` against
    ``F(1, G-1)``, the square of a cluster-robust t."""
    d = np.asarray(effects, dtype=float)
    if d.size == 0 or not np.isfinite(d).all() or d.min() <= 0:
        raise ValueError(f"design effects must be positive, got {np.round(d, 6).tolist()}")
    if n_clusters < 2:
        raise ValueError("the corrected test needs at least 2 clusters")
    scale = float(np.sum(d**2) / np.sum(d))
    nu = float(np.sum(d) ** 2 / np.sum(d**2))
    statistic = max(0.0, float(lr)) / scale / nu
    df2 = n_clusters - 1
    return RaoScottTest(statistic, nu, df2, float(stats.f.sf(statistic, nu, df2)), tuple(d.tolist()))
