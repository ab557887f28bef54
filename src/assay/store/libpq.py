"""A read-only DB-API cursor over libpq itself (ctypes), for the driver-only listings of ``fastread.py``.

WHY: ``import psycopg`` alone takes 0.17-0.22 s on a 2-core machine (its type adapters, its asyncio
support, its own version check), which put ``assay user list`` on PostgreSQL at 0.35 s against a 0.3 s
goal. libpq is the library psycopg drives too; loading it takes a few milliseconds. This covers only what
a listing needs: connect by URL, run a statement with text parameters, read rows. Values come back as
text except NULL, booleans and integers, which are converted; anything else (a connection refused, a
library missing) raises ``LibpqError``, and the caller steps aside to psycopg or the ORM.

The library is the system's ``libpq.so.5`` if there is one, else the copy psycopg-binary ships.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Sequence
from importlib.util import find_spec
from pathlib import Path
from typing import Any

_CONNECTION_OK, _TUPLES_OK, _COMMAND_OK = 0, 2, 1
_BOOL, _INTEGERS = 16, {20, 21, 23}  # type OIDs: boolean; int8, int2, int4


class LibpqError(RuntimeError):
    """libpq could not be loaded, could not connect, or refused a statement."""


def available() -> bool:
    """Whether a libpq can be loaded here (else psycopg's own import is the way)."""
    try:
        _library()
    except LibpqError:
        return False
    return True


@functools.cache
def _library() -> ctypes.CDLL:
    candidates = ["libpq.so.5"]
    spec = find_spec("psycopg_binary")
    if spec is not None and spec.origin:
        bundled = Path(spec.origin).parent.parent / "psycopg_binary.libs"
        candidates += [str(p) for p in sorted(bundled.glob("libpq-*.so*"))]
    for candidate in candidates:
        try:
            lib = ctypes.CDLL(candidate)
        except OSError:
            continue
        return _declare(lib)
    raise LibpqError("no libpq found")


def _declare(lib: ctypes.CDLL) -> ctypes.CDLL:
    p, s, i = ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int
    for name, result, arguments in (
        ("PQconnectdb", p, [s]),
        ("PQstatus", i, [p]),
        ("PQerrorMessage", s, [p]),
        ("PQfinish", None, [p]),
        ("PQexecParams", p, [p, s, i, p, ctypes.POINTER(s), p, p, i]),
        ("PQresultStatus", i, [p]),
        ("PQresultErrorMessage", s, [p]),
        ("PQntuples", i, [p]),
        ("PQnfields", i, [p]),
        ("PQftype", ctypes.c_uint, [p, i]),
        ("PQgetisnull", i, [p, i, i]),
        ("PQgetvalue", s, [p, i, i]),
        ("PQclear", None, [p]),
    ):
        function = getattr(lib, name)
        function.restype, function.argtypes = result, arguments
    return lib


def _value(text: bytes, oid: int) -> Any:
    if oid == _BOOL:
        return text == b"t"
    if oid in _INTEGERS:
        return int(text)
    return text.decode("utf-8")


class Connection:
    """One read-only session (``default_transaction_read_only``) at a ``postgresql://`` URL."""

    def __init__(self, url: str) -> None:
        self._lib = _library()
        self._conn = self._lib.PQconnectdb(url.encode("utf-8"))
        if not self._conn or self._lib.PQstatus(self._conn) != _CONNECTION_OK:
            message = self._lib.PQerrorMessage(self._conn) if self._conn else b"out of memory"
            self.close()
            raise LibpqError((message or b"").decode("utf-8", "replace").strip())
        self._rows: list[tuple[Any, ...]] = []
        self.execute("SET client_encoding TO 'UTF8'")
        self.execute("SET default_transaction_read_only TO on")

    def execute(self, statement: str, parameters: Sequence[Any] = ()) -> None:
        """Run ``statement`` (``%s`` marks its parameters, sent as text); its rows wait in ``fetchall``."""
        numbered = statement
        for index in range(len(parameters)):
            numbered = numbered.replace("%s", f"${index + 1}", 1)
        values = (ctypes.c_char_p * max(1, len(parameters)))(*[str(v).encode() for v in parameters])
        result = self._lib.PQexecParams(
            self._conn, numbered.encode(), len(parameters), None, values, None, None, 0
        )
        try:
            status = self._lib.PQresultStatus(result) if result else -1
            if status not in (_TUPLES_OK, _COMMAND_OK):
                error = (
                    self._lib.PQresultErrorMessage(result) if result else self._lib.PQerrorMessage(self._conn)
                )
                raise LibpqError((error or b"").decode("utf-8", "replace").strip())
            self._rows = [self._row(result, r) for r in range(self._lib.PQntuples(result))]
        finally:
            if result:
                self._lib.PQclear(result)

    def _row(self, result: int, row: int) -> tuple[Any, ...]:
        lib = self._lib
        return tuple(
            None
            if lib.PQgetisnull(result, row, c)
            else _value(lib.PQgetvalue(result, row, c), lib.PQftype(result, c))
            for c in range(lib.PQnfields(result))
        )

    def fetchall(self) -> list[tuple[Any, ...]]:
        rows, self._rows = self._rows, []
        return rows

    def fetchone(self) -> tuple[Any, ...] | None:
        return self._rows.pop(0) if self._rows else None

    def cursor(self) -> Connection:
        """The connection is its own cursor (one statement at a time, as a listing reads)."""
        return self

    def close(self) -> None:
        if getattr(self, "_conn", None):
            self._lib.PQfinish(self._conn)
            self._conn = None
