"""Every schema revision a release ever shipped upgrades to today's heads with its data intact.

For each revision in ``src/assay/store/migrations``: a new SQLite database is built at exactly that
revision with Alembic, every table gets a row (values chosen by column type, foreign keys pointing at the
parent's row), then ``open_store`` opens it as a newer release would (upgrading to heads), and every row is
read back: still there, and every column that still exists holds what was written. Migrations that drop a
column lose only that column; no migration here rewrites data, so any other difference is a bug.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory
from sqlalchemy import (
    JSON,
    Boolean,
    DateTime,
    Float,
    Integer,
    LargeBinary,
    MetaData,
    Table,
    create_engine,
    select,
)

from assay.store import open_store
from assay.store.engine import MIGRATIONS


def _config() -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    return config


def _revisions() -> list[str]:
    """Every revision, oldest first."""
    return [r.revision for r in reversed(list(ScriptDirectory.from_config(_config()).walk_revisions()))]


def _value(table: Table, column: Any, filled: dict[str, dict[str, Any]]) -> Any:
    """A value of the column's type; a foreign key takes the parent row's value (a self-reference: none)."""
    for key in column.foreign_keys:
        parent = key.column.table.name
        return None if parent == table.name else filled[parent][key.column.name]
    kind = column.type
    if isinstance(kind, Boolean):
        return True
    if isinstance(kind, Integer):
        return 3 if column.primary_key else 7
    if isinstance(kind, Float):
        return 0.25
    if isinstance(kind, DateTime):
        return datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    if isinstance(kind, JSON):
        return {"kept": [1, 2]}
    if isinstance(kind, LargeBinary):
        return b"\x00kept"
    text = f"{table.name}.{column.name}"
    return text[: kind.length] if getattr(kind, "length", None) else text


def _fill(url: str) -> dict[str, dict[str, Any]]:
    """One row in every table (parents first); returns the rows as the database reads them back."""
    engine = create_engine(url)
    filled: dict[str, dict[str, Any]] = {}
    try:
        with engine.begin() as connection:
            if connection.dialect.name == "sqlite":
                connection.exec_driver_sql("PRAGMA foreign_keys=ON")
            meta = MetaData()
            meta.reflect(connection)
            for table in meta.sorted_tables:
                if table.name == "alembic_version":
                    continue
                row = {}
                for column in table.columns:
                    row[column.name] = _value(table, column, {**filled, table.name: row})
                connection.execute(table.insert(), row)
                filled[table.name] = row
        return _read(url, filled)
    finally:
        engine.dispose()


def _read(url: str, rows: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each table's row with the written row's key, as stored now (None when the row is gone)."""
    engine = create_engine(url)
    try:
        with engine.connect() as connection:
            meta = MetaData()
            meta.reflect(connection)
            out = {}
            for name, row in rows.items():
                table = meta.tables[name]
                keys = [c for c in table.primary_key.columns]
                found = (
                    connection.execute(select(table).where(*(k == row[k.name] for k in keys)))
                    .mappings()
                    .all()
                )
                out[name] = dict(found[0]) if len(found) == 1 else None
            return out
    finally:
        engine.dispose()


@pytest.mark.slow
@pytest.mark.parametrize("revision", _revisions())
def test_every_revision_upgrades_to_heads_with_its_rows(revision: str, tmp_path: Path) -> None:
    _upgrade_with_rows(f"sqlite:///{tmp_path / 'old.db'}", revision)


@pytest.mark.slow
def test_the_oldest_revision_upgrades_to_heads_with_its_rows_on_postgresql(postgres) -> None:  # type: ignore[no-untyped-def]
    """The whole chain on PostgreSQL, where migrations alter tables in place instead of rebuilding them."""
    _upgrade_with_rows(postgres.new_database(), _revisions()[0])


def _upgrade_with_rows(url: str, revision: str) -> None:
    engine = create_engine(url)
    config = _config()
    with engine.begin() as connection:
        config.attributes["connection"] = connection
        command.upgrade(config, revision)
    engine.dispose()
    before = _fill(url)
    assert before, f"{revision}: no tables"

    open_store(url)  # what a newer release does when it opens an older database

    after = _read(url, before)
    for table, row in before.items():
        assert after[table] is not None, f"{revision}: the row of {table} is gone after the upgrade"
        kept = {name: value for name, value in row.items() if name in after[table]}
        assert kept == {name: after[table][name] for name in kept}, f"{revision}: {table} changed"
