"""Issue 35, item 2, from the attacker's side: no per-model fact of a sealed split leaves through the faces.

The attack (issue 35): a team polls its running test job; each step of ``models_done`` is one model's run
time, which its detector controls, and the run order was ``random.Random(job_id)`` over the sorted names
with the job id shown, so the steps named models. Three teams run by one person read 8 labels this way and
a team with no detector ranked 1 of 33. Here the job is driven as the harness drives it (one result
committed at a time) and the team's view is read after each: before the fix it changed at every model (16
distinct views on 16 models), now it is one view until the job finishes, and the organiser still sees the
count. The run order comes from OS entropy, not from anything the team sees.
"""

from __future__ import annotations

import random
from datetime import timedelta
from pathlib import Path

from fastapi import FastAPI

from assay.leaderboard import harness, rounds, submissions
from assay.runner import Task, TaskResult
from assay.store import Job, ModelResult, Submission
from assay.store.models import Worker, utcnow
from assay.web import accounts
from assay.web.app import create_app
from fake_board import fake_splits
from web_client import PASSWORD, signed_in

MODELS = [f"id-{i:08d}" for i in range(16)]


def _app(tmp_path: Path) -> tuple[FastAPI, int]:
    web = create_app(f"sqlite:///{tmp_path / 'web.db'}")
    with web.state.sessions.begin() as session:
        splits = fake_splits(tmp_path / "splits", {name: i % 2 for i, name in enumerate(MODELS)})
        round_ = rounds.create_round(session, "r1", splits)
        rounds.set_status(session, "r1", "open")
        team = rounds.add_team(session, "alpha")
        accounts.create_user(session, "tom", PASSWORD, ["team_member"], team=team)
        accounts.create_user(session, "olga", PASSWORD, ["organiser"])
        stored = tmp_path / "artifact"  # what the harness checks against the record before it runs
        stored.mkdir()
        (stored / "entrypoint.py").write_text("")
        submission = Submission(
            team=team,
            split=rounds.get_split(round_, "test"),
            artifact_path=str(stored),
            artifact_sha256=submissions.digest(stored),
            kind="folder",
            technique="probe",
            status="running",
        )
        now = utcnow()
        job = Job(submission=submission, status="running", claimed_at=now, started_at=now, heartbeat_at=now)
        session.add(job)
        session.flush()
        return web, job.id


def test_a_team_sees_no_model_finish_while_its_test_job_runs(tmp_path: Path) -> None:
    app, job_id = _app(tmp_path)
    team, organiser = signed_in(app, "tom"), signed_in(app, "olga")
    seen_by_team, seen_by_organiser, pages = set(), set(), set()
    for i, name in enumerate(MODELS):
        with app.state.sessions.begin() as session:  # as the harness commits each result
            session.add(
                ModelResult(job_id=job_id, model_name=name, value=0.5, flags="", wall_seconds=i + 0.5)
            )
        seen_by_team.add(team.get(f"/api/v1/leaderboard/jobs/{job_id}").text)
        seen_by_organiser.add(organiser.get(f"/api/v1/leaderboard/jobs/{job_id}").text)
        pages.add(team.get(f"/leaderboard/jobs/{job_id}").text.split("<main", 1)[-1])
    print(
        f"\nteam views of a running 16-model test job: {len(seen_by_team)} distinct (the organiser's: "
        f"{len(seen_by_organiser)}, as every team's were before)"
    )
    assert len(seen_by_organiser) == len(MODELS)  # the channel exists: the count moves at every model
    assert len(seen_by_team) == 1 and len(pages) == 1  # and no team face carries it
    record = team.get(f"/api/v1/leaderboard/jobs/{job_id}").json()
    assert record["models_done"] is None and record["hidden"] is True
    assert record["claimed_at"] is None and record["status"] == "submitted"  # issue 44: not even "running"
    page = pages.pop()
    assert 'id="job-done"' not in page and "<progress" not in page and " of 16 models" not in page


class _Recorder:
    """An executor that runs nothing and records the order it was handed the models in."""

    def __init__(self) -> None:
        self.order: list[str] = []

    def map(self, tasks: list[Task], on_result=None) -> list[TaskResult]:  # type: ignore[no-untyped-def]
        self.order += [task.key for task in tasks]
        return []


def test_the_run_order_comes_from_a_secret_not_the_job_id(tmp_path: Path) -> None:
    app, job_id = _app(tmp_path)
    orders = []
    for _ in range(3):
        recorder = _Recorder()
        harness.run_models(app.state.sessions, job_id, recorder)
        orders.append(recorder.order)
    by_job_id = sorted(MODELS)
    random.Random(job_id).shuffle(by_job_id)  # what a team could compute before
    assert all(sorted(order) == MODELS for order in orders)
    assert by_job_id not in orders and len({tuple(order) for order in orders}) == 3


def test_a_finished_sealed_job_shows_only_its_publication_on_the_hour(tmp_path: Path) -> None:
    """Issue 44: a job that has just finished still says "submitted"; once published on the round's
    hourly clock it says done, with the publication's time (on the hour) and no run time at all."""
    app, job_id = _app(tmp_path)
    tom = signed_in(app, "tom")
    with app.state.sessions.begin() as session:
        job = session.get(Job, job_id)
        assert job is not None
        job.status, job.finished_at = "done", utcnow()
    record = tom.get(f"/api/v1/leaderboard/jobs/{job_id}").json()
    assert record["status"] == "submitted" and not record["finished"] and record["finished_at"] is None
    with app.state.sessions.begin() as session:
        job = session.get(Job, job_id)
        assert job is not None
        job.claimed_at = utcnow() - timedelta(hours=3)
        job.finished_at = job.claimed_at + timedelta(seconds=1234)
    record = tom.get(f"/api/v1/leaderboard/jobs/{job_id}").json()
    assert record["finished"] and record["models_done"] is None and record["status"] == "done"
    assert record["claimed_at"] is None and record["finished_at"][14:19] == "00:00", record
    full = signed_in(app, "olga").get(f"/api/v1/leaderboard/jobs/{job_id}").json()
    assert full["hidden"] is False and full["models_done"] == 0


def test_a_queued_job_says_its_place_and_whether_any_worker_is_alive(tmp_path: Path) -> None:
    """Issue 39/36: "Waiting for a worker" with 8 jobs ahead and no worker alive said neither. (Practice
    jobs: a sealed job says only "submitted", issue 44.)"""
    app, first = _app(tmp_path)
    with app.state.sessions.begin() as session:
        job = session.get(Job, first)
        assert job is not None
        job.status = "queued"
        job.submission.split = rounds.get_split(job.submission.split.round, "train")
        second = Job(
            submission=Submission(
                team=job.submission.team,
                split=job.submission.split,
                artifact_path="/nowhere",
                artifact_sha256="1" * 64,
                technique="probe 2",
                status="queued",
            ),
            status="queued",
        )
        session.add(second)
        session.flush()
        second_id = second.id
    tom = signed_in(app, "tom")
    page = tom.get(f"/leaderboard/jobs/{second_id}").text
    assert "place 2 in the queue (1 job ahead)" in page and "no worker is alive right now" in page
    record = tom.get(f"/api/v1/leaderboard/jobs/{second_id}").json()
    assert (record["queue_place"], record["workers_alive"]) == (2, 0)
    with app.state.sessions.begin() as session:
        session.add(Worker(name="h:1", host="h", pid=1, version="x", isolation="bwrap", executor="local"))
        session.add(
            Worker(
                name="h:2",
                host="h",
                pid=2,
                version="x",
                isolation="none",
                executor="local",
                healthy=False,
                problem="no bwrap",
            )
        )
        session.add(
            Worker(
                name="h:3",
                host="h",
                pid=3,
                version="x",
                isolation="bwrap",
                executor="local",
                heartbeat_at=utcnow() - timedelta(minutes=5),
            )
        )  # dead: its stamp is stale
    page = tom.get(f"/leaderboard/jobs/{first}").text
    assert "next in the queue" in page and "1 worker alive" in page
