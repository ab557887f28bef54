"""assay.stats.detection against scikit-learn and a second derivation, to 1e-12."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.metrics import brier_score_loss, log_loss, roc_auc_score

from assay.stats import brier_score, cross_entropy, cross_entropy_ci, cross_entropy_terms, roc_auc


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
