"""Row ids are unique or refused.

Why: an answer sheet names release rows by their ``id``; with a repeated id two rows share one name, so a
sheet's answers go to the first of them and a backdoor sample silently vanishes from the verdict. So
``prepare`` refuses a benchmark whose ``id`` column repeats a value, and ``verify --from-log`` refuses a
release or a sheet that does, naming the first repeat (file, line, field, value).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from assay.errors import input_error

ID_FIELD = "id"


def check_unique(
    path: Path, rows: Sequence[dict[str, Any]], wheres: Sequence[str], field: str = ID_FIELD
) -> None:
    """Raise a one-line ``UserError`` at the first row whose ``field`` repeats an earlier row's value.

    Values are compared as text (``7`` and ``"7"`` name the same row on a sheet). Rows without the field
    are passed over: a file with no id column is addressed by row number, which cannot repeat.
    """
    first: dict[str, str] = {}
    for row, where in zip(rows, wheres, strict=True):
        if field not in row or row[field] is None:
            continue
        value = str(row[field])
        if value in first:
            problem = f"repeats the id at {first[value]}; ids must be unique"
            raise input_error(path, where, field, row[field], problem)
        first[value] = where
