"""Sign-in throttling: slow down guessing without letting a stranger lock anyone out.

Failed sign-ins are counted in four scopes (``ThrottleScope``). A client address with no device cookie for
the name is counted per address (20 free failures), per (address, name) (5) and per name over all such
clients (50, the distributed guesser); a browser that has signed in to the account before (its
``assay_device`` cookie, OWASP's "device cookie" scheme) is counted only on its own (5). Past the free
failures each further one doubles the wait, from 1 s up to 15 min, and a waiting attempt is refused with
429 and ``Retry-After`` before any password is hashed. So a flood against a name from anywhere slows the
flood and unknown clients, never the account's owner on a browser they used before; a success clears its
own (address, name) or device count, never the others. Counts fall back to zero after an hour without a
failure. Keys are the name as typed, so a name that exists and one that does not are throttled the same and
nothing tells them apart. Each block that starts is written to the audit trail.

Counts live in the database (``web_login_throttles``), so every worker process sees the same ones; the
increment is one UPDATE, safe under concurrent requests.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import case, delete, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from assay.store.enums import ThrottleScope
from assay.store.models import as_utc
from assay.store.web_models import WebLoginThrottle
from assay.web.audit import record

FREE_FAILURES = {
    ThrottleScope.CLIENT: 20,
    ThrottleScope.CLIENT_ACCOUNT: 5,
    ThrottleScope.ACCOUNT: 50,
    ThrottleScope.DEVICE: 5,
}
FIRST_WAIT = timedelta(seconds=1)
LONGEST_WAIT = timedelta(minutes=15)
FORGET_AFTER = timedelta(hours=1)  # a count with no failure for this long starts again from zero


@dataclass(frozen=True)
class Attempt:
    """Who tries to sign in: the client's address, the name as typed, and their known device (if any)."""

    client: str
    username: str
    device: str | None = None  # sha256 of a device cookie that belongs to this name's account

    def counts(self) -> list[tuple[ThrottleScope, str]]:
        """The counts this attempt is judged by and adds to."""
        name = self.username.strip().lower()[:200]
        if self.device is not None:
            return [(ThrottleScope.DEVICE, self.device)]
        return [
            (ThrottleScope.CLIENT, self.client),
            (ThrottleScope.CLIENT_ACCOUNT, f"{self.client} {name}"),
            (ThrottleScope.ACCOUNT, name),
        ]


def wait_for(failures: int, scope: ThrottleScope) -> timedelta | None:
    """How long an attempt must wait after ``failures`` in ``scope``: nothing within the free failures."""
    extra = failures - FREE_FAILURES[scope]
    if extra < 0:
        return None
    return min(FIRST_WAIT * 2 ** min(extra, 20), LONGEST_WAIT)


def retry_after(session: Session, attempt: Attempt, now: datetime) -> int | None:
    """Seconds until ``attempt`` may be tried, or None if it may be tried now."""
    waits = [
        row.blocked_until
        for scope, key in attempt.counts()
        if (row := _row(session, scope, key)) is not None and row.blocked_until is not None
    ]
    latest = max((_utc(w) for w in waits), default=None)
    return math.ceil((latest - now).total_seconds()) if latest is not None and latest > now else None


def record_failure(session: Session, attempt: Attempt, now: datetime) -> None:
    """Count one failure in each of the attempt's scopes; a count past its free failures starts a wait."""
    for scope, key in attempt.counts():
        _ensure_row(session, scope, key, now)
        session.execute(
            update(WebLoginThrottle)
            .where(WebLoginThrottle.scope == scope, WebLoginThrottle.key == key)
            .values(
                failures=case(
                    (WebLoginThrottle.last_failure_at < now - FORGET_AFTER, 1),
                    else_=WebLoginThrottle.failures + 1,
                ),
                last_failure_at=now,
            )
        )
        row = _row(session, scope, key)
        assert row is not None
        session.refresh(row)
        wait = wait_for(row.failures, scope)
        if wait is not None:
            if row.failures == FREE_FAILURES[scope]:
                record(
                    session, None, "signin.throttle", key[:200], f"{scope}: {row.failures} failed sign-ins"
                )
            row.blocked_until = now + wait
    session.flush()


def record_success(session: Session, attempt: Attempt) -> None:
    """A success clears the count of this (address, name) or this device, never anyone else's."""
    for scope, key in attempt.counts():
        if scope in (ThrottleScope.CLIENT_ACCOUNT, ThrottleScope.DEVICE):
            session.execute(
                delete(WebLoginThrottle).where(WebLoginThrottle.scope == scope, WebLoginThrottle.key == key)
            )


def names_waiting(session: Session, usernames: list[str], now: datetime) -> dict[str, datetime]:
    """Of ``usernames``, those unknown clients must wait for now, and until when (one query, for lists)."""
    names = {u.strip().lower(): u for u in usernames}
    rows = session.execute(
        select(WebLoginThrottle.key, WebLoginThrottle.blocked_until).where(
            WebLoginThrottle.scope == ThrottleScope.ACCOUNT,
            WebLoginThrottle.key.in_(list(names)),
            WebLoginThrottle.blocked_until > now,
        )
    )
    return {names[key]: _utc(until) for key, until in rows if key in names}


def forget_name(session: Session, username: str, devices: list[str]) -> None:
    """Clear every count about ``username`` (an organiser lifting the wait): its name, every address's
    count for it, and its devices' counts."""
    name = username.strip().lower()
    session.execute(
        delete(WebLoginThrottle).where(
            ((WebLoginThrottle.scope == ThrottleScope.ACCOUNT) & (WebLoginThrottle.key == name))
            | (
                (WebLoginThrottle.scope == ThrottleScope.CLIENT_ACCOUNT)
                & WebLoginThrottle.key.endswith(f" {name}")
            )
            | ((WebLoginThrottle.scope == ThrottleScope.DEVICE) & WebLoginThrottle.key.in_(devices))
        )
    )


def prune(session: Session, now: datetime) -> int:
    """Delete counts that have been quiet past ``FORGET_AFTER`` and wait no more (the sweeper calls it)."""
    quiet = (WebLoginThrottle.last_failure_at < now - FORGET_AFTER) & (
        WebLoginThrottle.blocked_until.is_(None) | (WebLoginThrottle.blocked_until < now)
    )
    return session.execute(delete(WebLoginThrottle).where(quiet)).rowcount or 0


def _row(session: Session, scope: ThrottleScope, key: str) -> WebLoginThrottle | None:
    return session.scalar(
        select(WebLoginThrottle).where(WebLoginThrottle.scope == scope, WebLoginThrottle.key == key)
    )


def _ensure_row(session: Session, scope: ThrottleScope, key: str, now: datetime) -> None:
    """Insert the count's row unless it exists (two workers may race to make it: the loser does nothing)."""
    values = {"scope": scope, "key": key, "failures": 0, "last_failure_at": now}
    dialect = postgresql if session.get_bind().dialect.name == "postgresql" else sqlite
    session.execute(dialect.insert(WebLoginThrottle).values(**values).on_conflict_do_nothing())


def _utc(moment: datetime) -> datetime:
    result = as_utc(moment)
    assert result is not None
    return result
