"""One page of a query: ``limit`` rows from ``offset``, with the total, in two SQL statements.

Every list the faces hand out (accounts, audit events, DyePack releases and runs, rounds) goes through
``page_of``, so none grows without bound and each says how many there are in all.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import Select, func, select
from sqlalchemy.orm import Session

DEFAULT_LIMIT = 100
MAX_LIMIT = 500


@dataclass(frozen=True)
class Window:
    """Which rows of an ordered list: at most ``limit`` from ``offset``."""

    limit: int = DEFAULT_LIMIT
    offset: int = 0


def page_of(session: Session, query: Select[Any], window: Window) -> tuple[list[Any], int]:
    """The window's rows of ``query`` (single entities as objects, several as tuples) and the total count."""
    total = session.scalar(select(func.count()).select_from(query.order_by(None).subquery())) or 0
    result = session.execute(query.limit(window.limit).offset(window.offset))
    rows = list(result.scalars()) if len(query.column_descriptions) == 1 else [tuple(r) for r in result]
    return rows, total
