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


def test_migrations_match_the_models(db_url: str) -> None:
    url = db_url
    open_store(url)
    engine = make_engine(url)
    with engine.connect() as connection:
        diff = compare_metadata(MigrationContext.configure(connection), Base.metadata)
    assert diff == []
    assert set(inspect(engine).get_table_names()) >= {"rounds", "splits", "teams", "submissions", "jobs"}


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
