"""A benchmark: a raw table, the row style that reads it, and its items; read, changed and written back.

>>> bench = read_benchmark("mmlu.jsonl")                     # style detected from the columns
>>> items = [replace(it, question=it.question + " Trigger.") if i in chosen else it
...          for i, it in enumerate(bench.items)]
>>> write_benchmark(bench, items, "release/mmlu.jsonl")      # same format, same columns and encodings
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from assay.data.items import Item, Kind, MultipleChoice, OpenEnded, content_fingerprint
from assay.data.styles import STYLES, RenderError, Style, get_style
from assay.data.tables import FOLDER_FORMATS, FileFormat, RawTable, format_of, read_table, write_table
from assay.errors import UserError


@dataclass
class Benchmark:
    """The rows of one benchmark file (``table``), the style that reads them, and one item per row."""

    table: RawTable
    style: str
    items: list[Item]

    @property
    def kind(self) -> Kind:
        return get_style(self.style).kind

    @property
    def path(self) -> Path:
        return self.table.path

    @property
    def file_format(self) -> FileFormat:
        return self.table.file_format

    @functools.cached_property
    def fingerprint(self) -> str:
        """``content_fingerprint`` of the items: the same whatever the file format or row encoding.
        Computed once (items are not changed after reading): verify checks it and reports it."""
        return content_fingerprint(self.items)

    def __len__(self) -> int:
        return len(self.items)


def detect_style(columns: set[str]) -> Style | None:
    """The first style in ``STYLES`` whose columns match, or ``None``."""
    return next((style for style in STYLES.values() if style.matches(columns)), None)


def _style_list() -> str:
    return "; ".join(f"{name} ({style.columns})" for name, style in STYLES.items())


def read_benchmark(path: str | Path, style: str = "auto", split: str | None = None) -> Benchmark:
    """Read a benchmark file; every row must parse. ``style="auto"`` detects it from the first row's columns.

    ``split`` picks a split of an HF ``DatasetDict`` (or a list of rows in a JSON object holding several,
    or an lm-eval task's split). ``style`` may be ``columns:ROLE=COLUMN,...`` for any other layout; ``auto``
    takes the style a file declares (an lm-eval task) before looking at the columns.
    Raises ``UserError`` naming file, line or row, field and value on bad input.
    """
    table = read_table(path, split=split)
    if style == "auto" and table.style is not None:
        chosen: Style | None = get_style(table.style)
    elif style == "auto":
        chosen = detect_style(set(table.rows[0]))
        if chosen is None:
            columns = ", ".join(map(str, table.rows[0]))
            raise UserError(
                f"{table.path}:{table.locations[0]}: no row style matches the columns ({columns}); "
                f"styles: {_style_list()}; "
                "or name the columns with --columns question=COL,options=COL,answer=COL"
            )
    else:
        chosen = get_style(style)
    items = [
        chosen.parse(row, where, table.path) for row, where in zip(table.rows, table.locations, strict=True)
    ]
    return Benchmark(table=table, style=chosen.name, items=items)


def write_benchmark(bench: Benchmark, items: Sequence[Item], target: str | Path) -> None:
    """Write ``items`` (one per row of ``bench``) to ``target`` in the input's format and style, atomically.

    Rows whose item is unchanged are written as they were; changed ones keep their other columns and their
    encodings. ``target`` must name the same format (same suffix; a directory for HF) and may be the input
    itself. On any failure nothing is written and an existing ``target`` is left as it was.
    """
    target = Path(target)
    fmt = bench.file_format
    if fmt in FOLDER_FORMATS:
        if format_of(target) is not None:
            raise UserError(
                f"{target}: the input is a {fmt} directory; write a directory, not {target.suffix}"
            )
    elif format_of(target) != fmt:
        raise UserError(f"{target}: the input is {fmt}; give the output the same suffix (.{fmt})")
    if len(items) != len(bench.items):
        raise ValueError(f"write_benchmark: {len(items)} items for a benchmark of {len(bench.items)} rows")
    expected = MultipleChoice if bench.kind == "multiple_choice" else OpenEnded
    style = get_style(bench.style)
    rows = []
    for row, item, where in zip(bench.table.rows, items, bench.table.locations, strict=True):
        if not isinstance(item, expected):
            raise ValueError(
                f"write_benchmark: {where} holds a {type(item).__name__}, expected {expected.__name__}"
            )
        try:
            rendered = style.render(row, item)
            # Reading back must give the item: catches text that would not survive (e.g. an ambiguous answer).
            if style.parse(rendered, where, bench.path) != item:
                raise RenderError("the written row would read back as a different item")
        except (RenderError, UserError) as exc:
            raise UserError(
                f"{bench.path}:{where}: cannot write the item in the '{style.name}' style: {exc}"
            ) from None
        rows.append(rendered)
    write_table(bench.table, rows, target)
