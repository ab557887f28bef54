"""The leaderboard's numbers as each viewer meets them (issue 47, items 1, 7 and 8): the organiser reads
exact test scores on every round's page and in ``assay leaderboard show``, counts read as integers, a
disclosed interval prints the digits that tell its ends apart, and the public rows say nothing of rounds a
visitor cannot see.

The round is the small fake ``assay zoo split`` folder of ``fake_board`` (4 models per split); scores come
from the harness's own ``score_job``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi import FastAPI
from starlette.testclient import TestClient
from typer.testing import CliRunner

from assay.leaderboard import rounds
from assay.leaderboard.cli import app as leaderboard_cli
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


def test_the_public_export_carries_no_submission_number(app: FastAPI, tmp_path: Path) -> None:
    """Item 8: ``assay leaderboard export`` writes the standings as anyone may see them: no numbers."""
    result = CliRunner().invoke(leaderboard_cli, ["export", "r1", "--out", str(tmp_path / "site")])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "site" / "test-all.csv").read_text().startswith("rank,team,technique,")
    assert "submission_id" not in (tmp_path / "site" / "test-all.json").read_text()
