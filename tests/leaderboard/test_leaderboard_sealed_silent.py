"""Issue 44 from the attacker's side: a sealed job is silent until its publication on the round's clock.

The attack: a team submits a test job and polls every face it has (the submission record and the job from
the JSON API, the logs, ``assay leaderboard results --as-team --json``, the submission, job and round pages,
the test standings) while a real worker runs it: a detector that sleeps and writes a result file with a
trailing line (the job log's warning, and its ``isolation:`` line, once appeared mid-run: about 10 bits
each per submission; the running -> done flip told when the last model finished). Every view taken before
the round's clock publishes the job must be one and the same; after it, the showing appears. Meanwhile
another team's practice job waits behind the sealed one: its place in the queue must not move when the
sealed job starts (it moved with other teams' test jobs, their durations to 0.1 s).

Before the fix the team saw 3 or more distinct records (queued, running, done; the isolation line and the
warning) and the other team's place went from 2 to 1.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from fastapi import FastAPI
from sqlalchemy import select
from starlette.testclient import TestClient
from test_leaderboard import fake_detector
from typer.testing import CliRunner

from assay.leaderboard import rounds, sealing, submissions
from assay.leaderboard.cli import app as leaderboard_cli
from assay.leaderboard.worker import work
from assay.runner import LocalExecutor, isolation
from assay.store import Job, open_store
from assay.web import accounts
from assay.web.app import create_app
from fake_board import fake_splits
from web_client import PASSWORD, signed_in

pytestmark = pytest.mark.skipif(
    isolation.isolation_available() != "bwrap", reason="sealed jobs need bubblewrap"
)

CLOCK_S = 3  # the round's clock: a fast one, so the test sees a publication within seconds
SLEEPER = (
    "time.sleep(0.3)\nopen(args.result_filepath, 'w').write('0.9\\ntrailing line chosen by the detector')\n"
)


def _board(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[FastAPI, str]:
    """An open round on a fast clock, a sealed test job of team alpha, then a practice job of team bob."""
    monkeypatch.setenv("ASSAY_ARGON2_FAST", "1")
    url = f"sqlite:///{tmp_path / 'lb.db'}"
    monkeypatch.setenv("ASSAY_DB_URL", url)  # what the command line opens
    app = create_app(url)
    with app.state.sessions.begin() as session:
        splits = fake_splits(tmp_path / "splits")
        rounds.create_round(session, "r1", splits, submission_window_s=0, publish_every_s=CLOCK_S)
        rounds.set_status(session, "r1", "open")
        alpha, bob = rounds.add_team(session, "alpha"), rounds.add_team(session, "bob")
        accounts.create_user(session, "tom", PASSWORD, ["team_member"], team=alpha)
        accounts.create_user(session, "bea", PASSWORD, ["team_member"], team=bob)
    detector = fake_detector(tmp_path / "d", SLEEPER)
    with app.state.sessions.begin() as session:
        submissions.submit(session, tmp_path / "artifacts", "alpha", "r1", "test", detector)
    with app.state.sessions.begin() as session:
        practice = fake_detector(tmp_path / "p", "open(args.result_filepath, 'w').write('0.5')")
        submissions.submit(session, tmp_path / "artifacts", "bob", "r1", "train", practice)
    return app, url


def _cli(*args: str) -> str:
    result = CliRunner().invoke(leaderboard_cli, list(args))
    assert result.exit_code == 0, (args, result.output, result.exception)
    return result.stdout


def _faces(tom: TestClient) -> dict[str, Callable[[], str]]:
    """Every face team alpha has onto its submission 1 (job 1), each read as text."""

    def page(path: str) -> Callable[[], str]:
        return lambda: tom.get(path).text.split("<main", 1)[-1]

    return {
        "api submission": lambda: tom.get("/api/v1/leaderboard/submissions/1").text,
        "api job": lambda: tom.get("/api/v1/leaderboard/jobs/1").text,
        "logs": lambda: tom.get("/leaderboard/submissions/1/logs").text,
        "api standings": lambda: tom.get("/api/v1/leaderboard/rounds/r1/standings?all=true").text,
        "submission page": page("/leaderboard/submissions/1"),
        "job page": page("/leaderboard/jobs/1"),
        "round page": page("/leaderboard/rounds/r1"),
        "cli results": lambda: _cli("results", "1", "--as-team", "alpha", "--json"),
    }


def _bob_place(bea: TestClient) -> int | None:
    return bea.get("/api/v1/leaderboard/jobs/2").json()["queue_place"]


def _finished_at(url: str):  # type: ignore[no-untyped-def]
    with open_store(url)() as session:
        return session.scalar(select(Job.finished_at).where(Job.id == 1))


def test_a_sealed_job_shows_nothing_until_the_round_publishes_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    app, url = _board(tmp_path, monkeypatch)
    tom, bea = signed_in(app, "tom"), signed_in(app, "bea")
    faces = _faces(tom)
    organiser_statuses: set[str] = set()
    places = [_bob_place(bea)]
    polls: list[tuple[float, float, dict[str, str]]] = []  # (asked at, answered by, what every face said)
    worker = threading.Thread(target=work, args=(open_store(url), LocalExecutor(2)), kwargs={"once": True})
    worker.start()
    deadline = time.time() + 90
    while time.time() < deadline:
        asked = time.time()
        seen = {name: read() for name, read in faces.items()}
        polls.append((asked, time.time(), seen))
        place = _bob_place(bea)
        if place is not None:
            places.append(place)
        organiser_statuses.add(json.loads(_cli("results", "1", "--json"))["status"])
        finished = None if worker.is_alive() else _finished_at(url)
        if finished is not None and asked > sealing.publication_time(CLOCK_S, finished).timestamp() + 0.5:
            break
        time.sleep(0.1)
    worker.join(timeout=60)
    published = sealing.publication_time(CLOCK_S, _finished_at(url)).timestamp()
    before = [seen for _, answered, seen in polls if answered < published]
    after = [seen for asked, _, seen in polls if asked >= published]
    print(
        f"\n{len(before)} polls of {len(faces)} faces before the publication, {len(after)} after; "
        f"distinct views before: {len({json.dumps(s, sort_keys=True) for s in before})}; the organiser saw "
        f"{sorted(organiser_statuses)}; the other team's queue places: {places}"
    )
    assert len(organiser_statuses) >= 2  # the channel is there: the organiser saw the job move
    assert len(before) >= 3 and after
    for name in faces:
        views_before = {seen[name] for seen in before}
        assert len(views_before) == 1, (name, views_before)
    frozen = json.loads(before[0]["api submission"])
    assert frozen["status"] == "submitted" and frozen["job"]["status"] == "submitted"
    assert "isolation" not in before[0]["logs"] and "trailing" not in before[0]["logs"]
    shown = json.loads(after[-1]["api submission"])
    assert shown["status"] == "done" and shown["metrics"]["shown_low"] <= shown["metrics"]["shown_high"]
    assert (
        shown["flag_counts"] == {}
        and "when the round closes" in shown["log"]
        and shown["job"]["claimed_at"] is None
    )
    assert shown["job"]["finished_at"].startswith(
        sealing.publication_time(CLOCK_S, _finished_at(url)).isoformat()[:19]
    )
    assert "isolation" not in after[-1]["logs"] and "lines after the first" not in after[-1]["logs"]
    assert len(set(places)) == 1, places  # the practice job's place never moved with the sealed job
