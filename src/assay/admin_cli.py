"""``assay admin``: operating an instance: backup, restore, migrate, readiness.

A face: it parses, calls ``assay.store.backup`` / ``assay.store.engine`` / ``assay.web.ops`` and prints.
Imports stay inside the commands, so ``assay admin --help`` starts fast.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Annotated

import typer

app = typer.Typer(
    help="Operate an instance: back up and restore the database with its files, migrate, check readiness.\n\n"
    "Example: assay admin backup nightly.tar && assay admin restore nightly.tar --db postgresql+psycopg://...",
    no_args_is_help=True,
)
DbUrl = Annotated[
    str | None,
    typer.Option("--db", help="Database URL (default: ASSAY_DB_URL or the SQLite file in ASSAY_HOME)."),
]
Home = Annotated[Path | None, typer.Option("--home", help="The instance's files (default: ASSAY_HOME).")]
Json = Annotated[bool, typer.Option("--json", help="Print JSON.")]


def _where(db: str | None, home: Path | None) -> tuple[str, Path]:
    from assay.config import settings

    return db or settings().database_url, home or settings().home


@app.command("backup")
def backup_command(
    out: Annotated[Path, typer.Argument(help="The backup file to write (a tar).")],
    db: DbUrl = None,
    home: Home = None,
    json_out: Json = False,
) -> None:
    """Back up the database and the files it names (artifacts, round folders under ASSAY_HOME), consistent
    with each other, while the server runs. The file must lie outside ASSAY_HOME; SIGTERM stops it (exit
    143) with nothing written, and folders left by a killed run are removed first.

    Example: assay admin backup /var/lib/assay-backups/assay-$(date +%F).tar
    """
    from assay.store.backup import backup

    url, folder = _where(db, home)
    with _stoppable(f"{out}: backup"):
        report = backup(url, folder, out)
    if json_out:
        typer.echo(json.dumps(asdict(report), default=str, indent=1))
        return
    rows = sum(report.tables.values())
    typer.echo(
        f"{out}: {rows} rows in {len(report.tables)} tables at {', '.join(report.revisions)}; "
        f"{report.files} files, {report.bytes / 2**20:.1f} MiB ({report.attempts} snapshot(s))"
    )
    for path in report.external_paths:
        typer.echo(f"note: {path} lies outside ASSAY_HOME and is not in the backup", err=True)
    for path in report.skipped_backups:
        typer.echo(
            f"note: {path} is an earlier backup inside ASSAY_HOME; left out (move it elsewhere)", err=True
        )
    _removed(report.removed_stale)


@contextmanager
def _stoppable(what: str) -> Iterator[None]:
    """SIGTERM (a scheduler's stop, podman stop) ends the run with one line and exit code 143 (128 + 15),
    after ``assay.store.backup`` has removed what it had written."""
    from assay.store.backup import Terminated, stop_on_sigterm

    try:
        with stop_on_sigterm():
            yield
    except Terminated:
        typer.echo(f"{what} stopped by SIGTERM; nothing written", err=True)
        raise typer.Exit(143) from None


def _removed(paths: list[str]) -> None:
    for path in paths:
        typer.echo(f"note: removed {path}, left by a backup or restore that was killed", err=True)


@app.command("restore")
def restore_command(
    source: Annotated[Path, typer.Argument(help="A file written by 'assay admin backup'.")],
    db: DbUrl = None,
    home: Home = None,
    json_out: Json = False,
) -> None:
    """Restore a backup into a new, empty database and an ASSAY_HOME without artifacts, then upgrade the
    schema to this release's. SIGTERM stops it (exit 143) with nothing half-restored.

    Example: createdb assay2 && assay admin restore nightly.tar --db postgresql+psycopg://assay@db/assay2
    """
    from assay.store.backup import restore

    url, folder = _where(db, home)
    with _stoppable(f"{source}: restore"):
        report = restore(source, url, folder)
    if json_out:
        typer.echo(json.dumps(asdict(report), indent=1))
        return
    rows, schema = sum(report.tables.values()), f"{', '.join(report.revisions)} -> {', '.join(report.heads)}"
    typer.echo(
        f"restored {rows} rows in {len(report.tables)} tables and {report.files} files; schema {schema}"
    )
    _removed(report.removed_stale)


@app.command("migrate")
def migrate_command(db: DbUrl = None) -> None:
    """Bring the schema to this release's revisions (servers and workers also do it when they open it).

    Example: ASSAY_DB_URL=postgresql+psycopg://assay@db/assay assay admin migrate
    """
    from assay.store.engine import open_store

    url, _ = _where(db, None)
    open_store(url)
    typer.echo("schema at head")


@app.command("ready")
def ready_command(db: DbUrl = None, json_out: Json = False) -> None:
    """Exit 0 when the database answers and is at this release's revisions, else 1: what /api/v1/ready
    answers, for a probe or a script without HTTP.

    Example: assay admin ready || echo not yet
    """
    from sqlalchemy import create_engine

    from assay.web.ops import readiness

    url, _ = _where(db, None)
    engine = create_engine(url)
    try:
        state = readiness(engine)
    finally:
        engine.dispose()
    typer.echo(state.model_dump_json() if json_out else state.database)
    raise typer.Exit(0 if state.ready else 1)
