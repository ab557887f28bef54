"""Work the web app does after, or beside, a request: one module for all of it, with one set of rules.

Three kinds of work outlive the request that starts them: a red teamer's model reply (the chat), a DyePack
verification run, and a STAR analysis report build. Each goes to a named lane (``LANES``) of one
``BackgroundWork`` per application: a bounded number of worker threads per lane, so a burst of one kind
never starves another (sixteen replies may stream while two verifications and one report build run).

Rules, the same for every job:
- A job has a name people can read ("DyePack run 12") and an optional ``key`` (a run id, a campaign id);
  ``submit_unique`` refuses a second job with the same key while one is queued or running.
- States: queued -> running -> done | failed. A failure is recorded on the job (a ``UserError``'s one line,
  else the exception's type and message) and logged with its traceback; the server goes on.
- ``status()`` is what the organisers' dashboard shows: each lane's load, the jobs under way, the last
  finished ones. Finished jobs are kept as plain records only (``JobView``), never with their work or its
  result, so nothing a job held (a DyePack key) stays in memory after it.
- Threads are daemons: a stopping server does not wait hours for a verification. What a job leaves behind
  is its owner's to settle: a reply is stored or the page offers "Get the reply"; a DyePack run carries a
  heartbeat and is failed by the next sweep (``assay.web.sweeper``) once its holder is gone; a report build
  leaves the previous report. Nothing stays "running" after its process.
- ``reserve`` + ``start`` split a submission in two for work whose row is committed in between (a DyePack
  run): from ``reserve`` on, ``holding(lane)`` counts the key as held, so a sweep never takes the
  just-committed row for an orphan.

Jobs are tracked per server process: with several uvicorn workers each shows its own.
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from pydantic import BaseModel

from assay.errors import UserError
from assay.store.enums import ACTIVE_JOBS, JobStatus
from assay.store.models import utcnow

log = logging.getLogger(__name__)

LANES = {"reply": 16, "dyepack": 2, "report": 1}  # worker threads per lane: model replies, runs, builds
KEEP_FINISHED = 50  # finished jobs remembered for the dashboard
Key = int | str | None  # what a job is about: a run id, a campaign id


class JobView(BaseModel):
    """A job as the dashboard shows it: no work, no result, nothing secret."""

    id: int
    lane: str
    name: str
    key: Key = None
    state: JobStatus
    queued_at: datetime
    started_at: datetime | None = None
    finished_at: datetime | None = None
    error: str | None = None

    @property
    def active(self) -> bool:
        """Queued or running: a report build under way disables the button that starts another."""
        return self.state in ACTIVE_JOBS


class LaneStatus(BaseModel):
    name: str
    workers: int
    running: int
    queued: int


class BackgroundStatus(BaseModel):
    """This server process's background work: lanes, jobs under way, the last finished, failures so far."""

    lanes: list[LaneStatus]
    active: list[JobView]
    recent: list[JobView]  # newest first
    failed: int


@dataclass(eq=False)
class Job:
    """A submitted job. Its owner may ``wait`` for the result or be told when it ends (``on_done``)."""

    id: int
    lane: str
    name: str
    key: Key
    state: JobStatus = JobStatus.QUEUED
    queued_at: datetime = field(default_factory=utcnow)
    started_at: datetime | None = None
    finished_at: datetime | None = None
    error: str | None = None
    _result: Any = None
    _exception: BaseException | None = None
    _done: threading.Event = field(default_factory=threading.Event)
    _callbacks: list[Callable[[Job], None]] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def view(self) -> JobView:
        """A plain copy for the dashboard, holding nothing of the work."""
        return JobView(
            id=self.id,
            lane=self.lane,
            name=self.name,
            key=self.key,
            state=self.state,
            queued_at=self.queued_at,
            started_at=self.started_at,
            finished_at=self.finished_at,
            error=self.error,
        )

    def wait(self, timeout: float | None = None) -> Any:
        """The work's return value once done; its exception re-raised if it failed."""
        if not self._done.wait(timeout):
            raise TimeoutError(f"{self.name}: not finished after {timeout} s")
        if self._exception is not None:
            raise self._exception
        return self._result

    @property
    def exception(self) -> BaseException | None:
        """Why the job failed (None while it runs or after it succeeded), for an owner to word it."""
        return self._exception

    def on_done(self, callback: Callable[[Job], None]) -> None:
        """Call ``callback(job)`` when the job ends (at once if it has), from the thread that ends it."""
        with self._lock:
            if not self._done.is_set():
                self._callbacks.append(callback)
                return
        callback(self)

    def _settle(self, result: Any, exception: BaseException | None) -> None:
        """Record the outcome (before the job leaves the active list, so no reader sees it in neither)."""
        self.finished_at = utcnow()
        self._result, self._exception = result, exception
        self.state = JobStatus.FAILED if exception is not None else JobStatus.DONE
        self.error = None if exception is None else failure_text(exception)

    def _release(self) -> None:
        """Wake ``wait`` and run the ``on_done`` callbacks."""
        with self._lock:
            self._done.set()
            callbacks, self._callbacks = self._callbacks, []
        for callback in callbacks:
            try:
                callback(self)
            except Exception:  # a listener's bug must not kill the worker thread
                log.exception("background job %r: a done callback failed", self.name)


def failure_text(error: BaseException) -> str:
    """What is recorded for a failed job: a ``UserError``'s own line, else the type and message."""
    return str(error) if isinstance(error, UserError) else f"{type(error).__name__}: {error}"


class _Lane:
    """A bounded set of daemon worker threads fed by one queue, started as they are first needed."""

    def __init__(self, name: str, size: int) -> None:
        self.name, self.size = name, size
        self._queue: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._idle = threading.Semaphore(0)
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()

    def put(self, task: Callable[[], None]) -> None:
        """Queue ``task``; start another worker unless one is idle or the lane is full."""
        self._queue.put(task)
        if self._idle.acquire(blocking=False):
            return
        with self._lock:
            if len(self._threads) < self.size:
                name = f"assay-{self.name}-{len(self._threads) + 1}"
                thread = threading.Thread(target=self._loop, name=name, daemon=True)
                self._threads.append(thread)
                thread.start()

    def _loop(self) -> None:
        """A worker: run tasks as they come, and say it is idle after each."""
        while True:
            self._queue.get()()
            self._idle.release()


class BackgroundWork:
    """The application's background jobs, in bounded lanes (``LANES``), observable with ``status()``."""

    def __init__(self, lanes: dict[str, int] | None = None, keep: int = KEEP_FINISHED) -> None:
        self._lanes = {name: _Lane(name, size) for name, size in (lanes or LANES).items()}
        self._lock = threading.Lock()
        self._active: dict[int, Job] = {}
        self._finished: deque[JobView] = deque(maxlen=keep)
        self._failed = 0
        self._ids = itertools.count(1)

    def _reserve(self, lane: str, name: str, key: Key, unique: bool) -> Job | None:
        """Register a queued job (None when ``unique`` and its key is taken), under the lock."""
        if lane not in self._lanes:
            raise ValueError(f"unknown lane {lane!r} (lanes: {', '.join(self._lanes)})")
        with self._lock:
            if unique and self._find(lane, key) is not None:
                return None
            job = Job(next(self._ids), lane, name, key)
            self._active[job.id] = job
        return job

    def reserve(self, lane: str, name: str, key: Key = None) -> Job:
        """A queued job that holds its key (``holding``) but runs nothing until ``start``."""
        job = self._reserve(lane, name, key, unique=False)
        assert job is not None  # only unique reservations are refused
        return job

    def start(self, job: Job, work: Callable[[], Any]) -> Job:
        """Run ``work`` for a reserved job on its lane."""
        self._lanes[job.lane].put(lambda: self._run(job, work))
        return job

    def cancel(self, job: Job) -> None:
        """Forget a reserved job that will not be started (its request failed before ``start``)."""
        with self._lock:
            self._active.pop(job.id, None)

    def submit(self, lane: str, name: str, work: Callable[[], Any], key: Key = None) -> Job:
        """Queue ``work`` on ``lane`` under ``name``."""
        return self.start(self.reserve(lane, name, key), work)

    def submit_unique(self, lane: str, name: str, work: Callable[[], Any], key: Key) -> Job | None:
        """Queue ``work`` unless a job with ``key`` is queued or running in ``lane`` (then None): one report
        build per campaign at a time."""
        job = self._reserve(lane, name, key, unique=True)
        return None if job is None else self.start(job, work)

    def _run(self, job: Job, work: Callable[[], Any]) -> None:
        """Run one job in a lane's thread: any failure is recorded and logged, never raised there."""
        job.state, job.started_at = JobStatus.RUNNING, utcnow()
        result, error = None, None
        try:
            result = work()
        except Exception as exc:
            error = exc
            if isinstance(exc, UserError):
                log.info("background job %r refused: %s", job.name, exc)
            else:
                log.error("background job %r failed", job.name, exc_info=exc)
        job._settle(result, error)
        with self._lock:
            self._active.pop(job.id, None)
            self._finished.appendleft(job.view())
            self._failed += error is not None
        job._release()

    def _find(self, lane: str, key: Key) -> Job | None:
        """The queued or running job with ``key`` in ``lane`` (call under the lock)."""
        return next((j for j in self._active.values() if j.lane == lane and j.key == key), None)

    def is_held(self, lane: str, key: Key) -> bool:
        """Whether a job with ``key`` is queued or running in ``lane`` in this process."""
        with self._lock:
            return self._find(lane, key) is not None

    def holding(self, lane: str) -> _Holding:
        """A live view of the keys held in ``lane``: ``key in view`` asks at that moment."""
        return _Holding(self, lane)

    def latest(self, lane: str, key: Key) -> JobView | None:
        """The job with ``key`` under way in ``lane``, else the last finished one, else None."""
        with self._lock:
            job = self._find(lane, key)
            if job is not None:
                return job.view()
            keyed = (v for v in self._finished if v.lane == lane and v.key == key)
            return next(keyed, None)

    def status(self) -> BackgroundStatus:
        """What the dashboard shows about this process's background work."""
        with self._lock:
            active = sorted((j.view() for j in self._active.values()), key=lambda v: v.id)
            recent, failed = list(self._finished), self._failed
        lanes = [
            LaneStatus(
                name=name,
                workers=lane.size,
                running=sum(v.lane == name and v.state == JobStatus.RUNNING for v in active),
                queued=sum(v.lane == name and v.state == JobStatus.QUEUED for v in active),
            )
            for name, lane in self._lanes.items()
        ]
        return BackgroundStatus(lanes=lanes, active=active, recent=recent, failed=failed)


class _Holding:
    """``key in holding`` asks ``BackgroundWork.is_held`` at that moment (see ``BackgroundWork.holding``)."""

    def __init__(self, work: BackgroundWork, lane: str) -> None:
        self._work, self._lane = work, lane

    def __contains__(self, key: object) -> bool:
        return isinstance(key, int | str) and self._work.is_held(self._lane, key)
