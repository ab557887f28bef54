"""The API's description kept true to what it answers: every operation that needs a sign-in documents its
401.

FastAPI documents only what a route declares; the 401 comes from the shared ``current_user`` dependency, so
it is added here to each operation that carries a security requirement.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

UNAUTHENTICATED = {
    "description": "Not signed in: no valid session cookie or Bearer token",
    "content": {
        "application/json": {
            "schema": {"type": "object", "properties": {"detail": {"type": "string"}}, "required": ["detail"]}
        }
    },
}


def install(app: FastAPI) -> None:
    """Make ``app.openapi`` document 401 on every operation that needs a sign-in."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(
                title=app.title, version=app.version, description=app.description, routes=app.routes
            )
            for operations in schema.get("paths", {}).values():
                for operation in operations.values():
                    if operation.get("security"):
                        operation.setdefault("responses", {}).setdefault("401", UNAUTHENTICATED)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
