"""Pages of the JSON API's lists: ``?limit=&offset=`` in, ``{items, total, limit, offset}`` out, and no
query parameter an endpoint does not know.

``Paging`` is the dependency every list endpoint takes (limit 1-500, default 100; offset from 0), ``Page[T]``
the response, and ``refuse_unknown_query`` (applied to every ``/api`` route by the app) turns a parameter
the route does not declare into a 422 naming it, so a typo (``?limt=10``) is an error, not a silent default.
"""

from __future__ import annotations

from typing import Annotated, Generic, TypeVar

from fastapi import Depends, Query, Request
from fastapi.dependencies.models import Dependant
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from pydantic import BaseModel

from assay.store.paging import DEFAULT_LIMIT, MAX_LIMIT, Window
from assay.web.params import MAX_ID
from assay.web.security import API_PREFIX

T = TypeVar("T")


def _window(
    limit: Annotated[int, Query(ge=1, le=MAX_LIMIT, description="How many items at most.")] = DEFAULT_LIMIT,
    offset: Annotated[int, Query(ge=0, le=MAX_ID, description="How many items to skip.")] = 0,
) -> Window:
    return Window(limit, offset)


Paging = Annotated[Window, Depends(_window)]


class Page(BaseModel, Generic[T]):
    """One page of a list: its items, the total number there are, and the window asked for."""

    items: list[T]
    total: int
    limit: int
    offset: int

    @classmethod
    def of(cls, items: list[T], total: int, window: Window) -> Page[T]:
        return cls(items=items, total=total, limit=window.limit, offset=window.offset)


def _query_names(dependant: Dependant) -> set[str]:
    """The query parameters a route declares, its dependencies' included."""
    names = {p.alias for p in dependant.query_params}
    for sub in dependant.dependencies:
        names |= _query_names(sub)
    return names


async def refuse_unknown_query(request: Request) -> None:
    """422 for a query parameter the ``/api`` route does not declare (pages ignore extras, as browsers add
    their own). ``async`` though it awaits nothing: every request runs it, and a plain ``def`` would cost each
    one a wait for a thread (``assay.web.admission``)."""
    route = request.scope.get("route")
    if not request.url.path.startswith(API_PREFIX) or not isinstance(route, APIRoute):
        return
    known = _query_names(route.dependant)
    unknown = sorted(set(request.query_params) - known)
    if unknown:
        problem = {"loc": ("query", unknown[0]), "msg": "unknown query parameter", "type": "extra_forbidden"}
        raise RequestValidationError([{**problem, "input": request.query_params[unknown[0]]}])
