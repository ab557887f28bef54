"""``examples/check_demo.py``, what ``make demo`` ends each part with: on a fabricated demo-out folder that
did everything it should it passes; on one where every baseline job failed (issue 36: exit 0, empty
standings), a verdict is wrong or the STAR report is missing, it exits non-zero naming the step and why.

The files are shaped like what the demo writes: ``assay leaderboard results ID --json`` /
``show --json`` / ``status --json`` for the zoo, each ``verify`` folder's ``summary.json``, the STAR report.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

CHECKER = Path(__file__).resolve().parents[1] / "examples" / "check_demo.py"
BWRAP_FAILURE = (
    "model id-00000000: started\nharness error: test split needs bwrap isolation and this machine offers "
    "'unshare': install bubblewrap"
)


@pytest.fixture(scope="module")
def checker() -> ModuleType:
    spec = importlib.util.spec_from_file_location("check_demo", CHECKER)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _write(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2), encoding="utf-8")


def _standing(team: str, rank: int) -> dict[str, Any]:
    return {
        "rank": rank,
        "team": team,
        "submission_id": rank,
        "technique": "",
        "status": "done",
        "submitted_at": "2026-11-27T10:00:00Z",
        "metrics": {"cross_entropy": 0.6},
        "flagged_models": 2,
    }


def _good(out: Path) -> Path:
    """A demo-out folder as a demo that worked leaves it."""
    check = out / "zoo" / "check"
    for i, detector in enumerate(("constant", "meta_classifier", "neural_cleanse"), start=1):
        job = {"job_id": i, "submission_id": i, "status": "done", "models_done": 4, "models_total": 4}
        _write(check / f"results-{detector}.json", {"id": i, "job": job, "log": "model id-0: ok"})
    teams = [f"team-{d}" for d in ("meta_classifier", "neural_cleanse", "constant")]
    _write(check / "standings-test.json", [_standing(t, r) for r, t in enumerate(teams, start=1)])
    _write(check / "standings-holdout.json", [_standing(t, r) for r, t in enumerate(teams, start=1)])
    _write(check / "status.json", {"queued": 0, "running": 0, "stale": 0, "jobs": {"done": 6}, "rounds": []})
    for name, flagged, activated in (("verify-clean", False, 0), ("verify-contaminated", True, 6)):
        verdict = "CONTAMINATED: 6 of 6 ..." if flagged else "not flagged: 0 of 6 ..."
        summary = {"flagged": flagged, "verdict": verdict, "activated": activated, "backdoors": 6}
        _write(out / "dyepack" / name / "summary.json", summary)
    report = out / "star" / "report"
    _write(report / "summary.json", {"schema_version": 2, "n": {"dialogues": 24, "annotations": 48}})
    (report / "report.html").write_text("<!DOCTYPE html><title>report</title>", encoding="utf-8")
    return out


def _run(checker: ModuleType, out: Path, capsys: pytest.CaptureFixture[str], *parts: str) -> tuple[int, str]:
    code = checker.main([str(out), *parts])
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def test_a_demo_that_did_its_job_passes(checker: ModuleType, tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    code, output = _run(checker, _good(tmp_path / "demo-out"), capsys)
    assert code == 0, output
    assert "3 baseline jobs done" in output and "contaminated model flagged (6/6" in output
    assert "report with 24 dialogues" in output


def test_every_baseline_job_failed_fails_at_step_3_with_the_cause(
    checker: ModuleType, tmp_path: Path, capsys
) -> None:  # type: ignore[no-untyped-def]
    """The issue's demo: the worker could not sandbox, marked all three jobs failed, standings empty."""
    out = _good(tmp_path / "demo-out")
    check = out / "zoo" / "check"
    for detector in ("constant", "meta_classifier", "neural_cleanse"):
        job = {"job_id": 1, "status": "failed", "models_done": 0, "models_total": 4}
        _write(check / f"results-{detector}.json", {"job": job, "log": BWRAP_FAILURE})
    _write(check / "standings-test.json", [])
    code, output = _run(checker, out, capsys, "zoo-test")
    assert code == 1
    assert output.strip().splitlines() == [
        "demo check failed: zoo-demo step 3 (baselines on the test split): team-constant's job is failed, "
        "not done: harness error: test split needs bwrap isolation and this machine offers 'unshare': "
        "install bubblewrap"
    ]


@pytest.mark.parametrize(
    ("part", "spoil", "expected"),
    [
        (
            "zoo-test",
            lambda o: _write(o / "zoo/check/standings-test.json", []),
            "step 3 (baselines on the test split): the standings are empty",
        ),
        (
            "zoo-test",
            lambda o: (o / "zoo/check/results-neural_cleanse.json").unlink(),
            "results-neural_cleanse.json is missing",
        ),
        (
            "zoo-holdout",
            lambda o: _write(o / "zoo/check/status.json", {"jobs": {"done": 3, "failed": 3}}),
            "step 4 (holdout after closing the round): jobs not all done (3 done, 3 failed)",
        ),
        (
            "zoo-holdout",
            lambda o: _write(o / "zoo/check/standings-holdout.json", []),
            "step 4 (holdout after closing the round): the standings are empty",
        ),
        (
            "dyepack",
            lambda o: _write(
                o / "dyepack/verify-clean/summary.json", {"flagged": True, "verdict": "CONTAMINATED: 1 of 6"}
            ),
            "step 2 (verify the clean model): expected not flagged, got: CONTAMINATED: 1 of 6",
        ),
        (
            "dyepack",
            lambda o: _write(
                o / "dyepack/verify-contaminated/summary.json",
                {"flagged": False, "verdict": "not flagged: 2 of 6"},
            ),
            "step 3 (verify the contaminated model): expected CONTAMINATED, got: not flagged: 2 of 6",
        ),
        (
            "star",
            lambda o: (o / "star/report/report.html").unlink(),
            "star-demo step 3 (report):",
        ),
        (
            "star",
            lambda o: _write(o / "star/report/summary.json", {"n": {"dialogues": 0}}),
            "the report counts no dialogues",
        ),
    ],
)
def test_each_fault_fails_its_step(
    checker: ModuleType, tmp_path: Path, capsys, part: str, spoil, expected: str
) -> None:  # type: ignore[no-untyped-def]
    out = _good(tmp_path / "demo-out")
    spoil(out)
    code, output = _run(checker, out, capsys, part)
    assert code == 1 and expected in output, output
    assert _run(checker, out, capsys)[0] == 1  # the Makefile's final check of everything fails too


def test_unknown_parts_are_a_usage_error(checker: ModuleType, tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    assert _run(checker, tmp_path, capsys, "zooo")[0] == 2
