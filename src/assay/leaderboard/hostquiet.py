"""Quiet after a sealed job: a host that ran one takes no practice run until the job's publication tick.

A practice job that waited for a host (or a worker) busy with a sealed job started when the sealed job let
go, and its team sees when it started (its job's claim time, its detector's own clock on its stderr): the
sealed job's end to the second, up to about 16 bits at a 24 h limit about how long the sealed detector
chose to take (issue 44). That end is published on the round's clock anyway (``sealing.publication_time``),
so the host stays quiet until then: sealed jobs may still follow each other on it, and a practice job that
waits, waits until that tick, so its start tells only the publication slot, which docs/leaderboard.md counts.

Two walls, one rule (``quiet_after``):
- ``sealed_hold``: a worker holds its host alone for the whole sealed job, scoring and finishing included,
  and leaves the quiet in the host lease (``runner.hostlease``) as it lets go; every practice run on the
  machine starts only once that quiet is over, whoever claimed it and whenever;
- ``claimable``: while its host (the lease's record, shared by every worker of the machine) or the worker
  itself (its last sealed job: the one wall a Ray worker has) is quiet, a worker claims sealed jobs only, so
  no practice job turns "running" at the sealed job's end. A separate pool for sealed jobs (``worker
  --splits``) never waits.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Sequence

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from assay.leaderboard.sealing import SEALED_SPLITS, publication_time
from assay.runner import Executor
from assay.store.models import Job, Split, Submission, utcnow


def _sealed(session: Session, job_ids: Sequence[int]) -> list[int]:
    """Those of ``job_ids`` that run on a sealed split."""
    query = (
        select(Job.id)
        .join(Submission, Submission.id == Job.submission_id)
        .join(Split, Split.id == Submission.split_id)
        .where(Job.id.in_(job_ids), Split.name.in_(SEALED_SPLITS))
    )
    return list(session.scalars(query))


def quiet_after(sessions: sessionmaker[Session], job_id: int) -> float:
    """Until when (epoch seconds) a host that ran ``job_id`` takes no practice run: a sealed job's
    publication tick (for one given back unfinished, the tick at or after now: its run ended then); 0 for
    a practice job."""
    with sessions() as session:
        job = session.get(Job, job_id)
        if job is None or job.submission.split.name not in SEALED_SPLITS:
            return 0.0
        ended = job.finished_at or utcnow()
        return publication_time(job.submission.split.round.publish_every_s, ended).timestamp()


@contextlib.contextmanager
def sealed_hold(sessions: sessionmaker[Session], job_id: int, executor: Executor) -> Iterator[None]:
    """Run a claimed job's block; a sealed one holding the host alone (an executor with a host lease)
    throughout, and leaving it quiet until its publication tick (``quiet_after``). Held by the worker,
    not per chunk, so the job is finished (its ``finished_at`` stamped) before the host is let go."""
    holding = getattr(executor, "holding", None)
    if holding is None:
        yield
        return
    with sessions() as session:
        sealed = bool(_sealed(session, [job_id]))
    if not sealed:
        yield
        return
    with holding(True) as lease:
        try:
            yield
        finally:
            lease.quiet_until = max(lease.quiet_until, quiet_after(sessions, job_id))


def host_quiet(executor: Executor) -> float:
    """The quiet the executor's host was left in (a local executor's lease); 0 where it keeps none."""
    quiet = getattr(executor, "quiet_until", None)
    return quiet() if quiet is not None else 0.0


def claimable(
    sessions: sessionmaker[Session], job_ids: Sequence[int], quiet_until: float
) -> tuple[list[int], bool]:
    """Of the jobs a worker could claim, those it may claim now: all of them, or while ``quiet_until``
    is ahead only the sealed ones; and whether any was held back (the worker then waits for the quiet to
    end, even under ``--once``)."""
    if quiet_until <= time.time() or not job_ids:
        return list(job_ids), False
    with sessions() as session:
        sealed = _sealed(session, job_ids)
    return [job_id for job_id in job_ids if job_id in sealed], len(sealed) < len(job_ids)
