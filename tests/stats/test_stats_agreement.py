"""Krippendorff's alpha against the published worked examples, an independent coincidence-matrix computation,
and the bootstrap and percent-agreement contracts."""

from __future__ import annotations

import numpy as np
import pytest

from assay.stats import bootstrap_alpha_ci, krippendorff_alpha, percent_agreement

NAN = np.nan
# Krippendorff (2011), "Computing Krippendorff's Alpha-Reliability", section C: 4 coders x 12 units, missing.
FOUR_CODERS = np.array(
    [
        [1, 2, 3, 3, 2, 1, 4, 1, 2, NAN, NAN, NAN],
        [1, 2, 3, 3, 2, 2, 4, 1, 2, 5, NAN, 3],
        [NAN, 3, 3, 3, 2, 3, 4, 2, 2, 5, 1, NAN],
        [1, 2, 3, 3, 2, 4, 4, 1, 2, 5, 1, NAN],
    ]
)
# Same paper, section A: 2 coders x 10 units, binary, no missing values.
TWO_CODERS_BINARY = np.array(
    [
        [0, 1, 0, 0, 0, 0, 0, 0, 1, 0],
        [1, 1, 1, 0, 0, 1, 0, 0, 0, 0],
    ]
)


def _nominal_alpha_from_scratch(data: np.ndarray) -> float:
    """Nominal alpha by the paper's recipe with plain loops: coincidence matrix o_ck = sum over units of
    (number of c-k pairs of coders) / (m_u - 1), then alpha = 1 - (n - 1) * sum_{c != k} o_ck
    / sum_{c != k} n_c n_k."""
    values = sorted({float(v) for v in data.ravel() if not np.isnan(v)})
    index = {v: i for i, v in enumerate(values)}
    o = np.zeros((len(values), len(values)))
    for unit in data.T:
        coded = [float(v) for v in unit if not np.isnan(v)]
        if len(coded) < 2:
            continue
        for i, vi in enumerate(coded):
            for j, vj in enumerate(coded):
                if i != j:
                    o[index[vi], index[vj]] += 1 / (len(coded) - 1)
    n_c = o.sum(axis=0)
    n = n_c.sum()
    off = ~np.eye(len(values), dtype=bool)
    return 1 - (n - 1) * o[off].sum() / np.outer(n_c, n_c)[off].sum()


@pytest.mark.parametrize(
    ("level", "published"),
    [("nominal", 0.743), ("ordinal", 0.815), ("interval", 0.849), ("ratio", 0.797)],
)
def test_four_coder_worked_example(level: str, published: float) -> None:
    assert round(krippendorff_alpha(FOUR_CODERS, level), 3) == published


def test_two_coder_binary_worked_example() -> None:
    assert round(krippendorff_alpha(TWO_CODERS_BINARY, "nominal"), 3) == 0.095


@pytest.mark.parametrize("data", [FOUR_CODERS, TWO_CODERS_BINARY])
def test_nominal_matches_from_scratch_coincidences(data: np.ndarray) -> None:
    assert krippendorff_alpha(data, "nominal") == pytest.approx(_nominal_alpha_from_scratch(data), abs=1e-12)


def test_nominal_matches_from_scratch_on_random_data() -> None:
    rng = np.random.default_rng(3)
    for _ in range(20):
        data = rng.integers(0, 4, size=(3, 40)).astype(float)
        data[rng.random(data.shape) < 0.2] = NAN
        expected = _nominal_alpha_from_scratch(data)
        assert krippendorff_alpha(data, "nominal") == pytest.approx(expected, abs=1e-12)


def test_ordinal_uses_order_not_spacing() -> None:
    """Ordinal alpha depends only on ranks: a monotone relabelling leaves it unchanged (interval does not)."""
    relabelled = np.where(np.isnan(FOUR_CODERS), NAN, FOUR_CODERS**3)
    assert krippendorff_alpha(relabelled, "ordinal") == pytest.approx(
        krippendorff_alpha(FOUR_CODERS, "ordinal")
    )
    assert krippendorff_alpha(relabelled, "interval") != pytest.approx(
        krippendorff_alpha(FOUR_CODERS, "interval")
    )


def test_perfect_agreement_is_one() -> None:
    data = np.array([[1, 2, 3, 1], [1, 2, 3, 1]], dtype=float)
    for level in ("nominal", "ordinal", "interval", "ratio"):
        assert krippendorff_alpha(data, level) == pytest.approx(1.0)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (np.array([[1, 2, NAN], [1, NAN, 3]]), "at least 2 units"),
        (np.array([[1, 1, 1], [1, 1, 1]]), "identical"),
        (np.array([[1, 2, 3]]), "at least 2 coders"),
        (np.array([1, 2, 3]), "2-D"),
        (np.array([[1, np.inf], [1, 2]]), "infinite"),
    ],
)
def test_alpha_rejects_undefined_inputs(data: np.ndarray, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        krippendorff_alpha(data, "nominal")


def test_alpha_rejects_unknown_level_and_negative_ratio() -> None:
    with pytest.raises(ValueError, match="level must be"):
        krippendorff_alpha(FOUR_CODERS, "Interval")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="non-negative"):
        krippendorff_alpha(FOUR_CODERS - 3, "ratio")


@pytest.mark.parametrize("level", ["nominal", "ordinal", "interval", "ratio"])
def test_bootstrap_interval_brackets_point_and_is_reproducible(level: str) -> None:
    result = bootstrap_alpha_ci(FOUR_CODERS, level, n_boot=500, seed=1)
    assert result.alpha == krippendorff_alpha(FOUR_CODERS, level)
    assert result.low <= result.alpha <= result.high <= 1.0
    assert result.n_boot <= 500
    assert bootstrap_alpha_ci(FOUR_CODERS, level, n_boot=500, seed=1) == result


@pytest.mark.parametrize("level", ["nominal", "ordinal", "interval", "ratio"])
def test_bootstrap_replicates_match_alpha_on_resampled_units(level: str) -> None:
    """The vectorised replicate (weighted coincidence sums) equals alpha recomputed on the resampled columns:
    a one-replicate bootstrap re-draws the same indices as this test does."""
    rng = np.random.default_rng(7)
    data = rng.integers(1, 5, size=(3, 60)).astype(float)
    data[rng.random(data.shape) < 0.1] = NAN
    pairable = data[:, (~np.isnan(data)).sum(axis=0) >= 2]
    picks = np.random.default_rng(11).integers(0, pairable.shape[1], size=(1, pairable.shape[1]))
    expected = krippendorff_alpha(pairable[:, picks[0]], level)
    result = bootstrap_alpha_ci(data, level, n_boot=1, seed=11)
    assert result.low == pytest.approx(expected, abs=1e-12)


def test_bootstrap_interval_narrows_with_more_units() -> None:
    rng = np.random.default_rng(5)
    truth = rng.integers(1, 5, size=2000).astype(float)
    noisy = np.where(rng.random((3, 2000)) < 0.8, truth, rng.integers(1, 5, size=(3, 2000)))
    wide = bootstrap_alpha_ci(noisy[:, :100], "ordinal", n_boot=300)
    narrow = bootstrap_alpha_ci(noisy, "ordinal", n_boot=300)
    assert narrow.high - narrow.low < (wide.high - wide.low) / 2


def test_bootstrap_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="n_boot"):
        bootstrap_alpha_ci(FOUR_CODERS, "nominal", n_boot=0)
    with pytest.raises(ValueError, match="confidence"):
        bootstrap_alpha_ci(FOUR_CODERS, "nominal", confidence=1.0)


def test_percent_agreement_worked_examples() -> None:
    # Binary example: 6 of 10 units agree, one pair each.
    assert percent_agreement(TWO_CODERS_BINARY) == pytest.approx(0.6)
    # Four-coder example by hand: agreeing pairs / pairable pairs, unit by unit (units 1-11; unit 12 has one
    # code). Pairs per unit with m coders: m(m-1)/2.
    agreeing = 3 + 3 + 6 + 6 + 6 + 0 + 6 + 3 + 6 + 3 + 1
    total = 3 + 6 + 6 + 6 + 6 + 6 + 6 + 6 + 6 + 3 + 1
    assert percent_agreement(FOUR_CODERS) == pytest.approx(agreeing / total, abs=1e-15)


def test_percent_agreement_needs_a_pairable_unit() -> None:
    with pytest.raises(ValueError, match="no unit"):
        percent_agreement(np.array([[1, NAN], [NAN, 2]]))
