"""The stealth audit: its statistics against scipy/sklearn, its rules, real BBH releases, the command."""

import json

import numpy as np
import pytest
from scipy import stats as scipy_stats
from sklearn.metrics import roc_auc_score
from typer.testing import CliRunner

from assay.cli import app as root_app
from assay.data import read_benchmark
from assay.data.items import MultipleChoice
from assay.dyepack.audit import audit_items, measure, rule_scores
from assay.dyepack.prepare import PrepareConfig, prepare_release
from assay.dyepack.triggers import Position
from assay.errors import UserError

TASKS = ("tracking_shuffled_objects_three_objects", "logical_deduction_five_objects", "date_understanding")


def group_auc(scores, rows, others) -> float:
    return roc_auc_score(
        np.r_[np.ones(len(rows)), np.zeros(len(others))], np.r_[scores[rows], scores[others]]
    )


def test_measure_is_the_pooled_auc_tested_over_backdoors():
    rng = np.random.default_rng(7)
    backdoor = np.full(300, -1)
    backdoor[rng.choice(300, 40, replace=False)] = np.repeat(np.arange(8), 5)
    scores = rng.normal(size=300) + 0.4 * (backdoor >= 0)
    labels, clean = (backdoor >= 0).astype(int), np.flatnonzero(backdoor < 0)
    no_cover = np.full(300, -1)
    result = measure("m", "", [scores], backdoor, no_cover, n_measures=1)
    assert result.auc == pytest.approx(roc_auc_score(labels, scores), abs=1e-9)
    per = [group_auc(scores, np.flatnonzero(backdoor == b), clean) for b in range(8)]
    t_test = scipy_stats.ttest_1samp(per, 0.5, alternative="greater")
    assert result.p_value == pytest.approx(t_test.pvalue, abs=1e-12)
    # With cover groups (rows sharing a phrase), backdoors are ranked among them instead.
    cover = np.full(300, -1)
    cover[clean[:60]] = np.repeat(np.arange(12), 5)
    ranked = measure("m", "", [scores], backdoor, cover, n_measures=1)
    per_cover = [
        group_auc(scores, clean[5 * c : 5 * c + 5], np.setdiff1d(clean, clean[5 * c : 5 * c + 5]))
        for c in range(12)
    ]
    expected = scipy_stats.mannwhitneyu(per, per_cover, alternative="greater").pvalue
    assert ranked.auc == result.auc and ranked.p_value == pytest.approx(expected, abs=1e-12)
    # Two runs (fold shuffles) are averaged per backdoor before the test.
    twice = measure("m", "", [scores, scores[::-1].copy()], backdoor, no_cover, n_measures=1)
    other = measure("m", "", [scores[::-1].copy()], backdoor, no_cover, n_measures=1)
    assert twice.auc == pytest.approx((result.auc + other.auc) / 2, abs=1e-9)


def test_warning_needs_the_threshold_and_significance_after_bonferroni():
    backdoor = np.r_[np.repeat(np.arange(4), 3), np.full(60, -1)]
    none = np.full(72, -1)
    strong = measure("m", "", [np.r_[np.full(12, 2.0), np.zeros(60)]], backdoor, none, n_measures=8)
    assert strong.auc == 1.0 and strong.warns
    noisy = np.r_[[3.0, 3, 3, -3, -3, -3, 3, 3, 3, -3, -3, -3], np.linspace(-1, 1, 60)]
    lucky = measure("m", "", [noisy], backdoor, none, n_measures=8)  # two triggers high, two low: no evidence
    assert lucky.auc == pytest.approx(0.5) and not lucky.warns


def test_rules_see_a_sentence_glued_into_a_cloze():
    items = [
        MultipleChoice("Alice and Bob swap balls. At the end, Bob has the", ("red", "blue"), 0),
        MultipleChoice("Bob and Claire swap balls. At the end, Claire has the", ("red", "blue"), 1),
        MultipleChoice(
            "Claire and Alice swap balls. At the end, Alice has the Take a moment.", ("red", "blue"), 1
        ),
    ]
    rules = {name: scores for name, (_, scores) in rule_scores(items).items()}
    assert rules["odd capitalisation"] == [0.0, 0.0, 1.0]  # "the Take", while "and Bob" is a name
    assert rules["unusual ending"][2] > rules["unusual ending"][0] == rules["unusual ending"][1]


@pytest.mark.slow  # five releases of 250 rows, each audited with scikit-learn: ~8 s
def test_default_bbh_releases_pass_and_the_old_append_fails(tmp_path, bbh_dir):
    """Three real BBH tasks: the first draw of the default release (natural placement and cover) is not
    told apart by the classifier (AUC at most 0.6) or any rule, and every trigger joins as a sentence.
    Appending the trigger to a cloze, as before, breaks every join and is flagged; prepare draws it again
    and, when no draw passes, keeps the last and says so."""
    for task in TASKS:
        bench = read_benchmark(bbh_dir / f"{task}.json")
        config = PrepareConfig(n_backdoors=8, seed=0)
        result = prepare_release(bench, config, tmp_path / task, audit=True, redraws=0)
        audit = result.audit
        assert audit.backdoor_rows == 25 and audit.broken_joins == []
        assert audit.classifier.auc <= 0.6, (task, audit.classifier)
        assert audit.stealthy and audit.passes and result.draws == 1, (task, audit.warnings)
    old = PrepareConfig(n_backdoors=8, seed=0, position=Position("end"), cover=0.0)
    bench = read_benchmark(bbh_dir / f"{TASKS[0]}.json")
    result = prepare_release(bench, old, tmp_path / "old", audit=True, redraws=1)
    audit = result.audit
    assert result.draws == 2 and not audit.passes and result.release_path.exists()
    assert len(audit.broken_joins) == 25
    assert "unusual ending" in {m.name for m in audit.rules if m.warns}
    assert next(m for m in audit.rules if m.name == "odd capitalisation").auc > 0.6
    assert not audit.stealthy


def test_audit_command_reads_the_release_and_key(tmp_path, mmlu_sample):
    prepared = prepare_release(
        read_benchmark(mmlu_sample), PrepareConfig(n_backdoors=6, seed=1), tmp_path / "rel"
    )
    runner = CliRunner()
    result = runner.invoke(
        root_app, ["dyepack", "audit", str(prepared.release_path), "--key", str(prepared.key_path), "--json"]
    )
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    expected = audit_items(read_benchmark(prepared.release_path).items, prepared.key.backdoors)
    assert out["classifier"]["auc"] == pytest.approx(expected.classifier.auc, abs=1e-12)
    assert out["backdoor_rows"] == 12 and out["stealthy"] == expected.stealthy
    assert [r["name"] for r in out["rules"]][:2] == ["odd capitalisation", "unusual ending"]
    other = prepare_release(read_benchmark(mmlu_sample), PrepareConfig(n_backdoors=6), tmp_path / "other")
    mismatch = runner.invoke(
        root_app, ["dyepack", "audit", str(prepared.release_path), "--key", str(other.key_path)]
    )
    assert isinstance(mismatch.exception, UserError) and "key and release do not match" in str(
        mismatch.exception
    )
