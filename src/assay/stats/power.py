"""Power and sample size for comparing two 'broken' shares when the observations come in clusters.

STAR compares the share of dialogues or ratings judged broken between two sides (in-group vs out-group red
teamers or annotators). The test is the two-sided two-proportion z-test on the arcsine scale (Cohen's h,
``statsmodels.stats.proportion.proportion_effectsize``; power from
``statsmodels.stats.power.NormalIndPower``), which needs ``n`` independent observations on the first side
and ``ratio * n`` on the second.

Ratings are not independent: a dialogue's two or three ratings agree more than two random ones (an
intraclass correlation ``icc``, about Krippendorff's alpha for binary ratings), and one annotator or red
teamer contributes many. The variance of a share then grows by the design effect
``1 + (m - 1) * icc + (r - 1) * person_icc`` (m observations per dialogue, r per person; the usual
additive approximation for a crossed design, Kish 1965), so a side needs ``design effect / m`` times as many
dialogues as it would need independent observations. Pure functions: no I/O.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import NamedTuple

from scipy import optimize

MAX_UNITS = 1e12  # beyond this a sample size is reported as unreachable, not searched further


class Effect(NamedTuple):
    """The two shares a test should tell apart, and Cohen's h between them (other minus reference)."""

    reference: float
    other: float
    h: float


def planned_effect(
    baseline: float, *, odds_ratio: float | None = None, difference: float | None = None
) -> Effect:
    """The shares for a baseline and an effect given as an odds ratio or as a difference in shares."""
    from statsmodels.stats.proportion import proportion_effectsize

    if (odds_ratio is None) == (difference is None):
        raise ValueError("give exactly one of odds_ratio and difference")
    if not 0.0 < baseline < 1.0:
        raise ValueError(f"baseline must be a share strictly between 0 and 1, got {baseline}")
    if odds_ratio is not None:
        if odds_ratio <= 0:
            raise ValueError(f"odds_ratio must be positive, got {odds_ratio}")
        odds = odds_ratio * baseline / (1.0 - baseline)
        other = odds / (1.0 + odds)
    else:
        other = baseline + float(difference)  # type: ignore[arg-type]
        if not 0.0 < other < 1.0:
            raise ValueError(f"baseline {baseline} + difference {difference} = {other} is not a share")
    return Effect(baseline, other, float(proportion_effectsize(other, baseline)))


def design_effect(per_unit: float, icc: float, per_person: float = 1.0, person_icc: float = 0.0) -> float:
    """``1 + (m - 1) icc + (r - 1) person_icc``: m observations per dialogue, r per person."""
    for name, value in (("per_unit", per_unit), ("per_person", per_person)):
        if value < 1:
            raise ValueError(f"{name} must be at least 1, got {value}")
    for name, value in (("icc", icc), ("person_icc", person_icc)):
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"{name} must be in [0, 1], got {value}")
    return 1.0 + (per_unit - 1.0) * icc + (per_person - 1.0) * person_icc


def power_at(h: float, n_effective: float, alpha: float, ratio: float = 1.0) -> float:
    """Power of the two-sided test with ``n_effective`` independent observations on the first side."""
    from statsmodels.stats.power import NormalIndPower

    _check(alpha, ratio)
    if n_effective <= 0 or h == 0:
        return float(alpha) if h == 0 else 0.0
    return float(NormalIndPower().power(abs(h), n_effective, alpha, ratio=ratio, alternative="two-sided"))


@lru_cache(maxsize=256)
def n_needed(h: float, alpha: float, power: float, ratio: float = 1.0) -> float:
    """Independent observations the first side needs (the second: ``ratio`` times as many); ``inf`` when
    more than ``MAX_UNITS`` or when the shares are equal. Solved to 1e-12 on statsmodels' power function
    (its own ``solve_power`` stops near 1e-8); cached, as a plan asks the same question for every group."""
    _check(alpha, ratio)
    if not alpha < power < 1.0:
        raise ValueError(f"power must be between alpha ({alpha}) and 1, got {power}")
    if h == 0 or power_at(h, MAX_UNITS, alpha, ratio) < power:
        return math.inf
    return float(
        optimize.brentq(
            lambda n: power_at(h, n, alpha, ratio) - power, 1e-9, MAX_UNITS, xtol=1e-12, rtol=1e-15
        )
    )


def _check(alpha: float, ratio: float) -> None:
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    if not ratio > 0:
        raise ValueError(f"ratio must be positive, got {ratio}")
