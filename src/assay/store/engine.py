"""One engine and session factory for the whole package, with the schema brought up to date by Alembic.

SQLite (a file under ``ASSAY_HOME``) by default: foreign keys on, WAL journal so readers do not block the
writer, and a busy timeout so two workers wait for each other instead of failing. PostgreSQL by
``ASSAY_DB_URL``. ``open_store`` migrates on every open where the database is not at the scripts' heads; at
head (the everyday case) it only reads ``alembic_version``, and Alembic is not even imported.
Several processes opening a fresh database at once (uvicorn workers, leaderboard workers) take turns: the
migration runs under a lock, so the second one finds the schema already there instead of racing to create it.
"""

from __future__ import annotations

import fcntl
import functools
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy import Connection, Engine, create_engine, event, inspect, text
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker

from assay.config import settings
from assay.errors import UserError
from assay.store.heads import MIGRATIONS, are_heads

TABLE_MODULES = ("models", "star_models", "web_models", "star_web_models", "dyepack_models")
MIGRATION_LOCK_KEY = 0x61737361  # "assa": the PostgreSQL advisory lock that serialises migrations
POOL_RESERVE = 5  # PostgreSQL connections beyond the web requests': the sweeper, background work


def make_engine(url: str | None = None) -> Engine:
    """An engine for ``url`` (default: ``ASSAY_DB_URL`` or the SQLite file under ``ASSAY_HOME``)."""
    url = url or settings().database_url
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite":
        # One connection for each request a web worker admits (ASSAY_WEB_THREADS), plus the sweeper's and
        # background work's: an admitted request never waits for the pool (assay.web.admission).
        size = settings().web_threads + POOL_RESERVE
        return create_engine(url, pool_pre_ping=True, pool_size=size, max_overflow=0)
    if parsed.database and parsed.database != ":memory:":
        Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
    # No cap on connections: a web server's thread pool (40 in FastAPI) must never wait on a 15-connection
    # pool while the threads holding connections wait on it in turn; SQLite connections cost little.
    engine = create_engine(url, connect_args={"timeout": 30, "check_same_thread": False}, max_overflow=-1)

    @event.listens_for(engine, "connect")
    def _pragmas(connection, _record) -> None:  # type: ignore[no-untyped-def]
        cursor = connection.cursor()
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA busy_timeout=30000")
        cursor.close()

    return engine


def upgrade(engine: Engine, from_models: bool = True) -> None:
    """Bring the schema to the newest Alembic revision of every branch.

    A database with no table at all is built from the models in one step and stamped at the heads
    (Alembic's recipe for a fresh database): the schema the migrations would build (``tests/store`` holds
    the two equal, column by column), in a fraction of the time of running every script on an empty
    database. ``from_models=False`` runs the scripts anyway (the tests that compare the two ways).
    """
    from alembic import command
    from alembic.config import Config

    from assay.store.models import Base  # every table module is imported by open_store first

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    with (
        _file_lock(engine),
        engine.connect() as connection,
        _foreign_keys_deferred(connection),
        connection.begin(),
    ):
        _advisory_lock(connection)
        config.attributes["connection"] = connection
        if from_models and not inspect(connection).get_table_names():
            Base.metadata.create_all(connection)
            command.stamp(config, "heads")
        else:
            command.upgrade(config, "heads")  # pillars may branch from one revision
        _check_foreign_keys(connection)


@contextmanager
def _foreign_keys_deferred(connection: Connection) -> Iterator[None]:
    """On SQLite, migrate with foreign keys off, as SQLite's own procedure for schema changes says: a batch
    migration rebuilds a table (copy, drop, rename), and with them on, dropping a parent that has rows
    fails ("FOREIGN KEY constraint failed"), so a database with data at 0006 could not reach 0007. The
    pragma only takes effect outside a transaction, hence before ``begin`` and after the commit."""
    if connection.dialect.name != "sqlite":
        yield
        return
    connection.exec_driver_sql("PRAGMA foreign_keys=OFF")
    connection.commit()
    try:
        yield
    finally:
        connection.exec_driver_sql("PRAGMA foreign_keys=ON")
        connection.commit()


def _check_foreign_keys(connection: Connection) -> None:
    """On SQLite, refuse (and roll back) a migration that left a row pointing at nothing."""
    if connection.dialect.name == "sqlite":
        broken = connection.exec_driver_sql("PRAGMA foreign_key_check").fetchall()
        if broken:
            raise RuntimeError(
                f"the migration left {len(broken)} broken foreign keys, e.g. {tuple(broken[0])}"
            )


def _advisory_lock(connection: Connection) -> None:
    """On PostgreSQL, hold a transaction-scoped lock so concurrent migrations run one after the other."""
    if connection.dialect.name == "postgresql":
        connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK_KEY})


@contextmanager
def _file_lock(engine: Engine) -> Iterator[None]:
    """On a SQLite file, hold an exclusive flock on ``<file>.migrate-lock`` while migrating.

    SQLite runs DDL outside the migration's transaction, so two processes could both see an empty schema;
    the lock is a separate file because closing any descriptor of the database itself would drop the POSIX
    locks SQLite holds on it.
    """
    database = engine.url.database
    if engine.dialect.name != "sqlite" or not database or database == ":memory:":
        yield
        return
    with open(f"{database}.migrate-lock", "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def database_revisions(engine: Engine) -> tuple[str, ...] | None:
    """The database's ``alembic_version`` rows, sorted; None before the first migration made the table.

    Connection errors are not caught: ``open_store`` turns them into its one line, as it did when
    Alembic met them first.
    """
    with engine.connect() as connection:
        if not inspect(connection).has_table("alembic_version"):
            return None
        rows = connection.execute(text("SELECT version_num FROM alembic_version")).scalars().all()
    return tuple(sorted(rows))


def at_head(engine: Engine) -> bool:
    """Whether the database is exactly at the migration scripts' heads, so there is nothing to migrate.

    Anything else goes through ``upgrade``, which migrates or fails as it always did."""
    return are_heads(database_revisions(engine))


def open_store(url: str | None = None) -> sessionmaker[Session]:
    """Engine + migrations + a session factory; a database that cannot be opened is a one-line error.

    Every table module is imported first, so each mapped class can find the others its relationships name,
    whichever of them the caller imported."""
    import importlib

    for tables in TABLE_MODULES:
        importlib.import_module(f"assay.store.{tables}")
    engine = make_engine(url)
    try:
        if not at_head(engine):
            upgrade(engine)
    except Exception as exc:  # an unreachable server, a file that is not a database, a read-only folder
        shown = make_url(url or settings().database_url).render_as_string(hide_password=True)
        reason = getattr(exc, "orig", None) or exc  # the driver's message, without SQLAlchemy's help link
        raise UserError(f"{shown}: cannot open the database ({str(reason).splitlines()[0]})") from exc
    factory = sessionmaker(engine, expire_on_commit=False)
    held = importlib.import_module("assay.store.star_models").StarCampaign
    event.listen(factory, "loaded_as_persistent", functools.partial(_hold_rows, held))
    return factory


def _hold_rows(kind: type, session: Session, instance: object) -> None:
    """Keep each row of ``kind`` (campaigns) loaded by ``session`` for the session's life.

    SQLAlchemy's identity map holds rows only while something else references them, so the several steps
    of one STAR request that each look up the task's campaign (``session.get``) loaded it again and again:
    3-4 times a claim (issue 27's crowd). Campaigns are few and rarely change; a session is one request."""
    if isinstance(instance, kind):
        session.info.setdefault("held", []).append(instance)
