"""The driver-only reader behind `assay user list` answers exactly what the ORM answers, or steps aside.

It must never answer differently from ``accounts.list_users``: held to it on SQLite and PostgreSQL over
several windows, with teams, disabled accounts and several roles. Where it cannot be sure (no database yet,
a schema behind or ahead, another driver) it answers None and the command takes the ORM's path.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import text
from typer.testing import CliRunner

from assay.cli import app as cli_app
from assay.config import Settings
from assay.leaderboard.rounds import add_team
from assay.store import fastread, open_store
from assay.store.engine import make_engine
from assay.web import accounts
from assay.web.cli import _users_page as orm_page  # the command's ORM path


def _seed(url: str) -> None:
    sessions = open_store(url)
    with sessions.begin() as session:
        team = add_team(session, "red-team")
        for index, name in enumerate(["zoe", "alice", "bob.b", "carol_c", "dave-d", "erin"]):
            roles = ["organiser"] if index == 0 else ["annotator", "viewer"] if index % 2 else ["team_member"]
            user = accounts.create_user(
                session,
                name,
                "a-long-password-1",
                roles,
                team if "team_member" in roles else None,
                name.upper(),
            )
            user.disabled = index == 3


def test_a_page_equals_the_orms_on_each_backend(db_url: str) -> None:
    _seed(db_url)
    for limit, offset in [(100, 0), (2, 0), (2, 2), (3, 5), (5, 10)]:
        assert fastread.users_page(db_url, limit, offset) == orm_page(db_url, limit, offset)
    rows, total = fastread.users_page(db_url, 100, 0)  # type: ignore[misc]
    assert total == 6 and rows[0]["username"] == "alice" and rows[-1]["username"] == "zoe"
    assert {row["team"] for row in rows} == {"red-team", None}
    assert [row["disabled"] for row in rows].count(True) == 1


def test_it_steps_aside_where_it_cannot_be_sure(tmp_path: Path) -> None:
    missing = f"sqlite:///{tmp_path / 'nothing-yet.db'}"
    assert fastread.users_page(missing, 10, 0) is None
    assert not (tmp_path / "nothing-yet.db").exists()  # read-only: it created nothing
    assert fastread.users_page("mysql://u:p@127.0.0.1/x", 10, 0) is None
    assert fastread.users_page("sqlite://", 10, 0) is None  # in memory: nothing to read
    empty = tmp_path / "empty.db"
    empty.write_bytes(b"")
    assert fastread.users_page(f"sqlite:///{empty}", 10, 0) is None  # no alembic_version
    behind = f"sqlite:///{tmp_path / 'behind.db'}"
    _seed(behind)
    with make_engine(behind).begin() as connection:  # one branch's head row gone: as if behind on it
        newest = "SELECT max(version_num) FROM alembic_version"
        connection.execute(text(f"DELETE FROM alembic_version WHERE version_num = ({newest})"))
    assert fastread.users_page(behind, 10, 0) is None  # the ORM's path decides
    broken = f"sqlite:///{tmp_path / 'broken.db'}"
    open_store(broken)
    with make_engine(broken).begin() as connection:  # at head, but the table is not what it reads
        connection.execute(text("ALTER TABLE web_users RENAME COLUMN display_name TO shown_name"))
    assert fastread.users_page(broken, 10, 0) is None  # a driver error is a None, never a traceback
    not_a_database = tmp_path / "junk.db"
    not_a_database.write_text("not sqlite")
    assert fastread.users_page(f"sqlite:///{not_a_database}", 10, 0) is None  # the engine words the error


@pytest.mark.parametrize(
    "environ",
    [
        {},
        {"ASSAY_HOME": "/srv/assay"},
        {"assay_home": "/srv/lower"},
        {"ASSAY_DB_URL": "postgresql+psycopg://u:p@db:5432/assay"},
        {"ASSAY_HOME": "/srv/assay", "ASSAY_DB_URL": ""},
        {"ASSAY_HOME": "/srv/assay", "assay_db_url": "sqlite:////data/x.db"},
    ],
)
def test_the_default_url_is_the_settings(environ: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("ASSAY_HOME", "ASSAY_DB_URL", "assay_home", "assay_db_url"):
        monkeypatch.delenv(name, raising=False)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    assert fastread.database_url() == Settings().database_url


def test_the_command_reads_the_same_either_way(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`user list` answers through the reader at head, and through the ORM on a fresh home (which it
    creates and migrates), with the same output for the same users."""
    monkeypatch.setenv("ASSAY_HOME", str(tmp_path))
    monkeypatch.delenv("ASSAY_DB_URL", raising=False)
    runner = CliRunner()
    fresh = runner.invoke(cli_app, ["user", "list", "--json"])
    assert fresh.exit_code == 0 and fresh.output.strip() == "[]"
    url = fastread.database_url()
    assert fastread.users_page(url, 100, 0) == ([], 0)  # the ORM's path left it at head
    _seed(url)
    by_reader = runner.invoke(cli_app, ["user", "list", "--limit", "3", "--offset", "1"])
    monkeypatch.setattr(fastread, "users_page", lambda *_: None)
    by_orm = runner.invoke(cli_app, ["user", "list", "--limit", "3", "--offset", "1"])
    assert by_reader.exit_code == by_orm.exit_code == 0
    assert by_reader.output == by_orm.output and "users 2-4 of 6" in by_reader.output


@pytest.mark.parametrize(
    ("limit", "word"), [("0", "greater than or equal to 1"), ("501", "less than or equal to")]
)
def test_a_limit_out_of_bounds_is_still_refused(limit: str, word: str, tmp_path: Path, monkeypatch) -> None:
    """The bounded ``--limit`` skips typer's pydantic adapter only when in bounds; outside them it still
    gets the adapter's one-line refusal and exit code 2."""
    monkeypatch.setenv("ASSAY_HOME", str(tmp_path))
    result = CliRunner().invoke(cli_app, ["user", "list", "--limit", limit])
    assert result.exit_code == 2 and word in result.output


@pytest.mark.slow
@pytest.mark.parametrize("driver", ["libpq", "psycopg"])
def test_on_postgresql_libpq_and_psycopg_read_what_the_orm_reads(driver: str, postgres, monkeypatch) -> None:
    """Both PostgreSQL ways agree with the ORM: libpq through ctypes (the fast one, where a libpq loads)
    and psycopg (where none does); NULLs, booleans, JSON roles and non-ASCII names included."""
    from assay.store import libpq

    url = postgres.new_database()
    _seed(url)
    sessions = open_store(url)
    with sessions.begin() as session:
        accounts.create_user(session, "yves", "a-long-password-1", ["viewer"]).disabled = True
        accounts.create_user(session, "xena", "a-long-password-1", ["viewer"], None, "Xéna Ünïcode ✓")
    if driver == "psycopg":
        monkeypatch.setattr(libpq, "available", lambda: False)
    else:
        assert libpq.available()
    for limit, offset in [(100, 0), (3, 2), (2, 6)]:
        assert fastread.users_page(url, limit, offset) == orm_page(url, limit, offset)
    rows, total = fastread.users_page(url, 100, 0)  # type: ignore[misc]
    by_name = {row["username"]: row for row in rows}
    assert total == 8 and by_name["xena"]["display_name"] == "Xéna Ünïcode ✓"
    assert by_name["yves"] == {
        "username": "yves",
        "display_name": "",
        "roles": ["viewer"],
        "team": None,
        "disabled": True,
    }


@pytest.mark.slow
def test_the_libpq_session_is_read_only_and_a_refusal_is_an_error(postgres) -> None:
    from assay.store.libpq import Connection, LibpqError

    url = postgres.new_database()
    _seed(url)
    connection = Connection(url.replace("+psycopg", "", 1))
    try:
        connection.execute("SELECT count(*), bool_or(disabled) FROM web_users WHERE username <> %s", ["zoe"])
        assert connection.fetchall() == [(5, True)]
        with pytest.raises(LibpqError, match="read-only transaction"):
            connection.execute("DELETE FROM web_users")
    finally:
        connection.close()
    missing = url.rsplit("/", 1)[0] + "/no_such_database_here"
    with pytest.raises(LibpqError, match="does not exist"):
        Connection(missing.replace("+psycopg", "", 1))
    assert fastread.users_page(missing, 10, 0) is None  # the engine's path words the error


@pytest.mark.slow
def test_user_list_on_postgresql_at_head_imports_no_driver_but_libpq(postgres, tmp_path: Path) -> None:
    """The 0.3 s goal on PostgreSQL: no SQLAlchemy, Alembic, pydantic, and no psycopg either."""
    import json
    import os
    import subprocess
    import sys

    url = postgres.new_database()
    _seed(url)
    env = {**os.environ, "ASSAY_DB_URL": url, "ASSAY_HOME": str(tmp_path)}
    probe = (
        "import runpy, sys, json\nsys.argv = ['assay', 'user', 'list', '--json']\n"
        "try:\n    runpy.run_module('assay', run_name='__main__')\nexcept SystemExit:\n    pass\n"
        "print('LOADED', json.dumps(sorted({m.split('.')[0] for m in sys.modules} & "
        "{'sqlalchemy', 'alembic', 'pydantic', 'psycopg', 'psycopg_binary'})))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=120)
    listed, loaded = done.stdout.rsplit("LOADED ", 1)
    assert json.loads(loaded) == [], done.stderr
    assert [row["username"] for row in json.loads(listed)][:2] == ["alice", "bob.b"]
