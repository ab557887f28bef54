"""Scores of a trojan detector's probabilities against ground truth, as the TrojAI leaderboard computes them.

The ranking metric is the log score: binary cross entropy with predictions clipped to [1e-12, 1 - 1e-12], so
a certain wrong answer costs about 27.6 nats, not infinity. Its confidence-interval half-widths use NIST's
rounded normal quantiles times the population standard deviation of the per-model losses over sqrt(n).

Beside it: Brier score, ROC-AUC and the ROC curve, the confusion table at fixed thresholds, the detection rate
at a 5% false-alarm rate, the expected calibration error, and all of them per group of a metadata factor.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

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
    from scipy.stats import rankdata  # here: scipy.stats takes 1.4 s to import, and listings never rank

    ranks = rankdata(p)
    u = ranks[y == 1].sum() - positives * (positives + 1) / 2.0
    return float(u / (positives * negatives))


def roc_auc_ci(targets: np.ndarray, predictions: np.ndarray, level: float = 0.95) -> float:
    """Half-width of the ROC-AUC's confidence interval: z(level) times Hanley and McNeil's (1982) standard
    error, which needs only the AUC and the class sizes; NaN when one class is absent.

    Why this one: it is the interval NIST-style reports can state without resampling, and it widens
    correctly when one class is small (a group of 6 trojaned models gets a wide interval, not a bootstrap's
    degenerate one)."""
    if level not in CI_Z:
        raise ValueError(f"level must be one of {sorted(CI_Z)}, got {level!r}")
    area = roc_auc(targets, predictions)
    if np.isnan(area):
        return float("nan")
    y = np.asarray(targets, dtype=np.float64)
    n1, n0 = float(y.sum()), float(len(y) - y.sum())
    q1, q2 = area / (2.0 - area), 2.0 * area**2 / (1.0 + area)
    variance = (area * (1 - area) + (n1 - 1) * (q1 - area**2) + (n0 - 1) * (q2 - area**2)) / (n1 * n0)
    return float(CI_Z[level] * np.sqrt(max(variance, 0.0)))


def roc_curve(targets: np.ndarray, predictions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """False- and true-positive rates at every distinct score, highest threshold first, as sklearn's.

    The first point is the (0, 0) corner at threshold +inf, so a caller can always find an operating point
    with no false positives. Rates with an empty class are NaN (0/0), as sklearn gives them.
    """
    y, p = _check(targets, predictions)
    order = np.argsort(-p, kind="mergesort")
    p_sorted, y_sorted = p[order], y[order]
    # The last index of each run of equal scores: every model at or above that score is called trojaned.
    last = np.r_[np.flatnonzero(np.diff(p_sorted)), len(p_sorted) - 1]
    tps = np.r_[0.0, np.cumsum(y_sorted)[last]]
    fps = np.r_[0.0, (last + 1) - tps[1:]]
    thresholds = np.r_[np.inf, p_sorted[last]]
    with np.errstate(invalid="ignore", divide="ignore"):
        return fps / fps[-1], tps / tps[-1], thresholds


@dataclass(frozen=True)
class ConfusionTable:
    """Counts and rates at each threshold; ``tpr``/``fpr`` are NaN where their class is absent."""

    thresholds: np.ndarray
    tp: np.ndarray
    fp: np.ndarray
    fn: np.ndarray
    tn: np.ndarray
    tpr: np.ndarray
    fpr: np.ndarray


def confusion_table(
    targets: np.ndarray, predictions: np.ndarray, thresholds: int | np.ndarray = 101
) -> ConfusionTable:
    """TP, FP, FN, TN, TPR and FPR at each threshold (an int ``k`` means ``linspace(0, 1, k)``).

    A model counts as predicted trojaned when ``p >= t``, the convention of NIST's leaderboard
    (``predictions >= threshold``), so at t = 0 every model is called trojaned.
    """
    y, p = _check(targets, predictions)
    t = np.linspace(0.0, 1.0, thresholds) if isinstance(thresholds, int) else np.asarray(thresholds, float)
    called = p[None, :] >= t[:, None]
    positive = y == 1
    tp = (called & positive).sum(axis=1)
    fp = (called & ~positive).sum(axis=1)
    fn = positive.sum() - tp
    tn = (~positive).sum() - fp
    with np.errstate(invalid="ignore", divide="ignore"):
        tpr, fpr = tp / (tp + fn), fp / (fp + tn)
    return ConfusionTable(t, tp, fp, fn, tn, tpr, fpr)


def tpr_at_fpr(targets: np.ndarray, predictions: np.ndarray, max_fpr: float = 0.05) -> float:
    """The best detection rate a threshold gets while keeping false alarms at or below ``max_fpr``.

    Read off the ROC curve (every distinct score is a candidate threshold); NaN when one class is absent.
    """
    fpr, tpr, _ = roc_curve(targets, predictions)
    if np.isnan(fpr).any() or np.isnan(tpr).any():
        return float("nan")
    return float(tpr[fpr <= max_fpr].max())


def expected_calibration_error(targets: np.ndarray, predictions: np.ndarray, bins: int = 10) -> float:
    """Mean gap between confidence and frequency: sum over non-empty bins of n_b/n * |mean(p) - mean(y)|.

    Bins are equal-width over [0, 1], each [a, b) except the last, [a, 1], so p = 1 has a bin. (sklearn's
    ``calibration_curve`` puts a p on an inner edge in the lower bin; elsewhere the two agree.)
    """
    y, p = _check(targets, predictions)
    if bins < 1:
        raise ValueError(f"bins must be at least 1, got {bins}")
    edges = np.linspace(0.0, 1.0, bins + 1)
    index = np.searchsorted(edges[1:-1], p, side="right")
    counts = np.bincount(index, minlength=bins)
    sum_p = np.bincount(index, weights=p, minlength=bins)
    sum_y = np.bincount(index, weights=y, minlength=bins)
    full = counts > 0
    return float(np.abs(sum_p[full] - sum_y[full]).sum() / len(p))


def detection_metrics(targets: np.ndarray, predictions: np.ndarray) -> dict[str, float | int]:
    """Every scalar score of one set of predictions, keyed as the leaderboard reports them."""
    y, p = _check(targets, predictions)
    metrics: dict[str, float | int] = {"cross_entropy": cross_entropy(y, p)}
    for level in CI_Z:
        metrics[f"ce_ci_{round(level * 100)}"] = cross_entropy_ci(y, p, level)
    metrics.update(
        brier=brier_score(y, p),
        roc_auc=roc_auc(y, p),
        tpr_at_5_fpr=tpr_at_fpr(y, p, 0.05),
        ece=expected_calibration_error(y, p),
        n=len(y),
        positives=int(y.sum()),
    )
    return metrics


def grouped_metrics(
    targets: np.ndarray, predictions: np.ndarray, groups: Sequence[str]
) -> dict[str, dict[str, float | int]]:
    """``detection_metrics`` of each group's own rows, by group value in sorted order.

    NIST's grouped ROC-AUC scores the whole array for every group; here each group sees only its models,
    so a factor that makes detection harder shows up as a lower score in its group.
    """
    y, p = _check(targets, predictions)
    labels = np.asarray(groups, dtype=object)
    if labels.shape != y.shape:
        raise ValueError(f"groups must have one entry per model, got {labels.shape} for {y.shape}")
    return {value: detection_metrics(y[labels == value], p[labels == value]) for value in sorted(set(groups))}
