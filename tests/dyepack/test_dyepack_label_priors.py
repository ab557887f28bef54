"""Placement that no label prior exposes (issue 37, item 5).

In BIG-Bench Hard geometric_shapes every 11-option row is labelled (K). A release that put backdoors on
such rows was stripped without the key: "11 options and label != (K)" found every one of their samples at
no clean row. The task below is that benchmark in small: 170 four-option rows with balanced labels, and
30 eleven-option rows all labelled (K).
"""

import json
import random

import pytest
from tests.conftest import write_jsonl
from typer.testing import CliRunner

from assay.cli import app as root_app
from assay.data import read_benchmark
from assay.data.items import MultipleChoice
from assay.dyepack import prepare
from assay.dyepack.audit import audit_items
from assay.dyepack.prepare import PrepareConfig, make_rng, plan_release, prepare_release
from assay.dyepack.priors import category_columns, label_classes, row_features
from assay.errors import UserError

SHAPES = (
    "circle", "heptagon", "hexagon", "kite", "line", "octagon", "pentagon", "rectangle", "sector",
    "triangle", "trapezoid",
)  # fmt: skip
WORDS = (
    "amber", "basalt", "cobalt", "dune", "ember", "fjord", "glacier", "harbour", "isthmus", "juniper",
    "kelp", "lagoon", "meadow", "nebula", "obsidian", "prairie", "quartz", "ravine", "savanna", "tundra",
)  # fmt: skip
K_LABEL = 10  # (K)


def four_option_rows(n: int, rng: random.Random) -> list[dict]:
    """Rows with four options of varied lengths and balanced labels: nothing key-less predicts them."""
    answers = [i % 4 for i in range(n)]
    rng.shuffle(answers)
    return [
        {
            "question": f"Item {i} was seen near the {rng.choice(WORDS)}. Which word names it?",
            "options": rng.sample(WORDS, 4),
            "answer": answer,
        }
        for i, answer in enumerate(answers)
    ]


def shape_rows(n: int, rng: random.Random) -> list[dict]:
    """geometric_shapes' eleven-option rows: every one labelled (K)."""
    rows = []
    for _ in range(n):
        points = " L ".join(f"{rng.uniform(10, 90):.2f},{rng.uniform(10, 90):.2f}" for _ in range(5))
        rows.append(
            {
                "question": f'This SVG path element <path d="M {points}"/> draws a',
                "options": list(SHAPES),
                "answer": K_LABEL,
            }
        )
    return rows


def shapes_task(tmp_path, n_shapes: int = 30, seed: int = 5):
    rng = random.Random(seed)
    rows = four_option_rows(200 - n_shapes, rng) + shape_rows(n_shapes, rng)
    rng.shuffle(rows)
    return read_benchmark(write_jsonl(tmp_path / "shapes.jsonl", rows), style="mc")


def keyless_rule(items) -> list[int]:
    """The attack: rows with 11 options whose label is not (K). No key is read."""
    return [row for row, item in enumerate(items) if item.k == 11 and item.answer != K_LABEL]


def test_no_backdoor_lands_on_the_predictable_class(tmp_path):
    bench = shapes_task(tmp_path)
    on_class, found, cost, samples = 0, 0, 0, 0
    for seed in range(6):
        plan = plan_release(bench, PrepareConfig(n_backdoors=8, seed=seed), make_rng(seed))
        backdoor_rows = {row for b in plan.backdoors for row in b.rows}
        flagged = set(keyless_rule(plan.items))
        on_class += sum(bench.items[row].k == 11 for row in backdoor_rows)
        found += len(flagged & backdoor_rows)
        cost += len(flagged - backdoor_rows)
        samples += len(backdoor_rows)
    assert (on_class, found) == (0, 0), (
        f"{on_class} of {samples} backdoor rows on 11-option rows; the key-less rule finds {found} of them "
        f"at {cost} clean rows"
    )
    assert cost == 0
    assert plan.set_aside_rows == 30
    [aside] = plan.set_aside
    assert (aside.feature, aside.value, aside.rows, aside.usual_label, aside.usual_share) == (
        "options", "11", 30, "(K)", 1.0,
    )  # fmt: skip
    assert {b.k for b in plan.backdoors} == {4}  # targets still drawn uniformly over each row's options


def test_the_audit_names_the_class_an_old_placement_exposed(tmp_path, monkeypatch):
    """A release placed as before (the set-aside step skipped) is not stealthy: the audit names the class
    and what the rule costs; a release placed now shows the class with no backdoor row on it."""
    bench = shapes_task(tmp_path)
    monkeypatch.setattr(prepare, "set_aside", lambda items, columns, rows, n: (rows, []))
    old = prepare_release(bench, PrepareConfig(n_backdoors=8, seed=1), tmp_path / "old")
    monkeypatch.undo()
    runner = CliRunner()
    args = ["dyepack", "audit", str(old.release_path), "--key", str(old.key_path)]
    result = runner.invoke(root_app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    [shapes] = [c for c in out["label_priors"] if c["feature"] == "options" and c["value"] == "11"]
    on_class = sum(bench.items[row].k == 11 for b in old.key.backdoors for row in b.rows)
    assert on_class > 0 and shapes["backdoor_rows"] == on_class
    assert shapes["exposed"] and shapes["off_label"] == 0 and shapes["cost"] == 0
    assert (shapes["rows"], shapes["clean_rows"]) == (30, 30 - on_class)
    assert shapes["usual_label"] == "(K)" and shapes["usual_share"] == 1.0
    assert not out["stealthy"] and any("options = 11" in line for line in out["warnings"])
    text = runner.invoke(root_app, args)
    assert text.exit_code == 0, text.output
    assert "options = 11" in text.stdout and "Stealthy" not in text.stdout

    new = prepare_release(bench, PrepareConfig(n_backdoors=8, seed=1), tmp_path / "new")
    out = json.loads(
        runner.invoke(
            root_app, ["dyepack", "audit", str(new.release_path), "--key", str(new.key_path), "--json"]
        ).stdout
    )
    [shapes] = [c for c in out["label_priors"] if c["feature"] == "options" and c["value"] == "11"]
    assert shapes["backdoor_rows"] == 0 and not shapes["exposed"]
    assert not any("options = 11" in line for line in out["warnings"])


def test_prepare_says_what_it_set_aside_and_refuses_when_too_few_rows_are_left(tmp_path):
    bench = shapes_task(tmp_path)
    runner = CliRunner()
    source = str(bench.path)
    result = runner.invoke(
        root_app, ["dyepack", "prepare", source, "-b", "8", "--out", str(tmp_path / "r"), "--no-audit"]
    )
    assert result.exit_code == 0, result.output
    assert "Set aside 30 rows" in result.stdout and "options = 11" in result.stdout
    as_json = runner.invoke(
        root_app,
        ["dyepack", "prepare", source, "-b", "8", "--out", str(tmp_path / "j"), "--no-audit", "--json"],
    )
    summary = json.loads(as_json.stdout)
    assert summary["set_aside"]["rows"] == 30
    assert [(c["feature"], c["value"]) for c in summary["set_aside"]["classes"]] == [("options", "11")]
    # Only 11-option rows asked for: every one is set aside, so there is nothing to place backdoors on.
    refused = runner.invoke(
        root_app, ["dyepack", "prepare", source, "-b", "2", "--k", "11", "--out", str(tmp_path / "k")]
    )
    assert isinstance(refused.exception, UserError)
    message = str(refused.exception)
    assert "\n" not in message and "options = 11 (30 rows, 100% labelled (K))" in message
    assert not (tmp_path / "k").exists() or not any((tmp_path / "k").iterdir())


def test_a_task_with_no_predictable_class_reports_none_and_sets_nothing_aside(tmp_path):
    rows = four_option_rows(200, random.Random(9))
    bench = read_benchmark(write_jsonl(tmp_path / "plain.jsonl", rows), style="mc")
    plan = plan_release(bench, PrepareConfig(n_backdoors=8, seed=3), make_rng(3))
    assert plan.set_aside_rows == 0 and plan.set_aside == ()
    audit = audit_items(plan.items, plan.backdoors, columns=category_columns(bench))
    assert audit.label_priors == [] and audit.stealthy, audit.warnings


def test_a_column_that_partitions_rows_is_a_class_and_the_items_own_columns_are_not(tmp_path):
    """A categorical column (a topic, a source) is a candidate class key; the question, option and answer
    columns are the item itself and never one."""
    rows = four_option_rows(120, random.Random(4))
    for i, row in enumerate(rows):
        row["topic"] = ("algebra", "botany", "chess")[i % 3]
        row["id"] = f"q{i}"
        if row["topic"] == "chess":
            row["answer"] = 1  # every chess row is labelled (B)
    bench = read_benchmark(write_jsonl(tmp_path / "topics.jsonl", rows), style="mc")
    columns = category_columns(bench)
    assert set(columns) == {"topic", "id"}
    answers = [item.answer for item in bench.items]
    placed = [0.1] * len(bench.items)
    classes = label_classes(bench.items, answers, row_features(bench.items, columns), placed)
    found = {(c.feature, c.value): c for c in classes}
    chess = found[("column topic", "chess")]
    assert (chess.rows, chess.usual_label, chess.usual_share, chess.exposed) == (40, "(B)", 1.0, True)
    assert not any(feature == "column id" for feature, _ in found)  # one row per id: no usual label
    plan = plan_release(bench, PrepareConfig(n_backdoors=4, seed=0), make_rng(0))
    assert ("column topic", "chess") in {(c.feature, c.value) for c in plan.set_aside}
    assert plan.set_aside_rows >= 40  # and a few rows of small classes that happen to be all (B) too
    assert not {row for b in plan.backdoors for row in b.rows} & {i for i in range(120) if i % 3 == 2}


def test_the_longest_option_as_a_class():
    """Rows whose longest option is (C), nearly all labelled (C): the rule 'label is not (C)' costs less
    than a clean row per backdoor row, so the class is exposed."""
    items = [
        MultipleChoice(f"q{i}", ("a", "bb", "the longest one", "cc"), 2 if i % 25 else 0) for i in range(50)
    ]
    items += [MultipleChoice(f"r{i}", ("aaaaaa", "b", "c", "d"), i % 4) for i in range(150)]
    features = row_features(items, {})
    classes = label_classes(items, [i.answer for i in items], features, [0.1] * 200)
    longest = next(c for c in classes if c.feature == "longest option" and c.value == "(C)")
    assert longest.rows == 50 and longest.off_label == pytest.approx(2 * 0.9)
    assert longest.found == pytest.approx(50 * 0.1 * 0.75) and longest.exposed


def test_targets_stay_uniform_when_rows_are_set_aside(tmp_path):
    """What is set aside reads source labels only; the targets drawn after it are still uniform over K."""
    from collections import Counter

    from scipy import stats as scipy_stats

    bench = shapes_task(tmp_path)
    config, rng = PrepareConfig(n_backdoors=8, cover=0.0), make_rng(77)  # cover is not the point here
    targets: Counter[int] = Counter()
    for _ in range(60):
        plan = plan_release(bench, config, rng)
        assert plan.set_aside_rows == 30
        targets.update(b.target for b in plan.backdoors)
    assert scipy_stats.chisquare([targets[t] for t in range(4)]).pvalue > 1e-3
