"""The worker: claim a queued job atomically, keep a heartbeat, run it, score it; survive being killed.

Claiming is one conditional ``UPDATE ... WHERE id = (first claimable) AND still claimable RETURNING id``,
so two workers (threads, processes or machines on one PostgreSQL) never run the same job. A job whose
worker stopped sending heartbeats for ``stale_after_s`` is claimable again; since model results are
committed one by one, the new worker runs only the models still missing.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable
from datetime import timedelta

from sqlalchemy import and_, func, or_, select, update
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session, sessionmaker

from assay.leaderboard.harness import run_models, score_job
from assay.retry import retry
from assay.runner import Executor
from assay.store.enums import JobStatus, SubmissionStatus
from assay.store.heartbeat import Heartbeat
from assay.store.models import Job, Submission, utcnow

HEARTBEAT_S = 5.0
STALE_AFTER_S = 60.0


def worker_name() -> str:
    """host:pid, recorded on each job a worker claims."""
    return f"{socket.gethostname()}:{os.getpid()}"


def _claimable(stale_after_s: float):  # type: ignore[no-untyped-def]
    stale = utcnow() - timedelta(seconds=stale_after_s)
    return or_(
        Job.status == JobStatus.QUEUED, and_(Job.status == JobStatus.RUNNING, Job.heartbeat_at < stale)
    )


def claim_job(
    sessions: sessionmaker[Session], worker: str, stale_after_s: float = STALE_AFTER_S
) -> int | None:
    """Claim the oldest claimable job for ``worker``; None when there is none."""

    def claim() -> int | None:
        with sessions.begin() as session:
            first = (
                select(Job.id).where(_claimable(stale_after_s)).order_by(Job.id).limit(1).scalar_subquery()
            )
            now = utcnow()
            claimed = session.scalar(
                update(Job)
                .where(Job.id == first, _claimable(stale_after_s))
                .values(
                    status=JobStatus.RUNNING,
                    worker=worker,
                    claimed_at=now,
                    heartbeat_at=now,
                    started_at=func.coalesce(Job.started_at, now),  # the total limit runs from here
                    attempts=Job.attempts + 1,
                )
                .returning(Job.id)
            )
            if claimed is not None:
                session.execute(
                    update(Submission)
                    .where(
                        Submission.id == select(Job.submission_id).where(Job.id == claimed).scalar_subquery()
                    )
                    .values(status=JobStatus.RUNNING)
                )
            return claimed

    # SQLite: another writer held the lock past the busy timeout; try again
    return retry(claim, on=OperationalError, attempts=10, wait=0.2, default=None)


def _stamp(sessions: sessionmaker[Session], job_id: int, worker: str) -> None:
    """Touch the job's heartbeat while this worker still holds it."""
    with sessions.begin() as session:
        session.execute(
            update(Job).where(Job.id == job_id, Job.worker == worker).values(heartbeat_at=utcnow())
        )


def _finish(sessions: sessionmaker[Session], job_id: int, status: str, note: str = "") -> None:
    with sessions.begin() as session:
        job = session.get(Job, job_id)
        assert job is not None
        job.status, job.finished_at = status, utcnow()
        job.log += note
        job.submission.status = (
            SubmissionStatus.FAILED if status == JobStatus.FAILED else SubmissionStatus.DONE
        )


def run_job(
    sessions: sessionmaker[Session],
    job_id: int,
    executor: Executor,
    worker: str,
    on_model: Callable[[str], None] | None = None,
) -> str:
    """Run and score a claimed job; returns its final status."""
    with Heartbeat(lambda: _stamp(sessions, job_id, worker), HEARTBEAT_S, f"assay-job-{job_id}"):
        try:
            finished = run_models(sessions, job_id, executor, on_model=on_model)
            score_job(sessions, job_id)
        except Exception as exc:  # the harness's own failure (a broken split folder): recorded, not fatal
            _finish(sessions, job_id, JobStatus.FAILED, f"harness error: {type(exc).__name__}: {exc}\n")
            return JobStatus.FAILED
    status = JobStatus.DONE if finished else JobStatus.TIMED_OUT
    _finish(sessions, job_id, status)
    return status


def work(
    sessions: sessionmaker[Session],
    executor: Executor,
    once: bool = False,
    poll_s: float = 2.0,
    stale_after_s: float = STALE_AFTER_S,
    on_job: Callable[[int, str], None] | None = None,
) -> int:
    """Run jobs until the queue is empty (``once``) or forever; returns the number of jobs run."""
    worker = worker_name()
    count = 0
    while True:
        job_id = claim_job(sessions, worker, stale_after_s)
        if job_id is None:
            if once:
                return count
            time.sleep(poll_s)
            continue
        status = run_job(sessions, job_id, executor, worker)
        count += 1
        if on_job is not None:
            on_job(job_id, status)
