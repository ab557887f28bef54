"""How many dialogues STAR's group tests need, and whether a planned campaign has them.

Two tests compare in-group with out-group, over all target groups and within each one:

* **red-team success**: the share of dialogues broken, in-group vs out-group red teamers (one observation
  per dialogue; the sides split by ``in_group_share``);
* **annotation**: the share of ratings "broken", in-group vs out-group annotators (``annotators_per_dialogue``
  observations per dialogue and side; a dialogue is on the in-group side in the in-group and both arms, on
  the out-group side in the out-group and both arms).

Each side's effective size is its observations over the design effect (``assay.stats.power``): ratings of
one dialogue correlate by ``icc``; with a pool, each person's observations by ``person_icc`` over the number
of eligible people on that side, so a small pool caps what more dialogues can buy. The planned group-targeted
dialogues are the design's share of group-targeted rules (every rule and group within one of it), so the plan
holds for any seed.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from pydantic import BaseModel, ConfigDict
from scipy import optimize

from assay.errors import UserError
from assay.star.participants import Person, membership
from assay.star.spec import CampaignSpec, PowerTarget, group_label
from assay.stats.power import MAX_UNITS, design_effect, n_needed, planned_effect, power_at
from assay.store.enums import Role

ALL = "all target groups"
RED_TEAM, ANNOTATION = "red-team success", "annotation"
PEOPLE = {Role.RED_TEAMER: "red teamers", Role.ANNOTATOR: "annotators"}


class PowerRow(BaseModel):
    """One test in one scope: planned and needed group-targeted dialogues, and the power planned."""

    model_config = ConfigDict(frozen=True)
    test: str
    scope: str
    planned: float
    needed: float | None  # None: no size reaches the power (a side empty, or the pool too small)
    in_side: float  # planned dialogues on the in-group side
    out_side: float
    per_dialogue: int  # observations per dialogue and side
    design_effect_in: float
    design_effect_out: float
    power: float
    enough: bool
    note: str = ""


class PowerPlan(BaseModel):
    """The whole plan: the effect planned for, and a row per test and scope."""

    model_config = ConfigDict(frozen=True)
    reference: float  # 'broken' share on the out-group side
    other: float  # on the in-group side
    h: float
    alpha: float
    power: float
    icc: float
    person_icc: float
    dialogues: int
    targeted: float
    pool: dict[str, dict[str, int]] | None
    rows: list[PowerRow]

    def warnings(self) -> list[str]:
        """Lines for ``assay star design`` and ``init``: every test over all groups that falls short, and one
        line per test for the groups that do."""
        lines = [
            f"{row.test} test ({ALL}): {round(row.planned)} group-targeted dialogues planned, "
            f"{_n(row.needed)} needed for power {self.power:g} ({self._effect()})"
            for row in self.rows
            if row.scope == ALL and not row.enough
        ]
        for test in (RED_TEAM, ANNOTATION):
            scoped = [r for r in self.rows if r.test == test and r.scope != ALL]
            short = [r for r in scoped if not r.enough]
            if short:
                needed = [r.needed for r in short if r.needed is not None]
                lines.append(
                    f"{test} test per target group: {len(short)} of {len(scoped)} groups too small "
                    f"(about {round(short[0].planned)} dialogues each, "
                    f"{_n(max(needed) if needed else None)} needed)"
                )
        return lines

    def _effect(self) -> str:
        return (
            f"broken {self.reference:.3g} vs {self.other:.3g}, alpha {self.alpha:g}, "
            f"icc {self.icc:g}; assay star plan-power"
        )


def _n(value: float | None) -> str:
    return "no number of" if value is None else str(math.ceil(value - 1e-9))


def plan_power(
    spec: CampaignSpec,
    target: PowerTarget | None = None,
    dialogues: int | None = None,
    pool: Sequence[Person] | None = None,
    person_icc: float = 0.0,
) -> PowerPlan:
    """The plan for ``dialogues`` (default: the spec's) with the spec's power target unless one is given."""
    target = target or spec.power
    count = spec.dialogues if dialogues is None else dialogues
    if count < 1:
        raise UserError(f"dialogues must be at least 1 (value: {count})")
    try:
        shares = planned_effect(target.baseline, odds_ratio=target.odds_ratio, difference=target.difference)
    except ValueError as exc:
        raise UserError(f"power target: {exc}") from None
    groups = spec.demographics.groups()
    targeted_rules = sum(rule.targets_groups for rule in spec.rules)
    targeted = count * targeted_rules / len(spec.rules) if groups else 0.0
    people = _pool_counts(spec, pool) if pool is not None else None
    scopes = [(ALL, targeted)] + [(group_label(g), targeted / len(groups)) for g in groups]
    rows = [
        _row(spec, target, shares.h, test, scope, planned, people, person_icc)
        for test in (RED_TEAM, ANNOTATION)
        for scope, planned in scopes
    ]
    return PowerPlan(
        reference=shares.reference,
        other=shares.other,
        h=shares.h,
        alpha=target.alpha,
        power=target.power,
        icc=target.icc,
        person_icc=person_icc,
        dialogues=count,
        targeted=targeted,
        pool=people,
        rows=rows if targeted_rules and groups else [],
    )


def _sides(spec: CampaignSpec, test: str) -> tuple[float, float, int, str]:
    """Share of a scope's dialogues on each side, observations per dialogue, and who supplies them."""
    if test == RED_TEAM:
        share = spec.in_group_share
        return share, 1.0 - share, 1, Role.RED_TEAMER
    arms = spec.annotation_arms
    return arms.in_group + arms.both, arms.out_group + arms.both, spec.annotators_per_dialogue, Role.ANNOTATOR


def _row(
    spec: CampaignSpec,
    target: PowerTarget,
    h: float,
    test: str,
    scope: str,
    planned: float,
    people: dict[str, dict[str, int]] | None,
    person_icc: float,
) -> PowerRow:
    """Power at the planned size, and the size that reaches the target power (solved over dialogues)."""
    in_share, out_share, m, role = _sides(spec, test)
    staff = (people or {}).get(scope, {})
    counts = (staff[f"in-group {PEOPLE[role]}"], staff[f"out-group {PEOPLE[role]}"]) if people else None

    def effective(total: float) -> tuple[float, float, float, float]:
        sizes, deffs = [], []
        for side, share in enumerate((in_share, out_share)):
            n = total * share
            persons = counts[side] if counts is not None else None
            per_person = max(n * m / persons, 1.0) if persons else 1.0
            deff = design_effect(m, target.icc, per_person, person_icc)
            sizes.append(n * m / deff)
            deffs.append(deff)
        return sizes[0], sizes[1], deffs[0], deffs[1]

    def power_of(total: float) -> float:
        n_in, n_out = effective(total)[:2]
        return power_at(h, n_in, target.alpha, n_out / n_in) if n_in > 0 and n_out > 0 else 0.0

    note = ""
    if in_share == 0 or out_share == 0:
        note = f"no {'in' if in_share == 0 else 'out'}-group side in the design"
    elif counts is not None and not all(counts):
        side = "in" if not counts[0] else "out"
        note = f"no {side}-group {PEOPLE[role][:-1]} in the pool"
    planned_power = power_of(planned) if not note and planned > 0 else 0.0
    if note:
        needed = None
    elif counts is None or person_icc == 0:  # design effects do not grow with the campaign: closed form
        n_in, n_out = effective(1.0)[:2]
        independent = n_needed(h, target.alpha, target.power, n_out / n_in)
        needed = independent / n_in if math.isfinite(independent) else None
    else:
        needed = _solve(power_of, target.power)
    if not note and needed is None:
        note = "pool too small at any size"
    _, _, deff_in, deff_out = effective(max(planned, 1.0))
    return PowerRow(
        test=test,
        scope=scope,
        planned=planned,
        needed=needed,
        in_side=planned * in_share,
        out_side=planned * out_share,
        per_dialogue=m,
        design_effect_in=deff_in,
        design_effect_out=deff_out,
        power=planned_power,
        enough=needed is not None and planned >= needed - 1e-9,
        note=note,
    )


def _solve(power_of: Callable[[float], float], wanted: float) -> float | None:
    """The smallest number of dialogues at which ``power_of`` reaches ``wanted``; None if none does."""
    if power_of(MAX_UNITS) < wanted:
        return None
    return float(optimize.brentq(lambda t: power_of(t) - wanted, 1e-6, MAX_UNITS, xtol=1e-10, rtol=1e-14))


def _pool_counts(spec: CampaignSpec, pool: Sequence[Person]) -> dict[str, dict[str, int]]:
    """Per scope, how many people (not opted out) may be in-group or out-group red teamers and annotators."""
    groups = spec.demographics.groups()
    found: dict[str, dict[str, int]] = {}
    active = [p for p in pool if not p.opted_out]
    for scope, members in [(ALL, groups)] + [(group_label(g), [g]) for g in groups]:
        row = {}
        for role, noun in PEOPLE.items():
            able = [p for p in active if role in p.roles]
            for side, flag in (("in-group", True), ("out-group", False)):
                row[f"{side} {noun}"] = sum(
                    any(membership(p.demographics, g) is flag for g in members) for p in able
                )
        found[scope] = row
    return found
