"""The database URL from a file (``ASSAY_DB_URL_FILE``: a mounted secret, never in the environment): the
settings, the fast listing path (``store.fastread``) and the command line all read the same database, and
a file that cannot be used is one line naming it (issue 36)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from assay.config import settings
from assay.errors import UserError
from assay.store import fastread


@pytest.fixture
def url_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, str]:
    """A file holding a SQLite URL, as a secret is mounted: trailing newline, mode 0400."""
    url = f"sqlite:///{tmp_path / 'secret.db'}"
    path = tmp_path / "db-url"
    path.write_text(url + "\n")
    path.chmod(0o400)
    monkeypatch.delenv("ASSAY_DB_URL", raising=False)
    monkeypatch.setenv("ASSAY_DB_URL_FILE", str(path))
    return path, url


def test_the_url_comes_from_the_file(url_file: tuple[Path, str]) -> None:
    _, url = url_file
    assert settings().database_url == url
    assert fastread.database_url() == url


@pytest.mark.parametrize(
    ("contents", "message"),
    [(None, r"ASSAY_DB_URL_FILE: cannot read .*db-url: No such file"), ("\n", r"db-url is empty")],
)
def test_a_file_that_cannot_be_used_is_one_line(
    url_file: tuple[Path, str], contents: str | None, message: str
) -> None:
    path, _ = url_file
    path.unlink()
    if contents is not None:
        path.write_text(contents)
    for read in (lambda: settings().database_url, fastread.database_url):
        with pytest.raises(UserError, match=message):
            read()


def test_both_set_is_refused(url_file: tuple[Path, str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ASSAY_DB_URL", "sqlite:////elsewhere.db")
    for read in (lambda: settings().database_url, fastread.database_url):
        with pytest.raises(UserError, match="set ASSAY_DB_URL or ASSAY_DB_URL_FILE, not both"):
            read()


@pytest.mark.slow
def test_the_cli_writes_and_lists_through_the_file(url_file: tuple[Path, str], tmp_path: Path) -> None:
    """``user add`` (the ORM, settings) and ``user list`` (the driver alone, fastread) both use the file's
    database: the one the URL names, not the SQLite file under ASSAY_HOME."""
    _, url = url_file
    env = {**os.environ, "ASSAY_PASSWORD": "correct horse battery", "ASSAY_ARGON2_FAST": "1"}
    assay = [sys.executable, "-m", "assay", "user"]
    added = subprocess.run(
        [*assay, "add", "olga", "--role", "organiser"], env=env, capture_output=True, text=True
    )
    assert added.returncode == 0, added.stderr
    listed = subprocess.run([*assay, "list"], env=env, capture_output=True, text=True)
    assert listed.returncode == 0 and "olga" in listed.stdout, listed.stderr
    assert Path(url.removeprefix("sqlite:///")).is_file()
    assert not (Path(os.environ["ASSAY_HOME"]) / "assay.db").exists()
    broken = subprocess.run(
        [*assay, "list"], env={**env, "ASSAY_DB_URL": url}, capture_output=True, text=True
    )
    assert broken.returncode == 2 and broken.stderr.strip().count("\n") == 0, broken.stderr
    assert "not both" in broken.stderr
