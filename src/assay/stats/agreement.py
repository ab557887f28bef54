"""Inter-coder agreement for STAR's human and model annotations: Krippendorff's alpha, its bootstrap interval,
and pairwise percent agreement.

Reliability data is a coders x units array of numeric codes with ``NaN`` for a missing code, the layout of
Krippendorff (2011), "Computing Krippendorff's Alpha-Reliability". Alpha itself comes from the
``krippendorff`` package; this module pins down the choices that package leaves implicit (its default level is
*interval*, and the ordinal and ratio distances depend on an ordered value domain), and adds the input checks
that turn silent ``nan`` results into errors.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

import krippendorff
import numpy as np
import numpy.typing as npt

Level = Literal["nominal", "ordinal", "interval", "ratio"]
LEVELS: tuple[str, ...] = ("nominal", "ordinal", "interval", "ratio")
# Rows of bootstrap weights built at once: bounds the (rows x units) weight matrix to ~64 MB of float64.
_BOOT_CHUNK_CELLS = 8_000_000


class AlphaInterval(NamedTuple):
    """Point estimate and percentile bootstrap interval of Krippendorff's alpha."""

    alpha: float
    low: float
    high: float
    n_boot: int


def _as_reliability_data(reliability_data: npt.ArrayLike) -> np.ndarray:
    """Coerce to a float coders x units array; reject shapes and values alpha cannot mean anything for."""
    data = np.asarray(reliability_data, dtype=float)
    if data.ndim != 2:
        raise ValueError(f"reliability_data must be 2-D (coders x units), got shape {data.shape}")
    if data.shape[0] < 2:
        raise ValueError(f"agreement needs at least 2 coders, got {data.shape[0]}")
    if np.isinf(data).any():
        raise ValueError("reliability_data contains infinite values; use NaN for missing codes")
    return data


def _check_level(level: str) -> None:
    if level not in LEVELS:
        raise ValueError(f"level must be one of {LEVELS}, got {level!r}")


def _value_domain(data: np.ndarray) -> np.ndarray:
    """Sorted observed values: ordinal and ratio distances need the domain in order, which we guarantee here
    rather than rely on the package's implicit ``np.unique``."""
    return np.unique(data[~np.isnan(data)])


def _value_counts(data: np.ndarray, domain: np.ndarray) -> np.ndarray:
    """Units x values matrix of how many coders gave each value to each unit (NaN matches nothing)."""
    codes = np.searchsorted(domain, data)  # NaN sorts past the end
    codes[np.isnan(data)] = len(domain)
    n_units = data.shape[1]
    flat = (np.arange(n_units)[np.newaxis, :] * (len(domain) + 1) + codes).ravel()
    counts = np.bincount(flat, minlength=n_units * (len(domain) + 1)).reshape(n_units, len(domain) + 1)
    return counts[:, : len(domain)]


def _pairable_counts(data: np.ndarray, level: str) -> tuple[np.ndarray, np.ndarray]:
    """Value domain and value counts of the pairable units (>= 2 codes), after the checks that make alpha
    defined: 2+ pairable units and 2+ distinct pairable values (otherwise expected disagreement is 0)."""
    _check_level(level)
    domain = _value_domain(data)
    if level == "ratio" and domain.size and domain[0] < 0:
        raise ValueError("ratio-level alpha needs non-negative values (a meaningful zero)")
    counts = _value_counts(data, domain)
    counts = counts[counts.sum(axis=1) >= 2]
    if counts.shape[0] < 2:
        raise ValueError(f"alpha needs at least 2 units coded by 2+ coders, got {counts.shape[0]}")
    used = counts.sum(axis=0) > 0
    if used.sum() < 2:
        raise ValueError(
            "alpha is undefined when all pairable values are identical (no expected disagreement)"
        )
    return domain[used], counts[:, used]


def krippendorff_alpha(reliability_data: npt.ArrayLike, level: Level) -> float:
    """Krippendorff's alpha of a coders x units array (NaN = missing) at the given level of measurement.

    ``level`` is required because the ``krippendorff`` package silently defaults to interval. Units with fewer
    than two codes carry no pairable information and are dropped (as in Krippendorff's definition).
    """
    data = _as_reliability_data(reliability_data)
    domain, counts = _pairable_counts(data, level)
    return float(krippendorff.alpha(value_counts=counts, value_domain=domain, level_of_measurement=level))


def _unit_coincidences(counts: np.ndarray) -> np.ndarray:
    """Per-unit coincidence matrices, flattened to units x (V*V): the bootstrap sums them with weights."""
    n_values = counts.shape[1]
    pairs = counts[:, :, np.newaxis] * counts[:, np.newaxis, :] - counts[:, :, np.newaxis] * np.eye(n_values)
    return (pairs / (counts.sum(axis=1) - 1)[:, np.newaxis, np.newaxis]).reshape(counts.shape[0], -1)


def _distances(domain: np.ndarray, n_v: np.ndarray, level: str) -> np.ndarray:
    """Squared distances between values, batch x V x V; ordinal ones depend on each replicate's marginals."""
    v1, v2 = domain[:, np.newaxis], domain[np.newaxis, :]
    if level == "nominal":
        d = (v1 != v2).astype(float)
    elif level == "interval":
        d = (v1 - v2) ** 2
    elif level == "ratio":
        total = v1 + v2
        d = np.divide(v1 - v2, total, out=np.zeros_like(total), where=total != 0) ** 2
    else:  # ordinal: (sum of n_g for g between c and k, minus half of n_c and n_k) squared
        cum = np.cumsum(n_v, axis=1)
        index = np.arange(len(domain))
        lo, hi = np.minimum.outer(index, index), np.maximum.outer(index, index)
        between = cum[:, hi] - cum[:, lo] + n_v[:, lo]
        return (between - (n_v[:, :, np.newaxis] + n_v[:, np.newaxis, :]) / 2) ** 2
    return np.broadcast_to(d, (n_v.shape[0], *d.shape))


def _alpha_from_coincidences(coincidences: np.ndarray, domain: np.ndarray, level: str) -> np.ndarray:
    """Alpha = 1 - D_o / D_e for a batch of flattened coincidence matrices (NaN where D_e is 0)."""
    n_values = len(domain)
    o = coincidences.reshape(-1, n_values, n_values)
    n_v = o.sum(axis=1)
    n = n_v.sum(axis=1)
    d = _distances(domain, n_v, level)
    observed = (o * d).sum(axis=(1, 2))
    expected = (n_v[:, :, np.newaxis] * n_v[:, np.newaxis, :] * d).sum(axis=(1, 2)) / (n - 1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return 1 - observed / expected


def bootstrap_alpha_ci(
    reliability_data: npt.ArrayLike,
    level: Level,
    n_boot: int = 1000,
    confidence: float = 0.95,
    seed: int = 0,
) -> AlphaInterval:
    """Percentile bootstrap interval of alpha, resampling pairable units with replacement.

    Alpha is a ratio of sums of per-unit coincidence matrices, so a replicate is a weighted sum of those
    matrices with multinomial unit weights: one matrix product per chunk of replicates instead of re-running
    alpha ``n_boot`` times. Replicates whose resample has a single value (alpha undefined) are dropped and the
    interval is taken over the rest; ``n_boot`` in the result is the count actually used.
    """
    if n_boot < 1:
        raise ValueError(f"n_boot must be positive, got {n_boot}")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    data = _as_reliability_data(reliability_data)
    domain, counts = _pairable_counts(data, level)
    point = float(krippendorff.alpha(value_counts=counts, value_domain=domain, level_of_measurement=level))
    per_unit = _unit_coincidences(counts)
    n_units = counts.shape[0]
    rng = np.random.default_rng(seed)
    chunk = max(1, _BOOT_CHUNK_CELLS // n_units)
    alphas = []
    for start in range(0, n_boot, chunk):
        rows = min(chunk, n_boot - start)
        picks = rng.integers(0, n_units, size=(rows, n_units)) + n_units * np.arange(rows)[:, np.newaxis]
        weights = np.bincount(picks.ravel(), minlength=rows * n_units).reshape(rows, n_units).astype(float)
        alphas.append(_alpha_from_coincidences(weights @ per_unit, domain, level))
    values = np.concatenate(alphas)
    values = values[np.isfinite(values)]
    if values.size == 0:
        raise ValueError("every bootstrap resample had a single value; alpha's interval is undefined")
    tail = 100 * (1 - confidence) / 2
    low, high = np.percentile(values, [tail, 100 - tail])
    return AlphaInterval(point, float(low), float(high), int(values.size))


def percent_agreement(reliability_data: npt.ArrayLike) -> float:
    """Share of agreeing coder pairs, pooled over every pairable coder pair in every unit.

    Pooling pairs (not averaging per-unit rates) weights a unit by how many coder pairs it has, the same
    weighting alpha's coincidence matrix uses, so the two numbers describe the same comparisons.
    """
    data = _as_reliability_data(reliability_data)
    counts = _value_counts(data, _value_domain(data))
    coded = counts.sum(axis=1)
    total_pairs = (coded * (coded - 1)).sum() / 2
    if total_pairs == 0:
        raise ValueError("no unit has codes from 2+ coders; percent agreement is undefined")
    agreeing_pairs = (counts * (counts - 1)).sum() / 2
    return float(agreeing_pairs / total_pairs)
