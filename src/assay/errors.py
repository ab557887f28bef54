"""Errors a user can cause and fix.

The CLI prints a ``UserError`` as one line and exits with code 2; anything else is a bug and keeps its
traceback. Messages name what to fix: file, line, field and value where there is one. Every such line is
built here, so a value is quoted and shortened the same way everywhere.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

MAX_SHOWN = 80  # characters of a quoted value in a message


class UserError(Exception):
    """Bad input, bad arguments or an unreachable service: the user can fix it."""


def shown(value: Any) -> str:
    """``repr(value)``, cut to ``MAX_SHOWN`` characters (ending in ``...``) so a message stays one line."""
    text = repr(value)
    return text if len(text) <= MAX_SHOWN else text[: MAX_SHOWN - 3] + "..."


def first_problem(err: Any) -> tuple[str, str, Any]:
    """The first problem of a pydantic ``ValidationError``: the field's dotted path (``(top level)`` for
    the whole object), pydantic's message and the offending input."""
    first = err.errors()[0]
    field = ".".join(str(part) for part in first["loc"]) or "(top level)"
    return field, first["msg"], first.get("input")


def field_error(where: str | Path, field: str, value: Any, problem: str) -> UserError:
    """The one line for a bad field: ``WHERE: field 'x' PROBLEM (value: ...)``."""
    return UserError(f"{where}: field '{field}' {problem} (value: {shown(value)})")


def validation_error(err: Any, where: str | Path) -> UserError:
    """One line for the first problem of a pydantic ``ValidationError``, naming the field and value."""
    field, problem, value = first_problem(err)
    return field_error(where, field, value, problem.removeprefix("Value error, "))


def input_error(path: str | Path, line: int | str, field: str, value: Any, problem: str) -> UserError:
    """The one-line message for a bad field in a data file: ``file:line: field 'x' ... (value: ...)``."""
    return field_error(f"{path}:{line}", field, value, problem)
