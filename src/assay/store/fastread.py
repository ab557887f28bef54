"""Read-only listings through the database driver alone, for commands that must answer in under 0.3 s.

WHY: importing SQLAlchemy takes 0.29 s on a 2-core machine and the ORM and the tables 0.5 s more, so
`assay user list` took 1.2 s (docs/benchmarks.md, issue 27). A listing needs none of it: one SELECT on a
database already at the schema's head. Everything else, writes and migrations included, goes through the
one engine (``assay.store.engine``); a reader here answers None whenever it cannot be sure (another driver,
no database yet, a schema not at head), and the caller takes that path instead. Tests hold each reader to
the ORM's answer on SQLite and PostgreSQL.
"""

from __future__ import annotations

import json
import os
from contextlib import closing
from pathlib import Path
from typing import Any
from urllib.parse import quote

from assay import dburl
from assay.store.heads import are_heads


def database_url(environ: dict[str, str] | None = None) -> str:
    """``ASSAY_DB_URL`` (or ``ASSAY_DB_URL_FILE``'s contents), else the SQLite file under ``ASSAY_HOME``
    (default ``~/.assay``): what ``assay.config.settings().database_url`` says, read without
    pydantic-settings (0.05 s), whose environment names are not case-sensitive."""
    names = {key.lower(): value for key, value in (os.environ if environ is None else environ).items()}
    home = Path(names["assay_home"]) if "assay_home" in names else Path.home() / ".assay"
    url = dburl.resolve(names.get("assay_db_url"), names.get("assay_db_url_file"))
    return url or f"sqlite:///{home / 'assay.db'}"


def _connect(url: str) -> Any | None:
    """A DB-API connection for SQLite files and psycopg URLs, opened read-only where the driver can; None
    for anything else, or a SQLite file that does not exist yet (the engine creates it)."""
    if url.startswith("sqlite:///"):
        import sqlite3

        path = url.removeprefix("sqlite:///")
        if not path or path == ":memory:" or "?" in path or not Path(path).is_file():
            return None
        connection = sqlite3.connect(f"file:{quote(path)}?mode=ro", uri=True, timeout=30)
        connection.execute("PRAGMA busy_timeout=30000")
        return connection
    if url.startswith("postgresql+psycopg://"):
        from assay.store import libpq

        plain = url.replace("+psycopg", "", 1)
        if libpq.available():
            return libpq.Connection(plain)  # a few milliseconds where psycopg's import takes 0.2 s
        import psycopg

        connection = psycopg.connect(plain, autocommit=True)
        connection.read_only = True
        return connection
    return None


def _at_head(cursor: Any) -> bool:
    """Whether the database is exactly at the scripts' heads (``engine.at_head``'s test, by the driver)."""
    try:
        cursor.execute("SELECT version_num FROM alembic_version")
    except Exception:  # no such table: a database the engine has not migrated yet
        return False
    return are_heads(row[0] for row in cursor.fetchall())


USERS_PAGE = (
    "SELECT u.username, u.display_name, u.roles, t.name, u.disabled FROM web_users u "
    "LEFT OUTER JOIN teams t ON t.id = u.team_id ORDER BY u.username LIMIT {mark} OFFSET {mark}"
)


def users_page(url: str, limit: int, offset: int) -> tuple[list[dict[str, Any]], int] | None:
    """A page of web users by username and the number of users, as ``assay user list`` prints them; None
    when this module cannot read ``url`` (then ask ``assay.web.accounts.list_users``). Any error of the
    driver is a None too: the engine's path then opens the database and words the error as it words
    every other."""
    try:
        connection = _connect(url)
        if connection is None:
            return None
        with closing(connection), closing(connection.cursor()) as cursor:
            return _read_users(cursor, "?" if url.startswith("sqlite") else "%s", limit, offset)
    except Exception:
        return None


def _read_users(cursor: Any, mark: str, limit: int, offset: int) -> tuple[list[dict[str, Any]], int] | None:
    if not _at_head(cursor):
        return None
    cursor.execute(USERS_PAGE.format(mark=mark), (limit, offset))
    rows = [
        {
            "username": username,
            "display_name": display_name,
            "roles": list(json.loads(roles) if isinstance(roles, str) else roles),
            "team": team,
            "disabled": bool(disabled),
        }
        for username, display_name, roles, team, disabled in cursor.fetchall()
    ]
    cursor.execute("SELECT count(*) FROM web_users")
    return rows, int(cursor.fetchone()[0])
