"""``assay admin backup`` / ``restore``: a restored instance equals the one backed up, table by table and file
by file, on SQLite and on PostgreSQL; a backup taken while submissions arrive and practice artifacts are
pruned restores into an instance where every held artifact is there, with its recorded digest.
"""

from __future__ import annotations

import hashlib
import shutil
import tarfile
import threading
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy import MetaData, create_engine, select
from typer.testing import CliRunner

from assay.cli import app as root_cli
from assay.errors import UserError
from assay.leaderboard import rounds, submissions
from assay.store import open_store
from assay.store.backup import PATH_COLUMNS, backup, restore
from assay.store.models import Submission
from assay.web import accounts
from assay.web.demo import seed_demo
from fake_board import fake_splits, scored

PROJECT = Path(__file__).resolve().parents[2]
CONSTANT = PROJECT / "detectors" / "constant"


def _detector(folder: Path, payload: bytes) -> Path:
    shutil.copytree(CONSTANT, folder, ignore=shutil.ignore_patterns("__pycache__"))
    (folder / "learned_parameters").mkdir(exist_ok=True)
    (folder / "learned_parameters" / "blob.bin").write_bytes(payload)
    return folder


def _instance(url: str, home: Path, tmp: Path):  # type: ignore[no-untyped-def]
    """A busy instance: the demo's people, campaign and DyePack release, a round whose data lies under
    ASSAY_HOME, three stored artifacts and a scored job."""
    sessions = open_store(url)
    seeded = seed_demo(sessions, home / "demo", round_dir=fake_splits(home / "rounds" / "r1"), dialogues=4)
    with sessions.begin() as session:
        rounds.create_round(session, "r1", home / "rounds" / "r1")
        rounds.set_status(session, "r1", "open")
    for i, (team, split) in enumerate((("alpha", "test"), ("beta", "test"), ("alpha", "train"))):
        with sessions.begin() as session:
            made = submissions.submit(
                session, home / "artifacts", team, "r1", split, _detector(tmp / f"det{i}", bytes([i]) * 100)
            )
            assert made.status == "queued", made.validation_errors
    scored(sessions, "alpha", "test", {"id-00000000": 0.3, "id-00000001": 0.8})
    return seeded.passwords


def _in_order(columns, key):  # type: ignore[no-untyped-def]
    """The primary key first, then the other columns by name."""
    return [*key, *sorted((c for c in columns if c not in set(key)), key=lambda c: c.name)]


def _rows(url: str) -> dict[str, list[tuple]]:  # type: ignore[type-arg]
    """Each table's rows, the key first and the other columns by name: a database built from the models
    and one built by the migration scripts hold the same columns in another order (added ones last)."""
    engine = create_engine(url)
    try:
        with engine.connect() as connection:
            meta = MetaData()
            meta.reflect(connection)
            return {
                t.name: [
                    tuple(r)
                    for r in connection.execute(
                        select(*_in_order(t.columns, t.primary_key.columns)).order_by(*t.primary_key.columns)
                    )
                ]
                for t in meta.sorted_tables
            }
    finally:
        engine.dispose()


def _files(home: Path) -> dict[str, str]:
    skip = ("assay.db", "cache")
    return {
        p.relative_to(home).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(home.rglob("*"))
        if p.is_file() and not p.relative_to(home).parts[0].startswith(skip)
    }


def _moved(rows: dict[str, list[tuple]], url: str, old: Path, new: Path) -> dict[str, list[tuple]]:  # type: ignore[type-arg]
    """The source's rows with paths under the old home moved to the new one, as restore promises."""
    engine = create_engine(url)
    meta = MetaData()
    with engine.connect() as connection:
        meta.reflect(connection)
    engine.dispose()
    out = {}
    for name, table_rows in rows.items():
        table = meta.tables[name]
        columns = [c.name for c in _in_order(table.columns, table.primary_key.columns)]  # as ``_rows`` reads
        paths = [columns.index(c) for c in PATH_COLUMNS.get(name, ())]
        out[name] = [
            tuple(
                str(new / Path(v).relative_to(old)) if i in paths and v and v.startswith(f"{old}/") else v
                for i, v in enumerate(row)
            )
            for row in table_rows
        ]
    return out


def _second_database(db_url: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    if db_url.startswith("sqlite"):
        return f"sqlite:///{tmp_path / 'restored' / 'assay.db'}"
    return request.getfixturevalue("postgres").new_database()


@pytest.mark.slow
def test_restore_equals_the_backed_up_instance_table_by_table_and_file_by_file(
    db_url: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    home, home2 = tmp_path / "home", tmp_path / "restored"
    passwords = _instance(db_url, home, tmp_path)
    before, files = _rows(db_url), _files(home)
    assert len(files) > 10 and any(name.startswith("artifacts/") for name in files)
    assert sum(bool(rows) for rows in before.values()) >= 15  # most tables hold rows

    report = backup(db_url, home, tmp_path / "backup.tar")
    assert report.attempts == 1 and report.external_paths == ["/nowhere"]  # fake_board's scored job
    target = _second_database(db_url, tmp_path, request)
    restored = restore(tmp_path / "backup.tar", target, home2)
    assert restored.heads == restored.revisions  # made by this release: nothing to upgrade

    after = _rows(target)
    assert after.keys() == before.keys()
    expected = _moved(before, db_url, home.resolve(), home2.resolve())
    for table in before:
        assert after[table] == expected[table], table
    assert _files(home2) == files

    # the restored instance works: sign in, and new rows get fresh ids (PostgreSQL's sequences moved on)
    sessions = open_store(target)
    with sessions.begin() as session:
        assert accounts.authenticate(session, "olga", passwords["olga"]).username == "olga"
        team = rounds.add_team(session, "gamma")
        session.flush()
        assert team.id > max(row[0] for row in before["teams"])
        held = session.scalars(select(Submission).where(Submission.artifact_path != "/nowhere")).all()
        assert held and all(
            submissions.digest(Path(s.artifact_path)) == s.artifact_sha256 for s in held if s.artifact_path
        )


def _one_artifact(url: str, home: Path, tmp: Path) -> None:
    sessions = open_store(url)
    with sessions.begin() as session:
        rounds.create_round(session, "r1", fake_splits(tmp / "splits"))
        rounds.set_status(session, "r1", "open")
        rounds.add_team(session, "alpha")
        submissions.submit(session, home / "artifacts", "alpha", "r1", "test", _detector(tmp / "det", b"1"))


@pytest.mark.slow
def test_restore_refuses_a_used_database_a_foreign_file_and_a_tampered_backup(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'a.db'}"
    _one_artifact(url, tmp_path / "home", tmp_path)
    backup(url, tmp_path / "home", tmp_path / "b.tar")
    with pytest.raises(UserError, match="restore into a new database"):
        restore(tmp_path / "b.tar", url, tmp_path / "other")
    (tmp_path / "junk.tar").write_bytes(b"x" * 1024)
    with pytest.raises((UserError, tarfile.ReadError)):
        restore(tmp_path / "junk.tar", f"sqlite:///{tmp_path / 'new.db'}", tmp_path / "other")

    # one artifact byte changed: refused before anything is written
    with tarfile.open(tmp_path / "b.tar") as archive:
        archive.extractall(tmp_path / "unpacked", filter="data")
    blob = next((tmp_path / "unpacked" / "home" / "artifacts").rglob("blob.bin"))
    blob.write_bytes(b"\xff" + blob.read_bytes()[1:])
    with tarfile.open(tmp_path / "bad.tar", "w") as archive:
        for entry in sorted((tmp_path / "unpacked").iterdir()):
            archive.add(entry, entry.name)
    target = tmp_path / "fresh.db"
    with pytest.raises(UserError, match="does not match the backup's manifest"):
        restore(tmp_path / "bad.tar", f"sqlite:///{target}", tmp_path / "fresh-home")
    assert not target.exists() and not (tmp_path / "fresh-home" / "artifacts").exists()


@pytest.mark.slow
def test_backup_while_submissions_arrive_and_practice_artifacts_are_pruned(tmp_path: Path) -> None:
    url, home = f"sqlite:///{tmp_path / 'live.db'}", tmp_path / "home"
    sessions = open_store(url)
    with sessions.begin() as session:
        rounds.create_round(session, "r1", fake_splits(tmp_path / "splits"), keep_practice=1)
        rounds.set_status(session, "r1", "open")
        rounds.add_team(session, "alpha")
    stop, made, errors = threading.Event(), [], []

    def submit_forever() -> None:  # each smoke submission prunes the previous one's folder
        i = 0
        while not stop.is_set() and i < 200:
            try:
                with sessions.begin() as session:
                    folder = _detector(tmp_path / f"live{i}", i.to_bytes(4, "big") * 64)
                    made.append(
                        submissions.submit(session, home / "artifacts", "alpha", "r1", "smoke", folder).id
                    )
            except Exception as exc:  # pragma: no cover - reported below
                errors.append(exc)
                return
            i += 1

    writer = threading.Thread(target=submit_forever, daemon=True)
    writer.start()
    try:
        reports = []
        for n in range(2):
            while len(made) < 3 * (n + 1) and writer.is_alive():
                threading.Event().wait(0.02)
            reports.append(backup(url, home, tmp_path / f"live{n}.tar"))
    finally:
        stop.set()
        writer.join(30)
    assert not errors, errors
    for n, report in enumerate(reports):
        target, home2 = tmp_path / f"restored{n}.db", tmp_path / f"home{n}"
        restore(tmp_path / f"live{n}.tar", f"sqlite:///{target}", home2)
        with open_store(f"sqlite:///{target}")() as session:
            rows = session.scalars(select(Submission)).all()
            held = [s for s in rows if s.artifact_path and s.artifact_removed_at is None]
            assert len(rows) == report.tables["submissions"] and held
            for s in held:
                assert Path(s.artifact_path).is_relative_to(home2.resolve())
                assert submissions.digest(Path(s.artifact_path)) == s.artifact_sha256
        stored = {p.name for p in (home2 / "artifacts").iterdir()}
        assert stored <= {s.artifact_sha256 for s in rows}  # nothing the snapshot does not name


def test_admin_cli_backup_and_restore(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "home"
    monkeypatch.setenv("ASSAY_HOME", str(home))
    monkeypatch.delenv("ASSAY_DB_URL", raising=False)
    open_store(f"sqlite:///{home / 'assay.db'}")
    runner = CliRunner()
    done = runner.invoke(root_cli, ["admin", "backup", str(tmp_path / "cli.tar")])
    assert done.exit_code == 0, done.output
    assert "rows in" in done.output and "snapshot" in done.output
    target = f"sqlite:///{tmp_path / 'cli-restored.db'}"
    done = runner.invoke(
        root_cli,
        ["admin", "restore", str(tmp_path / "cli.tar"), "--db", target, "--home", str(tmp_path / "h2")],
    )
    assert done.exit_code == 0, done.output
    assert "restored 0 rows" in done.output
    assert runner.invoke(root_cli, ["admin", "ready", "--db", target]).exit_code == 0


@pytest.mark.slow
def test_a_sqlite_backup_restores_into_postgresql(tmp_path: Path, postgres) -> None:  # type: ignore[no-untyped-def]
    """Moving an instance from SQLite to PostgreSQL is a backup and a restore."""
    url, home, home2 = f"sqlite:///{tmp_path / 'a.db'}", tmp_path / "home", tmp_path / "moved"
    _one_artifact(url, home, tmp_path)
    with open_store(url).begin() as session:
        accounts.create_user(session, "olga", "correct horse battery", ["organiser"])
    backup(url, home, tmp_path / "b.tar")
    target = postgres.new_database()
    restore(tmp_path / "b.tar", target, home2)
    before, after = _rows(url), _rows(target)
    expected = _moved(before, url, home.resolve(), home2.resolve())
    for table in before:  # SQLite reads its times back without the zone they were stored in (UTC)
        assert _utc(after[table]) == _utc(expected[table]), table
    assert _files(home2) == _files(home)
    with open_store(target).begin() as session:  # ids continue after the copied ones
        assert accounts.create_user(session, "anna", "correct horse battery", ["annotator"]).id == 2


def _utc(rows: list[tuple]) -> list[tuple]:  # type: ignore[type-arg]
    return [
        tuple(
            v.replace(tzinfo=UTC)
            if isinstance(v, datetime) and v.tzinfo is None
            else v.astimezone(UTC)
            if isinstance(v, datetime)
            else v
            for v in row
        )
        for row in rows
    ]
