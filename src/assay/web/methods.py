"""Which methods a path answers: the ``Allow`` header of a 405, from every route, not only the first.

Starlette answers a method a path lacks with 405 and the methods of the *first* route whose path matched, so
a path served by two routes (``GET`` and ``POST /api/v1/dyepack/benchmarks``, ``GET`` and ``PATCH
/api/v1/admin/users/NAME``) advertised one of them. ``allowed`` asks every route of the app instead.

A path that a literal route and a parameter route share (``POST /star/tasks/claim`` beside ``GET
/star/tasks/{task_id}``) answers 405 for the literal's other methods only if the parameter route cannot
match it: such parameters carry a path convertor (``{task_id:int}``, ``{action:theme_action}``), so the
router itself tells ``claim`` from an id, instead of the id's validation answering 422.
"""

from __future__ import annotations

from fastapi import Request
from starlette.convertors import Convertor, register_url_convertor
from starlette.routing import Match

METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE")


def allowed(request: Request) -> list[str]:
    """The methods some route of the app fully matches at ``request``'s path, in ``METHODS`` order."""
    routes = request.app.router.routes
    found = []
    for method in METHODS:
        scope = {**request.scope, "method": method}
        if any(route.matches(scope)[0] == Match.FULL for route in routes):
            found.append(method)
    return found


class WordConvertor(Convertor[str]):
    """A path segment that is one of a fixed set of words (a route's verbs), so that a literal route beside
    it is told apart by the router."""

    def __init__(self, *words: str) -> None:
        self.regex = "|".join(words)

    def convert(self, value: str) -> str:
        return value

    def to_string(self, value: str) -> str:
        return value


THEME_ACTIONS = ("label", "settle")
register_url_convertor("theme_action", WordConvertor(*THEME_ACTIONS))
