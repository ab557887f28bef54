"""What an organiser watches and what a team waits on: round states, the job queue, worker health, progress.

``queue_status`` is the organiser's view, the one queue status (the web's ``/leaderboard/status`` and its API,
the organiser dashboard, and ``assay leaderboard status``; who may see it: ``views.queue_view``);
``job_progress`` is one job's models done out of its total (the web's live job page). Both return pydantic
models so the JSON API can hand them out as they are. A running job is *stale* when its heartbeat is older
than the worker's reclaim limit: its worker has most likely died, and the next worker to poll takes it over.
"""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from assay.leaderboard.fleet import LiveWorker, live_workers, queue_place
from assay.leaderboard.rounds import split_models
from assay.leaderboard.sealing import SILENT_STATUS, shown_status
from assay.leaderboard.worker import STALE_AFTER_S
from assay.store.enums import FINISHED_JOBS, JobStatus
from assay.store.models import Job, ModelResult, Round, Split, Submission, as_utc, utcnow


class RoundState(BaseModel):
    """One round: where it is in its lifecycle and how many jobs of each status it has."""

    name: str
    status: str
    opened_at: datetime | None
    closed_at: datetime | None
    submissions: int
    jobs: dict[str, int]


class RunningJob(BaseModel):
    """A job a worker holds, with its last heartbeat; ``stale`` when that is older than the reclaim limit."""

    job_id: int
    submission_id: int
    team: str
    round: str
    split: str
    worker: str | None
    attempts: int
    claimed_at: datetime | None
    heartbeat_at: datetime | None
    heartbeat_age_s: float | None
    stale: bool
    models_done: int
    models_total: int


class QueueStatus(BaseModel):
    """The whole leaderboard at one moment: rounds, job counts by status, each running job, and the live
    workers (``fleet.live_workers``: a fresh heartbeat; ``unhealthy`` of them claim nothing, and say why)."""

    checked_at: datetime
    stale_after_s: float
    queued: int
    running: int
    stale: int
    jobs: dict[str, int]
    rounds: list[RoundState]
    running_jobs: list[RunningJob]
    workers: list[LiveWorker] = []
    unhealthy: int = 0


class JobProgress(BaseModel):
    """How far one job has got; ``finished`` once it is done, failed or timed out.

    ``hidden``: a sealed split as its team sees it: no models done, and times to the hour only.
    """

    job_id: int
    submission_id: int
    team: str
    round: str
    split: str
    status: str
    models_done: int | None
    models_total: int
    claimed_at: datetime | None
    finished_at: datetime | None
    finished: bool
    hidden: bool = False
    queue_place: int | None = None  # 1 = the next job a worker claims; None unless queued
    workers_alive: int | None = None  # healthy workers with a fresh heartbeat, for a queued job
    # the wait in words while queued, "" once a worker has it: the live page replaces its line with this on
    # every poll, so no line outlives the state it told (issue 47: "Waiting for a worker" beside "running")
    waiting: str = ""


def waiting_words(place: int | None, alive: int | None) -> str:
    """A queued job's wait as its page says it: where it stands in the queue and who could take it."""
    if place == 1:
        where = "next in the queue"
    elif place:
        ahead = place - 1
        where = f"place {place} in the queue ({ahead} job{'s' if ahead != 1 else ''} ahead)"
    else:
        where = "waiting to be retried after a platform fault"
    if alive:
        who = f"{alive} worker{'s' if alive != 1 else ''} alive"
    else:
        who = "no worker is alive right now (the organisers see this on their status page)"
    return f"Waiting for a worker: {where}; {who}."


def _models_done(session: Session, job_id: int) -> int:
    return session.scalar(select(func.count()).where(ModelResult.job_id == job_id)) or 0


def _to_hour(moment: datetime | None) -> datetime | None:
    """A time cut to its hour: what a sealed job's team may know of when it ran (one coarse number per
    submission, where a detector that sleeps on chosen models could otherwise signal through its duration)."""
    moment = as_utc(moment)
    return None if moment is None else moment.replace(minute=0, second=0, microsecond=0)


def _identity(job: Job) -> dict:
    """What every view of a job says of it: which job, whose, where, and how many models its split runs."""
    split = job.submission.split
    return {
        "job_id": job.id,
        "submission_id": job.submission_id,
        "team": job.submission.team.name,
        "round": split.round.name,
        "split": split.name,
        "models_total": len(split_models(split)),
    }


def sealed_progress(job: Job, published: datetime | None) -> JobProgress:
    """A sealed job as anyone but an organiser sees it (``sealing.phase``): before its publication
    (``published`` None) "submitted" and nothing that moves; after, when it was published and whether it
    scored. No count of models done, no run times, no queue place: each would be a step the detector
    controls, or another team's job's duration."""
    return JobProgress(
        **_identity(job),
        status=SILENT_STATUS if published is None else shown_status(job.status),
        models_done=None,
        claimed_at=None,
        finished_at=published,
        finished=published is not None,
        hidden=True,
    )


def job_progress(session: Session, job: Job, hide: bool = False, public: bool = False) -> JobProgress:
    """Models with a result out of the models the job's split runs (a folder listing, no scoring), and
    for a queued job its place in the queue and how many healthy workers are alive to take it;
    ``hide``: the sealed view (``views._hides_progress``): no count of models done, times to the hour;
    ``public``: a team's view, whose queue place leaves sealed jobs out (``fleet.queue_place``)."""
    moment = _to_hour if hide else as_utc
    queued = job.status == JobStatus.QUEUED
    place = queue_place(session, job.id, public=public) if queued else None
    alive = sum(w.healthy for w in live_workers(session)) if queued else None
    return JobProgress(
        **_identity(job),
        status=job.status,
        models_done=None if hide else _models_done(session, job.id),
        claimed_at=moment(job.claimed_at),
        finished_at=moment(job.finished_at),
        finished=job.status in FINISHED_JOBS,
        hidden=hide,
        queue_place=place,
        workers_alive=alive,
        waiting=waiting_words(place, alive) if queued else "",
    )


def _running_job(session: Session, job: Job, now: datetime, stale_after_s: float) -> RunningJob:
    beat = as_utc(job.heartbeat_at)
    age = (now - beat).total_seconds() if beat is not None else None
    progress = job_progress(session, job)
    return RunningJob(
        job_id=job.id,
        submission_id=job.submission_id,
        team=progress.team,
        round=progress.round,
        split=progress.split,
        worker=job.worker,
        attempts=job.attempts,
        claimed_at=progress.claimed_at,
        heartbeat_at=beat,
        heartbeat_age_s=age,
        stale=age is None or age > stale_after_s,
        models_done=progress.models_done,
        models_total=progress.models_total,
    )


def _round_states(session: Session) -> list[RoundState]:
    counts: dict[int, dict[str, int]] = {}
    rows = session.execute(
        select(Split.round_id, Job.status, func.count())
        .join(Submission, Submission.split_id == Split.id)
        .join(Job, Job.submission_id == Submission.id)
        .group_by(Split.round_id, Job.status)
    )
    for round_id, status, count in rows:
        counts.setdefault(round_id, {})[status] = count
    submitted = dict(
        session.execute(
            select(Split.round_id, func.count())
            .join(Submission, Submission.split_id == Split.id)
            .group_by(Split.round_id)
        ).all()
    )
    return [
        RoundState(
            name=r.name,
            status=r.status,
            opened_at=as_utc(r.opened_at),
            closed_at=as_utc(r.closed_at),
            submissions=submitted.get(r.id, 0),
            jobs=counts.get(r.id, {}),
        )
        for r in session.scalars(select(Round).order_by(Round.id))
    ]


def queue_status(
    session: Session, now: datetime | None = None, stale_after_s: float = STALE_AFTER_S
) -> QueueStatus:
    """Round states, queue depth and worker health, as the organiser's status page shows them."""
    now = now or utcnow()
    jobs = {
        status: count
        for status, count in session.execute(select(Job.status, func.count()).group_by(Job.status))
    }
    running = [
        _running_job(session, job, now, stale_after_s)
        for job in session.scalars(select(Job).where(Job.status == JobStatus.RUNNING).order_by(Job.id))
    ]
    workers = live_workers(session, now, stale_after_s)
    return QueueStatus(
        checked_at=now,
        stale_after_s=stale_after_s,
        queued=jobs.get(JobStatus.QUEUED, 0),
        running=jobs.get(JobStatus.RUNNING, 0),
        stale=sum(job.stale for job in running),
        jobs=jobs,
        rounds=_round_states(session),
        running_jobs=running,
        workers=workers,
        unhealthy=sum(not w.healthy for w in workers),
    )
