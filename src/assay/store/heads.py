"""The migration scripts' heads, read from their text: light enough for commands that must start fast.

Importing Alembic and every script costs 0.3-0.6 s, and SQLAlchemy alone 0.29 s, so neither is imported
here: ``open_store`` (``assay.store.engine``) and the driver-only readers (``assay.store.fastread``) both ask
this whether a database is at head.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterable
from pathlib import Path

MIGRATIONS = Path(__file__).parent / "migrations"


REVISION_FIELDS = ("revision", "down_revision", "depends_on")


def are_heads(revisions: Iterable[str] | None) -> bool:
    """Whether a database's ``alembic_version`` rows are exactly the scripts' heads (None: no such table).
    Anything else (behind, ahead of this code, a branch missing, scripts this reading cannot follow) is
    left to Alembic."""
    heads = script_heads()
    return heads is not None and revisions is not None and tuple(sorted(revisions)) == heads


@functools.cache
def script_heads() -> tuple[str, ...] | None:
    """The heads of the migration scripts, from their ``revision`` and ``down_revision`` lines.

    Read as text, not through Alembic: importing Alembic and every script costs 0.3-0.6 s, more than the
    command that opens the store (``assay user list``). None where a script is not in the plain form
    every one of ours has (one-line literal assignments, no ``depends_on``); Alembic then decides. A test
    holds this to Alembic's own ``ScriptDirectory.get_heads()``.
    """
    revisions: set[str] = set()
    parents: set[str] = set()
    for script in sorted((MIGRATIONS / "versions").glob("*.py")):
        fields = _fields(script)
        if fields is None or not isinstance(fields.get("revision"), str) or fields.get("depends_on"):
            return None
        down = fields.get("down_revision")
        down = (down,) if isinstance(down, str) or down is None else down
        if not isinstance(down, tuple) or not all(isinstance(d, str) or d is None for d in down):
            return None
        revisions.add(fields["revision"])  # type: ignore[arg-type]
        parents.update(d for d in down if d is not None)
    return tuple(sorted(revisions - parents)) if revisions else None


def _fields(script: Path) -> dict[str, object] | None:
    """The module-level ``revision``, ``down_revision`` and ``depends_on`` of one script; None where one of
    them is spread over lines or not a literal."""
    fields: dict[str, object] = {}
    for line in script.read_text(encoding="utf-8").splitlines():
        if not line.startswith(REVISION_FIELDS):
            continue
        try:
            (statement,) = ast.parse(line).body
        except (SyntaxError, ValueError):
            return None
        if isinstance(statement, ast.AnnAssign):
            target, value = statement.target, statement.value
        elif isinstance(statement, ast.Assign) and len(statement.targets) == 1:
            target, value = statement.targets[0], statement.value
        else:
            continue
        if isinstance(target, ast.Name) and target.id in REVISION_FIELDS:
            try:
                fields[target.id] = ast.literal_eval(value) if value is not None else None
            except ValueError:
                return None
    return fields
