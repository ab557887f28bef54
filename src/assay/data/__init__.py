"""Benchmark data: items, raw tables in the user's own file format, row styles and whole benchmarks."""

from assay.data.benchmark import Benchmark, detect_style, read_benchmark, write_benchmark
from assay.data.items import (
    LETTERS,
    Item,
    Kind,
    MultipleChoice,
    OpenEnded,
    content_fingerprint,
    item_kind,
)
from assay.data.styles import STYLES, RenderError, Style
from assay.data.tables import SUFFIXES, FileFormat, RawTable, format_of, read_table, write_table

__all__ = [
    "LETTERS",
    "STYLES",
    "SUFFIXES",
    "Benchmark",
    "FileFormat",
    "Item",
    "Kind",
    "MultipleChoice",
    "OpenEnded",
    "RawTable",
    "RenderError",
    "Style",
    "content_fingerprint",
    "detect_style",
    "format_of",
    "item_kind",
    "read_benchmark",
    "read_table",
    "write_benchmark",
    "write_table",
]
