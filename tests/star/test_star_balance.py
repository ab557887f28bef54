"""assay.star.balance: the in/out-group red-team split and the annotation arms, exact over any campaign
(property loops over many sizes, group counts, shares and seeds; pure functions, no database)."""

from __future__ import annotations

import random
from fractions import Fraction

import numpy as np
import pytest

from assay.star.balance import arm_of, in_group_counts
from assay.star.spec import ARM_PRESETS, AnnotationArms

SHARES = [Fraction(s) for s in ("0.5", "0.5", "0.3", "0.25", "0.7", "0.1", "0.9", "0.333", "0", "1")]


def _apply(state: dict[str, tuple[int, int]], new: dict[str, int], share: Fraction, seed: int) -> None:
    got = in_group_counts({g: c for g, c in state.items() if c[0]}, new, share, random.Random(seed))
    assert set(got) == {g for g, n in new.items() if n}
    for label, ins in got.items():
        assert 0 <= ins <= new[label]
        total, before = state.get(label, (0, 0))
        state[label] = (total + new[label], before + ins)


def _deviations(state: dict[str, tuple[int, int]], share: Fraction) -> tuple[Fraction, list[Fraction]]:
    overall = sum(ins for _, ins in state.values()) - sum(n for n, _ in state.values()) * share
    return overall, [ins - n * share for n, ins in state.values()]


def test_one_batch_is_exact_overall_and_within_one_per_group() -> None:
    """1,000 campaigns of 1-40 groups and 1-400 tasks: overall within half a task of N * share (so at 50/50
    an even campaign splits exactly and an odd one by one), every group within one."""
    rng = random.Random(0)
    for trial in range(1000):
        share = rng.choice(SHARES)
        groups = rng.randint(1, 40)
        new = {f"g{i}": rng.randint(0, 12) for i in range(groups)}
        state: dict[str, tuple[int, int]] = {}
        _apply(state, new, share, trial)
        overall, per_group = _deviations(state, share)
        assert abs(overall) <= Fraction(1, 2), (trial, share, new)
        assert all(abs(d) <= 1 for d in per_group)
        if share == Fraction(1, 2):  # the odd tasks go either way: the coin, not always in-group
            assert all(abs(d) <= Fraction(1, 2) for d in per_group)


def test_the_issues_campaigns_no_longer_lean_in_group() -> None:
    """80, 40, 151 and 30 group-targeted tasks over 19 groups (the example spec): 40, 20, 75 or 76, 15."""
    for total in (80, 40, 151, 30):
        sizes = [total // 19 + (i < total % 19) for i in range(19)]
        for seed in range(20):
            state: dict[str, tuple[int, int]] = {}
            _apply(state, {f"g{i}": n for i, n in enumerate(sizes)}, Fraction(1, 2), seed)
            ins = sum(i for _, i in state.values())
            assert abs(2 * ins - total) <= 1, (total, seed, ins)


def test_later_batches_keep_every_group_within_one_and_the_campaign_close() -> None:
    """Batches after tasks are handed out cannot move those; every group stays within one whatever comes,
    and with a few batches of design-sized chunks the campaign stays within one too."""
    rng = random.Random(1)
    for trial in range(400):
        share = rng.choice(SHARES)
        groups = [f"g{i}" for i in range(rng.randint(1, 25))]
        state: dict[str, tuple[int, int]] = {}
        for batch in range(rng.randint(2, 6)):
            new = {g: rng.randint(0, 8) for g in groups if rng.random() < 0.7}
            _apply(state, new, share, trial * 10 + batch)
            overall, per_group = _deviations(state, share)
            assert all(abs(d) <= 1 for d in per_group)
            assert abs(overall) <= 1, (trial, batch, share)


def test_arms_are_within_one_dialogue_of_their_shares_at_every_point() -> None:
    """After any number n of group-targeted dialogues, each arm's count is within one of n * share."""
    rng = random.Random(2)
    cases = [AnnotationArms.model_validate(p).shares() for p in ARM_PRESETS.values()]
    for _ in range(25):
        a, b = sorted(rng.randint(0, 100) for _ in range(2))
        cases.append(AnnotationArms(in_group=a / 100, out_group=(b - a) / 100, both=(100 - b) / 100).shares())
    n = np.arange(1, 2001)[:, None]
    for case, shares in enumerate(cases):
        arms = np.array([arm_of(i, shares, seed=case) for i in range(2000)])
        counts = np.cumsum(arms[:, None] == np.arange(3), axis=0)
        worst = np.abs(counts - n * np.array([float(s) for s in shares])).max()
        assert worst < 1 - 1e-9, (case, worst)


def test_paper_arms_hit_59_24_17_exactly_per_hundred_and_the_seed_breaks_ties() -> None:
    paper = AnnotationArms.model_validate("paper").shares()
    for seed in range(5):
        arms = [arm_of(i, paper, seed) for i in range(300)]
        assert [arms.count(a) for a in range(3)] == [177, 72, 51]
        assert [arms[:100].count(a) for a in range(3)] == [59, 24, 17]
    thirds = AnnotationArms(in_group=1 / 3, out_group=1 / 3, both=1 / 3).shares()
    firsts = {tuple(arm_of(i, thirds, seed) for i in range(3)) for seed in range(30)}
    assert len(firsts) > 1 and all(sorted(f) == [0, 1, 2] for f in firsts)
    with pytest.raises(ValueError, match="zero or more"):
        arm_of(-1, paper, 0)
