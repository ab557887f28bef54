"""The disclosure bins checked by brute force over every label vector, against detection's own scores."""

from __future__ import annotations

import math

import numpy as np
import pytest

from assay.stats.detection import brier_score, cross_entropy
from assay.stats.disclosure import partition, subset_sum_counts


def every_vector(n: int) -> np.ndarray:
    return (np.arange(2**n)[:, None] >> np.arange(n)[None, :]) & 1


def exact_scores(p: np.ndarray, metric: str, vectors: np.ndarray) -> np.ndarray:
    """Every vector's score, by the formula written out; spot-checked against ``assay.stats.detection``."""
    if metric == "cross_entropy":
        q = np.clip(p, 1e-12, 1 - 1e-12)
        scores = -(vectors * np.log(q) + (1 - vectors) * np.log(1 - q)).mean(axis=1)
    else:
        scores = ((vectors - p) ** 2).mean(axis=1)
    score = cross_entropy if metric == "cross_entropy" else brier_score
    for i in range(0, len(vectors), max(1, len(vectors) // 16)):
        assert scores[i] == pytest.approx(score(vectors[i], p), rel=1e-12, abs=1e-15)
    return scores


def probe_answers(n: int) -> np.ndarray:
    """The attack of issue 25: log-odds 2^k (times a scale that keeps them under the clipping), so every
    label vector's cross entropy is distinct and one exact score names the label vector."""
    logits = 25.0 * 2.0 ** np.arange(n) / 2.0 ** (n - 1)
    return 1.0 / (1.0 + np.exp(-logits))


CASES = [
    ("probe", lambda rng, n: probe_answers(n)),
    ("random", lambda rng, n: rng.uniform(0, 1, n)),
    ("confident", lambda rng, n: rng.choice([1e-15, 0.01, 0.99, 1.0], n)),
    ("coin", lambda rng, n: np.full(n, 0.5)),
    ("two values", lambda rng, n: rng.choice([0.2, 0.8], n)),
]


@pytest.mark.parametrize("metric", ["cross_entropy", "brier"])
@pytest.mark.parametrize("bits", [1, 8, 11])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_every_shown_value_leaves_enough_label_vectors(metric: str, bits: int, case) -> None:
    n = 12
    p = case[1](np.random.default_rng(bits), n)
    table = partition(p, metric, bits)
    vectors = every_vector(n)
    truth = exact_scores(p, metric, vectors)
    bins = table.bin_of(vectors)
    for k in np.unique(bins):
        members = bins == k
        shown = table.shown(vectors[np.flatnonzero(members)[0]])
        # the attacker's count: vectors whose showing is this one
        assert members.sum() == shown.vectors >= 2 ** (n - bits)
        assert shown.bits <= bits + 1e-12
        # the true score of every member lies in the shown interval (to the arithmetic's rounding)
        assert truth[members].min() >= shown.low - 1e-12 and truth[members].max() <= shown.high + 1e-12
        assert shown.high - shown.low >= truth[members].max() - truth[members].min() - 1e-12
        assert shown.share == pytest.approx((bins <= k).mean(), abs=1e-15)
    # bins are ordered by score: no vector of a later bin beats one of an earlier bin by more than the lattice
    best = np.array([truth[bins == k].min() for k in np.unique(bins)])
    worst = np.array([truth[bins == k].max() for k in np.unique(bins)])
    assert (np.maximum.accumulate(worst)[:-1] <= best[1:] + table.unit + 1e-12).all()


def test_bins_are_as_fine_as_the_budget_allows() -> None:
    """With distinct scores the number of bins is floor(2^n / 2^(n - bits)): no coarser than needed."""
    n, bits = 12, 8
    p = probe_answers(n)
    assert len(np.unique(exact_scores(p, "cross_entropy", every_vector(n)).round(9))) == 2**n
    table = partition(p, "cross_entropy", bits)
    assert len(table.ends) == 2**bits and (table.counts == 2 ** (n - bits)).all()


def test_unlimited_budget_shows_the_score_itself() -> None:
    n = 10
    p = probe_answers(n)
    y = np.array([1, 0] * 5)
    shown = partition(p, "cross_entropy", n).shown(y)
    assert shown.vectors == 1 and shown.bits == n
    assert shown.low <= cross_entropy(y, p) <= shown.high and shown.high - shown.low < 1e-4


def test_subset_sum_counts_equal_enumeration() -> None:
    rng = np.random.default_rng(3)
    steps = rng.integers(0, 6, 11)
    sums = every_vector(11) @ steps
    assert np.array_equal(subset_sum_counts(steps), np.bincount(sums, minlength=steps.sum() + 1))


def test_large_split_is_counted_without_enumeration() -> None:
    """144 models (a NIST-sized test split): 2^144 vectors counted exactly on the lattice."""
    rng = np.random.default_rng(0)
    p = rng.uniform(0.01, 0.99, 144)
    y = (rng.uniform(size=144) < p).astype(int)
    table = partition(p, "cross_entropy", 8)
    shown = table.shown(y)
    assert math.isclose(table.total, 2.0**144, rel_tol=1e-12)
    assert shown.bits <= 8 + 1e-9 and shown.low <= cross_entropy(y, p) <= shown.high
    assert 2**8 - 1 <= len(table.ends) <= 2**8


def test_refuses_what_it_cannot_bound() -> None:
    with pytest.raises(ValueError, match="additive"):
        partition(np.array([0.5]), "roc_auc", 8)
    with pytest.raises(ValueError, match="probabilities"):
        partition(np.array([1.5]), "brier", 8)


def believed_probability(p: np.ndarray, vectors: np.ndarray) -> np.ndarray:
    """Each label vector's probability if model i is trojaned with probability p_i (clipped), by product."""
    q = np.clip(p, 1e-12, 1 - 1e-12)
    return np.prod(np.where(vectors == 1, q, 1 - q), axis=1)


def test_weighted_subset_sums_equal_enumeration() -> None:
    """The believed probability of each lattice sum, against the product over all 2^11 vectors."""
    rng = np.random.default_rng(5)
    steps, chances = rng.integers(0, 6, 11), rng.uniform(0, 1, 11)
    vectors = every_vector(11)
    weights = np.prod(np.where(vectors == 1, chances, 1 - chances), axis=1)
    oracle = np.bincount(vectors @ steps, weights=weights, minlength=steps.sum() + 1)
    assert np.allclose(subset_sum_counts(steps, chances), oracle, rtol=1e-12, atol=1e-15)
    # a coin for every model: the probabilities are the counts over 2^n, exactly (powers of two)
    assert np.array_equal(subset_sum_counts(steps, np.full(11, 0.5)) * 2**11, subset_sum_counts(steps))


@pytest.mark.parametrize("bits", [2, 6, 8])
@pytest.mark.parametrize("case", CASES[:3] + CASES[4:], ids=[c[0] for c in CASES[:3] + CASES[4:]])
def test_believed_bins_hold_the_budget_for_a_team_that_believes_its_answers(bits: int, case) -> None:
    """Every outcome has probability >= 2^-bits under the answers' own belief (so it tells a believer at
    most ``bits`` bits), there are at most 2^bits showings, and each interval holds its members' scores."""
    n = 12
    p = case[1](np.random.default_rng(bits), n)
    table = partition(p, "cross_entropy", bits, believed_by_answers=True)
    vectors = every_vector(n)
    truth, belief = exact_scores(p, "cross_entropy", vectors), believed_probability(p, vectors)
    bins = table.bin_of(vectors)
    assert len(np.unique(bins)) <= 2**bits
    for k in np.unique(bins):
        members = bins == k
        shown = table.shown(vectors[np.flatnonzero(members)[0]])
        assert belief[members].sum() == pytest.approx(shown.vectors, rel=1e-9, abs=1e-300)
        assert belief[members].sum() >= 2.0**-bits * (1 - 1e-9) and shown.bits <= bits + 1e-9
        assert truth[members].min() >= shown.low - 1e-12 and truth[members].max() <= shown.high + 1e-12


def test_believed_bins_are_narrow_where_a_confident_detector_expects_its_score() -> None:
    """40 models, answers that are right as often as they say: the believed bin is far narrower than the
    counting bin, and a probe near 0.5 gets about the counting bins (the issue's two requirements)."""
    rng = np.random.default_rng(40)
    labels = rng.integers(0, 2, 40)
    p = 1.0 / (1.0 + np.exp(-(3.0 * (2 * labels - 1) + rng.normal(0.0, 1.0, 40))))
    counted = partition(p, "cross_entropy", 8).shown(labels)
    believed = partition(p, "cross_entropy", 8, believed_by_answers=True).shown(labels)
    assert believed.low <= cross_entropy(labels, p) <= believed.high
    assert believed.high - believed.low < 0.01 < 0.1 < counted.high - counted.low
    near_half = 0.5 + rng.uniform(-0.01, 0.01, 40)
    plain = partition(near_half, "cross_entropy", 8)
    weighted = partition(near_half, "cross_entropy", 8, believed_by_answers=True)
    assert abs(len(weighted.ends) - len(plain.ends)) <= 8
    assert weighted.counts.min() * 2**40 >= 0.5 * plain.counts.min()


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_refined_cells_are_fewer_than_2_to_the_bits_and_hold_the_score(case) -> None:
    """The grid at b - 1 narrowed by the believed bins at b - 1: over all 2^12 label vectors the showings
    number at most 2^b - 1 (the count ``refined`` reports), their entropy is at most b bits (scipy), and each
    shown interval holds the true score and is no wider than its grid cell (plus the lattice unit)."""
    from scipy.stats import entropy

    from assay.stats.disclosure import grid_edges, refined

    n, bits = 12, 6
    p = case[1](np.random.default_rng(7), n)
    vectors = every_vector(n)
    truth = exact_scores(p, "cross_entropy", vectors)
    table = partition(p, "cross_entropy", bits - 1, believed_by_answers=True)
    offsets = table.offsets(vectors)
    edges = grid_edges("cross_entropy", bits - 1)
    lattice = (table.base + offsets) * table.unit / n
    cells = np.clip(np.searchsorted(edges, lattice, side="right") - 1, 0, len(edges) - 2)
    pairs = cells * 10**6 + table.bin_of(vectors)
    _, counts = np.unique(pairs, return_counts=True)
    assert len(counts) <= 2**bits - 1 and entropy(counts, base=2) <= bits
    for i in np.random.default_rng(1).choice(2**n, 24, replace=False):
        shown = refined(p, vectors[i], "cross_entropy", bits)
        assert shown.showings == len(counts)
        assert shown.low - 1e-12 <= truth[i] <= shown.high + 1e-12
        assert shown.high - shown.low <= shown.cell.high - shown.cell.low + table.unit + 1e-12
