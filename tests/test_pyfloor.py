"""Python's floor (3.11.4, for tar extraction filters) is checked when the ``assay`` command and the web
app start: an older interpreter gets one line and exit code 2, before any upload or restore can fail with
"module 'tarfile' has no attribute 'FilterError'" (issue 36). The version is monkeypatched: no 3.11.2 here."""

from __future__ import annotations

import sys
import tarfile
import tomllib
from pathlib import Path

import pytest

from assay import pyfloor

OLD = (3, 11, 2, "final", 0)  # Debian bookworm's python3


def _one_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    return lines[0]


def test_this_python_passes_and_has_the_filters() -> None:
    assert pyfloor.problem() is None
    pyfloor.check()
    assert hasattr(tarfile, "FilterError") and hasattr(tarfile, "data_filter")


def test_an_older_python_is_one_line_and_exit_2(monkeypatch: pytest.MonkeyPatch, capsys) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(sys, "version_info", OLD)
    with pytest.raises(SystemExit) as exited:
        pyfloor.check()
    assert exited.value.code == 2
    line = _one_line(capsys.readouterr().err)
    assert line.startswith("error: assay needs Python 3.11.4 or newer (tar extraction filters)")
    assert line.endswith("is Python 3.11.2")


def test_the_cli_checks_before_doing_anything(monkeypatch: pytest.MonkeyPatch, capsys) -> None:  # type: ignore[no-untyped-def]
    from assay import cli

    monkeypatch.setattr(sys, "argv", ["assay", "--version"])
    monkeypatch.setattr(sys, "version_info", OLD)
    with pytest.raises(SystemExit) as exited:
        cli.main()
    assert exited.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == ""  # not the version: nothing ran
    assert "needs Python 3.11.4" in _one_line(captured.err)


def test_the_web_app_checks_before_opening_the_store(
    monkeypatch: pytest.MonkeyPatch, capsys, tmp_path: Path
) -> None:  # type: ignore[no-untyped-def]
    from assay.web.app import create_app

    monkeypatch.setattr(sys, "version_info", OLD)
    with pytest.raises(SystemExit) as exited:
        create_app(f"sqlite:///{tmp_path / 'web.db'}")
    assert exited.value.code == 2
    assert "needs Python 3.11.4" in _one_line(capsys.readouterr().err)
    assert not (tmp_path / "web.db").exists()  # nothing half-made


def test_pyproject_floor_is_the_checked_floor() -> None:
    project = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["project"]
    assert project["requires-python"] == ">=" + ".".join(map(str, pyfloor.FLOOR))
