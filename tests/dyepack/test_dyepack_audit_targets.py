"""The stealth audit decides which draws ``prepare`` keeps, so it must not see the targets (issue 26)."""

from collections import Counter

import pytest
from scipy import stats as scipy_stats
from tests.conftest import write_jsonl

from assay.data.items import MultipleChoice
from assay.dyepack.audit import audit_items, masked_answers, rule_scores
from assay.dyepack.key import Backdoor
from assay.dyepack.prepare import PrepareConfig, draft_release, draw_release, draw_targets, make_rng

SHARED = "The owl sits on the second branch from the left."


def relabelled(items, backdoors, targets):
    """The release as it would read with other targets: backdoor rows carry the new target as answer."""
    items = list(items)
    for b, t in zip(backdoors, targets, strict=True):
        for row in b.rows:
            items[row] = MultipleChoice(items[row].question, items[row].options, t)
    return items


def test_old_one_answer_rule_read_the_targets_and_the_masked_one_does_not():
    """The attack: a sentence shared by a backdoor row and clean rows 'agrees' only when the target equals
    the clean rows' answer, so the released answers made the audit (and so a redraw) depend on the target."""
    options = ("a", "b", "c")
    items = [MultipleChoice(f"{SHARED} Question {i}?", options, 0) for i in range(3)]
    items += [MultipleChoice(f"Other question {i}. Which one is it?", options, i % 3) for i in range(12)]
    backdoors = [Backdoor(index=0, trigger="t", k=3, target=0, target_label="A", rows=[0, 5])]
    with_target = {t: relabelled(items, backdoors, [t]) for t in range(3)}
    old = {t: rule_scores(with_target[t])["repeated sentence, one answer"][1] for t in range(3)}
    assert old[0] != old[1]  # before: which target was drawn changed what the audit saw
    masked = {
        t: rule_scores(with_target[t], masked_answers(with_target[t], backdoors))[
            "repeated sentence, one answer"
        ][1]
        for t in range(3)
    }
    assert masked[0] == masked[1] == masked[2]


@pytest.mark.slow  # three audits of a 250-row release: ~5 s
def test_audit_is_the_same_whatever_the_targets(tmp_path, bbh_dir):
    from assay.data import read_benchmark

    bench = read_benchmark(bbh_dir / "logical_deduction_three_objects.json")
    plan, stealth, _ = draw_release(bench, PrepareConfig(n_backdoors=4, seed=11), audit=True, redraws=0)
    assert audit_items(plan.items, plan.backdoors) == stealth  # the audit of the draft is the release's
    other = [(b.target + 1) % b.k for b in plan.backdoors]
    assert audit_items(relabelled(plan.items, plan.backdoors, other), plan.backdoors) == stealth


@pytest.mark.slow  # 30 releases drawn and audited with scikit-learn: ~18 s
def test_targets_are_uniform_given_a_pass(tmp_path):
    """Many releases of one benchmark drawn with redraws; the targets of those kept are uniform."""
    from assay.data import read_benchmark

    rows = [
        {
            "question": f"Item {i} asks about case {i % 7}. Which label fits it best?",
            "options": ["red", "green", "blue"],
            "answer": i % 3,
        }
        for i in range(30)
    ]
    bench = read_benchmark(write_jsonl(tmp_path / "b.jsonl", rows), style="mc")
    targets: Counter[int] = Counter()
    kept = 0
    for seed in range(30):
        plan, stealth, _ = draw_release(bench, PrepareConfig(3, fraction=0.2, seed=seed), True, 2)
        if stealth.passes:
            kept += 1
            targets.update(b.target for b in plan.backdoors)
    assert kept >= 15
    assert scipy_stats.chisquare([targets[t] for t in range(3)]).pvalue > 1e-3


def test_targets_are_drawn_after_the_draft():
    """The draft carries no target; ``draw_targets`` changes only the backdoor rows' labels."""
    items = [MultipleChoice(f"Question {i}. Which is it?", ("a", "b", "c", "d"), i % 4) for i in range(40)]
    bench = type("B", (), {"kind": "multiple_choice", "items": items})()
    draft = draft_release(bench, PrepareConfig(n_backdoors=2, fraction=0.1, cover=0.0), make_rng(3))
    assert {b.target_label for b in draft.backdoors} == {""}
    plan = draw_targets(draft, make_rng(4))
    rows = {row for b in plan.backdoors for row in b.rows}
    for row, (before, after) in enumerate(zip(draft.items, plan.items, strict=True)):
        assert after.question == before.question
        assert after.answer == before.answer or row in rows
