"""The leaderboard in a real browser: a team member signs in, uploads detectors/constant as a .tar.gz for the
``small_round`` test split, a real worker (the leaderboard's own ``work``, in a thread) runs it in the
sandbox, the job page follows it live (leaderboard.js) to the end, and the team's row is on the standings.

Screenshots: build/test-artifacts/screenshots/leaderboard-*.png.
"""

from __future__ import annotations

import re
import tarfile
import threading
from pathlib import Path
from typing import Any

import pytest

from assay.leaderboard import rounds
from assay.leaderboard.worker import work
from assay.runner import LocalExecutor
from assay.web import accounts
from assay.web.app import create_app
from browser import chromium_page, screenshot  # tests/ is on sys.path
from web_client import PASSWORD
from web_server import serve_in_thread

PROJECT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow  # drives chromium


def note_error(message: Any, problems: list[str]) -> None:
    """Keep console errors (script errors, CSP violations); the browser's own favicon probe is not ours."""
    if message.type == "error" and not message.location.get("url", "").endswith("/favicon.ico"):
        problems.append(f"{message.text} at {message.location}")


def test_upload_run_and_rank_in_a_browser(small_round: Path, tmp_path: Path) -> None:
    app = create_app(f"sqlite:///{tmp_path / 'web.db'}")
    sessions = app.state.sessions
    with sessions.begin() as session:
        rounds.create_round(
            session,
            "r1",
            small_round / "splits",
            submission_window_s=3600,
            per_model_timeout_s=60,
            publish_every_s=2,  # a fast clock: the sealed job is published within 2 s of its end
        )
        rounds.set_status(session, "r1", "open")
        alpha = rounds.add_team(session, "alpha")
        accounts.create_user(session, "tom", PASSWORD, ["team_member"], team=alpha, display_name="Tom")
    archive = tmp_path / "constant.tar.gz"
    with tarfile.open(archive, "w:gz") as packed:
        packed.add(PROJECT / "detectors" / "constant", arcname="constant")
    worker = threading.Thread(target=work, args=(sessions, LocalExecutor(1)), kwargs={"once": True})

    with serve_in_thread(app) as base_url, chromium_page() as page:
        problems: list[str] = []
        page.on("console", lambda msg: note_error(msg, problems))
        page.goto(f"{base_url}/login?next=/leaderboard/rounds/r1/submit")
        page.fill("#username", "tom")
        page.fill("#password", PASSWORD)
        page.click("button:has-text('Sign in')")
        page.wait_for_url("**/leaderboard/rounds/r1/submit")
        assert "can submit to the test split now" in page.inner_text("#window")
        page.select_option("#split", "test")
        page.set_input_files("#archive", str(archive))
        screenshot(page, "leaderboard-upload")
        page.click("button:has-text('Upload and queue')")
        page.wait_for_url("**/leaderboard/jobs/*")
        # a test job of an open round says only that it was submitted until its publication (issue 44)
        assert page.inner_text("#job-status") == "submitted" and page.inner_text("#job-total") == "5"
        assert page.is_visible("#job-live")  # leaderboard.js took over the refreshing
        screenshot(page, "leaderboard-job-queued")

        worker.start()
        page.wait_for_selector("#job-finished", timeout=180_000)  # the script reloads when it ends
        worker.join(60)
        # a test job of an open round: its team sees no count of models done (issue 35), nor when it ran
        assert page.inner_text("#job-status") == "done" and page.locator("#job-done").count() == 0
        assert "published on the round's clock" in page.inner_text("#job-sealed")
        screenshot(page, "leaderboard-job")

        page.click("#job-finished a:has-text('the standings')")
        page.wait_for_url("**/leaderboard/rounds/r1")
        row = page.locator("#test-best tbody tr").first
        cells = row.locator("td").all_inner_texts()
        assert cells[:3] == ["1", "alpha", "constant #1"]
        # the constant 0.5 scores ln 2 whatever the labels, so the refined board may show it exactly
        assert re.match(r"test CE between 0\.69314\d* and 0\.69314\d*; rank 1 of 1;", cells[3]), cells[3]
        assert "next test submission is allowed from" in page.inner_text("#window")
        assert page.is_visible("#holdout-hidden")
        screenshot(page, "leaderboard-round")

        row.locator("a").click()
        page.wait_for_url("**/leaderboard/submissions/1")
        # the round is open: the team sees its disclosed score, no ROC curve (docs/leaderboard.md)
        assert page.is_visible("#sealed") and page.locator("figure.roc svg").count() == 0
        screenshot(page, "leaderboard-submission")
        assert problems == []  # no script errors, no content-security-policy violations


def test_train_results_read_plainly_in_a_browser(tmp_path: Path) -> None:
    """Issue 39, item 4, as chromium shows it (fake round, no worker): the ROC plot's tick labels and axis
    titles are drawn inside the figure, the truth reads trojaned/clean, times are worded, and a queued
    submission says in words when its results come; no CSP violation."""
    from sqlalchemy import select

    from assay.store import Job, ModelResult, Submission
    from fake_board import ANSWERS, TRUTH, fake_splits, scored

    app = create_app(f"sqlite:///{tmp_path / 'web.db'}")
    sessions = app.state.sessions
    with sessions.begin() as session:
        rounds.create_round(session, "r1", fake_splits(tmp_path / "splits"))
        rounds.set_status(session, "r1", "open")
        alpha = rounds.add_team(session, "alpha")
        accounts.create_user(session, "tom", PASSWORD, ["team_member"], team=alpha)
    train_id = scored(sessions, "alpha", "train", ANSWERS)
    with sessions.begin() as session:
        for result in session.scalars(select(ModelResult)):
            result.wall_seconds = 250.0
        train = rounds.get_split(rounds.get_round(session, "r1"), "train")
        team = rounds.get_team(session, "alpha")
        waiting = Submission(team=team, split=train, artifact_path="x", artifact_sha256="w", status="queued")
        session.add(Job(submission=waiting, status="queued"))
        session.flush()
        waiting_id = waiting.id

    with serve_in_thread(app) as base_url, chromium_page() as page:
        problems: list[str] = []
        page.on("console", lambda msg: note_error(msg, problems))
        page.goto(f"{base_url}/login?next=/leaderboard/submissions/{train_id}")
        page.fill("#username", "tom")
        page.fill("#password", PASSWORD)
        page.click("button:has-text('Sign in')")
        page.wait_for_url(f"**/leaderboard/submissions/{train_id}")
        figure = page.locator("figure.roc svg")
        box = figure.bounding_box()
        texts = figure.locator("text")
        shown = texts.all_text_contents()  # SVG text has no innerText
        assert [shown.count(t) for t in ("0", "0.25", "0.5", "0.75", "1")] == [2] * 5
        assert {"false positive rate", "true positive rate"} <= set(shown)
        for i in range(texts.count()):  # every label drawn inside the figure, none clipped
            label = texts.nth(i).bounding_box()
            assert (
                box["x"] - 0.5 <= label["x"] <= label["x"] + label["width"] <= box["x"] + box["width"] + 0.5
            )
            assert (
                box["y"] - 0.5 <= label["y"] <= label["y"] + label["height"] <= box["y"] + box["height"] + 1
            )
        rows = page.locator("#models tbody tr").all_inner_texts()
        assert len(rows) == len(TRUTH) and all("4 min 10 s" in row for row in rows)
        assert sorted("trojaned" in row for row in rows) == sorted(bool(t) for t in TRUTH.values())
        screenshot(page, "leaderboard-train-submission")

        page.goto(f"{base_url}/leaderboard/submissions/{waiting_id}")
        assert "results per model appear here when it runs" in page.inner_text("#models-pending")
        assert page.locator("#models").count() == 0
        assert problems == []
