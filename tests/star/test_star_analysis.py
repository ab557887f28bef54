"""assay.star.analysis on synthetic campaigns: planted effects are found, nulls reject at their nominal
rate, the reliability reshaping reproduces Krippendorff's textbook example, and coverage names planted
shortfalls."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from assay.star.analysis import (
    arbitration_summary,
    coverage,
    evenness,
    final_labels,
    group_odds_ratios,
    in_group_annotation,
    interaction_tests,
    likert_distribution,
    parse_group_label,
    red_team_success,
    reliability,
    reliability_matrix,
)
from assay.star.spec import CampaignSpec, Demographics, PolicyRule, group_label

RACES = ["Asian", "Black"]
GENDERS = ["female", "male"]


@pytest.fixture(scope="module")
def spec() -> CampaignSpec:
    return CampaignSpec(
        name="synthetic",
        rules=[
            PolicyRule(id="hate", text="No hate.", area="harm", targets_groups=True),
            PolicyRule(id="medical", text="No diagnosis.", area="advice"),
        ],
        demographics=Demographics(attributes={"race": RACES, "gender": GENDERS}),
        templates={"plain": "Break {{ rule }}."},
    )


def _ratings(rng: np.random.Generator, broken: np.ndarray) -> np.ndarray:
    """A 4-point rating consistent with the broken flag (0/1 broken, 2/3 not, spec.broken_levels = 2)."""
    return np.where(broken, rng.integers(0, 2, broken.size), rng.integers(2, 4, broken.size))


def _annotation(dialogue_id: int, rating: int, relation: str = "none", kind: str = "annotate") -> dict:
    return {
        "annotation_id": None,
        "dialogue_id": dialogue_id,
        "annotator": "p",
        "annotator_relation": relation,
        "kind": kind,
        "ablation": False,
        "rating": int(rating),
    }


def _relation_campaign(rng: np.random.Generator, p_in: float, p_out: float, n: int = 800):
    """n in-group and n out-group annotations, one per dialogue, split over two rules."""
    relation = np.repeat(["in-group", "out-group"], n)
    broken = rng.random(2 * n) < np.where(relation == "in-group", p_in, p_out)
    ratings = _ratings(rng, broken)
    annotations = pd.DataFrame(
        [_annotation(i, r, rel) for i, (r, rel) in enumerate(zip(ratings, relation, strict=True))]
    )
    annotations["annotation_id"] = range(len(annotations))
    dialogues = pd.DataFrame(
        {
            "dialogue_id": range(2 * n),
            "rule_id": np.where(np.arange(2 * n) % 2 == 0, "hate", "medical"),
            "group_label": "",
            "red_teamer_relation": relation,
        }
    )
    return annotations, dialogues


def test_planted_in_group_effect_is_detected(spec: CampaignSpec) -> None:
    annotations, dialogues = _relation_campaign(np.random.default_rng(1), 0.45, 0.30)
    overall, *per_rule = in_group_annotation(annotations, dialogues, spec)
    assert overall.scope == "all" and overall.in_group.n == overall.out_group.n == 800
    assert overall.p_value < 0.01 and overall.statistic > 0 and overall.naive_z > 0
    assert overall.naive_p < 0.01 and "cluster-robust" in overall.method
    assert abs(overall.in_group.share - 0.45) < 0.05 and abs(overall.out_group.share - 0.30) < 0.05
    assert [c.scope for c in per_rule] == ["rule=hate", "rule=medical"]
    levels = likert_distribution(annotations, spec)
    assert len(levels) == 2 * len(spec.likert)
    in_broken = sum(s.share.count for s in levels if s.relation == "in-group" and s.rating < 2)
    assert in_broken == overall.in_group.count
    assert all(s.share.low <= s.share.share <= s.share.high for s in levels)
    # One rating per dialogue, no arbitration: the final label is that rating, so (b) sees the same effect.
    success = red_team_success(dialogues, annotations, spec)[0]
    assert success.in_group.count == overall.in_group.count and success.p_value < 0.01


@pytest.mark.slow
def test_null_rejects_at_nominal_rate(spec: CampaignSpec) -> None:
    rng = np.random.default_rng(2)
    reps, level = 100, 0.05
    rejections = 0
    for _ in range(reps):
        annotations, dialogues = _relation_campaign(rng, 0.35, 0.35)
        rejections += in_group_annotation(annotations, dialogues, spec)[0].p_value < level
    # Observed with seed 2: 3 rejections out of 100 (3%) at level 0.05; the 99.9% binomial band is [0, 13].
    low, high = stats.binom.ppf([0.0005, 0.9995], reps, level)
    assert low <= rejections <= high


def _intersection_campaign(rng: np.random.Generator, n_dialogues: int = 1600):
    """Rule 'hate' on race x gender cells with a planted interaction: only Black men are at high risk."""
    risk = {
        ("Asian", "female"): 0.2,
        ("Asian", "male"): 0.3,
        ("Black", "female"): 0.3,
        ("Black", "male"): 0.7,
    }
    cells = [(r, g) for r in RACES for g in GENDERS]
    picks = rng.integers(0, len(cells), n_dialogues)
    labels = [group_label({"race": cells[k][0], "gender": cells[k][1]}) for k in picks]
    dialogues = pd.DataFrame(
        {
            "dialogue_id": range(n_dialogues),
            "rule_id": "hate",
            "group_label": labels,
            "red_teamer_relation": "none",
        }
    )
    extra = pd.DataFrame(  # single-attribute targets: ignored by the interaction test, kept for odds ratios
        {"dialogue_id": range(n_dialogues, n_dialogues + 100), "rule_id": "hate", "group_label": "race=Asian"}
    )
    dialogues = pd.concat([dialogues, extra.assign(red_teamer_relation="none")], ignore_index=True)
    p = np.array([risk[cells[k]] for k in picks] + [0.25] * 100)
    rows = []
    for _ in range(2):  # two independent annotators per dialogue
        ratings = _ratings(rng, rng.random(p.size) < p)
        rows += [_annotation(int(d), r) for d, r in zip(dialogues["dialogue_id"], ratings, strict=True)]
    annotations = pd.DataFrame(rows)
    annotations["annotation_id"] = range(len(annotations))
    return annotations, dialogues


def test_planted_interaction_and_high_risk_group(spec: CampaignSpec) -> None:
    annotations, dialogues = _intersection_campaign(np.random.default_rng(3))
    tests = interaction_tests(annotations, dialogues, spec)
    assert [t.rule_id for t in tests] == ["hate"]
    assert tests[0].n == 3200 and tests[0].df == 1 and tests[0].p_value < 0.01, tests[0]
    odds = {o.group: o for o in group_odds_ratios(dialogues, annotations, spec)}
    high = odds["gender=male & race=Black"]
    assert high.odds_ratio > 1 and high.low > 1
    assert high.a + high.b + high.c + high.d == len(dialogues)


def test_interaction_skipped_with_reason(spec: CampaignSpec) -> None:
    annotations, dialogues = _intersection_campaign(np.random.default_rng(4), 200)
    only_asian = dialogues[dialogues["group_label"].str.contains("Asian")]
    kept = annotations[annotations["dialogue_id"].isin(only_asian["dialogue_id"])]
    (test,) = interaction_tests(kept, only_asian, spec)
    assert test.p_value is None and "race takes a single value" in test.skipped
    (test,) = interaction_tests(annotations, dialogues, spec, attributes=("race", "age"))
    assert "no demographic attribute age" in test.skipped


def _paired(a: list[int], b: list[int]) -> pd.DataFrame:
    """Two primary annotations per dialogue, coder A first."""
    rows = [_annotation(d, r) for d, r in enumerate(a)] + [_annotation(d, r) for d, r in enumerate(b)]
    frame = pd.DataFrame(rows)
    frame["annotation_id"] = range(len(frame))
    return frame


def _dialogues(n: int) -> pd.DataFrame:
    rule = ["hate" if i % 2 else "medical" for i in range(n)]
    return pd.DataFrame(
        {"dialogue_id": range(n), "rule_id": rule, "group_label": "", "red_teamer_relation": "none"}
    )


def test_perfect_agreement_gives_alpha_one(spec: CampaignSpec) -> None:
    ratings = [0, 1, 2, 3, 0, 3, 1, 2, 0, 3, 2, 1]
    report = reliability(_paired(ratings, ratings), _dialogues(len(ratings)), spec, n_boot=200)
    assert report.ordinal.alpha == pytest.approx(1.0) and report.nominal.alpha == pytest.approx(1.0)
    assert report.ordinal.n_units == 12 and report.ordinal.n_ratings == 24
    assert set(report.by_area) == {"harm", "advice"}
    assert all(a.agreement == 1.0 for a in report.percent_agreement)


def test_krippendorff_binary_example_after_reshaping(spec: CampaignSpec) -> None:
    coder_a = [0, 1, 0, 0, 0, 0, 0, 0, 1, 0]
    coder_b = [1, 1, 1, 0, 0, 1, 0, 0, 0, 0]
    to_rating = {1: 0, 0: 3}  # 1 = broken = "definitely broken"
    table = _paired([to_rating[v] for v in coder_a], [to_rating[v] for v in coder_b])
    table = table.sample(frac=1.0, random_state=0)  # row order must not matter, only annotation_id order
    matrix = reliability_matrix(table)
    assert matrix.shape == (2, 10)
    report = reliability(table, _dialogues(10), spec, n_boot=200)
    assert report.nominal.alpha == pytest.approx(0.095, abs=5e-4)
    assert report.nominal.n_units == 10 and report.nominal.low <= report.nominal.alpha <= report.nominal.high


def test_arbitration_rate_sides_and_final_labels(spec: CampaignSpec) -> None:
    rows = [
        *(_annotation(1, r) for r in (0, 3)),
        _annotation(1, 0, kind="arbitrate"),  # sides with the more-broken rating
        *(_annotation(2, r) for r in (1, 3)),
        _annotation(2, 3, kind="arbitrate"),  # less broken
        *(_annotation(3, r) for r in (0, 3)),
        _annotation(3, 2, kind="arbitrate"),  # in between
        *(_annotation(4, r) for r in (2, 2)),  # agreed: no arbitration
        *(_annotation(5, r) for r in (1, 2)),  # tie, mean 1.5 is not below the midpoint 1.5: not broken
        *(_annotation(6, r) for r in (0, 2)),  # tie, mean 1.0 < 1.5: broken; two apart: sent, still waiting
        _annotation(7, 0),  # incomplete: not in the denominator
    ]
    table = pd.DataFrame(rows).assign(annotation_id=range(len(rows)))
    arb = arbitration_summary(table, spec)
    assert (arb.n_complete, arb.n_sent, arb.n_arbitrated, arb.n_waiting) == (6, 4, 3, 1)
    assert arb.rate == pytest.approx(4 / 6)  # the waiting one counts: it was sent
    assert (arb.more_broken, arb.less_broken, arb.neither) == (1, 1, 1)
    labels = final_labels(table, spec)
    assert labels.to_dict() == {1: True, 2: False, 3: False, 4: False, 5: False, 6: True, 7: True}


def _design(spec: CampaignSpec) -> pd.DataFrame:
    """Two instructions per (rule, parameter value, target): uniform over every dimension."""
    rows = []
    targets = [group_label(g) for g in spec.demographics.groups()]
    for rule in ("hate", "medical"):
        for adv in ("low", "medium", "high"):
            for target in targets if rule == "hate" else [""]:
                rows += [{"rule_id": rule, "group_label": target, "parameters": {"adversariality": adv}}] * 2
    frame = pd.DataFrame(rows)
    frame["id"] = [f"i{k}" for k in range(len(frame))]
    return frame


def test_coverage_complete_design(spec: CampaignSpec) -> None:
    instructions = _design(spec)
    dialogues = instructions.rename(columns={"id": "instruction_id"}).drop(columns=["parameters"])
    dialogues["dialogue_id"] = range(len(dialogues))
    tables = {t.dimension: t for t in coverage(instructions, dialogues)}
    assert set(tables) == {"rule", "parameter:adversariality", "group", "intersection"}
    for name in ("parameter:adversariality", "group", "intersection"):
        assert tables[name].evenness == pytest.approx(1.0)
        assert tables[name].p_value == pytest.approx(1.0) and tables[name].biggest_shortfall == []
    assert tables["rule"].p_value == pytest.approx(1.0)


def test_coverage_names_planted_shortfall(spec: CampaignSpec) -> None:
    instructions = _design(spec)
    dialogues = instructions.rename(columns={"id": "instruction_id"}).drop(columns=["parameters"])
    short = "gender=female & race=Black"
    dialogues = dialogues[(dialogues["group_label"] != short) | (np.arange(len(dialogues)) % 6 == 0)]
    dialogues = dialogues.assign(dialogue_id=range(len(dialogues)))
    tables = {t.dimension: t for t in coverage(instructions, dialogues)}
    assert tables["intersection"].biggest_shortfall[0] == short
    assert tables["intersection"].evenness < 1


def test_helpers() -> None:
    assert parse_group_label("gender=female & race=Asian") == {"gender": "female", "race": "Asian"}
    assert parse_group_label("") == {} and parse_group_label(None) == {}
    assert evenness(np.array([5, 5, 5])) == pytest.approx(1.0) and evenness(np.array([3])) is None
    assert evenness(np.array([10, 0])) == pytest.approx(0.0)
