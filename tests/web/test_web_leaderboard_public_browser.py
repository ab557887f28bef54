"""Public standings in a real browser: a visitor who never signs in opens the site, follows the nav to the
leaderboard, finds the public round (and not the private one), opens it and reads the standings.

Screenshots: build/test-artifacts/screenshots/leaderboard-public-*.png.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from assay.leaderboard import rounds
from assay.web.app import create_app
from browser import chromium_page, screenshot  # tests/ is on sys.path
from fake_board import ANSWERS, TRUTH, fake_splits, scored
from web_server import serve_in_thread

pytestmark = pytest.mark.slow  # drives chromium


def note_error(message: Any, problems: list[str]) -> None:
    """Keep console errors (script errors, CSP violations) but the 404 this test asks for on purpose."""
    if message.type == "error" and "404" not in message.text:
        problems.append(f"{message.text} at {message.location}")


def test_a_visitor_reads_a_public_round_and_never_sees_a_private_one(tmp_path: Path) -> None:
    app = create_app(f"sqlite:///{tmp_path / 'web.db'}")
    with app.state.sessions.begin() as session:
        rounds.create_round(session, "spring", fake_splits(tmp_path / "splits"), submission_window_s=3600)
        rounds.create_round(session, "secret", tmp_path / "splits")
        for name in ("spring", "secret"):
            rounds.set_status(session, name, "open")
        rounds.set_public(session, "spring", True)
        for team in ("alpha", "beta"):
            rounds.add_team(session, team)
    for team, answers in (("alpha", ANSWERS), ("beta", dict.fromkeys(TRUTH, 0.5))):
        scored(app.state.sessions, team, "test", answers, round_name="spring")

    with serve_in_thread(app) as base_url, chromium_page() as page:
        problems: list[str] = []
        page.on("console", lambda msg: note_error(msg, problems))
        page.goto(base_url + "/")
        page.click("nav a:has-text('Leaderboard')")
        page.wait_for_url("**/leaderboard")
        listed = page.locator("table.rounds tbody a").all_inner_texts()
        assert listed == ["spring"]  # the private round is not listed
        screenshot(page, "leaderboard-public-rounds")

        page.click("table.rounds a:has-text('spring')")
        page.wait_for_url("**/leaderboard/rounds/spring")
        rows = page.locator("#test-best tbody tr")
        assert rows.count() == 2
        teams = [rows.nth(i).locator("td").nth(1).inner_text() for i in range(2)]
        assert teams == ["alpha", "beta"]  # alpha's answers beat a constant 0.5
        shown = rows.first.locator("td.shown").inner_text()  # the disclosed interval, in words
        assert "between" in shown and "exact score when the round closes" in shown
        assert page.locator("#test-best a").count() == 0  # no team's submission pages
        assert "Sign in" in page.inner_text("#public-note")
        assert page.locator("form").count() == 0  # read only: no form at all, not even sign-out
        screenshot(page, "leaderboard-public-round")

        answer = page.goto(base_url + "/leaderboard/rounds/secret")
        assert answer is not None and answer.status == 404
        assert "secret" not in page.inner_text("main") and "Sign in" in page.inner_text("main")
        assert problems == []
