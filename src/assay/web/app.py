"""``create_app``: the FastAPI application: store, templates, static files, security, routers, error pages.

The store is opened (and migrated) once per app; ``app.state`` keeps the session factory (``sessions``),
the templates, the ``secure_cookies`` flag and the nav ``areas``. Routers come from
``assay.web.routes.ROUTER_MODULES``. The dependencies routes use live in ``assay.web.security`` and are
re-exported here: ``DbSession``, ``CurrentUser``, ``OptionalUser``, ``require``.
"""

from __future__ import annotations

import json
from pathlib import Path

from fastapi import Depends, FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates
from jinja2 import Environment, FileSystemLoader
from starlette.exceptions import HTTPException as StarletteHTTPException

from assay import __version__
from assay.errors import UserError
from assay.store.engine import open_store
from assay.web.routes import load_routers, page_context, render
from assay.web.security import (
    CurrentUser,
    DbSession,
    NotAuthenticated,
    OptionalUser,
    SecurityHeaders,
    csrf_protect,
    db,
    is_api,
    not_authenticated_response,
    require,
)

__all__ = ["CurrentUser", "DbSession", "OptionalUser", "create_app", "db", "require"]

HERE = Path(__file__).parent
TEMPLATES = HERE / "templates"
STATIC = HERE / "static"


def make_templates() -> Jinja2Templates:
    """Jinja2 with autoescaping on for every template (not only ``.html``), and ``page_context`` added."""
    env = Environment(
        loader=FileSystemLoader(TEMPLATES), autoescape=True, trim_blocks=True, lstrip_blocks=True
    )
    return Jinja2Templates(env=env, context_processors=[page_context])


def create_app(database_url: str | None = None, *, secure_cookies: bool = False) -> FastAPI:
    """The web app over the store at ``database_url`` (default: ``settings().database_url``).

    ``secure_cookies``: mark the session cookie Secure; turn it on whenever the site is served over HTTPS.
    """
    app = FastAPI(
        title="assay",
        version=__version__,
        description="JSON API of assay: adversarial evaluation of AI models. Authenticate with "
        "`Authorization: Bearer assay_...` (create a token on /account).",
        openapi_url="/api/v1/openapi.json",
        docs_url="/api/v1/docs",
        redoc_url=None,
        dependencies=[Depends(csrf_protect)],
    )
    app.state.sessions = open_store(database_url)
    app.state.secure_cookies = secure_cookies
    app.state.templates = make_templates()
    app.state.areas = []
    app.add_middleware(SecurityHeaders, docs_path=app.docs_url)
    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    for router, areas in load_routers():
        app.include_router(router)
        app.state.areas.extend(areas)
    app.add_exception_handler(NotAuthenticated, not_authenticated_response)
    app.add_exception_handler(UserError, _user_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    return app


def _validation_error(request: Request, exc: Exception) -> Response:
    """FastAPI's 422, but written as ASCII JSON: its default echoes the input back as UTF-8, and input holding
    a lone surrogate (valid JSON, ``"\\ud800"``) cannot be encoded, which turned a bad request into a 500."""
    assert isinstance(exc, RequestValidationError)
    body = json.dumps({"detail": jsonable_encoder(exc.errors())}, ensure_ascii=True, default=str)
    return Response(body, status_code=422, media_type="application/json")


def _user_error(request: Request, exc: Exception) -> Response:
    """A ``UserError`` is the user's to fix: 400 with its one line (JSON under /api, else the error page)."""
    if is_api(request):
        return JSONResponse({"detail": str(exc)}, status_code=400)
    return render(
        request, "error.html", status_code=400, status=400, title="Cannot do that", message=str(exc)
    )


async def _http_error(request: Request, exc: Exception) -> Response:
    """HTTP errors on pages (403, 404, ...) render the error page; the API keeps FastAPI's JSON."""
    assert isinstance(exc, StarletteHTTPException)
    if is_api(request) or request.url.path.startswith("/static"):
        return await http_exception_handler(request, exc)
    titles = {401: "Please sign in", 403: "Not allowed", 404: "Page not found"}
    message = "There is no page at this address." if exc.status_code == 404 else str(exc.detail)
    return render(
        request,
        "error.html",
        status_code=exc.status_code,
        headers=exc.headers,
        status=exc.status_code,
        title=titles.get(exc.status_code, "Error"),
        message=message,
    )
