"""assay.stats.detection against scikit-learn and a second derivation, to 1e-12."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.calibration import calibration_curve
from sklearn.metrics import brier_score_loss, confusion_matrix, log_loss, roc_auc_score
from sklearn.metrics import roc_curve as sk_roc_curve

from assay.stats import (
    brier_score,
    confusion_table,
    cross_entropy,
    cross_entropy_ci,
    cross_entropy_terms,
    detection_metrics,
    expected_calibration_error,
    grouped_metrics,
    roc_auc,
    roc_auc_ci,
    roc_curve,
    tpr_at_fpr,
)


def _cases(seed: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, n)
    y[0], y[1] = 0, 1
    p = rng.random(n)
    p[rng.random(n) < 0.2] = rng.choice([0.0, 1.0, 0.5])  # exact 0 and 1 exercise the clipping, 0.5 ties
    return y, p


@pytest.mark.parametrize("seed", range(8))
def test_matches_sklearn(seed: int) -> None:
    y, p = _cases(seed, 50 + 30 * seed)
    clipped = np.clip(p, 1e-12, 1 - 1e-12)
    assert cross_entropy(y, p) == pytest.approx(log_loss(y, clipped, labels=[0, 1]), abs=1e-12)
    assert brier_score(y, p) == pytest.approx(brier_score_loss(y, p), abs=1e-12)
    assert roc_auc(y, p) == pytest.approx(roc_auc_score(y, p), abs=1e-12)


def test_constant_half_scores_ln2_with_zero_width() -> None:
    y = np.array([0, 1, 1, 0, 1])
    assert cross_entropy(y, np.full(5, 0.5)) == pytest.approx(math.log(2), abs=1e-15)
    assert cross_entropy_ci(y, np.full(5, 0.5)) == 0.0
    assert roc_auc(y, np.full(5, 0.5)) == 0.5


def test_certain_miss_costs_log_epsilon() -> None:
    terms = cross_entropy_terms(np.array([1, 0]), np.array([0.0, 1.0]))
    # 1 - 1e-12 is not exact in binary, so the second term is -log(1 - fl(1 - 1e-12)), as NIST's numpy gives
    assert terms == pytest.approx([-math.log(1e-12), -math.log(1 - (1 - 1e-12))], rel=1e-12)  # ~27.63 nats


@pytest.mark.parametrize(("level", "z"), [(0.90, 1.64), (0.95, 1.96), (0.98, 2.33), (0.99, 2.58)])
def test_ci_half_width_by_hand(level: float, z: float) -> None:
    y = np.array([1, 0, 1, 1])
    p = np.array([0.9, 0.2, 0.6, 0.3])
    terms = [-math.log(0.9), -math.log(0.8), -math.log(0.6), -math.log(0.3)]
    mean = sum(terms) / 4
    std = math.sqrt(sum((t - mean) ** 2 for t in terms) / 4)  # population standard deviation
    assert cross_entropy_ci(y, p, level) == pytest.approx(z * std / 2, abs=1e-12)


def test_auc_nan_when_one_class_absent_and_bad_input() -> None:
    assert math.isnan(roc_auc(np.ones(4), np.linspace(0, 1, 4)))
    with pytest.raises(ValueError, match="0 \\(clean\\) or 1"):
        cross_entropy(np.array([2, 0]), np.array([0.5, 0.5]))
    with pytest.raises(ValueError, match="probabilities"):
        cross_entropy(np.array([1, 0]), np.array([np.nan, 0.5]))
    with pytest.raises(ValueError, match="one length"):
        brier_score(np.array([1, 0]), np.array([0.5]))
    with pytest.raises(ValueError, match="level"):
        cross_entropy_ci(np.array([1, 0]), np.array([0.5, 0.5]), level=0.8)


@settings(max_examples=80, deadline=None)
@given(
    st.lists(st.tuples(st.booleans(), st.sampled_from([0.0, 0.1, 0.5, 0.7, 1.0])), min_size=2, max_size=40)
)
def test_auc_is_pairwise_concordance(pairs: list[tuple[bool, float]]) -> None:
    y = np.array([int(a) for a, _ in pairs])
    p = np.array([b for _, b in pairs])
    pos, neg = p[y == 1], p[y == 0]
    if len(pos) == 0 or len(neg) == 0:
        assert math.isnan(roc_auc(y, p))
        return
    wins = sum((a > b) + 0.5 * (a == b) for a in pos for b in neg)  # the definition, pair by pair
    assert roc_auc(y, p) == pytest.approx(wins / (len(pos) * len(neg)), abs=1e-12)


@pytest.mark.parametrize("seed", range(6))
def test_roc_curve_matches_sklearn(seed: int) -> None:
    y, p = _cases(seed, 40 + 25 * seed)
    fpr, tpr, thresholds = roc_curve(y, p)
    sk_fpr, sk_tpr, sk_thresholds = sk_roc_curve(y, p, drop_intermediate=False)
    np.testing.assert_allclose(fpr, sk_fpr, rtol=0, atol=1e-12)
    np.testing.assert_allclose(tpr, sk_tpr, rtol=0, atol=1e-12)
    np.testing.assert_array_equal(thresholds, sk_thresholds)
    assert (fpr[0], tpr[0], thresholds[0]) == (0.0, 0.0, np.inf)
    assert len(thresholds) == len(np.unique(p)) + 1
    assert np.trapezoid(tpr, fpr) == pytest.approx(roc_auc(y, p), abs=1e-12)


@pytest.mark.parametrize("seed", range(4))
def test_confusion_table_matches_sklearn_at_each_threshold(seed: int) -> None:
    y, p = _cases(seed, 60)
    p[:3] = [0.0, 0.07, 1.0]  # on the grid: p >= t counts a score equal to the threshold as trojaned
    table = confusion_table(y, p)
    assert len(table.thresholds) == 101
    for i, t in enumerate(table.thresholds):
        tn, fp, fn, tp = confusion_matrix(y, (p >= t).astype(int), labels=[0, 1]).ravel()
        assert (table.tp[i], table.fp[i], table.fn[i], table.tn[i]) == (tp, fp, fn, tn)
        assert table.tpr[i] == pytest.approx(tp / (tp + fn), abs=1e-12)
        assert table.fpr[i] == pytest.approx(fp / (fp + tn), abs=1e-12)
    assert table.tp[0] + table.fp[0] == len(y)  # t = 0 calls every model trojaned


def test_tpr_at_fpr_against_a_scan_of_thresholds() -> None:
    for seed in range(6):
        y, p = _cases(seed, 80)
        negatives = max(1, int((y == 0).sum()))
        best = 0.0
        for t in np.r_[np.inf, np.unique(p)]:  # the definition: every threshold, p >= t is trojaned
            fpr = ((p >= t) & (y == 0)).sum() / negatives
            if fpr <= 0.05:
                best = max(best, ((p >= t) & (y == 1)).sum() / (y == 1).sum())
        assert tpr_at_fpr(y, p) == pytest.approx(best, abs=1e-12)
    assert tpr_at_fpr(np.array([0, 0, 1, 1]), np.array([0.1, 0.2, 0.8, 0.9])) == 1.0
    assert tpr_at_fpr(np.array([0, 1, 1]), np.array([0.9, 0.8, 0.1])) == 0.0  # the (0, 0) corner
    assert math.isnan(tpr_at_fpr(np.zeros(3), np.array([0.1, 0.5, 0.9])))


def _ece_by_loop(y: np.ndarray, p: np.ndarray, bins: int) -> float:
    total = 0.0
    for b in range(bins):
        lo, hi = b / bins, (b + 1) / bins
        members = [i for i in range(len(p)) if lo <= p[i] < hi or (b == bins - 1 and p[i] == 1.0)]
        if members:
            gap = sum(p[i] for i in members) / len(members) - sum(y[i] for i in members) / len(members)
            total += len(members) / len(p) * abs(gap)
    return total


@pytest.mark.parametrize(("seed", "bins"), [(0, 10), (1, 10), (2, 5), (3, 15), (4, 1)])
def test_ece_against_a_loop_and_sklearn(seed: int, bins: int) -> None:
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, 120)
    p = rng.random(120)
    p[:4] = [0.0, 1.0, 0.0, 1.0]  # the end points; inner edges are where sklearn's bins differ
    assert expected_calibration_error(y, p, bins) == pytest.approx(_ece_by_loop(y, p, bins), abs=1e-12)
    prob_true, prob_pred = calibration_curve(y, p, n_bins=bins, strategy="uniform")
    counts = np.bincount(np.minimum((p * bins).astype(int), bins - 1), minlength=bins)
    weights = counts[counts > 0] / len(p)
    expected = float(np.sum(weights * np.abs(prob_true - prob_pred)))
    assert expected_calibration_error(y, p, bins) == pytest.approx(expected, abs=1e-12)


def test_ece_puts_an_inner_edge_in_the_upper_bin() -> None:
    # 0.5 belongs to [0.5, 0.6): that bin's mean p is 0.5 against truth 1, the other's 0.45 against 0
    y, p = np.array([1, 0]), np.array([0.5, 0.45])
    assert expected_calibration_error(y, p) == pytest.approx(0.5 * 0.5 + 0.5 * 0.45, abs=1e-15)
    assert expected_calibration_error(np.array([1, 1]), np.array([1.0, 1.0])) == 0.0


def test_detection_metrics_collects_every_scalar() -> None:
    y, p = _cases(3, 90)
    metrics = detection_metrics(y, p)
    assert metrics == {
        "cross_entropy": cross_entropy(y, p),
        "ce_ci_90": cross_entropy_ci(y, p, 0.90),
        "ce_ci_95": cross_entropy_ci(y, p, 0.95),
        "ce_ci_98": cross_entropy_ci(y, p, 0.98),
        "ce_ci_99": cross_entropy_ci(y, p, 0.99),
        "brier": brier_score(y, p),
        "roc_auc": roc_auc(y, p),
        "tpr_at_5_fpr": tpr_at_fpr(y, p),
        "ece": expected_calibration_error(y, p),
        "n": 90,
        "positives": int(y.sum()),
    }


def test_grouped_metrics_score_each_group_on_its_own_rows() -> None:
    # group "a" is separated perfectly, group "b" backwards; the whole array is in between
    y = np.array([0, 0, 1, 1, 0, 0, 1, 1, 1])
    p = np.array([0.1, 0.2, 0.8, 0.9, 0.7, 0.6, 0.3, 0.4, 1.0])
    groups = ["a", "a", "a", "a", "b", "b", "b", "b", "c"]
    result = grouped_metrics(y, p, groups)
    assert list(result) == ["a", "b", "c"]
    assert result["a"]["roc_auc"] == 1.0
    assert result["b"]["roc_auc"] == 0.0
    assert 0.0 < roc_auc(y, p) < 1.0
    assert math.isnan(result["c"]["roc_auc"])  # one class only: no AUC, but the other scores are there
    assert result["c"]["cross_entropy"] == pytest.approx(-math.log(1 - 1e-12), rel=1e-9)
    for value in "ab":
        rows = np.array(groups) == value
        assert result[value] == detection_metrics(y[rows], p[rows])
    with pytest.raises(ValueError, match="one entry per model"):
        grouped_metrics(y, p, groups[:-1])


def test_one_class_split_scores_without_auc_and_tpr() -> None:
    y, p = np.zeros(5), np.array([0.0, 0.2, 0.2, 0.9, 1.0])
    metrics = detection_metrics(y, p)
    assert math.isnan(metrics["roc_auc"]) and math.isnan(metrics["tpr_at_5_fpr"])
    clipped = np.clip(p, 1e-12, 1 - 1e-12)
    assert metrics["cross_entropy"] == pytest.approx(log_loss(y, clipped, labels=[0, 1]), abs=1e-12)
    assert metrics["brier"] == pytest.approx(brier_score_loss(y, p, labels=[0, 1]), abs=1e-12)
    fpr, tpr, _ = roc_curve(y, p)
    assert np.isnan(tpr).all() and fpr[-1] == 1.0
    table = confusion_table(y, p)
    assert np.isnan(table.tpr).all() and table.fpr[0] == 1.0


def test_roc_auc_ci_is_hanley_mcneil() -> None:
    # Hanley and McNeil (1982), table 2 style: AUC 0.875 from 4 trojaned and 4 clean models
    y = np.array([1, 1, 1, 0, 0, 0, 0, 1])
    p = np.array([0.9, 0.8, 0.3, 0.2, 0.1, 0.4, 0.35, 0.7])
    area = 0.875
    q1, q2 = area / (2 - area), 2 * area**2 / (1 + area)
    se = np.sqrt((area * (1 - area) + 3 * (q1 - area**2) + 3 * (q2 - area**2)) / 16)
    assert roc_auc(y, p) == area
    assert roc_auc_ci(y, p) == pytest.approx(1.96 * se, abs=1e-12)
    assert roc_auc_ci(y, p, level=0.99) > roc_auc_ci(y, p)
    assert np.isnan(roc_auc_ci(np.ones(3), np.full(3, 0.5)))
    with pytest.raises(ValueError, match="level"):
        roc_auc_ci(y, p, level=0.5)
