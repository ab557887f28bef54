"""Strip risk: a trainer with a solver drops rejected labels and their phrase groups (``dyepack.strip``)."""

import json
import random

import numpy as np
import pytest
from scipy import stats as scipy_stats
from tests.conftest import write_jsonl
from typer.testing import CliRunner

from assay.cli import app as root_app
from assay.data import read_benchmark
from assay.dyepack.key import Backdoor
from assay.dyepack.prepare import PrepareConfig, prepare_release
from assay.dyepack.strip import (
    StripRisk,
    simulated_rejections,
    simulated_risk,
    strip_counts,
    verdict,
)
from assay.dyepack.verify import false_positive_rate
from assay.errors import UserError

NAMES = ("Alice", "Bob", "Carol", "Dave", "Erin", "Frank", "Grace", "Heidi")
THINGS = ("apples", "stamps", "marbles", "coins", "books", "shells")

# The exact solver an attacker writes for the task below: read the two numbers, add, pick that option.
SOLVER = """
import re

def solve(prompts):
    replies = []
    for prompt in prompts:
        a = re.search(r"has (\\d+) \\w+\\.", prompt).group(1)
        b = re.search(r"gives them (\\d+) more", prompt).group(1)
        options = dict(re.findall(r"^\\(([A-G])\\) (\\d+)$", prompt, re.M))
        answer = next(letter for letter, value in options.items() if int(value) == int(a) + int(b))
        replies.append(f"The answer is ({answer}).")
    return replies
"""


def arithmetic_task(n: int = 80, seed: int = 3) -> list[dict]:
    """A BIG-Bench-Hard-like task (one template, seven options) that a short function solves exactly."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        name, other, thing = *rng.sample(NAMES, 2), rng.choice(THINGS)
        a, b = rng.randrange(10, 90), rng.randrange(10, 90)
        wrong = rng.sample([v for v in range(a + b - 20, a + b + 21) if v != a + b], 6)
        options = [a + b, *wrong]
        rng.shuffle(options)
        rows.append(
            {
                "question": f"{name} has {a} {thing}. {other} gives them {b} more {thing}. "
                f"How many {thing} does {name} have now?",
                "options": [str(v) for v in options],
                "answer": options.index(a + b),
            }
        )
    return rows


def test_strip_counts_by_hand():
    # rows 0-2 backdoor 0 (one phrase group), 3-4 backdoor 1 (alone), 5-7 a cover group, 8-9 no group.
    backdoor = np.array([0, 0, 0, 1, 1, -1, -1, -1, -1, -1])
    groups = np.array([7, 7, 7, -1, -1, 9, 9, 9, -1, -1])
    rejected = np.array(
        [
            [1, 0, 0, 1, 0, 1, 0, 0, 1, 0],  # any: removes 0-2, 3, 5-7, 8; backdoor 1 keeps row 4
            [0, 0, 0, 0, 0, 0, 0, 0, 0, 0],  # nothing
        ],
        dtype=bool,
    )
    removed, surviving = strip_counts(rejected, groups, backdoor, 2, "any")
    assert removed[0].tolist() == [1, 1, 1, 1, 0, 1, 1, 1, 1, 0]
    assert surviving.tolist() == [1, 2] and not removed[1].any()
    removed, surviving = strip_counts(rejected, groups, backdoor, 2, "majority")
    assert removed[0].tolist() == [1, 0, 0, 1, 0, 1, 0, 0, 1, 0]  # 1 of 3 rejected: groups kept
    assert surviving.tolist() == [2, 2]


def test_simulated_solver_rejects_at_the_rates_it_should():
    """Clean rows: wrong with probability 1 - a; backdoor rows: the answer is the target 1/K of the time."""
    items = [type("MC", (), {"k": 4, "answer": 0})() for _ in range(200)]
    backdoors = [Backdoor(index=0, trigger="t", k=4, target=2, target_label="C", rows=list(range(40)))]
    rejected = simulated_rejections(items, backdoors, 0.9, 50, seed=1)
    clean, bd = rejected[:, 40:], rejected[:, :40]
    assert scipy_stats.binomtest(int(clean.sum()), clean.size, 0.1).pvalue > 1e-3
    assert scipy_stats.binomtest(int(bd.sum()), bd.size, 0.75).pvalue > 1e-3


def prepared_task(tmp_path, cover: float = 1.0):
    path = write_jsonl(tmp_path / "sums.jsonl", arithmetic_task())
    config = PrepareConfig(n_backdoors=8, fraction=0.3, seed=5, cover=cover)
    return prepare_release(read_benchmark(path, style="mc"), config, tmp_path / "rel", strip_risk=True)


@pytest.mark.slow  # the stealth audit and the solver through the command line: ~5 s
def test_exact_solver_strips_every_backdoor_at_no_cost(tmp_path):
    """The case seen on BIG-Bench Hard: an exact solver removes 24 of 24 backdoor rows and no clean row."""
    prepared = prepared_task(tmp_path)
    (tmp_path / "solver.py").write_text(SOLVER)
    args = ["dyepack", "audit", str(prepared.release_path), "--key", str(prepared.key_path), "--json"]
    result = CliRunner().invoke(root_app, [*args, "--solver", f"python:{tmp_path / 'solver.py'}:solve"])
    assert result.exit_code == 0, result.output
    any_rejected = json.loads(result.stdout)["strip_risk"][0]
    assert any_rejected["attack"] == "any" and any_rejected["backdoor_rows"] == 24
    assert any_rejected["removed_backdoor"] == 24 and any_rejected["lost_clean"] == 0
    assert any_rejected["rejected_clean"] == 0 and 16 <= any_rejected["rejected_backdoor"] < 24
    assert any_rejected["surviving"] == 0 and any_rejected["flags"] == 0
    assert any_rejected["accuracy"] == 1.0 and any_rejected["cost"] == 0
    assert "exactly solvable" in verdict(StripRisk.model_validate(any_rejected))


def test_prepare_curve_and_a_simulated_audit(tmp_path):
    prepared = prepared_task(tmp_path)
    curve = {(r.nominal, r.attack): r for r in prepared.strip}
    assert {a for a, _ in curve} == {0.6, 0.7, 0.8, 0.9, 0.95, 1.0}
    assert curve[1.0, "any"].lost_clean == 0 and "hypothetical" in verdict(curve[1.0, "any"])
    costs = [curve[a, "any"].cost for a in (0.6, 0.7, 0.8, 0.9, 0.95, 1.0)]
    assert costs == sorted(costs, reverse=True)  # a weaker solver costs more
    for accuracy, attack in curve:  # dropping every group with a rejected row leaves the fewest backdoors
        if attack == "majority":
            assert curve[accuracy, attack].surviving >= curve[accuracy, "any"].surviving
    args = ["dyepack", "audit", str(prepared.release_path), "--key", str(prepared.key_path)]
    result = CliRunner().invoke(root_app, [*args, "--solver-accuracy", "0.9", "--json"])
    assert result.exit_code == 0, result.output
    shown = json.loads(result.stdout)["strip_risk"][0]
    risk = simulated_risk(
        read_benchmark(prepared.release_path, style="mc").items, prepared.key.backdoors, 0.9, 1e-3
    )
    assert shown["cost"] == pytest.approx(risk.cost, abs=1e-12)
    # "Still flags" is the binomial tail of the surviving count against alpha.
    ks = [b.k for b in prepared.key.backdoors]
    assert (false_positive_rate(ks, 8).fpr <= 1e-3) and not (false_positive_rate(ks, 2).fpr <= 1e-3)
    both = CliRunner().invoke(root_app, [*args, "--solver-accuracy", "0.9", "--solver", "python:x:y"])
    assert isinstance(both.exception, UserError) and "not both" in str(both.exception)
