"""Backup and restore of a whole instance: the database and the files under ``ASSAY_HOME`` that it names,
consistent with each other, taken while the server runs.

The backup is one tar file: ``manifest.json`` (format, revisions, row counts, every file's SHA-256),
``database.sqlite`` (a snapshot of every table) and ``home/`` (the instance's files: the detector artifacts
under ``artifacts/<sha256>/`` and anything else under ``ASSAY_HOME``, such as round folders; not the
database itself, the rebuildable caches under ``cache/`` or the upload spools).

**The snapshot.** SQLite: the ``sqlite3`` online backup API, in one step, so the copy is one consistent
state however many writers there are. PostgreSQL: every table copied with SQLAlchemy inside one
``REPEATABLE READ READ ONLY`` transaction (the snapshot ``pg_dump`` itself uses) into a SQLite file migrated
to the same revisions. Chosen over ``pg_dump`` because (a) ``pg_dump`` must be at least the server's major
version, and the platform's image and a cluster's nodes rarely carry a matching client; (b) one backup
format whatever the source, and it restores into either dialect, so moving from SQLite to PostgreSQL is a
backup and a restore; (c) the restore test compares tables the same way for both. The cost: it is slower
than ``pg_dump`` on a large database (rows pass through Python).

**Consistency with the files.** Artifacts are content-addressed and never change once stored, and a
submission is committed only after its folder is in place; garbage collection commits a release before it
deletes a folder. So: snapshot the database, then hard-link (or copy) every file into a staging folder,
then check that every artifact a submission in the snapshot *holds* was staged. If one vanished in between
(collected after the snapshot), take the snapshot again; a folder stored after the snapshot is left out,
as the snapshot does not know it.

**Restore** goes into a new, empty database (no tables) and an ``ASSAY_HOME`` without artifacts: the schema
is migrated to the backup's revisions, the rows copied in dependency order, PostgreSQL's id sequences moved
past the copied ids, then the schema is upgraded to this code's heads, so an older backup restores into a
newer release. Paths under the old ``ASSAY_HOME`` (``PATH_COLUMNS``) are rewritten to the new one. The files
are checked against the manifest's hashes first; on PostgreSQL the database work is one transaction, on
SQLite it is written to a temporary file renamed into place, so a failure leaves nothing half-restored.

**Runs an operator schedules** (issue 36). A backup is refused a target inside ``ASSAY_HOME``: the next
backup would contain it, and the one after both. Backups already lying there (an older example put them
there) are skipped. Every folder a run writes in (its staging under ``ASSAY_HOME``, the partial tar or
restored database beside its target) is ``held_folder``: locked with ``flock`` while the run lives, so the
next run removes those of killed runs (``remove_stale``; the lock dies with its process, even on SIGKILL,
and a pid could be reused: in a container every run is pid 1) and leaves a concurrent run's alone.
``stop_on_sigterm`` turns SIGTERM into ``Terminated``, so the same clean-up runs before the process exits.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import signal
import sqlite3
import tarfile
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, MetaData, create_engine, func, select, text
from sqlalchemy.engine import make_url

from assay import __version__
from assay.errors import UserError

FORMAT = 1
MANIFEST, DATABASE, HOME = "manifest.json", "database.sqlite", "home"
# Columns holding paths; values under the old ASSAY_HOME are moved to the new one on restore.
PATH_COLUMNS = {
    "rounds": ("dataset", "source_dataset"),
    "splits": ("models_path", "truth_path"),
    "submissions": ("artifact_path",),
}
SKIP_TOP = {"cache"}  # rebuildable: response and embedding caches
STAGING = (".backup-", ".restore-")  # our staging folders under ASSAY_HOME
# a folder beside a backup's tar or a restore's SQLite file, holding it while it is half-written
PARTIAL = ".assay-partial-"
SKIP_PREFIXES = (".incoming-", ".upload-", *STAGING, PARTIAL)  # uploads in flight, our own staging
LOCK = ".lock"  # in a held folder: flocked while its run lives
# a folder of ours without its lock (an older release's, or killed before locking) is stale after this
UNLOCKED_AFTER_S = 3600
SNAPSHOT_ATTEMPTS = 5
BATCH = 1000


@dataclass
class BackupReport:
    path: Path
    revisions: list[str]
    tables: dict[str, int]  # table -> rows
    files: int
    bytes: int
    attempts: int  # snapshots taken until every held artifact was staged
    external_paths: list[str] = field(default_factory=list)  # paths the database names outside ASSAY_HOME
    skipped_backups: list[str] = field(default_factory=list)  # earlier backups found under ASSAY_HOME
    removed_stale: list[str] = field(default_factory=list)  # folders of killed runs removed first


@dataclass
class RestoreReport:
    revisions: list[str]  # the backup's
    heads: list[str]  # after the upgrade
    tables: dict[str, int]
    files: int
    removed_stale: list[str] = field(default_factory=list)  # folders of killed runs removed first


class Terminated(BaseException):
    """SIGTERM arrived during a backup or restore (``stop_on_sigterm``). A ``BaseException``, so no
    ``except Exception`` on the way swallows it and every ``finally`` removes what the run had written."""


# --- runs that are killed or stopped -------------------------------------------------------------------


@contextmanager
def stop_on_sigterm() -> Iterator[None]:
    """While the block runs (in the main thread), SIGTERM raises ``Terminated``: a scheduler's stop then
    removes the staging folder and the half-written file instead of leaving them. A second SIGTERM during
    that clean-up is ignored; SIGKILL leaves them to the next run (``remove_stale``)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    fired = False

    def handler(signum: int, frame: object) -> None:
        nonlocal fired
        if not fired:
            fired = True
            raise Terminated("stopped by SIGTERM")

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextmanager
def held_folder(parent: Path, prefix: str) -> Iterator[Path]:
    """A new folder ``parent/prefix*``, flocked while the block runs and removed after it. The lock is the
    kernel's: it ends with the process however it ends, so ``remove_stale`` can tell a dead run's folder from
    a live one's."""
    parent.mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    lock = os.open(folder / LOCK, os.O_CREAT | os.O_RDWR, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        os.close(lock)


def _abandoned(folder: Path) -> bool:
    """No live run holds ``folder``: its lock can be taken (or, without a lock, it is an hour old)."""
    try:
        lock = os.open(folder / LOCK, os.O_RDWR)
    except FileNotFoundError:
        try:
            return time.time() - folder.stat().st_mtime > UNLOCKED_AFTER_S
        except OSError:
            return False
    except OSError:
        return False  # another user's lock: not ours to judge
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return False  # held: a run is using it
    finally:
        os.close(lock)
    return True


def remove_stale(parent: Path, prefixes: tuple[str, ...]) -> list[str]:
    """Remove the folders ``parent/prefix*`` that killed runs left (see ``held_folder``); their paths."""
    if not parent.is_dir():
        return []
    removed = []
    for folder in sorted(parent.iterdir()):
        ours = folder.name.startswith(prefixes) and folder.is_dir() and not folder.is_symlink()
        if ours and _abandoned(folder):
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(str(folder))
    return removed


# --- the database ------------------------------------------------------------------------------------------


def _alembic(connection: Connection):  # type: ignore[no-untyped-def]
    from alembic.config import Config

    from assay.store.engine import MIGRATIONS

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.attributes["connection"] = connection
    return config


def migrate(connection: Connection, revisions: list[str]) -> None:
    """Upgrade the schema on ``connection`` to each of ``revisions`` (one per branch head)."""
    from alembic import command

    config = _alembic(connection)
    for revision in revisions:
        command.upgrade(config, revision)


def revisions_of(connection: Connection) -> list[str]:
    from alembic.runtime.migration import MigrationContext

    return sorted(MigrationContext.configure(connection).get_current_heads())


def _utc(value: Any) -> Any:
    """Every stored time is UTC: give naive ones their zone and move aware ones to it, so neither SQLite
    (which drops the offset) nor PostgreSQL (which reads a naive time in its session zone) shifts it."""
    if isinstance(value, datetime):
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
    return value


def _tables(connection: Connection) -> MetaData:
    meta = MetaData()
    meta.reflect(connection)
    return meta


def copy_rows(
    source: Connection, target: Connection, rewrite: Callable[[str, str, Any], Any] | None = None
) -> dict[str, int]:
    """Copy every row of every table (but ``alembic_version``) from ``source`` into the same tables on
    ``target``, parents before children and rows in key order; returns rows per table."""
    source_tables, target_tables = _tables(source), _tables(target)
    counts: dict[str, int] = {}
    for table in source_tables.sorted_tables:
        if table.name == "alembic_version":
            continue
        into = target_tables.tables[table.name]
        names = [c.name for c in table.columns]
        result = source.execute(select(table).order_by(*table.primary_key.columns))
        counts[table.name] = 0
        while batch := result.fetchmany(BATCH):
            rows = [
                {
                    n: _utc(rewrite(table.name, n, v) if rewrite else v)
                    for n, v in zip(names, row, strict=True)
                }
                for row in batch
            ]
            target.execute(into.insert(), rows)
            counts[table.name] += len(rows)
    return counts


def _reset_sequences(connection: Connection) -> None:
    """PostgreSQL: move each serial id sequence past the ids copied in, so new rows get fresh ids."""
    if connection.dialect.name != "postgresql":
        return
    for table in _tables(connection).sorted_tables:
        keys = list(table.primary_key.columns)
        if len(keys) != 1 or keys[0].type.python_type is not int:
            continue
        sequence = connection.scalar(
            text("SELECT pg_get_serial_sequence(:t, :c)"), {"t": table.name, "c": keys[0].name}
        )
        if sequence:
            top = connection.scalar(select(func.max(keys[0])))
            connection.execute(
                text("SELECT setval(:s, :v, :called)"),
                {"s": sequence, "v": top or 1, "called": top is not None},
            )


def _sqlite_path(url: str) -> Path:
    database = make_url(url).database
    if not database or database == ":memory:":
        raise UserError(f"{url}: back up or restore a SQLite file, not an in-memory database")
    return Path(database)


def snapshot(url: str, out: Path) -> None:
    """One consistent copy of the database at ``url`` as the SQLite file ``out``."""
    if make_url(url).get_backend_name() == "sqlite":
        path = _sqlite_path(url)
        if not path.is_file():
            raise UserError(f"{path}: no such database to back up")
        source, target = sqlite3.connect(path, timeout=30), sqlite3.connect(out)
        try:
            source.backup(target)  # pages=-1: one step, one read transaction, one state
        finally:
            target.close()
            source.close()
        return
    engine, copy = create_engine(url), create_engine(f"sqlite:///{out}")
    try:
        with engine.connect() as source:
            source.execute(text("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY"))
            with copy.begin() as target:
                migrate(target, revisions_of(source))
                copy_rows(source, target)
            source.rollback()
    finally:
        engine.dispose()
        copy.dispose()


# --- the files ---------------------------------------------------------------------------------------------


def _is_database_file(path: Path, url: str) -> bool:
    if make_url(url).get_backend_name() != "sqlite":
        return False
    database = _sqlite_path(url).resolve()
    return path.resolve().name.startswith(database.name) and path.resolve().parent == database.parent


def _is_backup(path: Path) -> bool:
    """``path`` is a tar this module wrote (its first member is the database): an earlier backup left
    under ASSAY_HOME, never to be nested in this one. Other files cost one 512-byte read."""
    try:
        with open(path, "rb") as handle:
            if handle.read(512)[257:262] != b"ustar":
                return False
        with tarfile.open(path) as archive:
            first = archive.next()
    except (OSError, tarfile.TarError):
        return False
    return first is not None and first.name == DATABASE


def _home_files(home: Path, url: str, skipped: set[str]) -> Iterator[Path]:
    """Files and folders under ``home`` that belong in a backup, parents before children; earlier backups
    (outside ``artifacts/``, whose files are a detector's own) are added to ``skipped`` instead."""
    for parent, folders, names in os.walk(home):
        here = Path(parent)
        folders[:] = sorted(
            f for f in folders if not f.startswith(SKIP_PREFIXES) and not (here == home and f in SKIP_TOP)
        )
        for folder in folders:
            yield here / folder
        artifact = here.relative_to(home).parts[:1] == ("artifacts",)
        for name in sorted(names):
            path = here / name
            if name.startswith(SKIP_PREFIXES) or _is_database_file(path, url):
                continue
            if not artifact and not path.is_symlink() and _is_backup(path):
                skipped.add(str(path))
                continue
            yield path


def _stage(home: Path, url: str, stage: Path, skipped: set[str]) -> None:
    """Hard-link (or, across file systems, copy) the backed-up files into ``stage``; already staged ones
    are kept, so a retry adds only what is new."""
    for path in _home_files(home, url, skipped):
        target = stage / path.relative_to(home)
        if target.exists() or target.is_symlink():
            continue
        if path.is_symlink():
            target.symlink_to(os.readlink(path))
        elif path.is_dir():
            target.mkdir(parents=True, exist_ok=True)
        elif path.is_file():
            try:
                os.link(path, target)
            except OSError:
                shutil.copy2(path, target)


def _held_artifacts(database: Path) -> tuple[list[str], list[str]]:
    """From a snapshot: paths every submission names, and those whose artifact is held (must be there)."""
    with sqlite3.connect(database) as connection:
        rows = connection.execute(
            "SELECT artifact_path, artifact_removed_at IS NULL FROM submissions WHERE artifact_path != ''"
        ).fetchall()
    return [r[0] for r in rows], [r[0] for r in rows if r[1]]


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _under(path: str, home: Path) -> Path | None:
    """``path`` relative to ``home`` when it lies under it, else None."""
    try:
        return Path(path).resolve().relative_to(home.resolve())
    except ValueError:
        return None


# --- backup ------------------------------------------------------------------------------------------------


def backup(url: str, home: Path, out: Path) -> BackupReport:
    """Write a backup of the database at ``url`` and the files under ``home`` to the tar file ``out``."""
    home = home.resolve()
    _check_target(out, home)
    removed = remove_stale(home, STAGING) + remove_stale(out.parent, (PARTIAL,))
    skipped: set[str] = set()
    with held_folder(home, ".backup-") as stage:
        attempts = _consistent_stage(url, home, stage, skipped)
        manifest = _manifest(stage, home, url, attempts)
        _write_tar(stage, manifest, out)
    return BackupReport(
        path=out,
        revisions=manifest["revisions"],
        tables=manifest["tables"],
        files=len(manifest["files"]),
        bytes=sum(f["size"] for f in manifest["files"].values()),
        attempts=attempts,
        external_paths=manifest["external_paths"],
        skipped_backups=sorted(skipped),
        removed_stale=removed,
    )


def _check_target(out: Path, home: Path) -> None:
    """Refuse a target inside ``home``: the next backup would contain it, and the one after both (deploy.md's
    old example grew 2.1 -> 8.4 MiB); and a folder, which the rename would fail on."""
    if out.resolve().is_relative_to(home):
        raise UserError(
            f"{out}: inside ASSAY_HOME ({home}), so every later backup would contain it; write backups to a "
            "folder outside it, such as /var/lib/assay-backups"
        )
    if out.is_dir():
        raise UserError(f"{out}: is a folder; name the backup file, such as {out / 'assay.tar'}")


def _write_tar(stage: Path, manifest: dict[str, Any], out: Path) -> None:
    """The tar of ``stage`` and ``manifest``, written in a held folder beside ``out`` and renamed over it
    when complete: a reader (or the next night's rotation) never sees half a backup."""
    with held_folder(out.parent, PARTIAL) as partial:
        tmp = partial / out.name
        with tarfile.open(tmp, "w") as archive:
            archive.add(stage / DATABASE, DATABASE)  # first: _is_backup knows a backup by it
            archive.add(stage / HOME, HOME)
            data = json.dumps(manifest, indent=1, sort_keys=True).encode()
            info = tarfile.TarInfo(MANIFEST)
            info.size, info.mtime = len(data), int(datetime.now(UTC).timestamp())
            archive.addfile(info, _bytes(data))
        os.replace(tmp, out)


def _consistent_stage(url: str, home: Path, stage: Path, skipped: set[str]) -> int:
    """Snapshot, stage the files, and check every held artifact made it (else snapshot again); returns the
    snapshots taken."""
    files = stage / HOME
    files.mkdir()
    missing: list[str] = []
    for attempt in range(1, SNAPSHOT_ATTEMPTS + 1):
        database = stage / DATABASE
        database.unlink(missing_ok=True)
        snapshot(url, database)
        _stage(home, url, files, skipped)
        named, held = _held_artifacts(database)
        missing = [p for p in held if (rel := _under(p, home)) is not None and not (files / rel).exists()]
        if not missing:
            _drop_unnamed_artifacts(files, named, home)
            return attempt
    raise UserError(
        f"{home}: artifacts kept disappearing during the backup ({missing[0]} and {len(missing) - 1} more "
        f"after {SNAPSHOT_ATTEMPTS} snapshots); try again when quieter"
    )


def _bytes(data: bytes):  # type: ignore[no-untyped-def]
    import io

    return io.BytesIO(data)


def _drop_unnamed_artifacts(files: Path, named: list[str], home: Path) -> None:
    """Artifact folders no submission of the snapshot names (stored after it, or garbage) are left out."""
    keep = {rel.parts[1] for p in named if (rel := _under(p, home)) is not None and len(rel.parts) > 1}
    artifacts = files / "artifacts"
    if artifacts.is_dir():
        for folder in artifacts.iterdir():
            if folder.is_dir() and folder.name not in keep:
                shutil.rmtree(folder)


def _manifest(stage: Path, home: Path, url: str, attempts: int) -> dict[str, Any]:
    engine = create_engine(f"sqlite:///{stage / DATABASE}")
    try:
        with engine.connect() as connection:
            revisions = revisions_of(connection)
            tables = {
                t.name: connection.scalar(select(func.count()).select_from(t))
                for t in _tables(connection).sorted_tables
                if t.name != "alembic_version"
            }
            external = sorted(
                {
                    value
                    for table, columns in PATH_COLUMNS.items()
                    if table in tables
                    for column in columns
                    for value in connection.scalars(text(f'SELECT "{column}" FROM "{table}"'))
                    if value and _under(value, home) is None
                }
            )
    finally:
        engine.dispose()
    files = {}
    for path in sorted((stage / HOME).rglob("*")):
        if path.is_file() and not path.is_symlink():
            files[path.relative_to(stage / HOME).as_posix()] = {
                "sha256": _sha256(path),
                "size": path.stat().st_size,
            }
    return {
        "format": FORMAT,
        "assay": __version__,
        "created_at": datetime.now(UTC).isoformat(),
        "dialect": make_url(url).get_backend_name(),
        "home": str(home),
        "revisions": revisions,
        "tables": tables,
        "files": files,
        "external_paths": external,
        "snapshots": attempts,
    }


# --- restore -----------------------------------------------------------------------------------------------


def read_manifest(archive: tarfile.TarFile, source: Path) -> dict[str, Any]:
    try:
        member = archive.extractfile(MANIFEST)
        manifest = json.loads(member.read()) if member else None
    except (KeyError, json.JSONDecodeError) as exc:
        raise UserError(f"{source}: not an assay backup (no readable {MANIFEST})") from exc
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise UserError(
            f"{source}: backup format {manifest.get('format') if manifest else None!r}, want {FORMAT}"
        )
    return manifest


def _check_revisions(revisions: list[str], source: Path) -> None:
    from alembic.config import Config
    from alembic.script import ScriptDirectory
    from alembic.util import CommandError

    from assay.store.engine import MIGRATIONS

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    scripts = ScriptDirectory.from_config(config)
    for revision in revisions:
        try:
            scripts.get_revision(revision)
        except CommandError as exc:
            raise UserError(
                f"{source}: made at schema revision {revision!r}, which this assay does not know "
                f"(a newer release made it); restore with that release or newer"
            ) from exc


def _extract(archive: tarfile.TarFile, manifest: dict[str, Any], into: Path, source: Path) -> None:
    """Unpack the database and the files, refusing anything outside ``into`` or not as the manifest says."""
    archive.extractall(into, filter="data")
    for name, entry in manifest["files"].items():
        path = into / HOME / name
        if not path.is_file() or _sha256(path) != entry["sha256"]:
            raise UserError(f"{source}: file {name!r} is missing or does not match the backup's manifest")


def _check_empty_target(url: str, home: Path) -> None:
    shown = make_url(url).render_as_string(hide_password=True)
    if make_url(url).get_backend_name() == "sqlite":
        path = _sqlite_path(url)
        if path.exists() and path.stat().st_size > 0:
            raise UserError(f"{shown}: restore into a new database; this file exists")
    else:
        engine = create_engine(url)
        try:
            with engine.connect() as connection:
                tables = _tables(connection).tables
        except Exception as exc:
            raise UserError(
                f"{shown}: cannot open the database ({str(getattr(exc, 'orig', exc)).splitlines()[0]})"
            ) from exc
        finally:
            engine.dispose()
        if tables:
            raise UserError(f"{shown}: restore into a new, empty database; this one has {len(tables)} tables")
    artifacts = home / "artifacts"
    if artifacts.is_dir() and any(artifacts.iterdir()):
        raise UserError(f"{artifacts}: restore into an ASSAY_HOME without artifacts; this one has some")


def _rewriter(old_home: str, new_home: Path) -> Callable[[str, str, Any], Any]:
    old = old_home.rstrip("/") + "/"

    def rewrite(table: str, column: str, value: Any) -> Any:
        if isinstance(value, str) and column in PATH_COLUMNS.get(table, ()) and value.startswith(old):
            return str(new_home / value[len(old) :])
        return value

    return rewrite


@contextmanager
def _target_connection(url: str) -> Iterator[Connection]:
    """A connection in one transaction on the target: PostgreSQL directly (DDL is transactional); SQLite in
    a temporary file beside the target, renamed over it only when everything succeeded."""
    if make_url(url).get_backend_name() != "sqlite":
        engine = create_engine(url)
        try:
            with engine.begin() as connection:
                yield connection
        finally:
            engine.dispose()
        return
    path = _sqlite_path(url)
    with held_folder(path.parent, PARTIAL) as partial:
        tmp = partial / path.name
        engine = create_engine(f"sqlite:///{tmp}")
        try:
            with engine.begin() as connection:
                connection.exec_driver_sql("PRAGMA foreign_keys=ON")
                yield connection
        finally:
            engine.dispose()
        os.replace(tmp, path)


def restore(source: Path, url: str, home: Path) -> RestoreReport:
    """Restore the backup ``source`` into the new, empty database at ``url`` and ``home``."""
    if not source.is_file():
        raise UserError(f"{source}: no such backup file")
    home = home.resolve()
    removed = remove_stale(home, STAGING)
    if make_url(url).get_backend_name() == "sqlite":
        removed += remove_stale(_sqlite_path(url).parent, (PARTIAL,))
    _check_empty_target(url, home)
    moved: list[Path] = []
    with held_folder(home, ".restore-") as stage:
        try:
            with tarfile.open(source) as archive:
                manifest = read_manifest(archive, source)
                _check_revisions(manifest["revisions"], source)
                _extract(archive, manifest, stage, source)
            _move_files(stage / HOME, home, moved)
            tables, heads = _restore_database(
                stage / DATABASE, url, _rewriter(manifest["home"], home), manifest
            )
        except BaseException:  # SIGTERM (Terminated) too: nothing half-restored
            for path in moved:
                shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)
            raise
    return RestoreReport(manifest["revisions"], heads, tables, len(manifest["files"]), removed)


def _move_files(files: Path, home: Path, moved: list[Path]) -> None:
    """Move the unpacked files into ``home``, refusing to replace any; each moved one is added to ``moved``
    as it goes, so the caller can take them back out."""
    for entry in sorted(files.iterdir()):
        target = home / entry.name
        if target.exists():
            raise UserError(f"{target}: already exists; restore into an ASSAY_HOME without it")
        os.replace(entry, target)
        moved.append(target)


def _restore_database(
    database: Path, url: str, rewrite: Callable[[str, str, Any], Any], manifest: dict[str, Any]
) -> tuple[dict[str, int], list[str]]:
    backup_engine = create_engine(f"sqlite:///{database}")
    try:
        with backup_engine.connect() as source, _target_connection(url) as target:
            migrate(target, manifest["revisions"])
            tables = copy_rows(source, target, rewrite)
            if tables != manifest["tables"]:
                raise UserError(
                    f"restored rows {tables} differ from the backup's manifest {manifest['tables']}"
                )
            _reset_sequences(target)
            migrate(target, ["heads"])
            heads = revisions_of(target)
    finally:
        backup_engine.dispose()
    return tables, heads
