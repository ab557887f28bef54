"""Text files users hand assay (YAML configs; STAR specs, pools, rating tables, imports), read as UTF-8.

A file saved in another encoding (Latin-1 or Windows-1252 from a spreadsheet, say) would otherwise end the
command in a traceback. Here it is one ``UserError`` line that says where the first bad byte is (the line,
the byte within it and, for a whole file, its offset), so the lead can find it in an editor and save the
file as UTF-8. A UTF-8 byte-order mark, which spreadsheets write, is dropped: it is not part of the first
column's name.
"""

from __future__ import annotations

import codecs
from pathlib import Path

from assay.errors import UserError


def read(path: str | Path, what: str) -> str:
    """The whole file as text; unreadable or not UTF-8 is one line naming the file (and line) and ``what``."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise UserError(f"{path}: cannot read the {what} ({exc.strerror or exc})") from None
    return decode(data, path, what)


def decode(data: bytes, path: str | Path, what: str) -> str:
    """A whole file's bytes as text (a leading byte-order mark dropped)."""
    skip = len(codecs.BOM_UTF8) if data.startswith(codecs.BOM_UTF8) else 0
    try:
        return data[skip:].decode("utf-8")
    except UnicodeDecodeError as exc:
        start = skip + exc.start
        line = 1 + data.count(b"\n", 0, start)
        raise _bad_byte(path, line, data, start, what, f", offset {start} of the file") from None


def decode_line(raw: bytes, path: str | Path, line: int, what: str) -> str:
    """One line of a file read line by line (a JSONL file, perhaps gzipped), as text; ``line`` from 1."""
    skip = len(codecs.BOM_UTF8) if line == 1 and raw.startswith(codecs.BOM_UTF8) else 0
    try:
        return raw[skip:].decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _bad_byte(path, line, raw, skip + exc.start, what, "") from None


def _bad_byte(path: str | Path, line: int, data: bytes, start: int, what: str, offset: str) -> UserError:
    column = start - (data.rfind(b"\n", 0, start) + 1) + 1  # bytes, from 1
    return UserError(
        f"{path}:{line}: not UTF-8: byte 0x{data[start]:02X} at byte {column} of the line{offset}; "
        f"save the {what} as UTF-8"
    )
