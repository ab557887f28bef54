"""A throwaway PostgreSQL server for the tests: Debian's binaries (the Makefile installs `postgresql`), a
cluster in a temporary folder, listening on 127.0.0.1 and a free port, stopped and removed afterwards.

PostgreSQL refuses to run as root, so under root (CI) the server runs as the ``postgres`` account that the
Debian package creates. ``fsync`` is off: the tests want a real server, not a durable one.

with postgres_server() as server:
    url = server.new_database()  # postgresql+psycopg://assay@127.0.0.1:PORT/test_1
"""

from __future__ import annotations

import glob
import itertools
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from web_server import free_port  # tests/ is on sys.path (rootdir conftest)

USER = "assay"


def postgres_bin() -> Path | None:
    """The folder holding initdb and pg_ctl, newest major version first; None when none is installed."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[4]))
    if found:
        return Path(found[-1]).parent
    on_path = shutil.which("initdb")
    return Path(on_path).parent if on_path else None


def _as_server_user(argv: list[str]) -> list[str]:
    """Run ``argv`` as ``postgres`` when we are root (initdb and postgres refuse root)."""
    if os.geteuid() != 0:
        return argv
    return ["runuser", "-u", "postgres", "--", *argv]


class PostgresServer:
    def __init__(self, port: int) -> None:
        self.port = port
        self._names = itertools.count(1)

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://{USER}@127.0.0.1:{self.port}/{database}"

    def new_database(self) -> str:
        """A fresh, empty database on this server; returns its SQLAlchemy URL."""
        import psycopg

        name = f"test_{next(self._names)}"
        with psycopg.connect(
            f"host=127.0.0.1 port={self.port} user={USER} dbname=postgres", autocommit=True
        ) as c:
            c.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)


@contextmanager
def postgres_server() -> Iterator[PostgresServer]:
    """Start a private cluster; raise RuntimeError with the server's log when it does not come up."""
    binaries = postgres_bin()
    if binaries is None:
        raise FileNotFoundError("no PostgreSQL binaries (initdb) found; `make install` installs postgresql")
    folder = Path(tempfile.mkdtemp(prefix="assay-pg-"))
    data, log = folder / "data", folder / "server.log"
    if os.geteuid() == 0:
        account = pwd.getpwnam("postgres")
        os.chown(folder, account.pw_uid, account.pw_gid)
    port = free_port()
    try:
        _run(
            [str(binaries / "initdb"), "-D", str(data), "-U", USER, "-A", "trust", "--no-sync", "-E", "UTF8"]
        )
        options = f"-h 127.0.0.1 -p {port} -k {folder} -F -c max_connections=200"
        _run(
            [
                str(binaries / "pg_ctl"),
                "-D",
                str(data),
                "-l",
                str(log),
                "-o",
                options,
                "-w",
                "-t",
                "60",
                "start",
            ]
        )
        try:
            yield PostgresServer(port)
        finally:
            _run([str(binaries / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop"], check=False)
    except subprocess.CalledProcessError as err:
        shown = log.read_text(errors="replace")[-2000:] if log.exists() else ""
        raise RuntimeError(f"PostgreSQL did not start: {err.stderr}\n{shown}") from err
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _run(argv: list[str], check: bool = True) -> None:
    subprocess.run(_as_server_user(argv), check=check, capture_output=True, text=True, timeout=120)
