"""The exact false-positive rate of a DyePack accusation, alone: what ``assay dyepack fpr`` needs.

Why its own module, and a dataclass rather than a pydantic model: ``assay dyepack fpr`` should answer
in well under 0.3 s, and the verifier's imports (pydantic, the model protocol, the data readers) cost
more than that. ``VerifyReport`` embeds this dataclass as a field; pydantic validates and serialises it.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass

from assay.errors import UserError
from assay.stats import tails

DEFAULT_ALPHA = 1e-3  # flag a model when the false-positive rate of accusing it is at most this


@dataclass(frozen=True)
class FalsePositiveRate:
    """P[a clean model activates at least ``activated`` of the backdoors], exact and as a Chernoff bound."""

    backdoors: int
    activated: int
    k_values: list[int]
    fpr: float
    log10_fpr: float
    chernoff_bound: float
    log10_chernoff_bound: float
    # Asked in several layouts (``verify --formats``): ``fpr`` and the bound are the best layout's times the
    # number of layouts tried, capped at 1 (Bonferroni); ``one_layout_fpr`` is that layout's own.
    layouts: int = 1
    one_layout_fpr: float | None = None


def over_layouts(fpr: FalsePositiveRate, layouts: int) -> FalsePositiveRate:
    """The false-positive rate of an accusation made on the best of ``layouts`` layouts.

    Why Bonferroni: each layout's exact FPR is a valid p-value for a clean model (its targets are
    uniform and independent of how it is asked), so P[min over L layouts <= t] <= L t whatever the
    dependence between layouts (the same model answers all of them). Capped at 1.
    """
    if layouts < 1:
        raise ValueError(f"layouts must be at least 1 (value: {layouts})")
    if layouts == 1:
        return fpr
    log_l = math.log10(layouts)
    return dataclasses.replace(
        fpr,
        fpr=min(1.0, fpr.fpr * layouts),
        log10_fpr=min(0.0, fpr.log10_fpr + log_l),
        chernoff_bound=min(1.0, fpr.chernoff_bound * layouts),
        log10_chernoff_bound=min(0.0, fpr.log10_chernoff_bound + log_l),
        layouts=layouts,
        one_layout_fpr=fpr.fpr,
    )


def false_positive_rate(k_values: Sequence[int], activated: int) -> FalsePositiveRate:
    """Binomial tail when every backdoor has the same K, Poisson-binomial tail otherwise."""
    if not k_values:
        raise UserError("at least one backdoor is needed")
    if any(k < 2 for k in k_values):
        raise UserError(f"every K must be at least 2 (values: {list(k_values)})")
    if not 0 <= activated <= len(k_values):
        raise UserError(f"--activated must be between 0 and {len(k_values)} (value: {activated})")
    if len(set(k_values)) == 1:
        n, p = len(k_values), 1 / k_values[0]
        log_fpr = tails.log_binomial_sf(n, p, activated)
        log_bound = tails.log_chernoff_bound(n, p, activated)
    else:
        ps = [1 / k for k in k_values]
        log_fpr = tails.log_poisson_binomial_sf(ps, activated)
        log_bound = tails.log_poisson_binomial_chernoff_bound(ps, activated)
    return FalsePositiveRate(
        backdoors=len(k_values),
        activated=activated,
        k_values=list(k_values),
        fpr=math.exp(log_fpr),
        log10_fpr=log_fpr / math.log(10),
        chernoff_bound=math.exp(log_bound),
        log10_chernoff_bound=log_bound / math.log(10),
    )


def fpr_json(fpr: FalsePositiveRate) -> str:
    """The result as indented JSON (``assay dyepack fpr --json``), the fields as in a verify summary."""
    return json.dumps(dataclasses.asdict(fpr), indent=2)


def smallest_fpr(k_values: Sequence[int]) -> float:
    """The smallest false-positive rate a release can ever give: every backdoor activated, the product
    of 1/K (the exact binomial or Poisson-binomial tail at A = B)."""
    return false_positive_rate(k_values, len(k_values)).fpr


def backdoors_needed(k: int, alpha: float) -> int:
    """The fewest backdoors of K options whose all-activated FPR, K^-B, is at most ``alpha``."""
    b = max(1, math.ceil(math.log(1 / alpha) / math.log(k) - 1e-12))
    while k**-b > alpha:  # guard the float rounding of the logarithms
        b += 1
    return b


def options_needed(n_backdoors: int, alpha: float) -> int:
    """The fewest options K per backdoor for which B backdoors all activated give K^-B <= ``alpha``."""
    k = max(2, math.ceil(alpha ** (-1 / n_backdoors) - 1e-9))
    while k**-n_backdoors > alpha:
        k += 1
    return k


def weakness(k_values: Sequence[int], alpha: float) -> str | None:
    """None when a model that activates every backdoor is flagged at ``alpha``; else one line saying the
    release can never flag, its smallest FPR, and the B (at its smallest K) or K (at its B) that would."""
    floor = smallest_fpr(k_values)
    if floor <= alpha:
        return None
    b, k = len(k_values), min(k_values)
    return (
        f"this release can never flag at alpha {alpha:g}: its smallest possible false-positive rate, every "
        f"one of its {b} backdoors activated, is {floor:.3g}; use at least {backdoors_needed(k, alpha)} "
        f"backdoors at K = {k}, or K >= {options_needed(b, alpha)} options with {b} backdoors"
    )
