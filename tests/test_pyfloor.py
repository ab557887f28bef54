"""Python's floor (3.11.4, for tar extraction filters) is checked when the ``assay`` command and the web
app start: an older interpreter gets one line and exit code 2, before any upload or restore can fail with
"module 'tarfile' has no attribute 'FilterError'" (issue 36). The version is monkeypatched: no 3.11.2 here."""

from __future__ import annotations

import os
import subprocess
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


SRC = Path(__file__).resolve().parents[1] / "src"


def _bare_python(code: str) -> subprocess.CompletedProcess:
    """This interpreter without its site-packages (``-S``) and assay's source on PYTHONPATH: a checkout
    run by a Python that has none of assay's dependencies (issue 49)."""
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(SRC)}
    return subprocess.run(
        [sys.executable, "-S", "-c", code], capture_output=True, text=True, env=env, timeout=60
    )


def test_python_m_assay_checks_the_floor_before_any_third_party_import() -> None:
    done = _bare_python(
        f"import sys, runpy; sys.version_info = {OLD!r}; sys.argv = ['assay', '--help']; "
        "runpy.run_module('assay', run_name='__main__')"
    )
    assert done.returncode == 2 and done.stdout == ""
    assert "needs Python 3.11.4 or newer" in _one_line(done.stderr)


def test_missing_dependencies_are_one_line_not_a_traceback() -> None:
    done = _bare_python(
        "import sys, runpy; sys.argv = ['assay', '--help']; runpy.run_module('assay', run_name='__main__')"
    )
    assert done.returncode == 2 and done.stdout == ""
    line = _one_line(done.stderr)
    assert (
        line.startswith("error: assay's dependency 'typer' is not importable by ") and "make install" in line
    )


def test_the_console_script_enters_through_the_floor_check() -> None:
    project = tomllib.loads((SRC.parent / "pyproject.toml").read_text())["project"]
    assert project["scripts"]["assay"] == "assay.launch:main"
