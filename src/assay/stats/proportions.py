"""Proportions for STAR's harm rates: two-sample z-test, one-sample intervals, and the 2x2 odds ratio.

Closed-form and scalar on purpose: STAR compares a handful of rates per report, so clarity beats batching.
The z-test and intervals follow ``statsmodels.stats.proportion`` exactly (tests hold them to 1e-12), without
importing statsmodels at run time.
"""

from __future__ import annotations

import math
from typing import Literal, NamedTuple

from scipy import stats

CiMethod = Literal["wilson", "normal"]


class OddsRatio(NamedTuple):
    """Odds ratio of a 2x2 table with its Woolf interval; ``corrected`` says the Haldane 0.5 was added."""

    odds_ratio: float
    low: float
    high: float
    corrected: bool


def _check_count(count: int, n: int, name: str) -> None:
    if n <= 0:
        raise ValueError(f"{name}: n must be positive, got {n}")
    if not 0 <= count <= n:
        raise ValueError(f"{name}: count must be in [0, n], got {count} of {n}")


def _critical_value(confidence: float) -> float:
    """Two-sided standard normal quantile; ``isf`` of the tail (as statsmodels) keeps 1e-12 agreement."""
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    return float(stats.norm.isf((1 - confidence) / 2))


def two_proportion_ztest(count1: int, n1: int, count2: int, n2: int) -> tuple[float, float]:
    """Two-sided z-test of p1 == p2 with the pooled standard error; returns (z, p).

    The pooled SE is the one implied by the null (both groups share one rate). When the pooled rate is 0 or 1
    there is no variance and no test, so that raises instead of returning statsmodels' nan.
    """
    _check_count(count1, n1, "group 1")
    _check_count(count2, n2, "group 2")
    pooled = (count1 + count2) / (n1 + n2)
    if pooled in (0.0, 1.0):
        raise ValueError("pooled proportion is 0 or 1: the z-test is undefined (no variance)")
    se = math.sqrt(pooled * (1 - pooled) * (1 / n1 + 1 / n2))
    z = (count1 / n1 - count2 / n2) / se
    return float(z), float(stats.norm.sf(abs(z)) * 2)


def proportion_ci(
    count: int, n: int, confidence: float = 0.95, method: CiMethod = "wilson"
) -> tuple[float, float]:
    """Interval for a binomial proportion, clipped to [0, 1] as statsmodels does.

    Wilson is the default because the normal (Wald) interval collapses to a point at 0 or n successes,
    which is exactly where STAR's rare-harm rates sit.
    """
    _check_count(count, n, "proportion")
    crit = _critical_value(confidence)
    q = count / n
    if method == "normal":
        dist = crit * math.sqrt(q * (1 - q) / n)
        low, high = q - dist, q + dist
    elif method == "wilson":
        crit2 = crit**2
        denom = 1 + crit2 / n
        center = (q + crit2 / (2 * n)) / denom
        dist = crit * math.sqrt(q * (1 - q) / n + crit2 / (4 * n**2)) / denom
        # At 0 or n successes the bound is exactly 0 or 1; the formula leaves ~1e-17 of rounding there.
        low = 0.0 if count == 0 else center - dist
        high = 1.0 if count == n else center + dist
    else:
        raise ValueError(f"method must be 'wilson' or 'normal', got {method!r}")
    return min(max(low, 0.0), 1.0), min(max(high, 0.0), 1.0)


def odds_ratio_ci(a: int, b: int, c: int, d: int, confidence: float = 0.95) -> OddsRatio:
    """Odds ratio (a*d)/(b*c) of the table [[a, b], [c, d]] with the Woolf (log-scale normal) interval.

    Haldane correction: if any cell is zero, 0.5 is added to all four cells before computing both the ratio
    and its interval (otherwise the log odds ratio or its SE is infinite). Tables without zeros are left
    untouched, so the estimate is the plain sample odds ratio there; ``corrected`` reports which happened.
    """
    cells = (a, b, c, d)
    if any(x < 0 for x in cells):
        raise ValueError(f"cell counts must be non-negative, got {cells}")
    corrected = min(cells) == 0
    a_, b_, c_, d_ = (x + 0.5 for x in cells) if corrected else (float(x) for x in cells)
    log_or = math.log(a_) + math.log(d_) - math.log(b_) - math.log(c_)
    se = math.sqrt(1 / a_ + 1 / b_ + 1 / c_ + 1 / d_)
    half = _critical_value(confidence) * se
    return OddsRatio(math.exp(log_or), math.exp(log_or - half), math.exp(log_or + half), corrected)
