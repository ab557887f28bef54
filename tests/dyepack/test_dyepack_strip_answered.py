"""Issue 37, item 4: the strip report counts what the solver answered.

A solver that names no option for a row leaves that row's label in place, which is not accepting it: the
report gives answered and unparsed rows, accuracy over the clean rows answered, and calls a task "exactly
solvable" only when a real solver answered every row and accepted every clean label. A simulated solver
(``--solver-accuracy``) is a hypothetical one and is spoken of so.
"""

from __future__ import annotations

import json

import numpy as np
from tests.conftest import write_jsonl
from tests.dyepack.test_dyepack_strip import SOLVER, arithmetic_task
from typer.testing import CliRunner

from assay.cli import app as root_app
from assay.data import read_benchmark
from assay.dyepack.prepare import PrepareConfig, prepare_release
from assay.dyepack.strip import exactly_solvable, risk_from_rejections, simulated_risk, verdict

# The exact solver, but it answers only the first 71 prompts it is asked and says nothing useful after.
ABSTAINER = (
    SOLVER.replace("def solve(prompts):", "def exact(prompts):")
    + """

ASKED = [0]


def solve(prompts):
    replies = []
    for prompt in prompts:  # counted across batches: the backend may call this several times
        ASKED[0] += 1
        replies.append(exact([prompt])[0] if ASKED[0] <= 71 else "I am not sure.")
    return replies
"""
)


def release(tmp_path):
    path = write_jsonl(tmp_path / "sums.jsonl", arithmetic_task(n=250))
    config = PrepareConfig(n_backdoors=8, fraction=0.2, seed=5)
    return prepare_release(read_benchmark(path, style="mc"), config, tmp_path / "rel")


def test_a_solver_that_answers_71_of_250_rows_is_not_called_exact(tmp_path):
    prepared = release(tmp_path)
    (tmp_path / "solver.py").write_text(ABSTAINER)
    args = ["dyepack", "audit", str(prepared.release_path), "--key", str(prepared.key_path)]
    solver = ["--solver", f"python:{tmp_path / 'solver.py'}:solve"]
    shown = CliRunner().invoke(root_app, [*args, *solver, "--json"])
    assert shown.exit_code == 0, shown.output
    risk = json.loads(shown.stdout)["strip_risk"][0]
    assert risk["rows"] == 250 and risk["answered"] == 71 and risk["unparsed"] == 179
    assert risk["rejected_clean"] == 0 and risk["accuracy"] == 1.0  # right on every clean row it answered
    assert risk["answered_clean"] < 71 and risk["exactly_solvable"] is False
    text = CliRunner().invoke(root_app, [*args, *solver])
    assert text.exit_code == 0, text.output
    line = " ".join(text.stdout.split())
    assert "this task is exactly solvable" not in line
    assert "answered 71 of 250 rows (179 unparsed" in line and "does not show the task is exactly" in line


def test_only_a_solver_that_answers_every_row_and_accepts_every_clean_label_is_exact(tmp_path):
    prepared = release(tmp_path)
    items = read_benchmark(prepared.release_path, style="mc").items
    backdoors = prepared.key.backdoors
    backdoor_rows = {r for b in backdoors for r in b.rows}
    rejected = np.array([i in backdoor_rows for i in range(len(items))])  # every backdoor label rejected
    everything = np.ones(len(items), dtype=bool)
    exact = risk_from_rejections("exact", rejected, items, backdoors, 1e-3, answered=everything)
    assert exactly_solvable(exact) and "this task is exactly solvable" in verdict(exact)
    assert exact.answered == 250 and exact.unparsed == 0 and exact.accuracy == 1.0

    some = everything.copy()
    some[[i for i in range(len(items)) if i not in backdoor_rows][:5]] = False  # 5 clean rows unanswered
    partial = risk_from_rejections("partial", rejected, items, backdoors, 1e-3, answered=some)
    assert not exactly_solvable(partial) and partial.unparsed == 5 and partial.answered_clean == 250 - 50 - 5
    assert "this task is exactly solvable" not in verdict(partial)

    wrong = rejected.copy()
    wrong[next(i for i in range(len(items)) if i not in backdoor_rows)] = True  # one clean label rejected
    one_off = risk_from_rejections("one off", wrong, items, backdoors, 1e-3, answered=everything)
    assert not exactly_solvable(one_off) and one_off.accuracy == 1 - 1 / 200


def test_a_simulated_solver_of_accuracy_one_is_hypothetical(tmp_path):
    prepared = release(tmp_path)
    items = read_benchmark(prepared.release_path, style="mc").items
    perfect = simulated_risk(items, prepared.key.backdoors, 1.0, 1e-3)
    line = verdict(perfect)
    assert not exactly_solvable(perfect) and "this task is exactly solvable" not in line
    assert "hypothetical solver of accuracy 1" in line and "not measured" in line
    args = ["dyepack", "audit", str(prepared.release_path), "--key", str(prepared.key_path)]
    shown = CliRunner().invoke(root_app, [*args, "--solver-accuracy", "1.0"])
    assert shown.exit_code == 0, shown.output
    text = " ".join(shown.stdout.split())
    assert "hypothetical solver" in text and "this task is exactly solvable" not in text
