"""assay.store: migrations create the schema the models declare, on a real SQLite file and on a real
PostgreSQL server (tests/postgres.py), and several processes opening a fresh database take turns."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import inspect, select, text

from assay.errors import UserError
from assay.store import Base, Round, Split, Team, make_engine, open_store
from assay.store.engine import at_head, upgrade


def test_migrations_match_the_models(db_url: str) -> None:
    url = db_url
    open_store(url)  # the table modules registered
    engine = make_engine(url)
    upgrade(engine, from_models=False)  # every script, from an empty database
    with engine.connect() as connection:
        diff = compare_metadata(MigrationContext.configure(connection), Base.metadata)
    assert diff == []
    assert set(inspect(engine).get_table_names()) >= {"rounds", "splits", "teams", "submissions", "jobs"}


def schema(url: str) -> dict[str, object]:
    """Every table's columns (type, nullability, server default), indexes (with their WHERE), unique, foreign
    key, primary key and check constraints, as the database itself reports them."""
    found = inspect(make_engine(url))
    tables: dict[str, object] = {}
    for table in found.get_table_names():
        columns = {
            c["name"]: (str(c["type"]), c["nullable"], str(c.get("default")))
            for c in found.get_columns(table)
        }
        indexes = sorted(
            (
                i["name"],
                tuple(i["column_names"]),
                bool(i["unique"]),
                sorted((k, str(v)) for k, v in i.get("dialect_options", {}).items()),
            )
            for i in found.get_indexes(table)
        )
        uniques = sorted(tuple(u["column_names"]) for u in found.get_unique_constraints(table))
        keys = sorted(
            (
                tuple(f["constrained_columns"]),
                f["referred_table"],
                tuple(f["referred_columns"]),
                str(f.get("options")),
            )
            for f in found.get_foreign_keys(table)
        )
        checks = sorted(str(c["sqltext"]) for c in found.get_check_constraints(table))
        tables[table] = (
            columns,
            indexes,
            uniques,
            keys,
            found.get_pk_constraint(table)["constrained_columns"],
            checks,
        )
    return tables


def test_a_fresh_database_built_from_the_models_is_the_migrated_one(
    db_url: str, request: pytest.FixtureRequest
) -> None:
    """An empty database is created from the models and stamped (fast); the result is, table by table and
    column by column, what running every migration script builds, and it is at the heads."""
    second = (
        db_url.replace("store.db", "scripts.db")
        if db_url.startswith("sqlite")
        else request.getfixturevalue("postgres").new_database()
    )
    open_store(db_url)  # empty: built from the models
    upgrade(make_engine(second), from_models=False)
    assert at_head(make_engine(db_url)) and at_head(make_engine(second))
    built, migrated = schema(db_url), schema(second)
    assert len(built) >= 30 and built == migrated


OPEN_AT_ONCE = """
import sys, time
from pathlib import Path
go = Path(sys.argv[2])
while not go.exists():
    time.sleep(0.005)
from assay.store import open_store
open_store(sys.argv[1])
"""


@pytest.mark.slow
def test_processes_opening_a_fresh_database_at_once_all_succeed(db_url: str, tmp_path: Path) -> None:
    go = tmp_path / "go"
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", OPEN_AT_ONCE, db_url, str(go)], stderr=subprocess.PIPE, text=True
        )
        for _ in range(4)
    ]
    time.sleep(3)  # every process has imported assay.store and is waiting for the signal
    go.touch()
    errors = [worker.communicate(timeout=120)[1] for worker in workers]
    assert [worker.returncode for worker in workers] == [0, 0, 0, 0], "\n".join(errors)
    engine = make_engine(db_url)
    with engine.connect() as connection:
        versions = connection.execute(text("SELECT version_num FROM alembic_version")).scalars().all()
        assert compare_metadata(MigrationContext.configure(connection), Base.metadata) == []
    assert len(versions) == len(set(versions)) >= 2  # one row per branch head, none twice


def test_default_url_under_assay_home_and_reopen_keeps_data(assay_home: Path) -> None:
    sessions = open_store()
    assert (assay_home / "assay.db").is_file()
    with sessions.begin() as session:
        session.add(
            Round(name="r1", dataset="/data/r1", splits=[Split(name="test", models_path="m", truth_path="t")])
        )
        session.add(Team(name="alpha"))
    with open_store().begin() as session:  # migrations again: a no-op
        assert session.scalars(select(Round.name)).all() == ["r1"]
        assert session.scalars(select(Split.name)).all() == ["test"]


def test_foreign_keys_enforced_and_bad_database_is_one_line(tmp_path: Path) -> None:
    sessions = open_store(f"sqlite:///{tmp_path / 'b.db'}")
    with pytest.raises(Exception, match="FOREIGN KEY"), sessions.begin() as session:
        session.add(Split(round_id=99, name="test", models_path="m", truth_path="t"))
    bad = tmp_path / "not-a-db.db"
    bad.write_bytes(b"this is not a database file at all" * 100)
    with pytest.raises(UserError) as info:
        open_store(f"sqlite:///{bad}")
    assert "cannot open the database" in str(info.value) and "\n" not in str(info.value)
