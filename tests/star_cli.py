"""``assay star ...`` run in process: the one helper the STAR command-line tests share."""

from __future__ import annotations

import sys

import pytest

from assay.cli import main


def run(
    args: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> tuple[int, str, str]:
    """``assay star ARGS``: its exit code, stdout and stderr."""
    monkeypatch.setattr(sys, "argv", ["assay", "star", *args])
    with pytest.raises(SystemExit) as exit_:
        main()
    out, err = capsys.readouterr()
    return int(exit_.value.code or 0), out, err
