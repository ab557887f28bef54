"""The leaderboard's workers as everyone else sees them: which are alive, which are unhealthy and why, and
where a queued job stands.

Each worker keeps one ``Worker`` row (``Presence``): written when it starts, stamped every ``HEARTBEAT_S``
by the store's one heartbeat thread (idle or busy, so a dead idle worker is visible too) with its health
and its current job, and removed when it stops cleanly. It also records the submission kinds it can run and
the splits it serves, so a submission no live worker could run is refused when sent
(``assay.leaderboard.runnable``). A row whose stamp is older than ``STALE_AFTER_S``
is a dead worker (killed, or its machine lost): ``live_workers`` leaves it out, and the job it held is
claimable again after the same time (``assay.leaderboard.worker``). ``queue_place`` is where a queued job
waits. Reads here never write; the job page, ``assay leaderboard status`` and ``/metrics`` call them.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from pydantic import BaseModel
from sqlalchemy import delete, func, or_, select, update
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from assay import __version__
from assay.leaderboard.sealing import SEALED_SPLITS
from assay.store.enums import JobStatus
from assay.store.heartbeat import Heartbeat
from assay.store.models import Job, Split, Submission, Worker, utcnow

HEARTBEAT_S = 5.0
STALE_AFTER_S = 60.0  # no stamp for this long: the worker (or the job's holder) is dead
FORGET_AFTER = timedelta(days=1)  # rows of workers dead this long are removed when another starts

logger = logging.getLogger(__name__)


def worker_name() -> str:
    """host:pid, recorded on the worker's row and on each job it claims."""
    return f"{socket.gethostname()}:{os.getpid()}"


class LiveWorker(BaseModel):
    """A worker whose heartbeat is fresh; ``healthy`` False means it claims nothing (``problem`` says why).
    ``kinds``: the submission kinds it can run, ``splits``: those it serves; either empty means every one
    (``splits``: no ``--splits``; ``kinds``: a row of an older release, which did not say)."""

    name: str
    host: str
    pid: int
    version: str
    isolation: str
    executor: str
    started_at: datetime
    heartbeat_at: datetime
    heartbeat_age_s: float
    healthy: bool
    problem: str
    job_id: int | None
    kinds: list[str] = []
    splits: list[str] = []


def listed(text: str) -> list[str]:
    """A comma-separated column (``Worker.kinds``, ``Worker.splits``) as its items; "" is none."""
    return [item for item in text.split(",") if item]


def live_workers(
    session: Session, now: datetime | None = None, stale_after_s: float = STALE_AFTER_S
) -> list[LiveWorker]:
    """Workers stamped within ``stale_after_s`` of ``now``, by name; a stale stamp means dead."""
    now = now or utcnow()
    rows = session.scalars(
        select(Worker)
        .where(Worker.heartbeat_at >= now - timedelta(seconds=stale_after_s))
        .order_by(Worker.name)
    )
    lists = ("kinds", "splits")
    stored = [name for name in LiveWorker.model_fields if name not in ("heartbeat_age_s", *lists)]
    return [
        LiveWorker(
            **{name: getattr(w, name) for name in stored},
            **{name: listed(getattr(w, name)) for name in lists},
            heartbeat_age_s=max(0.0, (now - w.heartbeat_at).total_seconds()),
        )
        for w in rows
    ]


def due(now: datetime):  # type: ignore[no-untyped-def]
    """The condition "this job may be claimed now" as far as its back-off goes (``Job.not_before``)."""
    return or_(Job.not_before.is_(None), Job.not_before <= now)


def queue_place(
    session: Session, job_id: int, now: datetime | None = None, public: bool = False
) -> int | None:
    """The job's place in the queue (1: the next a worker claims), or None when it is not queued.

    Workers claim queued jobs oldest first, skipping those still backing off after a platform fault; so
    the place is one more than the due queued jobs older than this one. ``public`` (what a team is told):
    sealed (test, holdout) jobs are not counted, so no team's place moves when another's sealed job starts
    (issue 44: places moved with other teams' test jobs, their durations to 0.1 s).
    """
    job = session.get(Job, job_id)
    if job is None or job.status != JobStatus.QUEUED:
        return None
    ahead = (
        select(func.count())
        .select_from(Job)
        .where(Job.status == JobStatus.QUEUED, Job.id < job_id, due(now or utcnow()))
    )
    if public:
        ahead = (
            ahead.join(Submission, Submission.id == Job.submission_id)
            .join(Split, Split.id == Submission.split_id)
            .where(Split.name.not_in(SEALED_SPLITS))
        )
    return (session.scalar(ahead) or 0) + 1


@dataclass
class State:
    """What this worker's heartbeat writes: its health, why not, the job it runs, and the submission kinds
    it can run (comma-separated, as stored)."""

    healthy: bool = True
    problem: str = ""
    job_id: int | None = None
    kinds: str = ""


class Presence:
    """This worker's row, kept alive by a heartbeat thread while the ``with`` block runs.

    The main thread changes ``state`` (``report``, ``running``, ``able``); a change is written at once,
    and every beat writes it again with a fresh stamp. A clean stop removes the row. ``kinds``: the
    submission kinds it can run (``runnable.machine_kinds``), ``splits``: those it serves (none: all);
    empty ``kinds`` reads as every kind, as an older release's row does.
    """

    def __init__(
        self,
        sessions: sessionmaker[Session],
        isolation: str,
        executor: str,
        kinds: Sequence[str] = (),
        splits: Sequence[str] = (),
    ) -> None:
        self.sessions, self.name = sessions, worker_name()
        self.isolation, self.executor, self.splits = isolation, executor, ",".join(splits)
        self.state = State(kinds=",".join(kinds))
        self._lock = threading.Lock()
        self._heartbeat = Heartbeat(self._stamp, HEARTBEAT_S, "assay-worker-heartbeat")

    def __enter__(self) -> Presence:
        now = utcnow()
        with self.sessions.begin() as session:
            session.execute(
                delete(Worker).where(or_(Worker.name == self.name, Worker.heartbeat_at < now - FORGET_AFTER))
            )
            host, pid = self.name.rsplit(":", 1)
            session.add(
                Worker(
                    name=self.name,
                    host=host,
                    pid=int(pid),
                    version=__version__,
                    isolation=self.isolation,
                    executor=self.executor,
                    started_at=now,
                    heartbeat_at=now,
                    kinds=self.state.kinds,
                    splits=self.splits,
                )
            )
        self._heartbeat.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._heartbeat.stop()
        try:
            with self.sessions.begin() as session:
                session.execute(delete(Worker).where(Worker.name == self.name))
        except SQLAlchemyError as err:  # the database is gone: the row goes stale, which says the same
            logger.warning("worker %s: row not removed (%s)", self.name, type(err).__name__)

    def report(self, problem: str) -> None:
        """Record this worker's health (``problem`` "" when it can do every job it would be given), and log
        it when it changes."""
        before = self.state.problem
        self._change(healthy=not problem, problem=problem)
        if problem and problem != before:
            logger.warning("worker %s cannot do every job: %s", self.name, problem)
        elif before and not problem:
            logger.info("worker %s can do every job again", self.name)

    def running(self, job_id: int | None) -> None:
        """Record the job this worker runs now (None: idle)."""
        self._change(job_id=job_id)

    def able(self, kinds: Sequence[str]) -> None:
        """Record the submission kinds this worker can run now (the pre-flight re-probes its engines)."""
        self._change(kinds=",".join(kinds))

    def _change(self, **fields: object) -> None:
        with self._lock:
            changed = any(getattr(self.state, key) != value for key, value in fields.items())
            for key, value in fields.items():
                setattr(self.state, key, value)
        if changed:
            try:
                self._stamp()
            except SQLAlchemyError as err:  # the next beat writes it again
                logger.warning("worker %s: state not written (%s)", self.name, type(err).__name__)

    def _stamp(self) -> None:
        with self._lock:
            state = State(self.state.healthy, self.state.problem, self.state.job_id, self.state.kinds)
        with self.sessions.begin() as session:
            session.execute(
                update(Worker)
                .where(Worker.name == self.name)
                .values(
                    heartbeat_at=utcnow(),
                    healthy=state.healthy,
                    problem=state.problem,
                    job_id=state.job_id,
                    kinds=state.kinds,
                )
            )
