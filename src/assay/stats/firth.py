"""Firth's bias-reduced logistic regression and its penalised likelihood-ratio test, for the small and
separated tables of a STAR pilot, where the ordinary maximum-likelihood estimate does not exist.

Firth (1993) maximises the penalised log-likelihood ``l(b) + 1/2 log det I(b)`` with ``I = X'WX`` (a Jeffreys
prior). Its maximum is finite whenever ``X`` has full column rank, however separated the data are, and it
removes the O(1/n) bias of the MLE. The fit follows R's ``logistf`` (Heinze and Schemper 2002): steps
``I(b)^-1 U*(b)`` on the modified score ``U* = X'(y - p + h (1/2 - p))`` (``h``: the hat matrix diagonal),
each step capped at ``MAX_STEP`` per coefficient and halved while the penalised log-likelihood would fall.

The test is logistf's penalised likelihood ratio for nested models: the restricted fit keeps the *full*
design's penalty and fixes the tested coefficients at 0, so both penalised likelihoods are of one function and
``2 * (pl_full - pl_restricted)`` has the usual chi-square reference.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import numpy.typing as npt
from scipy import linalg, stats
from scipy.special import expit

MAX_STEP = 5.0  # logistf's maxstep: no coefficient moves further than this in one iteration
MAX_HALVINGS = 30
MAX_ITER = 500
_TOL = 1e-10  # on the largest step and on the largest modified score: far below any reported digit


class FirthFit(NamedTuple):
    """A penalised fit: coefficients (fixed ones exactly 0), the penalised and plain log-likelihoods, the
    inverse Fisher information (model-based covariance), per-row modified score contributions, leverages."""

    coef: np.ndarray
    penalized_llf: float
    llf: float
    cov: np.ndarray
    scores: np.ndarray
    hat: np.ndarray
    n_iter: int


class PenalizedLRTest(NamedTuple):
    """Penalised likelihood-ratio statistic, its degrees of freedom and p-value, and both fits."""

    lr: float
    df: int
    p_value: float
    full: FirthFit
    restricted: FirthFit


class _State(NamedTuple):
    penalized_llf: float
    llf: float
    info: np.ndarray  # X' diag(w (1 + h)) X: the information of logistf's augmented data
    modified: np.ndarray  # y - p + h (1/2 - p): the modified residual, per row
    hat: np.ndarray


def _state(y: np.ndarray, x: np.ndarray, beta: np.ndarray) -> _State:
    """Everything one iteration needs at ``beta``; the Cholesky factor gives log det I and the leverages."""
    eta = x @ beta
    p = expit(eta)
    w = p * (1 - p)
    info = (x * w[:, np.newaxis]).T @ x
    try:
        chol = linalg.cholesky(info, lower=True)
    except linalg.LinAlgError as exc:
        raise ValueError("Fisher information is singular: the design is not of full rank") from exc
    llf = float(np.sum(y * eta - np.logaddexp(0.0, eta)))
    penalized = llf + float(np.sum(np.log(np.diag(chol))))  # 1/2 log det I = sum log diag(L)
    half = linalg.solve_triangular(chol, x.T, lower=True)
    hat = w * np.sum(half**2, axis=0)
    augmented = (x * (w * (1 + hat))[:, np.newaxis]).T @ x
    return _State(penalized, llf, augmented, y - p + hat * (0.5 - p), hat)


def _check(y: npt.ArrayLike, x: npt.ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    outcome = np.asarray(y, dtype=float).ravel()
    design = np.asarray(x, dtype=float)
    if design.ndim == 1:
        design = design[:, np.newaxis]
    if design.ndim != 2 or design.shape[0] != outcome.size:
        raise ValueError(f"X must be 2-D with {outcome.size} rows, got shape {design.shape}")
    if not np.isin(outcome, (0.0, 1.0)).all():
        raise ValueError("y must be binary (0/1)")
    if not np.isfinite(design).all():
        raise ValueError("X contains non-finite values")
    if np.linalg.matrix_rank(design) < design.shape[1]:
        raise ValueError("X is not of full column rank (collinear columns)")
    return outcome, design


def _step(state: _State, x: np.ndarray, free: np.ndarray) -> np.ndarray:
    """The free coefficients' step I_ff^-1 U*_f, capped at MAX_STEP (logistf's maxstep)."""
    score = x[:, free].T @ state.modified
    step = linalg.solve(state.info[np.ix_(free, free)], score, assume_a="pos")
    largest = np.max(np.abs(step)) if step.size else 0.0
    return step * (MAX_STEP / largest) if largest > MAX_STEP else step


def _fit(y: np.ndarray, x: np.ndarray, fixed: Sequence[int]) -> FirthFit:
    k = x.shape[1]
    free = np.setdiff1d(np.arange(k), np.asarray(fixed, dtype=int))
    beta = np.zeros(k)
    state = _state(y, x, beta)
    for iteration in range(1, MAX_ITER + 1):  # noqa: B007 (kept: the fit reports it)
        step = _step(state, x, free) if free.size else np.zeros(0)
        for _ in range(MAX_HALVINGS):
            candidate = beta.copy()
            candidate[free] += step
            new = _state(y, x, candidate)
            # A rounding-size fall is accepted: near the optimum the change is below float resolution.
            if new.penalized_llf >= state.penalized_llf - 1e-12 * max(1.0, abs(state.penalized_llf)):
                break
            step = step / 2
        else:
            raise ValueError("Firth fit failed: step halving could not increase the penalised likelihood")
        beta, state = candidate, new
        score = x[:, free].T @ state.modified if free.size else np.zeros(0)
        if (not step.size) or (np.max(np.abs(step)) < _TOL and np.max(np.abs(score)) < _TOL * y.size):
            break
    else:
        raise ValueError(f"Firth fit did not converge in {MAX_ITER} iterations")
    cov = linalg.inv(state.info, assume_a="pos")
    return FirthFit(
        coef=beta,
        penalized_llf=state.penalized_llf,
        llf=state.llf,
        cov=cov,
        scores=x * state.modified[:, np.newaxis],
        hat=state.hat,
        n_iter=iteration,
    )


def firth_logit(y: npt.ArrayLike, X: npt.ArrayLike, fixed: Sequence[int] = ()) -> FirthFit:
    """Firth-penalised logistic fit of binary ``y`` on ``X`` (which carries its own intercept column).

    ``fixed``: column indices whose coefficients are held at 0 while the penalty still uses all of ``X`` (the
    restricted fit of the penalised LR test). Raises ValueError on bad input or a fit that does not converge.
    """
    outcome, design = _check(y, X)
    if any(not 0 <= int(j) < design.shape[1] for j in fixed):
        raise ValueError(f"fixed columns must lie in 0..{design.shape[1] - 1}, got {list(fixed)}")
    return _fit(outcome, design, fixed)


def firth_lrtest(y: npt.ArrayLike, X: npt.ArrayLike, tested: Sequence[int]) -> PenalizedLRTest:
    """Penalised LR test that the coefficients of columns ``tested`` are all 0 (logistf's nested test)."""
    outcome, design = _check(y, X)
    columns = sorted({int(j) for j in tested})
    if not columns or any(not 0 <= j < design.shape[1] for j in columns):
        raise ValueError(f"tested columns must be a non-empty subset of 0..{design.shape[1] - 1}")
    full = _fit(outcome, design, ())
    restricted = _fit(outcome, design, columns)
    lr = max(0.0, 2.0 * (full.penalized_llf - restricted.penalized_llf))
    df = len(columns)
    return PenalizedLRTest(lr, df, float(stats.chi2.sf(lr, df)), full, restricted)
