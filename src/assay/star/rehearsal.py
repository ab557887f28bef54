"""Who holds a machine rehearsal's claims, so that a killed ``assay star simulate`` strands none of them.

A rehearsal claims its tasks as its machine personas (``PERSONA_PREFIX`` ids), for which nobody but the
running simulate process works. While it runs, that process holds the campaign's rehearsal lock (``hold``):
on SQLite an exclusive ``flock`` on ``<database>.simulate-<campaign>.lock`` beside the database file (as the
store's migration lock is), on PostgreSQL a session advisory lock. Either is let go by the operating system
or the server the moment the process ends, SIGKILL included, and a pid reused later changes nothing. So a
free lock proves that nobody works for those personas any more: ``release_orphaned`` (part of every sweep)
then puts their claims back in the queue at once, instead of after the campaign's claim timeout (120
minutes by default), and a simulate that takes the lock releases what a dead one left before it resumes.

The sweep holds the lock while it releases, and a starting simulate waits a few seconds for it, so a sweep
never releases the claims of a rehearsal that starts meanwhile. A second simulate of a campaign whose lock
is held is refused in one line naming the holder (``host:pid``, written into the lock file on SQLite).
An in-memory SQLite database is seen by this process alone, so its lock is a lock within the process.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator

from sqlalchemy import Engine, select, text, update
from sqlalchemy.orm import Session, sessionmaker

from assay.errors import UserError
from assay.names import NAME
from assay.store.enums import TaskStatus
from assay.store.star_models import StarCampaign, StarParticipant, StarTask

PERSONA_PREFIX = "llm-persona-"  # the external ids of a rehearsal's machine personas
WAIT_SECONDS = 5.0  # how long a starting simulate waits for a sweep that holds the lock
# "STAR": the first key of the PostgreSQL advisory lock; a digest of the campaign's name gives the second.
LOCK_CLASS = 0x53544152
_IN_PROCESS: dict[str, threading.Lock] = {}  # in-memory SQLite: the locks, by campaign name
_IN_PROCESS_GUARD = threading.Lock()


@contextlib.contextmanager
def hold(sessions: sessionmaker[Session], name: str, wait: float = WAIT_SECONDS) -> Iterator[None]:
    """Hold campaign ``name``'s rehearsal lock for the block; a one-line ``UserError`` when another
    process still holds it after ``wait`` seconds (a sweep holds it only for a moment)."""
    with _locked(_engine(sessions), name, wait) as (held, holder):
        if not held:
            raise UserError(
                f"campaign {name!r} is being rehearsed by another `assay star simulate` right now"
                f"{f' ({holder})' if holder else ''}; let it finish or stop it, then run this again"
            )
        yield


def persona_claims(session: Session, campaign_id: int) -> list[int]:
    """The campaign's tasks claimed by its machine personas: what only a running simulate works on."""
    return list(
        session.scalars(
            select(StarTask.id)
            .join(StarParticipant, StarParticipant.id == StarTask.participant_id)
            .where(
                StarTask.campaign_id == campaign_id,
                StarTask.status == TaskStatus.CLAIMED,
                StarParticipant.external_id.startswith(PERSONA_PREFIX, autoescape=True),
            )
            .order_by(StarTask.id)
        )
    )


def release_persona_claims(session: Session, campaign_id: int) -> list[int]:
    """Put the personas' claims back in the queue (open, nobody's); their ids. Call it holding the lock."""
    claimed = persona_claims(session, campaign_id)
    if not claimed:
        return []
    released = session.scalars(
        update(StarTask)
        .where(StarTask.id.in_(claimed), StarTask.status == TaskStatus.CLAIMED)
        .values(status=TaskStatus.OPEN, participant_id=None, claimed_at=None)
        .returning(StarTask.id)
        .execution_options(synchronize_session="fetch")  # loaded tasks see the release
    ).all()
    session.flush()
    return sorted(released)


def release_orphaned(sessions: sessionmaker[Session], campaign_id: int) -> int:
    """The sweep's part: release the personas' claims when no simulate holds the campaign any more; how
    many. Reads only (and touches no lock) when no persona holds a claim, which is the usual case."""
    with sessions() as session:
        if not persona_claims(session, campaign_id):
            return 0
        name = session.get_one(StarCampaign, campaign_id).name
    with _locked(_engine(sessions), name, 0.0) as (held, _):
        if not held:  # a simulate is working on them
            return 0
        with sessions.begin() as session:
            return len(release_persona_claims(session, campaign_id))


def this_holder() -> str:
    """Who holds a lock: ``host:pid``, for the message a second simulate gets."""
    return f"{socket.gethostname()}:{os.getpid()}"


def _engine(sessions: sessionmaker[Session]) -> Engine:
    bind = sessions.kw.get("bind")
    if not isinstance(bind, Engine):
        raise TypeError("a rehearsal lock needs a sessionmaker bound to an engine (assay.store.open_store)")
    return bind


@contextlib.contextmanager
def _locked(engine: Engine, name: str, wait: float) -> Iterator[tuple[bool, str]]:
    """Try for ``wait`` seconds to take campaign ``name``'s lock; yields (taken, who holds it otherwise)."""
    if engine.dialect.name == "postgresql":
        lock = _advisory_lock(engine, name, wait)
    elif engine.dialect.name == "sqlite" and engine.url.database not in (None, "", ":memory:"):
        lock = _file_lock(f"{engine.url.database}.simulate-{_file_part(name)}.lock", wait)
    else:
        lock = _process_lock(f"{engine.url}|{name}", wait)
    with lock as taken:
        yield taken


def _file_part(name: str) -> str:
    """The campaign name in a lock file's name: as it is when it follows the name rule (campaigns stored
    before simulate checked its ``--campaign`` may not), else a digest of it."""
    return name if NAME.fullmatch(name) else hashlib.sha256(name.encode()).hexdigest()[:16]


def _retry(attempt: Callable[[], bool], wait: float) -> bool:
    """Call ``attempt`` until it returns True or ``wait`` seconds have passed."""
    deadline = time.monotonic() + wait
    while not attempt():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True


@contextlib.contextmanager
def _file_lock(path: str, wait: float) -> Iterator[tuple[bool, str]]:
    """An exclusive ``flock`` on ``path`` (a file of its own: closing a descriptor of the database itself
    would drop the POSIX locks SQLite holds on it); the holder writes ``host:pid`` into it."""
    with open(path, "a+", encoding="utf-8") as handle:

        def attempt() -> bool:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False
            return True

        if not _retry(attempt, wait):
            handle.seek(0)
            yield False, handle.read().strip()
            return
        try:
            handle.truncate(0)
            handle.write(this_holder())
            handle.flush()
            yield True, ""
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@contextlib.contextmanager
def _advisory_lock(engine: Engine, name: str, wait: float) -> Iterator[tuple[bool, str]]:
    """A session advisory lock on a connection of its own, kept for the block (the server lets it go if
    the process dies) and unlocked before the connection goes back to the pool."""
    key = {
        "a": LOCK_CLASS,
        "b": int.from_bytes(hashlib.sha256(name.encode()).digest()[:4], "big", signed=True),
    }
    with engine.connect() as connection:

        def attempt() -> bool:
            taken = connection.execute(text("SELECT pg_try_advisory_lock(:a, :b)"), key).scalar_one()
            connection.commit()  # no transaction left open while the lock is held
            return bool(taken)

        if not _retry(attempt, wait):
            yield False, ""
            return
        try:
            yield True, ""
        finally:
            connection.execute(text("SELECT pg_advisory_unlock(:a, :b)"), key)
            connection.commit()


@contextlib.contextmanager
def _process_lock(key: str, wait: float) -> Iterator[tuple[bool, str]]:
    with _IN_PROCESS_GUARD:
        lock = _IN_PROCESS.setdefault(key, threading.Lock())
    if not _retry(lambda: lock.acquire(blocking=False), wait):
        yield False, this_holder()
        return
    try:
        yield True, ""
    finally:
        lock.release()
