"""The leaderboard's numbers as each viewer meets them (issue 47, items 1, 7 and 8): the organiser reads
exact test scores on every round's page and in ``assay leaderboard show``, counts read as integers, a
disclosed interval prints the digits that tell its ends apart, and the public rows say nothing of rounds a
visitor cannot see.

The round is the small fake ``assay zoo split`` folder of ``fake_board`` (4 models per split); scores come
from the harness's own ``score_job``.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from fastapi import FastAPI
from sqlalchemy import select
from starlette.testclient import TestClient
from typer.testing import CliRunner

from assay.leaderboard import rounds
from assay.leaderboard.cli import app as leaderboard_cli
from assay.store.models import utcnow
from assay.web import accounts
from assay.web.app import create_app
from fake_board import ANSWERS, fake_splits, scored
from web_client import PASSWORD, signed_in


@pytest.fixture
def app(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FastAPI:
    """An open round r1 with a scored test job of alpha's; the command line opens the same store."""
    url = f"sqlite:///{tmp_path / 'web.db'}"
    monkeypatch.setenv("ASSAY_DB_URL", url)
    web = create_app(url)
    with web.state.sessions.begin() as session:
        rounds.create_round(session, "r1", fake_splits(tmp_path / "splits"), submission_window_s=0)
        rounds.set_status(session, "r1", "open")
        alpha = rounds.add_team(session, "alpha")
        accounts.create_user(session, "olga", PASSWORD, ["organiser"])
        accounts.create_user(session, "tom", PASSWORD, ["team_member"], team=alpha)
    scored(web.state.sessions, "alpha", "test", ANSWERS)
    return web


def exact_ce(app: FastAPI) -> float:
    """alpha's exact test cross entropy, as the store holds it."""
    olga = signed_in(app, "olga")
    return olga.get("/api/v1/leaderboard/rounds/r1/standings").json()["rows"][0]["metrics"]["cross_entropy"]


@pytest.mark.parametrize("state", ["open", "closed"])
def test_the_organiser_reads_exact_test_scores_on_the_round_page(app: FastAPI, state: str) -> None:
    """Item 1: no empty score cell for the organiser, on an open round and a closed one."""
    if state == "closed":
        with app.state.sessions.begin() as session:
            rounds.set_status(session, "r1", "closed")
    page = signed_in(app, "olga").get("/leaderboard/rounds/r1").text
    assert '<td class="shown"></td>' not in page
    assert f"{exact_ce(app):.4f}" in page


def test_the_organiser_reads_exact_test_scores_on_the_command_line(app: FastAPI) -> None:
    """Item 1: ``assay leaderboard show`` as the organiser prints the exact score, not an empty column."""
    result = CliRunner().invoke(leaderboard_cli, ["show", "r1"], terminal_width=200)
    assert result.exit_code == 0, result.output
    assert "(shown)" not in result.output and f"{exact_ce(app):.4f}" in result.output


def test_public_rows_carry_no_submission_number(app: FastAPI) -> None:
    """Item 8: submission numbers count every round's submissions, so a row carries its number only for a
    viewer who may open it (its team, the organisers); a visitor's and an outsider's rows have none."""
    scored(app.state.sessions, "alpha", "test", dict.fromkeys(ANSWERS, 0.5), ago_h=3)
    with app.state.sessions.begin() as session:
        rounds.set_public(session, "r1", True)
    path = "/api/v1/leaderboard/rounds/r1/standings?all=true"
    visitor = TestClient(app).get(path).json()["rows"]
    with app.state.sessions.begin() as session:
        accounts.create_user(session, "vic", PASSWORD, ["viewer"])
    outsider = signed_in(app, "vic").get(path).json()["rows"]
    own = signed_in(app, "tom").get(path).json()["rows"]
    assert len(visitor) == 2 and all("submission_id" not in row for row in visitor + outsider)
    assert all(isinstance(row["submission_id"], int) for row in own)
    assert set(visitor[0]) == {
        "rank", "team", "technique", "submitted_at", "status", "metrics", "flagged_models", "tied_with",
        "summary",
    }  # fmt: skip


def test_the_api_schema_still_lists_a_row_fields(app: FastAPI) -> None:
    """Item 8: dropping the number from a row's JSON keeps the documented schema of a row whole."""
    schema = TestClient(app).get("/api/v1/openapi.json").json()["components"]["schemas"]
    row = next(value for name, value in schema.items() if name.split("-")[0] == "Standing")
    assert {"rank", "team", "submission_id", "metrics", "summary"} <= set(row["properties"])


def test_the_public_export_carries_no_submission_number(app: FastAPI, tmp_path: Path) -> None:
    """Item 8: ``assay leaderboard export`` writes the standings as anyone may see them: no numbers."""
    result = CliRunner().invoke(leaderboard_cli, ["export", "r1", "--out", str(tmp_path / "site")])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "site" / "test-all.csv").read_text().startswith("rank,team,technique,")
    assert "submission_id" not in (tmp_path / "site" / "test-all.json").read_text()


def cells(page: str, label: str) -> str:
    """The text of the metrics table's cell beside ``label`` on a submission page."""
    found = re.search(rf"<th scope=\"row\">{re.escape(label)}</th><td class=\"num\">([^<]*)</td>", page)
    assert found is not None, label
    return found.group(1)


@pytest.mark.parametrize("answer", [0.5, 0.62])
def test_a_disclosed_score_prints_as_an_interval_and_its_counts_as_integers(
    app: FastAPI, answer: float
) -> None:
    """Item 7: "Cells of the grid 128.0000", "Showings these answers allow 1.0000", and "at least 0.6931 /
    at most 0.6931" for an interval whose ends differ past the fourth decimal."""
    sub_id = scored(app.state.sessions, "alpha", "test", dict.fromkeys(ANSWERS, answer), ago_h=3)
    record = signed_in(app, "olga").get(f"/api/v1/leaderboard/submissions/{sub_id}").json()["metrics"]
    for viewer in ("tom", "olga"):
        page = signed_in(app, viewer).get(f"/leaderboard/submissions/{sub_id}").text
        low, high = cells(page, "Disclosed score: at least"), cells(page, "Disclosed score: at most")
        assert (low == high) == (record["shown_low"] == record["shown_high"]), (low, high)
        width = record["shown_high"] - record["shown_low"]
        assert (
            abs(float(low) - record["shown_low"])
            <= width / 2 + 5e-5
            >= abs(float(high) - record["shown_high"])
        )
        for label, key in (
            ("Cells of the grid", "shown_cells"),
            ("Showings these answers allow", "shown_showings"),
        ):
            if key in record:
                assert cells(page, label) == str(int(record[key])), label


def test_a_trigger_group_reads_in_words() -> None:
    """Item 7: the "By trigger" table showed the METADATA's raw JSON spec."""
    from assay.leaderboard.views import group_name

    spec = '{"kind":"solid_patch","size":4,"location":"bottom_right","color":[255,0,0]}'
    assert group_name("trigger", spec, {"positives": 1}) == (
        "solid patch: size 4, location bottom right, color (255, 0, 0)"
    )
    assert group_name("trigger", '{"kind":"filter","gamma":0.81}', {"positives": 2}) == "filter: gamma 0.81"
    assert group_name("trigger", "[1, 2]", {"positives": 2}) == "[1, 2]"  # JSON but no spec: as it is


def test_a_closed_round_says_its_best_is_final(app: FastAPI) -> None:
    """Item 7: a closed round said "Best so far 0.1713 (still improving)"."""
    from assay.leaderboard.submissions import close_round

    with app.state.sessions.begin() as session:
        close_round(session, "r1")
    for viewer in ("tom", "olga"):
        page = signed_in(app, viewer).get("/leaderboard/rounds/r1").text
        assert "still improving" not in page and "Best so far" not in page
        assert re.search(r"<dt>Best</dt><dd>[\d.]+ \(final: the round is closed\)</dd>", page), viewer
    result = CliRunner().invoke(leaderboard_cli, ["show", "r1"], terminal_width=200)
    assert "still improving" not in result.output and "(final: the round is closed)" in result.output


def test_a_holdout_row_says_when_its_team_submitted(app: FastAPI) -> None:
    """Item 7: a holdout row's "Submitted" was the moment the close queued it, not the team's act."""
    from assay.leaderboard.publish import standings
    from assay.leaderboard.submissions import close_round
    from assay.store import Submission

    with app.state.sessions.begin() as session:
        (rerun,) = close_round(session, "r1")
        test = session.scalars(select(Submission).where(Submission.id != rerun.id)).one()
        assert rerun.submitted_at == test.submitted_at
        holdout_id = rerun.id
    with app.state.sessions.begin() as session:  # run and scored: the holdout row has the test's time
        job = session.get_one(Submission, holdout_id).job
        job.status, job.finished_at = "done", utcnow()
    with app.state.sessions() as session:
        rows = standings(session, "r1", "holdout")
        assert len(rows) == 1 and rows[0].submitted_at == test.submitted_at
