"""A rating table from any tool: one row per unit, one column per coder, blank for a missing rating.

The first column names the unit when its header is ``unit`` or ``id`` (or it is not numeric); every other
column is a coder. Values must be numbers (Likert points, 0/1 labels, scores). Bad cells are one
``UserError`` naming file, line, column and value.
"""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path

import numpy as np

from assay import textfile
from assay.errors import UserError, input_error

UNIT_HEADERS = ("unit", "id", "item", "unit_id", "dialogue_id")


def read_rating_table(path: str | Path) -> tuple[list[str], list[str], np.ndarray]:
    """Unit names, coder names, and the reliability data as coders x units (NaN for missing)."""
    path = Path(path)
    text = textfile.read(path, "rating table")
    rows = [row for row in csv.reader(io.StringIO(text, newline="")) if any(cell.strip() for cell in row)]
    if len(rows) < 2:
        raise UserError(f"{path}: needs a header row and at least one unit")
    header = [h.strip() for h in rows[0]]
    named = header[0].lower() in UNIT_HEADERS
    coders = header[1:] if named else header
    if len(coders) < 2:
        raise UserError(f"{path}: needs at least two coder columns (header: {', '.join(header)})")
    units, table = [], []
    for line, row in enumerate(rows[1:], start=2):
        if len(row) != len(header):
            raise input_error(path, line, "(row)", row, f"has {len(row)} cells, the header has {len(header)}")
        cells = row[1:] if named else row
        units.append(row[0].strip() if named else str(line - 1))
        values = []
        for coder, cell in zip(coders, cells, strict=True):
            text = cell.strip()
            try:
                value = float(text) if text else math.nan
            except ValueError:
                raise input_error(
                    path, line, coder, cell, "is not a number (leave it blank when missing)"
                ) from None
            if math.isinf(value):
                raise input_error(path, line, coder, cell, "is not a finite number")
            values.append(value)
        table.append(values)
    return units, coders, np.array(table, dtype=np.float64).T
