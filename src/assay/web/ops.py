"""Readiness: may this server take traffic now? (``GET /api/v1/ready``; liveness is ``/api/v1/health``.)

Liveness says the process answers; readiness says it can do its work: the database answers a query within
``TIMEOUT_S``, and its schema is at the revisions this code expects (``alembic_version`` equals the
migration scripts' heads). ``open_store`` migrates on open, so a pending migration means another process
(an older server, a restore, a hand-made change) moved the database under this one: a load balancer or a
pod should route around it until it is at head again. Nothing here writes.
"""

from __future__ import annotations

import concurrent.futures
import functools

from pydantic import BaseModel
from sqlalchemy import Engine

from assay.store.engine import MIGRATIONS

TIMEOUT_S = 3.0  # a database that has not answered by then counts as unreachable
_pool = concurrent.futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="assay-ready")


class Readiness(BaseModel):
    ready: bool
    database: str  # "ok", or why not: "unreachable: ...", "migrations pending: ...", "timeout"
    revisions: list[str]  # the database's current alembic revisions
    heads: list[str]  # the revisions this code expects


@functools.cache
def script_heads() -> tuple[str, ...]:
    """The heads of the migration scripts shipped with this code (read once per process)."""
    from alembic.config import Config
    from alembic.script import ScriptDirectory

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    return tuple(sorted(ScriptDirectory.from_config(config).get_heads()))


def current_revisions(engine: Engine) -> tuple[str, ...]:
    """The database's revisions (one per branch head), from its ``alembic_version`` table."""
    from alembic.runtime.migration import MigrationContext

    with engine.connect() as connection:
        return tuple(sorted(MigrationContext.configure(connection).get_current_heads()))


def readiness(engine: Engine, timeout_s: float = TIMEOUT_S) -> Readiness:
    """Check the database answers and is at head; a hung connection counts as unreachable after
    ``timeout_s`` (the check runs in a small thread pool so a request never waits longer)."""
    heads = list(script_heads())
    future = _pool.submit(current_revisions, engine)
    try:
        revisions = list(future.result(timeout=timeout_s))
    except concurrent.futures.TimeoutError:
        return Readiness(ready=False, database="timeout", revisions=[], heads=heads)
    except Exception as exc:  # the driver's own message: refused, no such host, authentication
        reason = str(getattr(exc, "orig", None) or exc).splitlines()[0] if str(exc) else type(exc).__name__
        return Readiness(ready=False, database=f"unreachable: {reason}", revisions=[], heads=heads)
    if revisions != heads:
        pending = ", ".join(sorted(set(heads) - set(revisions))) or "none"
        state = f"migrations pending: at {', '.join(revisions) or 'nothing'}, want {pending}"
        return Readiness(ready=False, database=state, revisions=revisions, heads=heads)
    return Readiness(ready=True, database="ok", revisions=revisions, heads=heads)
