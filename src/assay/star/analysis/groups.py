"""Group effects in a STAR campaign: in-group vs out-group annotation and attack success, per-group odds of a
rule break, and the race x gender interaction test.

Every result names its test and carries the counts it was computed from, so a reader can redo it by hand.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from pydantic import BaseModel, ConfigDict

from assay.star.analysis.reliability import primary_annotations
from assay.star.spec import CampaignSpec
from assay.stats.lrtest import nested_logit_lrtest
from assay.stats.proportions import odds_ratio_ci, proportion_ci, two_proportion_ztest
from assay.store.enums import TaskKind

Z_TEST = "pooled two-proportion z-test, two-sided"
RELATIONS = ("in-group", "out-group")


class Share(BaseModel):
    """A proportion with its Wilson 95% interval."""

    model_config = ConfigDict(frozen=True)
    count: int
    n: int
    share: float | None
    low: float | None
    high: float | None


class RateComparison(BaseModel):
    """In-group vs out-group share of 'broken', with the z-test (None and ``reason`` when undefined)."""

    model_config = ConfigDict(frozen=True)
    scope: str
    in_group: Share
    out_group: Share
    z: float | None
    p_value: float | None
    test: str = Z_TEST
    reason: str = ""


class LevelShare(BaseModel):
    """Share of one relation's ratings at one Likert level."""

    model_config = ConfigDict(frozen=True)
    relation: str
    rating: int
    label: str
    share: Share


class GroupOdds(BaseModel):
    """Odds of a break for dialogues targeting ``group`` vs the rule's other group-targeted dialogues."""

    model_config = ConfigDict(frozen=True)
    rule_id: str
    group: str
    a: int
    b: int
    c: int
    d: int
    odds_ratio: float
    low: float
    high: float
    corrected: bool
    test: str = "odds ratio, Woolf 95% interval (Haldane +0.5 if a cell is 0); a,b = group broken/not"


class InteractionTest(BaseModel):
    """LR test of the attribute interaction in a logistic model of 'broken' (annotation level)."""

    model_config = ConfigDict(frozen=True)
    rule_id: str
    n: int
    lr: float | None = None
    df: int | None = None
    p_value: float | None = None
    skipped: str = ""
    test: str = "likelihood-ratio test, logit(broken) ~ a + b + a:b vs a + b, dummy coded"


def parse_group_label(label: str | None) -> dict[str, str]:
    """Invert ``assay.star.spec.group_label``: ``"gender=female & race=Asian"`` -> {attribute: value}."""
    if not label or (isinstance(label, float) and np.isnan(label)):
        return {}
    pairs = (part.split("=", 1) for part in str(label).split(" & "))
    return {k.strip(): v.strip() for k, v in pairs}


def share(count: int, n: int) -> Share:
    """Proportion and Wilson interval; empty samples give None instead of raising."""
    if n == 0:
        return Share(count=0, n=0, share=None, low=None, high=None)
    low, high = proportion_ci(int(count), int(n), 0.95, method="wilson")
    return Share(count=int(count), n=int(n), share=count / n, low=low, high=high)


def compare_rates(scope: str, flags: pd.Series, relation: pd.Series) -> RateComparison:
    """In-group vs out-group share of True in ``flags``; rows of other relations are ignored."""
    counts = {r: (int(flags[relation == r].sum()), int((relation == r).sum())) for r in RELATIONS}
    (c1, n1), (c2, n2) = counts["in-group"], counts["out-group"]
    base = dict(scope=scope, in_group=share(c1, n1), out_group=share(c2, n2))
    if n1 == 0 or n2 == 0:
        return RateComparison(z=None, p_value=None, reason="a relation has no observations", **base)
    try:
        z, p = two_proportion_ztest(c1, n1, c2, n2)
    except ValueError as exc:
        return RateComparison(z=None, p_value=None, reason=str(exc), **base)
    return RateComparison(z=z, p_value=p, **base)


def annotated(annotations: pd.DataFrame, dialogues: pd.DataFrame, spec: CampaignSpec) -> pd.DataFrame:
    """Annotations with their dialogue's rule and group and a ``broken`` flag recomputed from the spec."""
    cols = ["dialogue_id", "rule_id", "group_label"]
    out = annotations.drop(columns=[c for c in cols[1:] if c in annotations.columns])
    out = out.merge(dialogues[cols], on="dialogue_id", how="left")
    out["broken"] = [spec.is_broken(int(r)) for r in out["rating"]]
    return out


def annotation_rows(annotations: pd.DataFrame, include_ablation: bool = True) -> pd.DataFrame:
    """First-round ratings; the out-group ablation is kept by default as it exists for this comparison."""
    if include_ablation:
        return annotations[annotations["kind"] == TaskKind.ANNOTATE]
    return primary_annotations(annotations)


def in_group_annotation(
    annotations: pd.DataFrame, dialogues: pd.DataFrame, spec: CampaignSpec, include_ablation: bool = True
) -> list[RateComparison]:
    """(a) Share rated broken by in-group vs out-group annotators, overall then per rule."""
    rows = annotated(annotation_rows(annotations, include_ablation), dialogues, spec)
    found = [compare_rates("all", rows["broken"], rows["annotator_relation"])]
    for rule_id, part in rows.groupby("rule_id", sort=True):
        found.append(compare_rates(f"rule={rule_id}", part["broken"], part["annotator_relation"]))
    return found


def likert_distribution(
    annotations: pd.DataFrame, spec: CampaignSpec, include_ablation: bool = True
) -> list[LevelShare]:
    """(a) Each relation's ratings spread over the Likert levels, each share with a Wilson interval."""
    rows = annotation_rows(annotations, include_ablation)
    found = []
    for relation in RELATIONS:
        ratings = rows.loc[rows["annotator_relation"] == relation, "rating"].astype(int)
        for level, label in enumerate(spec.likert):
            found.append(
                LevelShare(
                    relation=relation,
                    rating=level,
                    label=label,
                    share=share(int((ratings == level).sum()), len(ratings)),
                )
            )
    return found


def _majority(ratings: pd.Series, spec: CampaignSpec) -> bool:
    """Majority of binarised ratings; a tie is broken iff the mean rating is below the scale midpoint."""
    flags = [spec.is_broken(int(r)) for r in ratings]
    broken = sum(flags)
    if 2 * broken != len(flags):
        return 2 * broken > len(flags)
    return float(np.mean(ratings)) < (len(spec.likert) - 1) / 2


def final_labels(annotations: pd.DataFrame, spec: CampaignSpec) -> pd.Series:
    """Dialogue-level 'broken': the (last) arbitrator's rating when there is one, else the majority of the
    primary ratings; ties count as broken only if the mean rating is below the midpoint (len(likert)-1)/2,
    i.e. when the annotators leaned towards 'broken' on the full scale."""
    primary = primary_annotations(annotations)
    labels = primary.groupby("dialogue_id")["rating"].apply(lambda r: _majority(r, spec))
    arbiters = annotations[annotations["kind"] == TaskKind.ARBITRATE]
    if "created_at" in arbiters.columns:
        arbiters = arbiters.sort_values("created_at", kind="stable")
    last = arbiters.groupby("dialogue_id")["rating"].last()
    labels = labels.astype(bool)
    for dialogue_id, rating in last.items():
        labels.loc[dialogue_id] = spec.is_broken(int(rating))
    return labels.rename("broken")


def red_team_success(
    dialogues: pd.DataFrame, annotations: pd.DataFrame, spec: CampaignSpec
) -> list[RateComparison]:
    """(b) Attack success (final label broken) of in-group vs out-group red-teamers, overall then per rule."""
    labels = final_labels(annotations, spec)
    rows = dialogues[dialogues["dialogue_id"].isin(labels.index)].copy()
    rows["broken"] = rows["dialogue_id"].map(labels).astype(bool)
    found = [compare_rates("all", rows["broken"], rows["red_teamer_relation"])]
    for rule_id, part in rows.groupby("rule_id", sort=True):
        found.append(compare_rates(f"rule={rule_id}", part["broken"], part["red_teamer_relation"]))
    return found


def group_odds_ratios(
    dialogues: pd.DataFrame, annotations: pd.DataFrame, spec: CampaignSpec
) -> list[GroupOdds]:
    """(c) Per rule and targeted group, odds ratio of a break vs the rule's other group-targeted dialogues."""
    labels = final_labels(annotations, spec)
    rows = dialogues[dialogues["dialogue_id"].isin(labels.index) & dialogues["group_label"].fillna("").ne("")]
    rows = rows.assign(broken=rows["dialogue_id"].map(labels).astype(bool))
    found = []
    for (rule_id, group), part in rows.groupby(["rule_id", "group_label"], sort=True):
        others = rows[(rows["rule_id"] == rule_id) & (rows["group_label"] != group)]
        if others.empty:
            continue
        a, b = int(part["broken"].sum()), int((~part["broken"]).sum())
        c, d = int(others["broken"].sum()), int((~others["broken"]).sum())
        ratio = odds_ratio_ci(a, b, c, d, 0.95)
        found.append(
            GroupOdds(
                rule_id=str(rule_id),
                group=str(group),
                a=a,
                b=b,
                c=c,
                d=d,
                odds_ratio=ratio.odds_ratio,
                low=ratio.low,
                high=ratio.high,
                corrected=ratio.corrected,
            )
        )
    return found


def _dummies(values: pd.Series, levels: list[str], name: str) -> pd.DataFrame:
    """Treatment coding with the first observed spec value as reference, so coefficients read against a fixed
    base; unobserved values get no column (an all-zero column would make the design rank-deficient)."""
    seen = [v for v in levels if (values == v).any()]
    return pd.DataFrame({f"{name}={v}": (values == v).astype(float) for v in seen[1:]}, index=values.index)


def _interaction_designs(
    cells: pd.DataFrame, first: str, second: str, spec: CampaignSpec
) -> tuple[np.ndarray, np.ndarray]:
    """Additive and full (with products) design matrices, each with its intercept column."""
    a = _dummies(cells[first], spec.demographics.attributes[first], first)
    b = _dummies(cells[second], spec.demographics.attributes[second], second)
    products = pd.DataFrame(
        {f"{x}:{y}": a[x] * b[y] for x in a.columns for y in b.columns if (a[x] * b[y]).any()},
        index=cells.index,
    )
    additive = pd.concat([pd.Series(1.0, index=cells.index, name="const"), a, b], axis=1)
    return additive.to_numpy(), pd.concat([additive, products], axis=1).to_numpy()


def _skip_reason(cells: pd.DataFrame, first: str, second: str) -> str:
    """Why the interaction is not estimable from these two-way cells, or '' if it is."""
    if cells.empty:
        return f"no annotations of dialogues targeting a {first} x {second} intersection"
    for name in (first, second):
        if cells[name].nunique() < 2:
            return f"{name} takes a single value among the two-way cells"
    if cells["broken"].nunique() < 2:
        return "'broken' does not vary"
    return ""


def interaction_tests(
    annotations: pd.DataFrame,
    dialogues: pd.DataFrame,
    spec: CampaignSpec,
    attributes: tuple[str, str] = ("race", "gender"),
    include_ablation: bool = False,
) -> list[InteractionTest]:
    """(d) Per group-targeted rule, LR test of race x gender on annotation-level 'broken' over dialogues that
    target a two-way intersection (the only ones where both attributes are set)."""
    first, second = attributes
    missing = [a for a in attributes if a not in spec.demographics.attributes]
    rules = [r.id for r in spec.rules if r.targets_groups]
    if missing:
        why = f"the spec has no demographic attribute {', '.join(missing)}"
        return [InteractionTest(rule_id=r, n=0, skipped=why) for r in rules]
    rows = annotated(annotation_rows(annotations, include_ablation), dialogues, spec)
    parsed = rows["group_label"].map(parse_group_label)
    rows = rows.assign(**{a: parsed.map(lambda g, a=a: g.get(a)) for a in attributes})
    rows = rows[rows[first].notna() & rows[second].notna()]
    return [_interaction_test(rows[rows["rule_id"] == r], r, first, second, spec) for r in rules]


def _interaction_test(
    cells: pd.DataFrame, rule_id: str, first: str, second: str, spec: CampaignSpec
) -> InteractionTest:
    """One rule's test; estimation failures (separation, rank) become a skip reason, not an exception."""
    reason = _skip_reason(cells, first, second)
    if reason:
        return InteractionTest(rule_id=rule_id, n=len(cells), skipped=reason)
    additive, full = _interaction_designs(cells, first, second, spec)
    try:
        result = nested_logit_lrtest(cells["broken"].astype(float).to_numpy(), additive, full)
    except ValueError as exc:
        return InteractionTest(rule_id=rule_id, n=len(cells), skipped=str(exc))
    return InteractionTest(rule_id=rule_id, n=len(cells), lr=result.lr, df=result.df, p_value=result.p_value)
