"""The API's description kept true to what it answers: every operation that needs a sign-in documents its
401, and every operation that takes a body or changes something documents its 400.

FastAPI documents only what a route declares; the 401 comes from the shared ``current_user`` dependency, and
the 400 from the app's ``UserError`` handler (a rule of the service refused the request: a closed round, a
role that cannot be given) or from a body that cannot be parsed at all, so both are added here.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

PROBLEM = {"type": "object", "properties": {"detail": {"type": "string"}}, "required": ["detail"]}
REFUSED = {
    "description": "Refused by a rule of the service (one line saying which), or a body that will not parse",
    "content": {"application/json": {"schema": PROBLEM}},
}
UNAUTHENTICATED = {
    "description": "Not signed in: no valid session cookie or Bearer token",
    "content": {
        "application/json": {
            "schema": {"type": "object", "properties": {"detail": {"type": "string"}}, "required": ["detail"]}
        }
    },
}


def install(app: FastAPI) -> None:
    """Make ``app.openapi`` document 401 on every operation that needs a sign-in, and 400 on every one that
    takes a body or is not a GET."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(
                title=app.title, version=app.version, description=app.description, routes=app.routes
            )
            for operations in schema.get("paths", {}).values():
                for method, operation in operations.items():
                    responses = operation.setdefault("responses", {})
                    if operation.get("security"):
                        responses.setdefault("401", UNAUTHENTICATED)
                    if method != "get" or "requestBody" in operation:
                        responses.setdefault("400", REFUSED)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
