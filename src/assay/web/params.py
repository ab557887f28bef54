"""Request parameters every area of the web face shares: database ids and text the database can hold.

A value outside these bounds is a 422 naming the parameter, never a database error (a 500):
PostgreSQL's ids are 32-bit and SQLite cannot even compare a larger number; SQLite's driver cannot encode a
lone surrogate, and PostgreSQL refuses NUL characters in text.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Path
from pydantic import AfterValidator, Field

MAX_ID = 2**31 - 1  # the largest id any table can hold


def plain_text(text: str) -> str:
    """``text`` unchanged if the database and every later reader can hold it: no NUL, no lone surrogates;
    a ``ValueError`` (so a 422 naming the field) otherwise. Use it as a pydantic ``AfterValidator``."""
    if "\x00" in text:
        raise ValueError("text must not contain NUL characters")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError("text must be valid Unicode") from exc
    return text


# The schema says "no NUL" too, for clients and fuzzers (a lone surrogate cannot be put in a pattern).
PlainText = Annotated[str, AfterValidator(plain_text), Field(json_schema_extra={"pattern": "^[^\\u0000]*$"})]


def path_id(description: str | None = None) -> Any:
    """A path parameter for a database id: 1 to ``MAX_ID``."""
    return Path(ge=1, le=MAX_ID, description=description)


ObjectId = Annotated[int, path_id()]
