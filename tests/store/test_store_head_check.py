"""``open_store`` leaves Alembic out only for a database exactly at the migration scripts' heads.

The check reads the heads from the scripts' text (``script_heads``) and the database's ``alembic_version``;
everything else (a fresh database, one behind, one ahead of this code) still goes through Alembic and
migrates, or fails in one line, as before.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine, text

from assay.errors import UserError
from assay.store import engine as store_engine
from assay.store import heads, open_store


def _config() -> Config:
    config = Config()
    config.set_main_option("script_location", str(store_engine.MIGRATIONS))
    return config


@pytest.fixture
def upgrades(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Each Alembic upgrade ``open_store`` runs, by database URL."""
    calls: list[str] = []
    original = store_engine.upgrade

    def counted(engine):  # type: ignore[no-untyped-def]
        calls.append(str(engine.url))
        original(engine)

    monkeypatch.setattr(store_engine, "upgrade", counted)
    return calls


def test_the_heads_read_from_the_scripts_are_alembics() -> None:
    alembic_heads = tuple(sorted(ScriptDirectory.from_config(_config()).get_heads()))
    assert heads.script_heads() == alembic_heads
    assert len(alembic_heads) >= 2  # two branch heads today: the reading must handle branches and merges


def test_every_revision_id_fits_alembic_version_on_postgresql() -> None:
    """``alembic_version.version_num`` is VARCHAR(32): PostgreSQL refuses a longer id at the upgrade that
    stamps it (SQLite does not check), so a long name passes on SQLite and fails every PostgreSQL run."""
    revisions = [script.revision for script in ScriptDirectory.from_config(_config()).walk_revisions()]
    assert revisions and [r for r in revisions if len(r) > 32] == []


def test_a_database_at_head_opens_without_alembic(db_url: str, upgrades: list[str]) -> None:
    open_store(db_url)  # fresh: migrated
    assert len(upgrades) == 1
    open_store(db_url)  # at head: only alembic_version is read
    assert len(upgrades) == 1
    assert store_engine.database_revisions(store_engine.make_engine(db_url)) == heads.script_heads()


def test_a_database_behind_is_still_migrated(tmp_path: Path, upgrades: list[str]) -> None:
    url = f"sqlite:///{tmp_path / 'old.db'}"
    engine = create_engine(url)
    with engine.begin() as connection:
        config = _config()
        config.attributes["connection"] = connection
        command.upgrade(config, "0011_dyepack_board")
    open_store(url)
    assert len(upgrades) == 1
    assert store_engine.database_revisions(engine) == heads.script_heads()


def test_a_database_ahead_of_this_code_is_still_one_line(tmp_path: Path, upgrades: list[str]) -> None:
    url = f"sqlite:///{tmp_path / 'new.db'}"
    open_store(url)
    with create_engine(url).begin() as connection:
        connection.execute(text("INSERT INTO alembic_version VALUES ('zzzz_from_a_newer_release')"))
    with pytest.raises(UserError) as info:
        open_store(url)
    assert len(upgrades) == 2  # the second open went to Alembic, which refused
    assert "cannot open the database" in str(info.value) and "zzzz_from_a_newer_release" in str(info.value)
    assert "\n" not in str(info.value)


def test_a_script_the_reading_cannot_follow_is_left_to_alembic(tmp_path: Path) -> None:
    plain = tmp_path / "a.py"
    plain.write_text('revision: str = "b"\ndown_revision = ("a", None)  # a merge\n', encoding="utf-8")
    assert heads._fields(plain) == {"revision": "b", "down_revision": ("a", None)}
    spread = tmp_path / "b.py"
    spread.write_text('revision = "c"\ndown_revision = (\n    "a",\n    "b",\n)\n', encoding="utf-8")
    assert heads._fields(spread) is None
