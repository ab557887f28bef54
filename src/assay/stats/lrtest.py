"""Likelihood-ratio tests for STAR's nested logistic models (e.g. does a race x gender interaction matter?).

``likelihood_ratio_test`` works from two log-likelihoods; ``nested_logit_lrtest`` fits both models with
statsmodels' ``Logit`` and refuses to report a p-value from a fit that did not converge or is perfectly
separated, because then the log-likelihood is not a maximum and the chi-square reference is meaningless.
"""

from __future__ import annotations

import warnings
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt
from scipy import stats

# LR below zero by less than this (relative to the log-likelihood) is rounding, not a non-nested pair.
_LR_TOLERANCE = 1e-8
_MAX_ITER = 100
# A fitted probability this close to 0 or 1 needs |linear predictor| > ~23: only a diverging fit gets there.
_SEPARATION_EPS = 1e-10


class LRTestResult(NamedTuple):
    """Likelihood-ratio statistic, its degrees of freedom and p-value, and the two fitted log-likelihoods."""

    lr: float
    df: int
    p_value: float
    llf_restricted: float
    llf_full: float


def likelihood_ratio_test(llf_restricted: float, llf_full: float, df_diff: int) -> tuple[float, int, float]:
    """LR = 2 * (llf_full - llf_restricted) against chi-square(df_diff); returns (LR, df, upper-tail p).

    A full model fits at least as well as the restricted one it nests, so a clearly negative LR means the
    inputs are swapped or not nested and raises; a rounding-size negative is clipped to 0.
    """
    if int(df_diff) != df_diff or df_diff < 1:
        raise ValueError(
            f"df_diff must be a positive integer (extra parameters in the full model), got {df_diff}"
        )
    if not (np.isfinite(llf_restricted) and np.isfinite(llf_full)):
        raise ValueError(f"log-likelihoods must be finite, got {llf_restricted} and {llf_full}")
    lr = 2.0 * (llf_full - llf_restricted)
    if lr < 0:
        if -lr > _LR_TOLERANCE * max(1.0, abs(llf_full)):
            raise ValueError(
                f"llf_full ({llf_full}) < llf_restricted ({llf_restricted}): swapped or non-nested models"
            )
        lr = 0.0
    return float(lr), int(df_diff), float(stats.chi2.sf(lr, df_diff))


def _design(x: npt.ArrayLike, n: int, name: str) -> np.ndarray:
    """2-D float design with n rows and full column rank (a rank-deficient design has no unique MLE)."""
    design = np.asarray(x, dtype=float)
    if design.ndim == 1:
        design = design[:, np.newaxis]
    if design.ndim != 2 or design.shape[0] != n:
        raise ValueError(f"{name} must be 2-D with {n} rows, got shape {design.shape}")
    if not np.isfinite(design).all():
        raise ValueError(f"{name} contains non-finite values")
    if np.linalg.matrix_rank(design) < design.shape[1]:
        raise ValueError(f"{name} is not of full column rank (collinear columns)")
    return design


def _check_nested(x_restricted: np.ndarray, x_full: np.ndarray) -> None:
    """The restricted columns must lie in the span of the full ones, or LR has no chi-square reference."""
    coef, *_ = np.linalg.lstsq(x_full, x_restricted, rcond=None)
    residual = np.abs(x_full @ coef - x_restricted).max()
    if residual > 1e-8 * max(1.0, np.abs(x_restricted).max()):
        raise ValueError("X_restricted is not nested in X_full (its columns are not in X_full's span)")


def _separated(fitted: np.ndarray) -> bool:
    """Fitted probabilities pinned at 0 or 1 are the signature of (quasi-)separation: the coefficients run
    off to infinity, and statsmodels only warns when *every* observation is perfectly predicted."""
    return bool(((fitted < _SEPARATION_EPS) | (fitted > 1 - _SEPARATION_EPS)).any())


def _fit_logit(y: np.ndarray, x: np.ndarray, name: str) -> Any:
    """A statsmodels logistic fit with a proper maximum, or ValueError when there is none.

    statsmodels is imported here, not at module level, so ``import assay.stats`` stays light.
    """
    from statsmodels.discrete.discrete_model import Logit
    from statsmodels.tools.sm_exceptions import ConvergenceWarning, PerfectSeparationWarning

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            result = Logit(y, x).fit(disp=0, maxiter=_MAX_ITER)
        except np.linalg.LinAlgError as exc:
            raise ValueError(f"{name} logistic fit failed: singular Hessian ({exc})") from exc
        fitted = result.predict()
    kinds = {type(w.message) for w in caught}
    if any(issubclass(k, PerfectSeparationWarning) for k in kinds) or _separated(fitted):
        raise ValueError(f"{name} logistic model is perfectly separated: the MLE does not exist")
    if not result.mle_retvals.get("converged", False) or any(
        issubclass(k, ConvergenceWarning) for k in kinds
    ):
        raise ValueError(f"{name} logistic model did not converge in {_MAX_ITER} iterations")
    if not np.isfinite(result.llf):
        raise ValueError(f"{name} logistic model has a non-finite log-likelihood")
    return result


def _fit_logit_llf(y: np.ndarray, x: np.ndarray, name: str) -> float:
    """Maximised log-likelihood of a logistic fit, or ValueError when there is no proper maximum."""
    return float(_fit_logit(y, x, name).llf)


def nested_logit_lrtest(y: npt.ArrayLike, X_restricted: npt.ArrayLike, X_full: npt.ArrayLike) -> LRTestResult:
    """Fit two nested logistic regressions and test the extra columns of ``X_full`` with a likelihood ratio.

    Designs must include their own intercept column; df is the difference in column counts. Rank, nesting,
    convergence and separation are checked, since each one otherwise yields a plausible but wrong p-value.
    """
    outcome = np.asarray(y, dtype=float).ravel()
    if not np.isin(outcome, (0.0, 1.0)).all():
        raise ValueError("y must be binary (0/1)")
    n = outcome.size
    x_restricted = _design(X_restricted, n, "X_restricted")
    x_full = _design(X_full, n, "X_full")
    df_diff = x_full.shape[1] - x_restricted.shape[1]
    if df_diff < 1:
        raise ValueError(
            "X_full must have more columns than X_restricted, got "
            f"{x_full.shape[1]} vs {x_restricted.shape[1]}"
        )
    _check_nested(x_restricted, x_full)
    llf_restricted = _fit_logit_llf(outcome, x_restricted, "restricted")
    llf_full = _fit_logit_llf(outcome, x_full, "full")
    lr, df, p = likelihood_ratio_test(llf_restricted, llf_full, df_diff)
    return LRTestResult(lr, df, p, llf_restricted, llf_full)


MLE = "maximum likelihood"
FIRTH = "Firth penalised likelihood"


class LogitLRTest(NamedTuple):
    """A nested logistic LR test with the method that produced it (``MLE`` or ``FIRTH``) and what a
    clustered correction needs from the full model: coefficients, model-based covariance (inverse
    information) and per-row score contributions (the modified score for Firth)."""

    method: str
    lr: float
    df: int
    p_value: float
    coef: np.ndarray
    cov: np.ndarray
    scores: np.ndarray
    tested: tuple[int, ...]


def _mle_test(y: np.ndarray, x_restricted: np.ndarray, x_full: np.ndarray) -> LogitLRTest:
    llf_restricted = _fit_logit_llf(y, x_restricted, "restricted")
    full = _fit_logit(y, x_full, "full")
    lr, df, p = likelihood_ratio_test(
        llf_restricted, float(full.llf), x_full.shape[1] - x_restricted.shape[1]
    )
    fitted = full.predict()
    info = (x_full * (fitted * (1 - fitted))[:, np.newaxis]).T @ x_full
    tested = tuple(range(x_restricted.shape[1], x_full.shape[1]))
    scores = x_full * (y - fitted)[:, np.newaxis]
    return LogitLRTest(MLE, lr, df, p, np.asarray(full.params), np.linalg.inv(info), scores, tested)


def logit_lrtest(
    y: npt.ArrayLike, X_restricted: npt.ArrayLike, X_full: npt.ArrayLike, firth: bool | None = None
) -> LogitLRTest:
    """LR test of the extra columns of ``X_full = [X_restricted | extra]``, by maximum likelihood where its
    estimate exists and by Firth's penalised likelihood (``assay.stats.firth``) where it does not (separation,
    divergence) or when ``firth=True`` (small cells, where the MLE exists but is badly biased).
    ``firth=False`` never falls back and raises as ``nested_logit_lrtest`` does.
    """
    from assay.stats.firth import firth_lrtest

    outcome = np.asarray(y, dtype=float).ravel()
    if not np.isin(outcome, (0.0, 1.0)).all():
        raise ValueError("y must be binary (0/1)")
    x_restricted = _design(X_restricted, outcome.size, "X_restricted")
    x_full = _design(X_full, outcome.size, "X_full")
    k = x_restricted.shape[1]
    if x_full.shape[1] <= k or not np.array_equal(x_full[:, :k], x_restricted):
        raise ValueError("X_full must be X_restricted followed by at least one extra column")
    if not firth:
        try:
            return _mle_test(outcome, x_restricted, x_full)
        except ValueError:
            if firth is False:
                raise
    test = firth_lrtest(outcome, x_full, range(k, x_full.shape[1]))
    full = test.full
    tested = tuple(range(k, x_full.shape[1]))
    return LogitLRTest(FIRTH, test.lr, test.df, test.p_value, full.coef, full.cov, full.scores, tested)
