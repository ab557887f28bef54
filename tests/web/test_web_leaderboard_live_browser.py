"""The leaderboard's pages in Chromium as the organiser and a team meet them (issue 47).

The live job page (item 2): every line the page shows follows the job's state, its start included
(before, "Started ..." appeared only on a reload).
Before, "Waiting for a worker ... no worker is alive right now" stayed for the whole run beside "Status:
running" (the script updated the status and the count, never the waiting line).

No worker runs here: the test moves the job through its states in the store, as a worker would, and reads
what the page (``leaderboard.js``, polling every 2 s) says after each step.

The organiser's round page (item 1) showed an empty score cell on every test row, and the submission page
(item 7) "Cells of the grid 128.0000".
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from playwright.sync_api import expect
from sqlalchemy import update

from assay.leaderboard import rounds
from assay.store import Job, ModelResult, Submission
from assay.store.models import utcnow
from assay.web import accounts
from assay.web.app import create_app
from browser import chromium_page, screenshot, sign_in_page  # tests/ is on sys.path
from fake_board import ANSWERS, TRUTH, fake_splits, scored
from web_client import PASSWORD
from web_server import serve_in_thread

pytestmark = pytest.mark.slow  # drives chromium


def test_the_job_page_drops_the_waiting_line_once_a_worker_has_the_job(tmp_path: Path) -> None:
    app = create_app(f"sqlite:///{tmp_path / 'web.db'}")
    with app.state.sessions.begin() as session:
        rounds.create_round(session, "r1", fake_splits(tmp_path / "splits"), submission_window_s=0)
        rounds.set_status(session, "r1", "open")
        alpha = rounds.add_team(session, "alpha")
        accounts.create_user(session, "tom", PASSWORD, ["team_member"], team=alpha)
        sub = Submission(
            team=alpha,
            split=rounds.get_split(rounds.get_round(session, "r1"), "train"),
            artifact_path="/nowhere",
            artifact_sha256="0" * 64,
            technique="practice",
            status="queued",
        )
        job = Job(submission=sub, status="queued")
        session.add(job)
        session.flush()
        job_id = job.id

    with serve_in_thread(app) as base_url, chromium_page() as page:
        page.goto(f"{base_url}/login?next=/leaderboard/jobs/{job_id}")
        page.fill("#username", "tom")
        page.fill("#password", PASSWORD)
        page.click("button:has-text('Sign in')")
        page.wait_for_url(f"**/leaderboard/jobs/{job_id}")
        assert "Waiting for a worker: next in the queue" in page.inner_text("#job-queue")
        assert not page.locator("#job-started").is_visible()

        claimed = utcnow()
        with app.state.sessions.begin() as session:  # a worker claims the job and finishes 3 of 4 models
            session.execute(update(Job).where(Job.id == job_id).values(status="running", claimed_at=claimed))
            for name in list(TRUTH)[:3]:
                done = ModelResult(job_id=job_id, model_name=name, value=0.5, flags="", wall_seconds=1.0)
                session.add(done)
        expect(page.locator("#job-done")).to_have_text("3", timeout=15_000)  # the page polled (CSP: no eval)
        screenshot(page, "leaderboard-job-running")
        assert page.inner_text("#job-status") == "running"
        line = page.locator("#job-queue")
        assert line.count() == 0 or not line.is_visible() or "Waiting" not in line.inner_text()
        assert "Waiting for a worker" not in page.inner_text("#job-progress")
        # the start shows without a reload, written as the server writes it (before: only on reload)
        expect(page.locator("#job-started")).to_be_visible()
        assert page.inner_text("#job-started").strip() == f"Started {claimed.strftime('%Y-%m-%d %H:%M')} UTC."


def test_the_organiser_reads_exact_scores_and_whole_counts(tmp_path: Path) -> None:
    app = create_app(f"sqlite:///{tmp_path / 'web.db'}")
    with app.state.sessions.begin() as session:
        rounds.create_round(session, "r1", fake_splits(tmp_path / "splits"), submission_window_s=0)
        rounds.set_status(session, "r1", "open")
        rounds.add_team(session, "alpha")
        accounts.create_user(session, "olga", PASSWORD, ["organiser"])
    sub_id = scored(app.state.sessions, "alpha", "test", ANSWERS)

    with serve_in_thread(app) as base_url, chromium_page() as page:
        sign_in_page(page, base_url, "olga", PASSWORD, "/leaderboard/rounds/r1")
        row = page.locator("#test-best tbody tr").first
        cells = [text.strip() for text in row.locator("td").all_inner_texts()]
        screenshot(page, "leaderboard-round-organiser")
        assert "" not in cells[:4] and re.fullmatch(r"0\.\d{4}", cells[3]), cells  # the exact cross entropy
        page.goto(f"{base_url}/leaderboard/submissions/{sub_id}")
        grid = page.locator("#metrics tr", has_text="Cells of the grid").locator("td").inner_text()
        assert re.fullmatch(r"\d+", grid), grid
