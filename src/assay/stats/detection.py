"""Scores of a trojan detector's probabilities against ground truth, as the TrojAI leaderboard computes them.

The ranking metric is the log score: binary cross entropy with predictions clipped to [1e-12, 1 - 1e-12], so
a certain wrong answer costs about 27.6 nats, not infinity. Its confidence-interval half-widths use NIST's
rounded normal quantiles times the population standard deviation of the per-model losses over sqrt(n).
"""

from __future__ import annotations

import numpy as np
from scipy.stats import rankdata

EPSILON = 1e-12
# NIST's table of two-sided normal quantiles, rounded as the leaderboard rounds them.
CI_Z: dict[float, float] = {0.90: 1.64, 0.95: 1.96, 0.98: 2.33, 0.99: 2.58}


def _check(targets: np.ndarray, predictions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    y = np.asarray(targets, dtype=np.float64)
    p = np.asarray(predictions, dtype=np.float64)
    if y.shape != p.shape or y.ndim != 1:
        raise ValueError(f"targets and predictions must be 1-D of one length, got {y.shape} and {p.shape}")
    if len(y) == 0:
        raise ValueError("need at least one model to score")
    if not np.isin(y, (0.0, 1.0)).all():
        raise ValueError("targets must be 0 (clean) or 1 (trojaned)")
    if not (np.isfinite(p).all() and (p >= 0).all() and (p <= 1).all()):
        raise ValueError("predictions must be probabilities in [0, 1]")
    return y, p


def cross_entropy_terms(targets: np.ndarray, predictions: np.ndarray, epsilon: float = EPSILON) -> np.ndarray:
    """Per-model log loss ``-(y log p + (1 - y) log(1 - p))`` with ``p`` clipped to [eps, 1 - eps]."""
    y, p = _check(targets, predictions)
    p = np.clip(p, epsilon, 1.0 - epsilon)
    return -(y * np.log(p) + (1.0 - y) * np.log1p(-p))


def cross_entropy(targets: np.ndarray, predictions: np.ndarray, epsilon: float = EPSILON) -> float:
    """Mean binary cross entropy (the log score; constant 0.5 scores ln 2 = 0.693)."""
    return float(np.mean(cross_entropy_terms(targets, predictions, epsilon)))


def cross_entropy_ci(
    targets: np.ndarray, predictions: np.ndarray, level: float = 0.95, epsilon: float = EPSILON
) -> float:
    """Half-width of the cross entropy's confidence interval: z(level) * std(terms, ddof=0) / sqrt(n)."""
    if level not in CI_Z:
        raise ValueError(f"level must be one of {sorted(CI_Z)}, got {level!r}")
    terms = cross_entropy_terms(targets, predictions, epsilon)
    return float(CI_Z[level] * np.std(terms) / np.sqrt(len(terms)))


def brier_score(targets: np.ndarray, predictions: np.ndarray) -> float:
    """Mean squared difference between the probability and the 0/1 truth."""
    y, p = _check(targets, predictions)
    return float(np.mean((p - y) ** 2))


def roc_auc(targets: np.ndarray, predictions: np.ndarray) -> float:
    """Area under the ROC curve (ties count one half), NaN when one class is absent.

    Computed as the Mann-Whitney U statistic over mid-ranks, which equals the trapezoidal area under the
    empirical ROC curve.
    """
    y, p = _check(targets, predictions)
    positives = int(y.sum())
    negatives = len(y) - positives
    if positives == 0 or negatives == 0:
        return float("nan")
    ranks = rankdata(p)
    u = ranks[y == 1].sum() - positives * (positives + 1) / 2.0
    return float(u / (positives * negatives))
