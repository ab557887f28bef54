"""STAR's default group tests on realistic data: correlated ratings (planted Krippendorff alpha about .5 from
dialogue random effects, plus annotator and red-teamer effects), a 60-dialogue pilot, and the paper's campaign
size (8,360 dialogues, 225 red teamers, 286 annotators, annotation arms 59/24/17). Each default test is
checked against statsmodels on the same rows; its null rejection rate is measured next to the naive test's."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import statsmodels.api as sm
from scipy import stats
from scipy.special import expit
from tests.star.test_star_report import EXAMPLE, SCRIPTED

from assay.cli import main
from assay.star.analysis import groups
from assay.star.analysis.inference import MIN_CLUSTERS
from assay.star.analysis.reliability import reliability_matrix
from assay.star.spec import CampaignSpec, Demographics, PolicyRule, group_label
from assay.stats.agreement import krippendorff_alpha
from assay.stats.clustered import cluster_robust_cov, design_effects, rao_scott_lrtest
from assay.stats.firth import firth_lrtest

RACES = ["Asian", "Black"]
GENDERS = ["female", "male"]
CELLS = [(r, g) for r in RACES for g in GENDERS]
# Each rating's relation by annotation arm (in-group only, out-group only, both) and position in its dialogue.
ARM_RELATIONS = np.array([["in-group"] * 3, ["out-group"] * 3, ["in-group", "out-group", "out-group"]])
SD_DIALOGUE = 2.4  # logit-scale dialogue effect; with the red teamers' it gives binary alpha .53


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


def campaign(
    rng: np.random.Generator,
    n_dialogues: int,
    n_annotators: int = 40,
    n_red_teamers: int = 30,
    annotation_effect: float = 0.0,
    success_effect: float = 0.0,
    interaction: float = 0.0,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Dialogues (half 'hate' on a race x gender target, half 'medical') rated 2 or 3 times under the paper's
    arms. Latent logit: -0.6 + dialogue effect (sd 2.4) + red teamer (sd 1.5) + annotator (sd 0.3), plus the
    planted effects: in-group annotators, in-group red teamers, Black men targeted. Red teamers lean in-group
    or out-group (80/20), so their effects are confounded with relation unless clustered."""
    rule = np.where(rng.random(n_dialogues) < 0.5, "hate", "medical")
    cell = rng.integers(0, len(CELLS), n_dialogues)
    labels = [
        group_label({"race": CELLS[c][0], "gender": CELLS[c][1]}) if r == "hate" else ""
        for c, r in zip(cell, rule, strict=True)
    ]
    black_men = (rule == "hate") & (cell == CELLS.index(("Black", "male")))
    red_teamer = rng.integers(0, n_red_teamers, n_dialogues)
    leaning = np.where(rng.random(n_red_teamers) < 0.5, 0.2, 0.8)[red_teamer]
    red_in = rng.random(n_dialogues) < leaning
    latent = (
        -0.6
        + rng.normal(0, SD_DIALOGUE, n_dialogues)
        + rng.normal(0, 1.5, n_red_teamers)[red_teamer]
        + interaction * black_men
        + success_effect * red_in
    )
    size = np.where(rng.random(n_dialogues) < 0.3, 3, 2)
    arm = rng.choice(3, n_dialogues, p=[0.59, 0.24, 0.17])
    people = np.argsort(rng.random((n_dialogues, n_annotators)), axis=1)[:, :3]
    used = np.arange(3)[np.newaxis, :] < size[:, np.newaxis]
    dialogue = np.broadcast_to(np.arange(n_dialogues)[:, np.newaxis], (n_dialogues, 3))[used]
    relation = ARM_RELATIONS[arm][used]
    annotator = people[used]
    eta = latent[dialogue] + rng.normal(0, 0.3, n_annotators)[annotator]
    broken = rng.random(dialogue.size) < expit(eta + annotation_effect * (relation == "in-group"))
    annotations = pd.DataFrame(
        {
            "annotation_id": np.arange(dialogue.size),
            "dialogue_id": dialogue,
            "annotator": [f"a{k}" for k in annotator],
            "annotator_relation": relation,
            "kind": "annotate",
            "ablation": False,
            "rating": np.where(broken, rng.integers(0, 2, dialogue.size), rng.integers(2, 4, dialogue.size)),
        }
    )
    dialogues = pd.DataFrame(
        {
            "dialogue_id": np.arange(n_dialogues),
            "rule_id": rule,
            "group_label": labels,
            "red_teamer": [f"r{k}" for k in red_teamer],
            "red_teamer_relation": np.where(red_in, "in-group", "out-group"),
            "pre_annotation": [{"other_rules_broken": []} for _ in range(n_dialogues)],
        }
    )
    return annotations, dialogues


def _binary_alpha(annotations: pd.DataFrame) -> float:
    flags = annotations.assign(b=(annotations["rating"] < 2).astype(float))
    return krippendorff_alpha(reliability_matrix(flags, "b"), "nominal")


@pytest.mark.slow
def test_clustered_null_rejects_at_nominal_rate(spec: CampaignSpec) -> None:
    """200 null campaigns of 150 dialogues (about 375 ratings, 40 annotators, 30 red teamers), level 0.05.
    Each default test must reject within the binomial(200, 0.05) 99.9% band, 2 to 21 times. Observed with
    seed 11: annotation 7/200 (3.5%), red-team success 14/200 (7.0%), interaction 13/200 (6.5%); the naive
    tests on the same data: 16/200 (8.0%), 17/200 (8.5%) and 25/200 (12.5%). With 400 campaigns (seed 21):
    default 5.75%, 5.75%, 6.0%; naive 11.75%, 7.75%, 15.25%."""
    rng = np.random.default_rng(11)
    reps, level = 200, 0.05
    alpha = _binary_alpha(campaign(np.random.default_rng(0), 3000)[0])
    assert 0.45 < alpha < 0.57, alpha
    rejections = {k: 0 for k in ("annotation", "success", "interaction")}
    naive = dict(rejections)
    for _ in range(reps):
        annotations, dialogues = campaign(rng, 150)
        rows = groups.annotated(annotations, dialogues, spec)
        results = {
            "annotation": groups.compare_rates("all", rows, "annotator_relation", "annotator"),
            "success": groups.compare_rates(
                "all",
                groups.dialogue_outcomes(dialogues, annotations, spec),
                "red_teamer_relation",
                "red_teamer",
            ),
        }
        (interaction,) = groups.interaction_tests(annotations, dialogues, spec)
        for name, result in results.items():
            rejections[name] += result.p_value < level
            naive[name] += result.naive_p < level
        rejections["interaction"] += interaction.p_value < level
        naive["interaction"] += interaction.naive_p < level
    low, high = stats.binom.ppf([0.0005, 0.9995], reps, level)
    print(f"rejections of {reps}: default {rejections}, naive {naive}")
    assert all(low <= count <= high for count in rejections.values()), rejections
    assert naive["annotation"] > rejections["annotation"] and naive["interaction"] > rejections["interaction"]


@pytest.mark.slow
def test_planted_effects_found_at_the_papers_campaign_size(spec: CampaignSpec) -> None:
    annotations, dialogues = campaign(
        np.random.default_rng(5),
        8360,
        n_annotators=286,
        n_red_teamers=225,
        annotation_effect=0.9,
        success_effect=0.8,
        interaction=1.5,
    )
    annotation = groups.in_group_annotation(annotations, dialogues, spec)[0]
    assert annotation.p_value < 0.01 and annotation.difference > 0.05, annotation
    assert "annotator (286)" in annotation.method
    success = groups.red_team_success(dialogues, annotations, spec)[0]
    assert success.p_value < 0.01 and success.difference > 0, success
    assert "red teamer (225)" in success.method
    (interaction,) = groups.interaction_tests(annotations, dialogues, spec)
    assert interaction.p_value < 0.01 and interaction.design_effect > 1, interaction


def test_default_tests_equal_statsmodels_on_the_same_rows(spec: CampaignSpec) -> None:
    annotations, dialogues = campaign(np.random.default_rng(2), 150)
    result = groups.in_group_annotation(annotations, dialogues, spec)[0]
    rows = annotations.merge(dialogues[["dialogue_id", "rule_id"]], on="dialogue_id")
    y = (rows["rating"] < 2).astype(float)
    inside = (rows["annotator_relation"] == "in-group").astype(float)
    clusters = np.column_stack([rows["dialogue_id"], rows["annotator"].str[1:].astype(int)])
    assert rows["annotator"].nunique() >= MIN_CLUSTERS
    fit = sm.OLS(y, sm.add_constant(inside)).fit(
        cov_type="cluster", cov_kwds={"groups": clusters}, use_t=True
    )
    assert result.difference == pytest.approx(fit.params.iloc[1], abs=1e-12)
    assert result.statistic == pytest.approx(fit.tvalues.iloc[1], rel=1e-9)
    assert result.p_value == pytest.approx(fit.pvalues.iloc[1], rel=1e-9)
    assert result.naive_p == pytest.approx(
        sm.stats.proportions_ztest(
            [int(y[inside == 1].sum()), int(y[inside == 0].sum())],
            [int(inside.sum()), int((1 - inside).sum())],
        )[1],
        rel=1e-12,
    )

    (interaction,) = groups.interaction_tests(annotations, dialogues, spec)
    hate = rows[(rows["rule_id"] == "hate")].merge(
        dialogues[["dialogue_id", "group_label"]], on="dialogue_id"
    )
    black = hate["group_label"].str.contains("Black").astype(float)
    male = hate["group_label"].str.contains("=male").astype(float)
    restricted = np.column_stack([np.ones(len(hate)), black, male])
    full = np.column_stack([restricted, black * male])
    yh = (hate["rating"] < 2).astype(float).to_numpy()
    fit_r, fit_f = sm.Logit(yh, restricted).fit(disp=0), sm.Logit(yh, full).fit(disp=0)
    assert interaction.method.startswith("LR test by maximum likelihood")
    assert interaction.lr == pytest.approx(2 * (fit_f.llf - fit_r.llf), rel=1e-8)
    assert interaction.naive_p == pytest.approx(stats.chi2.sf(2 * (fit_f.llf - fit_r.llf), 1), rel=1e-7)
    two_way = np.column_stack([hate["dialogue_id"], hate["annotator"].str[1:].astype(int)])
    robust = sm.Logit(yh, full).fit(disp=0, cov_type="cluster", cov_kwds={"groups": two_way}).cov_params()
    effect = robust[3, 3] / fit_f.cov_params()[3, 3]
    assert interaction.design_effect == pytest.approx(effect, rel=1e-6)
    g = min(hate["dialogue_id"].nunique(), hate["annotator"].nunique())
    assert interaction.p_value == pytest.approx(stats.f.sf(interaction.lr / effect, 1, g - 1), rel=1e-6)


def test_small_cells_fall_back_to_firth_and_name_it(spec: CampaignSpec) -> None:
    """A cell with no broken rating: the MLE of the interaction does not exist, so the test is Firth's
    penalised LR (equal to assay.stats.firth on the same rows), corrected for clustering by dialogue."""
    annotations, dialogues = campaign(np.random.default_rng(4), 120, n_annotators=12)
    target = group_label({"race": "Black", "gender": "male"})
    in_cell = dialogues.loc[dialogues["group_label"] == target, "dialogue_id"]
    annotations.loc[annotations["dialogue_id"].isin(in_cell), "rating"] = 3
    (test,) = groups.interaction_tests(annotations, dialogues, spec)
    assert "Firth" in test.method and "by dialogue" in test.method and "annotator" not in test.method
    hate = annotations.merge(dialogues, on="dialogue_id")
    hate = hate[hate["rule_id"] == "hate"]
    black = hate["group_label"].str.contains("Black").astype(float)
    male = hate["group_label"].str.contains("=male").astype(float)
    x = np.column_stack([np.ones(len(hate)), black, male, black * male])
    y = (hate["rating"] < 2).astype(float).to_numpy()
    penalised = firth_lrtest(y, x, [3])
    assert test.lr == pytest.approx(penalised.lr, rel=1e-12) and test.naive_p == pytest.approx(
        penalised.p_value
    )
    robust = cluster_robust_cov(penalised.full.cov, penalised.full.scores, hate["dialogue_id"].to_numpy())
    corrected = rao_scott_lrtest(
        penalised.lr, design_effects(penalised.full.cov, robust.cov, [3]), robust.df + 1
    )
    assert test.p_value == pytest.approx(corrected.p_value, rel=1e-12)


def test_cells_below_min_n_are_not_tested(spec: CampaignSpec) -> None:
    annotations, dialogues = campaign(np.random.default_rng(6), 40, n_annotators=10, n_red_teamers=4)
    lonely = dialogues.index[dialogues["rule_id"] == "hate"][0]
    dialogues.loc[lonely, "group_label"] = group_label({"race": "Asian"})
    odds = {(o.group, o.pooled): o for o in groups.group_odds_ratios(dialogues, annotations, spec)}
    single = odds[("race=Asian", False)]
    assert single.odds_ratio is None and single.p_value is None
    assert single.reason.startswith("not enough data (n = 1)")
    for o in odds.values():
        assert (o.odds_ratio is not None) == (min(o.a + o.b, o.c + o.d) >= 5), o
    assert odds[("race=Asian", True)].a + odds[("race=Asian", True)].b > single.a + single.b
    per_rule = groups.in_group_annotation(annotations, dialogues, spec, min_n=100)
    assert all(r.p_value is None and r.reason.startswith("not enough data (n = ") for r in per_rule)
    (interaction,) = groups.interaction_tests(annotations, dialogues, spec, min_n=100)
    assert interaction.p_value is None and interaction.skipped.startswith("not enough data (n = ")
    assert len(interaction.left_out) == 4


def test_any_rule_broken_adds_the_red_teamers_other_rules(spec: CampaignSpec) -> None:
    annotations, dialogues = campaign(np.random.default_rng(8), 60)
    targeted = groups.dialogue_outcomes(dialogues, annotations, spec, "targeted").set_index("dialogue_id")
    calm = targeted.index[~targeted["broken"]][:7]
    dialogues["pre_annotation"] = [
        json.dumps({"other_rules_broken": ["medical"]}) if d in set(calm) else {"other_rules_broken": []}
        for d in dialogues["dialogue_id"]
    ]
    any_rule = groups.dialogue_outcomes(dialogues, annotations, spec, "any").set_index("dialogue_id")
    assert (any_rule["broken"] & ~targeted["broken"]).sum() == 7
    assert any_rule["broken"].sum() == targeted["broken"].sum() + 7
    overall = groups.red_team_success(dialogues, annotations, spec, "any")[0]
    assert (
        overall.measure == "any"
        and overall.in_group.count + overall.out_group.count == any_rule["broken"].sum()
    )


def test_pilot_of_sixty_dialogues_answers_every_test(spec: CampaignSpec) -> None:
    """Every requested test on a 60-dialogue pilot gives a p-value or says 'not enough data', never fails."""
    from assay.star.analysis.paper import paper_tests

    for seed in range(3):
        annotations, dialogues = campaign(np.random.default_rng(seed), 60, n_annotators=8, n_red_teamers=6)
        results = [
            *groups.in_group_annotation(annotations, dialogues, spec),
            *(r for m in groups.MEASURES for r in groups.red_team_success(dialogues, annotations, spec, m)),
            *(o for m in groups.MEASURES for o in groups.group_odds_ratios(dialogues, annotations, spec, m)),
        ]
        for result in results:
            assert result.p_value is not None or result.reason.startswith("not enough data (n = "), result
        for test in groups.interaction_tests(annotations, dialogues, spec):
            assert test.p_value is not None or test.skipped.startswith("not enough data (n = "), test
        for family in paper_tests(annotations, dialogues, spec).values():
            for test in family:
                assert test.p_value is not None or test.reason.startswith("not enough data (n = "), test


@pytest.mark.slow
def test_rehearsed_pilot_report_answers_every_test(tmp_path: Path, monkeypatch, capsys) -> None:
    """`assay star simulate -n 60` then `assay star report --paper-tests --bootstrap 0`: every test in
    summary.json has a p-value or 'not enough data', and alpha is reported without an interval."""
    agent = tmp_path / "agent.py"
    agent.write_text(SCRIPTED)
    monkeypatch.setenv("ASSAY_DB_URL", f"sqlite:///{tmp_path / 'star.db'}")
    target = f"python:{agent}:respond"
    out = tmp_path / "report"
    for args in (
        ["simulate", str(EXAMPLE), "--target", target, "-n", "60", "--turns", "1", "--seed", "3"],
        [
            "report",
            "demo-campaign-simulated",
            "--machine",
            "include",
            "--embedder",
            "none",
            "--out",
            str(out),
        ],
    ):
        extra = ["--paper-tests", "--bootstrap", "0", "--min-n", "3"] if args[0] == "report" else []
        monkeypatch.setattr(sys, "argv", ["assay", "star", *args, *extra])
        with pytest.raises(SystemExit) as exit_:
            main()
        assert not exit_.value.code, capsys.readouterr().err
    summary = json.loads((out / "summary.json").read_text())
    assert summary["n"]["dialogues"] == 60 and summary["settings"]["min_n"] == 3
    ordinal = summary["reliability"]["ordinal"]
    assert ordinal["alpha"] is not None and ordinal["low"] is None and ordinal["n_boot"] == 0
    tests = [
        *summary["in_group_annotation"],
        *summary["red_team_success"],
        *summary["odds_ratios"],
        *summary["paper_tests"]["t_tests"],
        *summary["paper_tests"]["anova"],
    ]
    assert {r["measure"] for r in summary["red_team_success"]} == {"targeted", "any"}
    for test in tests:
        assert test["p_value"] is not None or test["reason"].startswith("not enough data (n = "), test
    for test in summary["interactions"]:
        assert test["p_value"] is not None or test["skipped"].startswith("not enough data (n = "), test
    html = (out / "report.html").read_text()
    assert "not enough data (n = " in html and "seed paper" in html
