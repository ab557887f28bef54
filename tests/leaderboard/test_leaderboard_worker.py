"""A worker that cannot do its job claims nothing, and a fault of the platform is never the team's failure.

Real detectors through the real worker on the small fake round (4 empty models per split) and a real
SQLite file; bubblewrap made unusable by the runner's own probe (in process) or by a PATH without it (a
``python -m assay leaderboard worker`` subprocess).
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import select, update
from sqlalchemy.exc import OperationalError
from test_leaderboard import fake_detector

from assay.errors import UserError
from assay.leaderboard import rounds, submissions
from assay.leaderboard import worker as worker_module
from assay.leaderboard.worker import work
from assay.runner import LocalExecutor, isolation
from assay.runner.task import Task, TaskResult
from assay.store import Job, Submission, open_store
from assay.store.models import utcnow
from fake_board import TRUTH, fake_splits

ANSWER = "open(args.result_filepath, 'w').write('0.25')"


@pytest.fixture
def lb(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """An open round over the fake splits, practice runs allowed unisolated (so the tests run anywhere),
    one team, a one-hour window; the database in ASSAY_DB_URL for subprocess workers."""
    url = f"sqlite:///{tmp_path / 'lb.db'}"
    monkeypatch.setenv("ASSAY_DB_URL", url)
    sessions = open_store(url)
    with sessions.begin() as session:
        rounds.create_round(
            session,
            "r1",
            fake_splits(tmp_path / "splits"),
            submission_window_s=3600,
            allow_unisolated=True,
        )
        rounds.set_status(session, "r1", "open")
        rounds.add_team(session, "alpha")
    return sessions


def submit(sessions, tmp_path: Path, name: str, body: str = ANSWER, split: str = "test") -> Submission:
    with sessions.begin() as session:
        made = submissions.submit(
            session, tmp_path / "artifacts", "alpha", "r1", split, fake_detector(tmp_path / name, body, name)
        )
        session.expunge(made)
        return made


def job_of(sessions, submission_id: int) -> Job:
    with sessions() as session:
        job = session.scalars(select(Job).where(Job.submission_id == submission_id)).one()
        job.results  # noqa: B018 (loaded before the session closes)
        job.submission  # noqa: B018
        session.expunge_all()
        return job


@pytest.fixture
def no_bwrap(monkeypatch: pytest.MonkeyPatch):
    """This machine as one without bubblewrap: the runner's probe says bwrap does not work here."""
    real = isolation._probe.__wrapped__
    monkeypatch.setattr(isolation, "_probe", lambda level: level != "bwrap" and real(level))


# --- 1. a worker that cannot do its job claims nothing ---------------------------------------------------


def test_without_bubblewrap_sealed_jobs_stay_queued(lb, no_bwrap, tmp_path: Path) -> None:
    """Was: the worker claimed the job and failed it ("needs bwrap isolation"), the team's submission
    with it. Now it claims nothing, stops with the cause, and the job waits for a worker that can run it;
    a practice job of a round that allows unisolated runs is still served."""
    sealed = submit(lb, tmp_path, "sealed")
    practice = submit(lb, tmp_path, "practice", split="train")
    with pytest.raises(worker_module.CannotWork, match="needs bwrap isolation"):
        work(lb, LocalExecutor(1), once=True)
    job = job_of(lb, sealed.id)
    assert (job.status, job.attempts, job.results, job.submission.status) == ("queued", 0, [], "queued")
    assert job_of(lb, practice.id).status == "done"


def test_worker_once_exits_3_naming_the_cause(lb, tmp_path: Path) -> None:
    """With bubblewrap out of reach (a PATH without it) `leaderboard worker --once` claims nothing, exits 3
    and names the cause, in JSON log lines when asked; it first said what it is."""
    made = submit(lb, tmp_path, "sealed")
    (tmp_path / "bin").mkdir()
    env = {**os.environ, "PATH": str(tmp_path / "bin"), "ASSAY_LOG_FORMAT": "json"}
    done = subprocess.run(
        [sys.executable, "-m", "assay", "leaderboard", "worker", "--once"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 3, done.stderr
    records = [json.loads(line) for line in done.stderr.splitlines()]
    started = next(r for r in records if "started" in r["message"])
    assert started["isolation"] == "none" and "assay 0." in started["message"]
    assert "bwrap" in started["message"] and "rounds r1" in started["message"]
    assert records[-1]["level"] == "error" and "bwrap" in records[-1]["message"]
    job = job_of(lb, made.id)
    assert (job.status, job.attempts, job.worker) == ("queued", 0, None)


def test_an_unhealthy_worker_stays_up_and_says_why(lb, no_bwrap, tmp_path: Path) -> None:
    """A worker that stays up reports itself unhealthy in its heartbeat row, and claims nothing."""
    from assay.leaderboard.fleet import live_workers

    made = submit(lb, tmp_path, "sealed")
    stopper = worker_module.Stopper()
    loop = threading.Thread(
        target=work, args=(lb, LocalExecutor(1)), kwargs={"poll_s": 0.1, "stopper": stopper}
    )
    loop.start()
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with lb() as session:
                alive = live_workers(session)
            if alive and not alive[0].healthy:
                break
            time.sleep(0.1)
        assert len(alive) == 1 and not alive[0].healthy and alive[0].job_id is None
        assert alive[0].problem.startswith("isolation: a sealed job needs bwrap isolation: ")
    finally:
        stopper.event.set()
        loop.join(30)
    assert job_of(lb, made.id).status == "queued"
    with lb() as session:
        assert live_workers(session) == []  # a clean stop removes its row


def test_a_missing_split_folder_is_reported(lb, tmp_path: Path) -> None:
    from assay.leaderboard.preflight import Preflight

    submit(lb, tmp_path, "sealed")
    (tmp_path / "splits" / "test").rename(tmp_path / "elsewhere")
    ready = Preflight(lb).check(Job.status == "queued")
    assert ready.servable == []
    assert "round 'r1' split test: folder" in ready.problem and "does not exist here" in ready.problem


def test_too_little_disk_claims_nothing(lb, tmp_path: Path) -> None:
    from assay.leaderboard.preflight import Preflight

    submit(lb, tmp_path, "sealed")
    ready = Preflight(lb, min_free_bytes=2**62).check(Job.status == "queued")
    assert ready.servable == [] and "disk: ASSAY_HOME" in ready.problem and "temp dir" in ready.problem


# --- 2. a platform fault is never the team's failure ------------------------------------------------------


class DiskFullAfter:
    """The local executor until ``good`` models have run, then a full disk (as staging a model would hit)."""

    def __init__(self, good: int) -> None:
        self.inner, self.good = LocalExecutor(1), good

    def map(self, tasks: Sequence[Task], on_result=None) -> list[TaskResult]:
        self.inner.map(tasks[: self.good], on_result)
        raise OSError(errno.ENOSPC, "No space left on device")


def test_a_platform_fault_requeues_with_backoff_and_keeps_scored_models(
    lb, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Was: the job failed ("harness error: OSError ...") and the team's window was used up."""
    monkeypatch.setattr(worker_module, "BACKOFF_S", 1.0)
    made = submit(lb, tmp_path, "flaky")
    assert work(lb, DiskFullAfter(2), once=True) == 1
    job = job_of(lb, made.id)
    assert (job.status, job.worker, job.platform_faults, len(job.results)) == ("queued", None, 1, 2)
    assert job.not_before is not None and job.not_before > utcnow()
    assert "platform fault 1 of 3: OSError: [Errno 28] No space left on device" in job.log
    kept = {r.model_name: r.id for r in job.results}
    assert work(lb, LocalExecutor(2), once=True) == 0  # not due yet: nobody claims it
    time.sleep(1.1)
    assert work(lb, LocalExecutor(2), once=True) == 1
    job = job_of(lb, made.id)
    assert (job.status, job.attempts, job.submission.status) == ("done", 2, "done")
    assert sorted(r.model_name for r in job.results) == sorted(TRUTH)  # each model scored once
    assert {r.model_name: r.id for r in job.results if r.model_name in kept} == kept


def test_after_repeated_faults_platform_error_and_the_team_may_submit(
    lb, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Neither the window nor the one-artifact quota is used up by a job the platform failed."""
    monkeypatch.setattr(worker_module, "BACKOFF_S", 0.0)
    with lb.begin() as session:
        rounds.get_round(session, "r1").quota_artifacts = 1
    made = submit(lb, tmp_path, "unlucky")
    assert work(lb, DiskFullAfter(0), once=True) == 3
    job = job_of(lb, made.id)
    assert (job.status, job.submission.status) == ("platform-error", "platform-error")
    assert job.log.count("platform fault") == 3 and "failed" not in job.log
    again = submit(lb, tmp_path, "another")
    assert again.status == "queued", again.validation_errors


def test_a_dead_workers_job_counts_as_a_platform_fault(lb, tmp_path: Path) -> None:
    """A job whose worker died twice before is taken over a third time only to be given up."""
    made = submit(lb, tmp_path, "orphan")
    with lb.begin() as session:
        session.execute(
            update(Job).values(
                status="running",
                worker="gone:1",
                heartbeat_at=utcnow() - timedelta(hours=1),
                platform_faults=2,
            )
        )
    assert work(lb, LocalExecutor(1), once=True) == 1
    job = job_of(lb, made.id)
    assert (job.status, job.platform_faults, job.results) == ("platform-error", 3, [])
    assert "stopped sending heartbeats 3 times" in job.log


@pytest.mark.parametrize(
    ("exc", "platform"),
    [
        (OSError(errno.ENOSPC, "No space left on device"), True),
        (OperationalError("SELECT 1", {}, Exception("database is locked")), True),
        (UserError("task 'm' needs bwrap isolation and this machine offers 'none'"), True),
        (type("NodeDiedError", (Exception,), {"__module__": "ray.exceptions"})(), True),
        (MemoryError(), True),
        (ValueError("not a number"), False),
    ],
)
def test_platform_faults_are_told_from_the_rest(exc: BaseException, platform: bool) -> None:
    assert worker_module.is_platform_fault(exc) is platform


# --- liveness and the queue --------------------------------------------------------------------------------


def test_queue_place_counts_due_jobs_ahead(lb, tmp_path: Path) -> None:
    from assay.leaderboard.fleet import queue_place

    made = [submit(lb, tmp_path, f"d{i}", split="train") for i in range(3)]
    with lb.begin() as session:
        jobs = [session.scalars(select(Job).where(Job.submission_id == m.id)).one().id for m in made]
        assert [queue_place(session, j) for j in jobs] == [1, 2, 3]
        session.get(Job, jobs[0]).not_before = utcnow() + timedelta(minutes=5)  # backing off
        session.flush()
        assert [queue_place(session, j) for j in jobs] == [1, 1, 2]
        session.get(Job, jobs[1]).status = "running"
        session.flush()
        assert queue_place(session, jobs[1]) is None and queue_place(session, 10**6) is None


def test_live_workers_leave_out_stale_rows(lb) -> None:
    from assay.leaderboard.fleet import Presence, live_workers

    with Presence(lb, "bwrap", "local") as presence:
        presence.report("disk: full")
        presence.running(None)
        with lb() as session:
            (alive,) = live_workers(session)
            assert (alive.name, alive.healthy, alive.problem) == (presence.name, False, "disk: full")
            later = utcnow() + timedelta(seconds=61)
            assert live_workers(session, later) == []
