"""The worker: check it can do the work, claim a queued job atomically, run it, score it; survive its own
faults and stop cleanly.

Claiming is one conditional ``UPDATE ... WHERE id = (first claimable) AND still claimable RETURNING id``,
so two workers (threads, processes or machines on one PostgreSQL) never run the same job. Before each
claim the worker checks what the jobs need (``preflight``) and claims only those it can run: a machine
whose sandbox is broken claims nothing, says why in its heartbeat row (``fleet``) and its log, and under
``once`` stops with ``CannotWork``.

Faults have owners. What the detector does is recorded per model by the harness. A fault of the platform
(isolation refused by the runner, a full disk, the database, a lost Ray node) requeues the job with a
back-off (``not_before``), keeping the models already scored; after ``PLATFORM_TRIES`` it ends as
``platform-error``, which never counts against the team's window or quota. A worker that died (no
heartbeat for ``stale_after_s``) counts as one such fault for its job, which is claimable again; since
results are committed one by one, the next worker runs only the models still missing. SIGTERM or SIGINT
(``Stopper``) kills the running detectors, gives the job back at once and returns.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from datetime import timedelta
from pathlib import Path
from types import FrameType

from sqlalchemy import and_, case, func, or_, select, update
from sqlalchemy.exc import OperationalError, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from assay.errors import UserError
from assay.leaderboard.fleet import HEARTBEAT_S, STALE_AFTER_S, Presence, due, worker_name
from assay.leaderboard.harness import run_models, score_job
from assay.leaderboard.hostquiet import claimable, host_quiet, quiet_after, sealed_hold
from assay.leaderboard.preflight import Preflight, error_line
from assay.leaderboard.submissions import ArtifactFault
from assay.retry import retry
from assay.runner import Executor, RayExecutor, isolation_available
from assay.store.enums import JobStatus, RoundStatus, SubmissionStatus
from assay.store.heartbeat import Heartbeat
from assay.store.models import SPLIT_NAMES, Job, Round, Split, Submission, Team, utcnow

__all__ = ["HEARTBEAT_S", "STALE_AFTER_S", "claim_job", "run_job", "work", "worker_name"]

PLATFORM_TRIES = 3  # platform faults before a job ends as platform-error
BACKOFF_S = 30.0  # the wait after the first platform fault; it doubles after each
EXIT_CANNOT_WORK = 3  # the CLI's exit status when a worker under --once could not do the queued work

logger = logging.getLogger(__name__)


class CannotWork(Exception):
    """This worker cannot run (some of) the queued jobs: the one-line reasons, joined."""


class Stopped(BaseException):
    """A stop signal arrived while a job ran. A BaseException, so no ``except Exception`` on its way up
    mistakes it for a fault of the job."""


def _claimable(stale_after_s: float):  # type: ignore[no-untyped-def]
    now = utcnow()
    stale = now - timedelta(seconds=stale_after_s)
    return or_(
        and_(Job.status == JobStatus.QUEUED, due(now)),
        and_(Job.status == JobStatus.RUNNING, Job.heartbeat_at < stale),
    )


def on_splits(splits: Sequence[str]):  # type: ignore[no-untyped-def]
    """The condition "this job runs on one of ``splits``": a worker pool of its own for sealed jobs
    (``--splits test,holdout``) never makes a practice job wait on one (docs/leaderboard.md)."""
    unknown = [name for name in splits if name not in SPLIT_NAMES]
    if unknown or not splits:
        raise UserError(f"--splits: {unknown[0] if unknown else ''!r} is not one of {', '.join(SPLIT_NAMES)}")
    on = select(Submission.id).join(Split, Split.id == Submission.split_id).where(Split.name.in_(splits))
    return Job.submission_id.in_(on)


def claim_job(
    sessions: sessionmaker[Session],
    worker: str,
    stale_after_s: float = STALE_AFTER_S,
    among: Sequence[int] | None = None,
) -> int | None:
    """Claim the oldest claimable job for ``worker`` (only one of ``among``, when given); None when there
    is none. Taking over a job whose worker died counts one platform fault. Each claim is one log line."""

    def claim() -> tuple[int, dict] | None:
        with sessions.begin() as session:
            candidates = select(Job.id, Job.status, Job.worker).where(_claimable(stale_after_s))
            if among is not None:
                candidates = candidates.where(Job.id.in_(among))
            first = session.execute(candidates.order_by(Job.id).limit(1)).first()
            if first is None:
                return None
            now = utcnow()
            claimed = session.scalar(
                update(Job)
                # as it was read: a row changed meanwhile (another worker's claim) is a lost race
                .where(
                    Job.id == first.id,
                    Job.status == first.status,
                    Job.worker.is_not_distinct_from(first.worker),
                )
                .where(_claimable(stale_after_s))
                .values(
                    status=JobStatus.RUNNING,
                    worker=worker,
                    claimed_at=now,
                    heartbeat_at=now,
                    started_at=func.coalesce(Job.started_at, now),  # the total limit runs from here
                    attempts=Job.attempts + 1,
                    platform_faults=Job.platform_faults + case((Job.status == JobStatus.RUNNING, 1), else_=0),
                )
                .returning(Job.id)
            )
            if claimed is None:
                return None
            _set_submission(session, claimed, SubmissionStatus.RUNNING)
            dead = first.worker if first.status == JobStatus.RUNNING else None
            return claimed, _claim_fields(session, claimed, worker, dead)

    if among is not None and not among:
        return None
    # SQLite: another writer held the lock past the busy timeout; try again
    claimed = retry(claim, on=OperationalError, attempts=10, wait=0.2, default=None)
    if claimed is None:
        return None
    _log_claim(claimed[1])  # once committed: a claim rolled back and retried is logged once
    return claimed[0]


def _claim_fields(session: Session, job_id: int, worker: str, dead: str | None) -> dict:
    """What the claim's log line names: the job, its submission, team and split, the worker, and for a
    reclaim the worker whose heartbeat stopped (``reclaimed_from``)."""
    submission, team, split = session.execute(
        select(Submission.id, Team.name, Split.name)
        .join(Job, Job.submission_id == Submission.id)
        .join(Team, Team.id == Submission.team_id)
        .join(Split, Split.id == Submission.split_id)
        .where(Job.id == job_id)
    ).one()
    fields = {"job": job_id, "submission": submission, "team": team, "split": split, "worker": worker}
    return {**fields, "reclaimed_from": dead} if dead is not None else fields


def _log_claim(fields: dict) -> None:
    """One line per claim or reclaim, so an operator follows a job across workers from the log alone."""
    dead = fields.get("reclaimed_from")
    verb = f"reclaimed from {dead} (no heartbeat)" if dead is not None else "claimed"
    logger.info(
        "job %d %s by %s: submission %d, team %s, split %s",
        *(fields["job"], verb, fields["worker"], fields["submission"], fields["team"], fields["split"]),
        extra={"fields": fields},
    )


def _set_submission(session: Session, job_id: int, status: str) -> None:
    session.execute(
        update(Submission)
        .where(Submission.id == select(Job.submission_id).where(Job.id == job_id).scalar_subquery())
        .values(status=status)
    )


def _stamp(sessions: sessionmaker[Session], job_id: int, worker: str) -> None:
    """Touch the job's heartbeat while this worker still holds it."""
    with sessions.begin() as session:
        session.execute(
            update(Job).where(Job.id == job_id, Job.worker == worker).values(heartbeat_at=utcnow())
        )


_SUBMISSION_STATUS = {
    JobStatus.FAILED: SubmissionStatus.FAILED,
    JobStatus.PLATFORM_ERROR: SubmissionStatus.PLATFORM_ERROR,
}


def _end(job: Job, status: str, note: str = "") -> str:
    """The job (and its submission) ended as ``status``, with ``note`` added to its log."""
    job.status, job.finished_at = status, utcnow()
    job.log += note
    job.submission.status = _SUBMISSION_STATUS.get(status, SubmissionStatus.DONE)
    return status


def _finish(sessions: sessionmaker[Session], job_id: int, status: str, note: str = "") -> None:
    with sessions.begin() as session:
        job = session.get(Job, job_id)
        assert job is not None
        _end(job, status, note)


def _held(sessions: sessionmaker[Session], job_id: int, worker: str, change: Callable[[Job], str]) -> str:
    """Apply ``change`` to the job if this worker still holds it (a job taken over meanwhile is left to
    its new worker); returns what ``change`` says, or the job's status as it stands."""

    def apply() -> str:
        with sessions.begin() as session:
            job = session.get(Job, job_id)
            assert job is not None
            if job.worker != worker or job.status != JobStatus.RUNNING:
                return job.status
            return change(job)

    return retry(apply, on=OperationalError, attempts=10, wait=0.5, default=JobStatus.RUNNING)


def _requeue(job: Job, note: str, not_before: float = 0.0) -> str:
    """Back in the queue, claimable after ``not_before`` seconds; models already scored are kept."""
    job.status, job.worker, job.heartbeat_at = JobStatus.QUEUED, None, None
    job.not_before = utcnow() + timedelta(seconds=not_before) if not_before else None
    job.submission.status = SubmissionStatus.QUEUED
    job.log += note
    return JobStatus.QUEUED


def _platform_fault(job: Job, exc: BaseException) -> str:
    """Requeue with back-off, or after ``PLATFORM_TRIES`` faults end the job as platform-error."""
    job.platform_faults += 1
    note = (
        f"platform fault {job.platform_faults} of {PLATFORM_TRIES}: {type(exc).__name__}: {error_line(exc)}\n"
    )
    if job.platform_faults < PLATFORM_TRIES:
        return _requeue(job, note, BACKOFF_S * 2 ** (job.platform_faults - 1))
    return _end(job, JobStatus.PLATFORM_ERROR, note)


def is_platform_fault(exc: BaseException) -> bool:
    """Whether ``exc`` is the platform's fault, never the team's: the harness and the runner raise only
    for their own state (what a detector does is recorded per model, not raised). OSError (a full disk,
    a missing folder), the database's errors, memory, a ``UserError`` of the runner (isolation or a
    container engine missing here), a stored artifact unlike its record (``ArtifactFault``) and Ray's
    errors (a node lost for good). Anything else stays a failure of the job with its one line, as before."""
    if isinstance(exc, OSError | SQLAlchemyError | MemoryError | UserError | ArtifactFault):
        return True
    return any(cls.__module__.split(".")[0] == "ray" for cls in type(exc).__mro__)


def run_job(
    sessions: sessionmaker[Session],
    job_id: int,
    executor: Executor,
    worker: str,
    on_model: Callable[[str], None] | None = None,
    stopper: Stopper | None = None,
) -> str:
    """Run and score a claimed job; returns its status after (queued again when the platform failed it or
    the worker was stopped). ``Stopped`` is raised again once the job is given back."""
    stopper = stopper or Stopper()
    beat = Heartbeat(lambda: _stamp(sessions, job_id, worker), HEARTBEAT_S, f"assay-job-{job_id}")
    # a sealed job holds its host from before its first model until it is finished, and leaves it quiet
    # until its publication tick (``hostquiet``): no practice run's start tells when it ended
    with beat, contextlib.ExitStack() as hold:
        try:
            if _exhausted(sessions, job_id, worker):
                return JobStatus.PLATFORM_ERROR
            with stopper.interruptible():
                hold.enter_context(sealed_hold(sessions, job_id, executor))
                finished = run_models(sessions, job_id, executor, on_model=on_model)
            score_job(sessions, job_id)
        except Stopped:
            stopper.settle()
            _held(sessions, job_id, worker, lambda job: _requeue(job, f"released: {worker} was stopped\n"))
            raise
        except Exception as exc:
            if is_platform_fault(exc):
                logger.warning("job %d: platform fault: %s: %s", job_id, type(exc).__name__, error_line(exc))
                return _held(sessions, job_id, worker, functools.partial(_platform_fault, exc=exc))
            # not the platform's: recorded as the job's failure, as ever
            _finish(sessions, job_id, JobStatus.FAILED, f"harness error: {type(exc).__name__}: {exc}\n")
            return JobStatus.FAILED
        status = JobStatus.DONE if finished else JobStatus.TIMED_OUT
        _finish(sessions, job_id, status)
    return status


def _exhausted(sessions: sessionmaker[Session], job_id: int, worker: str) -> bool:
    """End a job whose workers kept dying under it (each take-over counts a fault) as platform-error."""

    def give_up(job: Job) -> str:
        if job.platform_faults < PLATFORM_TRIES:
            return JobStatus.RUNNING
        note = f"its worker stopped sending heartbeats {job.platform_faults} times\n"
        return _end(job, JobStatus.PLATFORM_ERROR, note)

    return _held(sessions, job_id, worker, give_up) == JobStatus.PLATFORM_ERROR


# --- stopping ----------------------------------------------------------------------------------------------


def kill_detectors() -> int:
    """SIGKILL the process group of each child of this process that leads its own group, which is how the
    runner starts every detector (bare, under bwrap or through podman); returns how many were signalled."""
    me, killed = os.getpid(), 0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            fields = Path(entry.path, "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # gone meanwhile
        pid = int(entry.name)
        if int(fields[1]) == me and int(fields[2]) == pid:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
                killed += 1
    return killed


class Stopper:
    """SIGTERM and SIGINT as a clean stop. Between jobs a signal only sets ``event``, which the work loop
    checks; while models run (``interruptible``) it also raises ``Stopped`` in the main thread and kills
    the detectors (again every 50 ms until ``settle``: an executor thread may start the next model before
    the executor has seen the stop). The container runs the worker as PID 1, which gets no default
    handler for SIGTERM: ``installed`` sets this one explicitly."""

    def __init__(self, kill: Callable[[], object] = kill_detectors) -> None:
        self.event, self._settled = threading.Event(), threading.Event()
        self._kill, self._armed, self.reason = kill, False, ""

    def handle(self, signum: int, frame: FrameType | None = None) -> None:
        self.reason = signal.Signals(signum).name
        self.event.set()
        if self._armed:
            self._armed = False
            threading.Thread(target=self._keep_killing, daemon=True, name="assay-stop").start()
            raise Stopped(self.reason)

    def _keep_killing(self) -> None:
        self._kill()
        while not self._settled.wait(0.05):
            self._kill()

    def settle(self) -> None:
        """The executor has stopped waiting on its tasks: stop killing."""
        self._settled.set()

    @contextlib.contextmanager
    def interruptible(self) -> Iterator[None]:
        """A stretch the signal may cut short (running models); a stop already asked for stops it at once."""
        if self.event.is_set():
            raise Stopped(self.reason)
        self._armed = True
        try:
            yield
        finally:
            self._armed = False

    @contextlib.contextmanager
    def installed(self) -> Iterator[Stopper]:
        """This stopper as the handler of SIGTERM and SIGINT (main thread only), the old ones after."""
        previous = {sig: signal.signal(sig, self.handle) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            yield self
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


# --- the loop ----------------------------------------------------------------------------------------------


def _rounds_served(sessions: sessionmaker[Session]) -> str:
    with sessions() as session:
        names = session.scalars(select(Round.name).where(Round.status == RoundStatus.OPEN).order_by(Round.id))
        return ", ".join(names) or "none open"


def _announce(sessions: sessionmaker[Session], executor_name: str, preflight: Preflight) -> str:
    """Log what this worker is (version, isolation and its problem, rounds, executor); its isolation."""
    from assay import __version__

    level, problem = isolation_available(), preflight.machine()["bwrap"]
    logger.info(
        "worker %s started: assay %s, isolation %s, rounds %s, executor %s",
        worker_name(),
        __version__,
        f"{level} ({problem})" if problem else level,
        _rounds_served(sessions),
        executor_name,
        extra={"fields": {"worker": worker_name(), "isolation": level, "executor": executor_name}},
    )
    return level


def work(
    sessions: sessionmaker[Session],
    executor: Executor,
    once: bool = False,
    poll_s: float = 2.0,
    stale_after_s: float = STALE_AFTER_S,
    on_job: Callable[[int, str], None] | None = None,
    stopper: Stopper | None = None,
    preflight: Preflight | None = None,
    splits: Sequence[str] | None = None,
) -> int:
    """Run jobs until the queue is empty (``once``), a stop signal (``stopper``), or forever; returns the
    number of jobs run. Under ``once`` a worker left with queued jobs it cannot run raises ``CannotWork``
    (one that merely could not run an open round's future jobs says so in its log and row, and returns).
    ``splits``: only jobs on these splits (``on_splits``); the others are another pool's."""
    pool = on_splits(splits) if splits is not None else None
    stopper = stopper or Stopper()
    executor_name = "ray" if isinstance(executor, RayExecutor) else "local"
    preflight = preflight or Preflight(sessions, local=executor_name == "local")
    count, quiet = 0, 0.0  # quiet: until when this worker's last sealed job keeps practice jobs off it
    level = _announce(sessions, executor_name, preflight)
    with Presence(sessions, level, executor_name, preflight.kinds(), splits or ()) as presence:
        while not stopper.event.is_set():
            due_now = _claimable(stale_after_s)
            ready = preflight.check(due_now if pool is None else and_(due_now, pool))
            presence.report(ready.problem)
            presence.able(preflight.kinds())
            until = max(quiet, host_quiet(executor))
            among, held_back = claimable(sessions, ready.servable, until)
            job_id = claim_job(sessions, presence.name, stale_after_s, among=among)
            if job_id is None and held_back:  # practice jobs wait for the tick, even under --once
                stopper.event.wait(max(0.0, min(poll_s, until - time.time())))
                continue
            if job_id is None:
                if once and ready.blocked:
                    raise CannotWork(ready.problem)
                if once:
                    break
                stopper.event.wait(poll_s)
                continue
            presence.running(job_id)
            try:
                status = run_job(sessions, job_id, executor, presence.name, stopper=stopper)
            except Stopped:
                logger.info(
                    "worker %s stopped (%s): job %d given back", presence.name, stopper.reason, job_id
                )
                break
            finally:
                presence.running(None)
            count, quiet = count + 1, max(quiet, quiet_after(sessions, job_id))
            logger.info("job %d: %s", job_id, status, extra={"fields": {"job": job_id, "status": status}})
            if on_job is not None:
                on_job(job_id, status)
    return count
