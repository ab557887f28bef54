"""The ``assay`` command's first step (``assay`` and ``python -m assay``): the Python floor, then the
dependencies, then the CLI.

WHY: ``assay.cli`` imports typer at its top, so on an interpreter without assay's dependencies (an old
Python pip refused to install into, a checkout on ``PYTHONPATH``) the command died with an import traceback
before the floor check could say what is wrong (issue 49). This module imports nothing beyond ``sys`` and
:mod:`assay.pyfloor` until the floor holds, and turns a missing third-party package into one line.
"""

from __future__ import annotations

import sys

from assay import pyfloor


def missing_dependency(err: ModuleNotFoundError) -> str | None:
    """The one-line reason when ``err`` is a third-party package assay needs; None for assay's own."""
    top = (err.name or "").split(".")[0]
    if not top or top == "assay":
        return None
    return (
        f"assay's dependency {top!r} is not importable by {sys.executable}: install assay into this Python "
        "(pip install assay; in a checkout, make install and use .venv/bin/assay)"
    )


def main() -> None:
    """Check the floor, import the CLI, run it; exit code 2 and one line on stderr for either problem."""
    pyfloor.check()
    try:
        from assay.cli import main as cli_main
    except ModuleNotFoundError as err:
        reason = missing_dependency(err)
        if reason is None:
            raise
        print(f"error: {reason}", file=sys.stderr)
        raise SystemExit(2) from None
    cli_main()
