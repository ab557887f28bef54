"""Exact splits for the assignment engine: red teamers in-group or out-group, and annotation arms.

Two promises, both checked by property tests over many campaign sizes and group counts:

* **In/out-group red teaming** (``in_group_counts``): in every group the in-group count is within one task of
  ``n * in_group_share``, and over the whole campaign too. A group whose share is not a whole number of tasks
  (an odd group at 50/50) takes the higher or the lower count by a seeded coin weighted by the fraction, and
  the coins are then evened out so the campaign's total is the nearest whole number to ``N * share``.
  Rounding half up in every group instead (as before) drifted: 42 of 80, 76 of 151. Tasks already handed out
  keep their requirement, so a later batch is balanced as closely as the earlier ones allow, never beyond
  one task per group.
* **Annotation arms** (``arm_of``): the k-th group-targeted dialogue's arm comes from one fixed sequence in
  which, after any number n of dialogues, each arm's count is within one of ``n * share`` (the arm with the
  largest shortfall ``n * share - count`` goes next; ties by a seeded order). Exact fractions, so 59/24/17
  holds at 100 dialogues exactly and never drifts over a long campaign.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from fractions import Fraction
from functools import lru_cache


def _bounds(before: int, before_in: int, new: int, share: Fraction) -> tuple[int, int, int, int]:
    """For one group: the preferred in-group counts (floor and ceiling of ``n * share`` reachable from the
    tasks already handed out) and the widest ones still within one task of it."""
    total, target = before + new, (before + new) * share
    low_pref = max(math.floor(target), before_in)
    high_pref = min(math.ceil(target), before_in + new)
    low = max(math.ceil(target - 1), before_in)
    high = min(math.floor(target + 1), before_in + new)
    low_pref, high_pref = max(low_pref, low), min(high_pref, high)
    if low_pref > high_pref:  # cannot happen with counts from this module; keep the widest range then
        low_pref, high_pref = low, high
    assert 0 <= low <= high <= total
    return low_pref, high_pref, low, high


def in_group_counts(
    before: Mapping[str, tuple[int, int]],
    new: Mapping[str, int],
    share: Fraction,
    rng: random.Random,
) -> dict[str, int]:
    """How many of each group's ``new`` red-team tasks go to in-group red teamers.

    ``before`` holds, for every group with earlier tasks, (earlier tasks, earlier in-group ones); groups with
    no new task count towards the campaign's total only. Returns the in-group count among the new tasks.
    """
    labels = sorted(label for label, n in new.items() if n > 0)
    fixed = sum(
        (
            Fraction(done_in) - done * share
            for label, (done, done_in) in before.items()
            if label not in labels
        ),
        Fraction(0),
    )
    bounds, count = {}, {}
    for label in labels:
        done, done_in = before.get(label, (0, 0))
        bounds[label] = _bounds(done, done_in, new[label], share)
        low_pref, high_pref = bounds[label][:2]
        fraction = (done + new[label]) * share - math.floor((done + new[label]) * share)
        count[label] = high_pref if high_pref > low_pref and rng.random() < fraction else low_pref
    deviation = fixed + sum(
        (count[g] - (before.get(g, (0, 0))[0] + new[g]) * share for g in labels), Fraction(0)
    )
    while abs(deviation) > Fraction(1, 2):
        step = -1 if deviation > 0 else 1
        label = _movable(labels, count, bounds, step, rng)
        if label is None:
            break
        count[label] += step
        deviation += step
    return {label: count[label] - before.get(label, (0, 0))[1] for label in labels}


def _movable(
    labels: Sequence[str],
    count: Mapping[str, int],
    bounds: Mapping[str, tuple[int, int, int, int]],
    step: int,
    rng: random.Random,
) -> str | None:
    """A group whose count may move by ``step``: one that stays at its floor or ceiling if any, else one that
    stays within one task; picked at random so no group is always the one that gives way."""
    for lo_index, hi_index in ((0, 1), (2, 3)):
        found = [g for g in labels if bounds[g][lo_index] <= count[g] + step <= bounds[g][hi_index]]
        if found:
            return rng.choice(found)
    return None


def arm_of(index: int, shares: Sequence[Fraction], seed: int) -> int:
    """The arm (an index into ``shares``) of the ``index``-th (0-based) group-targeted dialogue."""
    if index < 0:
        raise ValueError(f"index must be zero or more (value: {index})")
    length = 1 << max(index, 1).bit_length()  # grow by doubling: each length is computed once per process
    return _arm_sequence(tuple(shares), seed, length)[index]


@lru_cache(maxsize=32)
def _arm_sequence(shares: tuple[Fraction, ...], seed: int, length: int) -> tuple[int, ...]:
    """The first ``length`` arms: each step the arm furthest below its share goes next. Integers only (the
    shares over their common denominator), so ties are exact and broken by a seeded order of the arms."""
    scale = math.lcm(*(s.denominator for s in shares))
    weight = [int(s * scale) for s in shares]
    order = random.Random(f"arms:{seed}").sample(range(len(shares)), len(shares))
    rank = {arm: position for position, arm in enumerate(order)}
    counts = [0] * len(shares)
    found = []
    for step in range(1, length + 1):
        arm = max(range(len(shares)), key=lambda a: (step * weight[a] - counts[a] * scale, -rank[a]))
        counts[arm] += 1
        found.append(arm)
    return tuple(found)
