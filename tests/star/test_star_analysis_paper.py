"""The seed paper's tests (Welch t-tests, one- and two-way ANOVA) against independent computations on the same
rows, the min-n refusals, and `--bootstrap 0` reporting alpha without an interval."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from scipy import stats
from statsmodels.stats.weightstats import ttest_ind

from assay.star.analysis import reliability
from assay.star.analysis.paper import complete_grid, one_way_anova, t_tests, two_way_anova
from assay.star.analysis.reliability import reliability_matrix
from assay.star.spec import CampaignSpec, Demographics, PolicyRule, group_label
from assay.stats.agreement import krippendorff_alpha

RACES = ["Asian", "Black", "White"]
GENDERS = ["female", "male"]


@pytest.fixture(scope="module")
def spec() -> CampaignSpec:
    return CampaignSpec(
        name="paper",
        rules=[PolicyRule(id="hate", text="No hate.", area="harm", targets_groups=True)],
        demographics=Demographics(attributes={"race": RACES, "gender": GENDERS}),
        templates={"plain": "Break {{ rule }}."},
    )


@pytest.fixture(scope="module")
def frames() -> tuple[pd.DataFrame, pd.DataFrame]:
    """180 hate dialogues over race x gender targets (one cell, White men, left empty), 2 ratings each."""
    rng = np.random.default_rng(0)
    cells = [(r, g) for r in RACES for g in GENDERS if (r, g) != ("White", "male")]
    pick = rng.integers(0, len(cells), 180)
    dialogues = pd.DataFrame(
        {
            "dialogue_id": range(180),
            "rule_id": "hate",
            "group_label": [group_label({"race": cells[k][0], "gender": cells[k][1]}) for k in pick],
            "red_teamer": [f"r{k}" for k in rng.integers(0, 10, 180)],
            "red_teamer_relation": rng.choice(["in-group", "out-group"], 180),
        }
    )
    shift = np.array([0.4 * (cells[k][0] == "Black") for k in pick])
    rows = [
        {
            "annotation_id": 2 * d + j,
            "dialogue_id": d,
            "annotator": f"a{rng.integers(0, 12)}",
            "annotator_relation": rng.choice(["in-group", "out-group"]),
            "kind": "annotate",
            "ablation": False,
            "rating": int(np.clip(np.round(rng.normal(1.5 + shift[d], 1.0)), 0, 3)),
        }
        for d in range(180)
        for j in range(2)
    ]
    return pd.DataFrame(rows), dialogues


def test_welch_t_tests_equal_statsmodels(spec: CampaignSpec, frames) -> None:
    annotations, dialogues = frames
    found = t_tests(annotations, dialogues, spec)
    overall = found[0]
    assert overall.scope == "all" and overall.outcome.startswith("mean Likert rating")
    inside = annotations.loc[annotations["annotator_relation"] == "in-group", "rating"].astype(float)
    outside = annotations.loc[annotations["annotator_relation"] == "out-group", "rating"].astype(float)
    t, p, df = ttest_ind(inside, outside, usevar="unequal")
    assert overall.t == pytest.approx(t, rel=1e-12) and overall.p_value == pytest.approx(p, rel=1e-10)
    assert overall.df == pytest.approx(df, rel=1e-12) and overall.in_n == len(inside)
    assert {t.outcome for t in found} >= {"share broken (any rule), red teamers"}


def _rss(y: np.ndarray, x: np.ndarray) -> tuple[float, int]:
    beta, *_ = np.linalg.lstsq(x, y, rcond=None)
    residual = y - x @ beta
    return float(residual @ residual), int(np.linalg.matrix_rank(x))


def test_two_way_anova_equals_nested_least_squares(spec: CampaignSpec, frames) -> None:
    """Type II F tests by hand: interaction = RSS(additive) - RSS(full); race = RSS(gender) - RSS(additive).
    White men are missing, so the complete grid keeps Asian and Black only."""
    annotations, dialogues = frames
    terms = {t.term: t for t in two_way_anova(annotations, dialogues, spec)}
    assert terms["race:gender"].levels == "race: Asian, Black; gender: female, male"
    rows = annotations.merge(dialogues, on="dialogue_id")
    rows = rows[~rows["group_label"].str.contains("White")]
    y = rows["rating"].astype(float).to_numpy()
    black = rows["group_label"].str.contains("Black").astype(float).to_numpy()
    male = rows["group_label"].str.contains("=male").astype(float).to_numpy()
    one = np.ones_like(y)
    full, k_full = _rss(y, np.column_stack([one, black, male, black * male]))
    additive, _ = _rss(y, np.column_stack([one, black, male]))
    gender_only, _ = _rss(y, np.column_stack([one, male]))
    scale = full / (len(y) - k_full)
    assert terms["race:gender"].f == pytest.approx((additive - full) / scale, rel=1e-10)
    assert terms["race"].f == pytest.approx((gender_only - additive) / scale, rel=1e-10)
    assert terms["race"].df_den == len(y) - 4 and terms["race"].n == len(y)
    assert terms["race:gender"].p_value == pytest.approx(stats.f.sf(terms["race:gender"].f, 1, len(y) - 4))


def test_one_way_anova_equals_scipy(spec: CampaignSpec, frames) -> None:
    annotations, dialogues = frames
    (result,) = one_way_anova(annotations, dialogues, spec)
    rows = annotations.merge(dialogues, on="dialogue_id")
    samples = [part["rating"].astype(float) for _, part in rows.groupby("group_label")]
    expected = stats.f_oneway(*samples)
    assert result.f == pytest.approx(expected.statistic, rel=1e-12) and result.df_num == 4


def test_small_cells_and_grids_are_refused(spec: CampaignSpec, frames) -> None:
    annotations, dialogues = frames
    terms = two_way_anova(annotations, dialogues, spec, min_n=1000)
    assert all(t.p_value is None and t.reason.startswith("not enough data (n = 180)") for t in terms)
    sizes = pd.Series(
        {("A", "f"): 5, ("A", "m"): 6, ("B", "f"): 7, ("B", "m"): 5, ("C", "f"): 9, ("C", "m"): 4}
    )
    assert set(complete_grid(sizes, 5).index) == {("A", "f"), ("A", "m"), ("B", "f"), ("B", "m")}
    assert all(t.reason.startswith("not enough data") for t in t_tests(annotations, dialogues, spec, 500))


def test_no_bootstrap_reports_alpha_without_an_interval(spec: CampaignSpec, frames) -> None:
    annotations, dialogues = frames
    report = reliability(annotations, dialogues, spec, n_boot=0)
    expected = krippendorff_alpha(reliability_matrix(annotations, "rating"), "ordinal")
    assert report.ordinal.alpha == pytest.approx(expected, abs=1e-12)
    assert report.ordinal.low is None and report.ordinal.high is None and report.ordinal.n_boot == 0
    assert "no interval" in report.ordinal.reason
    assert reliability(annotations, dialogues, spec, n_boot=50).ordinal.alpha == report.ordinal.alpha
