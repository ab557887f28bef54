"""The seed paper's own tests, offered next to the default ones so a campaign can be compared with it:
Welch t-tests of in-group vs out-group means and analyses of variance of the Likert rating across targeted
groups (one-way) and over race x gender (two-way, type II sums of squares).

Like the paper, these treat every rating as an independent unit; the report labels them so. The default
tests in ``groups.py`` respect clustering and should be preferred for conclusions.
"""

from __future__ import annotations

import pandas as pd
from pydantic import BaseModel, ConfigDict
from scipy import stats

from assay.star.analysis.groups import (
    MEASURES,
    RELATIONS,
    annotated,
    annotation_rows,
    dialogue_outcomes,
    parse_group_label,
)
from assay.star.analysis.inference import DEFAULT_MIN_N, not_enough_data
from assay.star.spec import CampaignSpec

NAIVE = "every rating an independent unit, as in the paper"
T_TEST = f"Welch two-sample t-test (unequal variances), two-sided; {NAIVE}"
ONE_WAY = f"one-way ANOVA of the Likert rating (0 = most broken) across targeted groups; {NAIVE}"
TWO_WAY = f"two-way ANOVA of the Likert rating (0 = most broken), type II sums of squares; {NAIVE}"


class MeanTest(BaseModel):
    """In-group vs out-group means of ``outcome`` with Welch's t-test (None with ``reason`` when not run)."""

    model_config = ConfigDict(frozen=True)
    scope: str
    outcome: str
    in_mean: float | None
    in_n: int
    out_mean: float | None
    out_n: int
    t: float | None = None
    df: float | None = None
    p_value: float | None = None
    reason: str = ""
    test: str = T_TEST


class AnovaTerm(BaseModel):
    """One F test of an analysis of variance (None with ``reason`` when not run)."""

    model_config = ConfigDict(frozen=True)
    rule_id: str
    term: str
    n: int
    f: float | None = None
    df_num: float | None = None
    df_den: float | None = None
    p_value: float | None = None
    levels: str = ""
    reason: str = ""
    test: str = TWO_WAY


def welch(
    scope: str, outcome: str, inside: pd.Series, outside: pd.Series, units: tuple[int, int], min_n: int
) -> MeanTest:
    """Welch's t-test of two samples; ``units`` are their dialogue counts, which min_n applies to."""
    base = dict(
        scope=scope,
        outcome=outcome,
        in_mean=float(inside.mean()) if len(inside) else None,
        in_n=len(inside),
        out_mean=float(outside.mean()) if len(outside) else None,
        out_n=len(outside),
    )
    if min(units) < min_n:
        return MeanTest(
            reason=not_enough_data(min(units), f"fewer than {min_n} dialogues on one side"), **base
        )
    if inside.nunique() < 2 and outside.nunique() < 2:
        detail = "no variation within either group, so the t statistic is undefined"
        return MeanTest(reason=not_enough_data(sum(units), detail), **base)
    result = stats.ttest_ind(inside.astype(float), outside.astype(float), equal_var=False)
    return MeanTest(t=float(result.statistic), df=float(result.df), p_value=float(result.pvalue), **base)


def _scopes(rows: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    return [("all", rows), *((f"rule={r}", part) for r, part in rows.groupby("rule_id", sort=True))]


def _split(rows: pd.DataFrame, column: str, value: str) -> tuple[pd.Series, pd.Series, tuple[int, int]]:
    inside, outside = rows[rows[column] == "in-group"], rows[rows[column] == "out-group"]
    units = (int(inside["dialogue_id"].nunique()), int(outside["dialogue_id"].nunique()))
    return inside[value], outside[value], units


def t_tests(
    annotations: pd.DataFrame, dialogues: pd.DataFrame, spec: CampaignSpec, min_n: int = DEFAULT_MIN_N
) -> list[MeanTest]:
    """Mean Likert rating of in-group vs out-group annotators, and the share of dialogues broken (targeted
    and any rule) for in-group vs out-group red teamers; overall, then per rule."""
    found = []
    ratings = annotated(annotation_rows(annotations), dialogues, spec)
    ratings = ratings[ratings["annotator_relation"].isin(RELATIONS)]
    for scope, part in _scopes(ratings):
        inside, outside, units = _split(part, "annotator_relation", "rating")
        found.append(welch(scope, "mean Likert rating, annotators", inside, outside, units, min_n))
    for measure in MEASURES:
        rows = dialogue_outcomes(dialogues, annotations, spec, measure)
        rows = rows[rows["red_teamer_relation"].isin(RELATIONS)].assign(
            broken=lambda r: r["broken"].astype(float)
        )
        for scope, part in _scopes(rows):
            inside, outside, units = _split(part, "red_teamer_relation", "broken")
            found.append(
                welch(scope, f"share broken ({measure} rule), red teamers", inside, outside, units, min_n)
            )
    return found


def _group_ratings(annotations: pd.DataFrame, dialogues: pd.DataFrame, spec: CampaignSpec) -> pd.DataFrame:
    rows = annotated(annotation_rows(annotations, include_ablation=False), dialogues, spec)
    return rows[rows["group_label"].fillna("").ne("")]


def one_way_anova(
    annotations: pd.DataFrame, dialogues: pd.DataFrame, spec: CampaignSpec, min_n: int = DEFAULT_MIN_N
) -> list[AnovaTerm]:
    """Per group-targeted rule, does the mean rating differ across targeted groups? (``scipy.stats.f_oneway``
    over groups with at least min_n dialogues)."""
    rows = _group_ratings(annotations, dialogues, spec)
    found = []
    for rule in (r for r in spec.rules if r.targets_groups):
        part = rows[rows["rule_id"] == rule.id]
        sizes = part.groupby("group_label")["dialogue_id"].nunique()
        kept = [
            part.loc[part["group_label"] == g, "rating"].astype(float) for g in sizes[sizes >= min_n].index
        ]
        base = dict(rule_id=rule.id, term="targeted group", n=int(sum(len(k) for k in kept)), test=ONE_WAY)
        if len(kept) < 2:
            detail = f"fewer than 2 targeted groups with {min_n} or more dialogues"
            found.append(
                AnovaTerm(reason=not_enough_data(int(part["dialogue_id"].nunique()), detail), **base)
            )
            continue
        if pd.concat(kept).nunique() < 2:
            detail = "every rating is the same, so F is undefined"
            found.append(
                AnovaTerm(reason=not_enough_data(int(part["dialogue_id"].nunique()), detail), **base)
            )
            continue
        result = stats.f_oneway(*kept)
        df_den = float(base["n"] - len(kept))
        found.append(
            AnovaTerm(
                f=float(result.statistic),
                df_num=len(kept) - 1.0,
                df_den=df_den,
                p_value=float(result.pvalue),
                **base,
            )
        )
    return found


def two_way_anova(
    annotations: pd.DataFrame,
    dialogues: pd.DataFrame,
    spec: CampaignSpec,
    attributes: tuple[str, str] = ("race", "gender"),
    min_n: int = DEFAULT_MIN_N,
) -> list[AnovaTerm]:
    """Per group-targeted rule, ``rating ~ C(a) * C(b)`` over dialogues targeting a two-way intersection
    (cells with at least min_n dialogues), F tests of both main effects and the interaction (statsmodels
    ``anova_lm``, type II)."""
    first, second = attributes
    rules = [r.id for r in spec.rules if r.targets_groups]
    if any(a not in spec.demographics.attributes for a in attributes):
        return [
            AnovaTerm(rule_id=r, term=f"{first}:{second}", n=0, reason="the spec lacks an attribute")
            for r in rules
        ]
    rows = _group_ratings(annotations, dialogues, spec)
    parsed = rows["group_label"].map(parse_group_label)
    rows = rows.assign(a=parsed.map(lambda g: g.get(first)), b=parsed.map(lambda g: g.get(second)))
    rows = rows[rows["a"].notna() & rows["b"].notna()]
    return [t for r in rules for t in _two_way(rows[rows["rule_id"] == r], r, first, second, min_n)]


def complete_grid(sizes: pd.Series, min_n: int) -> pd.Series:
    """The largest complete a x b grid of cells with at least min_n dialogues, found greedily by dropping the
    level with the fewest such cells: anova_lm's type II tests assume every combination is present (with a
    missing cell its degrees of freedom are wrong)."""
    big = sizes[sizes >= min_n]
    if big.empty:
        return big
    grid = big.unstack()
    while grid.size and grid.isna().any().any():
        rows, cols = grid.notna().sum(axis=1), grid.notna().sum(axis=0)
        if rows.min() <= cols.min():
            grid = grid.drop(index=rows.idxmin())
        else:
            grid = grid.drop(columns=cols.idxmin())
    return grid.stack()


def _two_way(part: pd.DataFrame, rule_id: str, first: str, second: str, min_n: int) -> list[AnovaTerm]:
    from statsmodels.formula.api import ols
    from statsmodels.stats.anova import anova_lm

    grid = complete_grid(part.groupby(["a", "b"])["dialogue_id"].nunique(), min_n)
    kept = part[part.set_index(["a", "b"]).index.isin(grid.index)]
    names = {"C(a)": first, "C(b)": second, "C(a):C(b)": f"{first}:{second}"}
    levels = (
        f"{first}: {', '.join(sorted(kept['a'].unique()))}; {second}: {', '.join(sorted(kept['b'].unique()))}"
    )
    base = dict(rule_id=rule_id, n=len(kept), levels=levels if len(kept) else "")
    if kept.empty or kept["a"].nunique() < 2 or kept["b"].nunique() < 2 or len(kept) <= len(grid):
        detail = f"no complete {first} x {second} grid of 2 x 2 or more cells with {min_n} or more dialogues"
        reason = not_enough_data(int(part["dialogue_id"].nunique()), detail)
        return [AnovaTerm(term=t, reason=reason, **base) for t in names.values()]
    data = kept.assign(rating=kept["rating"].astype(float))
    if data["rating"].nunique() < 2:
        reason = not_enough_data(
            int(kept["dialogue_id"].nunique()), "every rating is the same, so F is undefined"
        )
        return [AnovaTerm(term=t, reason=reason, **base) for t in names.values()]
    table = anova_lm(ols("rating ~ C(a) * C(b)", data).fit(), typ=2)
    df_den = float(table.loc["Residual", "df"])
    return [
        AnovaTerm(
            term=term,
            f=float(table.loc[key, "F"]),
            df_num=float(table.loc[key, "df"]),
            df_den=df_den,
            p_value=float(table.loc[key, "PR(>F)"]),
            **base,
        )
        for key, term in names.items()
    ]


def paper_tests(
    annotations: pd.DataFrame,
    dialogues: pd.DataFrame,
    spec: CampaignSpec,
    attributes: tuple[str, str] = ("race", "gender"),
    min_n: int = DEFAULT_MIN_N,
) -> dict[str, list[BaseModel]]:
    """All of the paper's tests, by family."""
    return {
        "t_tests": list(t_tests(annotations, dialogues, spec, min_n)),
        "anova": [
            *one_way_anova(annotations, dialogues, spec, min_n),
            *two_way_anova(annotations, dialogues, spec, attributes, min_n),
        ],
    }
