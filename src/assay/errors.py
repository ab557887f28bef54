"""Errors a user can cause and fix.

The CLI prints a ``UserError`` as one line and exits with code 2; anything else is a bug and keeps its
traceback. Messages name what to fix: file, line, field and value where there is one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


class UserError(Exception):
    """Bad input, bad arguments or an unreachable service: the user can fix it."""


def validation_error(err: Any, where: str | Path) -> UserError:
    """One line for the first problem of a pydantic ``ValidationError``, naming the field and value."""
    first = err.errors()[0]
    field = ".".join(str(part) for part in first["loc"]) or "(top level)"
    problem = first["msg"].removeprefix("Value error, ")
    shown = repr(first.get("input"))
    if len(shown) > 80:
        shown = shown[:77] + "..."
    return UserError(f"{where}: field '{field}' {problem} (value: {shown})")


def input_error(path: str | Path, line: int | str, field: str, value: Any, problem: str) -> UserError:
    """The one-line message for a bad field in a data file: ``file:line: field 'x' ... (value: ...)``."""
    shown = repr(value)
    if len(shown) > 80:
        shown = shown[:77] + "..."
    return UserError(f"{path}:{line}: field '{field}' {problem} (value: {shown})")
