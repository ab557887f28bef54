"""Standings, the best score over time and the plateau indicator, on rows written straight to the store."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from assay.leaderboard import publish
from assay.store import Job, MetricResult, Round, Split, Submission, Team, open_store

T0 = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.fixture
def sessions(tmp_path: Path):
    sessions = open_store(f"sqlite:///{tmp_path / 'p.db'}")
    with sessions.begin() as session:
        round_ = Round(name="r", dataset="/d", status="open", plateau_days=14, plateau_delta=0.01)
        test = Split(name="test", models_path="/d/m", truth_path="/d/t")
        round_.splits = [test, Split(name="holdout", models_path="/d/h", truth_path="/d/ht")]
        teams = {name: Team(name=name) for name in ("a", "b")}
        session.add_all([round_, *teams.values()])
        # (team, day, cross entropy): a improves slowly after day 5, b never beats a
        for team, day, ce in [
            ("a", 0, 0.60),
            ("b", 1, 0.65),
            ("a", 5, 0.50),
            ("b", 8, 0.55),
            ("a", 20, 0.495),
        ]:
            sub = Submission(
                team=teams[team],
                split=test,
                artifact_path="x",
                artifact_sha256=f"{team}{day}",
                submitted_at=T0 + timedelta(days=day),
                status="done",
                technique=f"t{day}",
            )
            job = Job(submission=sub, status="done")
            job.metrics = [
                MetricResult(name="cross_entropy", value=ce),
                MetricResult(name="roc_auc", value=1 - ce),
            ]
            session.add(job)
    return sessions


def test_standings_best_per_team_and_all(sessions) -> None:
    with sessions() as session:
        best = publish.standings(session, "r", "test")
        every = publish.standings(session, "r", "test", best_per_team=False)
        hidden = publish.standings(session, "r", "holdout")
    assert [(r.rank, r.team, r.metrics["cross_entropy"]) for r in best] == [(1, "a", 0.495), (2, "b", 0.55)]
    assert [r.metrics["cross_entropy"] for r in every] == [0.495, 0.5, 0.55, 0.6, 0.65]
    assert hidden == []  # the round is still open
    lines = publish.to_csv(best).splitlines()
    assert lines[0].startswith("rank,team,submission_id,technique,submitted_at,status,cross_entropy")
    assert lines[1].startswith("1,a,")


def test_progress_running_best_and_plateau(sessions) -> None:
    with sessions() as session:
        late = publish.progress(session, "r", now=T0 + timedelta(days=20))
        early = publish.progress(session, "r", now=T0 + timedelta(days=10))
        steady = publish.progress(session, "r", now=T0 + timedelta(days=40))
    assert [v for _, v in late.overall] == [0.60, 0.60, 0.50, 0.50, 0.495]
    assert [v for _, v in late.teams["b"]] == [0.65, 0.55]
    # over days 6..20 the best went from 0.50 to 0.495: less than plateau_delta 0.01
    assert late.plateaued and late.improvement_in_window == pytest.approx(0.005, abs=1e-12)
    assert not early.plateaued and early.improvement_in_window is None  # younger than the window
    assert steady.plateaued and steady.improvement_in_window == pytest.approx(0.0, abs=1e-12)
