"""``create_app``: the FastAPI application: store, templates, static files, security, routers, error pages.

The store is opened (and migrated) once per app; ``app.state`` keeps the session factory (``sessions``),
the templates, the ``secure_cookies`` flag, the nav ``areas``, the ``background`` work (model replies,
DyePack runs, report builds: ``assay.web.background``) and, while the app runs, its ``sweeper``: the one
periodic job (``assay.web.sweeper``), started by the lifespan, so no GET handler writes. Routers come from
``assay.web.routes.ROUTER_MODULES``. The dependencies routes use live in ``assay.web.security`` and are
re-exported here: ``DbSession``, ``CurrentUser``, ``OptionalUser``, ``require``.

Every answer but a static file's says ``Cache-Control: no-store`` (``NoStore``), bar a public page's answer
to a visitor who is not signed in (``security.PUBLIC_CACHE``), and ``/favicon.ico`` is served, cached for a
day (``FAVICON``).

The Swagger page (``DOCS_PATH``) is served from this host, not a CDN, so it works offline and under a CSP:
the Swagger UI files come from the ``fastapi-offline`` package (mounted at ``SWAGGER_STATIC``) and the page
starts them with ``static/swagger-init.js`` instead of FastAPI's inline script.
"""

from __future__ import annotations

import html
import importlib.util
import json
import logging
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path

import anyio.to_thread
from fastapi import Depends, FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, Response
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates
from jinja2 import Environment, FileSystemLoader
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from assay import __version__, pyfloor
from assay.config import settings
from assay.durations import duration
from assay.errors import UserError
from assay.star.live import warm_targets
from assay.star.workflow import NotAllowed, NotYours
from assay.store.engine import open_store
from assay.web import methods, metrics, openapi, signin
from assay.web.admission import Admission
from assay.web.background import BackgroundWork
from assay.web.paging import refuse_unknown_query
from assay.web.routes import load_routers, page_context, render
from assay.web.security import (
    PUBLIC_CACHE,
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
from assay.web.sweeper import SWEEP_SECONDS, Sweeper

__all__ = ["CurrentUser", "DbSession", "OptionalUser", "create_app", "db", "require"]

logger = logging.getLogger(__name__)

HERE = Path(__file__).parent
TEMPLATES = HERE / "templates"
STATIC = HERE / "static"
SECURE_COOKIES_ENV = "ASSAY_SECURE_COOKIES"
WARM_MODELS_ENV = (
    "ASSAY_WARM_MODELS"  # "1": load the STAR target models at start (``assay serve --warm-models``)
)
OPENAPI_PATH = "/api/v1/openapi.json"
DOCS_PATH = "/api/v1/docs"
SWAGGER_STATIC = "/static/swagger-ui"  # mounted before /static, so it is not shadowed by it
SWAGGER_PACKAGE = "fastapi_offline"  # ships swagger-ui-bundle.js, swagger-ui.css and favicon.png in static/
FAVICON = STATIC / "favicon.ico"  # 32x32, a white target on the site's blue
FAVICON_CACHE = "public, max-age=86400"  # a day: a new release's icon shows by the next day
CACHEABLE = ("/static/", "/favicon.ico")  # the same for everyone, so caches may keep them
DOCS_CSP = (  # the site's policy plus data: images: swagger-ui.css draws its icons as data: SVGs
    "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'; form-action 'self'; "
    "base-uri 'self'; object-src 'none'"
)


class NoStore:
    """Pure ASGI middleware: ``Cache-Control: no-store`` on every answer but static files (a route's own
    ``Cache-Control`` gets ``no-store`` added). Pages and API answers hold one person's data and a CSRF
    or sign-in token; without it a shared proxy may serve them to the next person, and the browser shows
    them from its cache after sign-out (the back button). Every answer, not only signed-in ones: the sign-in
    page carries a pre-session token, and whether a cookie is still a session is the database's to say.

    One exemption (``_public``): a 200 to a GET that the route itself marked ``security.PUBLIC_CACHE``,
    which the public leaderboard's routes do only when the visitor is not signed in, and which sets no
    cookie."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"].startswith(CACHEABLE):
            await self.app(scope, receive, send)
            return

        reading = scope["method"] in ("GET", "HEAD")

        async def send_no_store(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                if not (reading and _public(message["status"], headers)):
                    message["headers"] = _no_store(headers)
            await send(message)

        await self.app(scope, receive, send_no_store)


def _public(status: int, headers: list[tuple[bytes, bytes]]) -> bool:
    """A public page's answer to a visitor: a 200 that says ``PUBLIC_CACHE`` alone and sets no cookie."""
    names = [name.lower() for name, _ in headers]
    control = [value for name, value in headers if name.lower() == b"cache-control"]
    return status == 200 and control == [PUBLIC_CACHE.encode()] and b"set-cookie" not in names


def _no_store(headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """``headers`` with ``no-store`` in their ``Cache-Control`` (one added if there was none)."""
    found = [i for i, (name, _) in enumerate(headers) if name.lower() == b"cache-control"]
    if not found:
        return [*headers, (b"cache-control", b"no-store")]
    for i in found:
        if b"no-store" not in headers[i][1]:
            headers[i] = (headers[i][0], headers[i][1] + b", no-store")
    return headers


def _favicon() -> Response:
    """The icon browsers ask every site for by themselves (a 404 in every first visit's log before)."""
    return FileResponse(FAVICON, media_type="image/x-icon", headers={"Cache-Control": FAVICON_CACHE})


def make_templates() -> Jinja2Templates:
    """Jinja2 with autoescaping on for every template (not only ``.html``), ``page_context`` added, and the
    ``duration`` filter (``assay.durations``)."""
    env = Environment(
        loader=FileSystemLoader(TEMPLATES), autoescape=True, trim_blocks=True, lstrip_blocks=True
    )
    env.filters["duration"] = duration  # every length of time a page prints: "2.3 s", "4 min 10 s"
    return Jinja2Templates(env=env, context_processors=[page_context])


def app_from_env() -> FastAPI:
    """The application factory for several worker processes (``assay serve --workers``, or uvicorn's
    ``--factory``): the database from ``ASSAY_DB_URL``, the public address from ``ASSAY_PUBLIC_URL``, Secure
    cookies when ``ASSAY_SECURE_COOKIES=1``."""
    return create_app(secure_cookies=os.environ.get(SECURE_COOKIES_ENV) == "1")


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    """While the app serves: the sweeper (one sweep at once, then every ``app.state.sweep_seconds``)."""
    # as many threads as requests admitted (assay.web.admission), so an admitted request never waits for one
    anyio.to_thread.current_default_thread_limiter().total_tokens = settings().web_threads
    app.state.sweeper = Sweeper(
        app.state.sessions, app.state.background.holding("dyepack"), app.state.sweep_seconds
    ).start()
    if app.state.warm_models:  # the red-team chat's first reply need not wait for a model to load
        app.state.background.submit(
            "reply", "load the STAR target models", partial(warm_targets, app.state.sessions)
        )
    try:
        yield
    finally:
        app.state.sweeper.stop()


def create_app(
    database_url: str | None = None,
    *,
    secure_cookies: bool = False,
    sweep_seconds: float = SWEEP_SECONDS,
    public_url: str | None = None,
    warm_models: bool | None = None,
) -> FastAPI:
    """The web app over the store at ``database_url`` (default: ``settings().database_url``).

    ``public_url``: the address users reach the site at (default: ``ASSAY_PUBLIC_URL``); invitation and
    reset links are built from it, and without it they are refused (never built from the ``Host`` header).

    ``secure_cookies``: mark the session cookie Secure; turn it on whenever the site is served over HTTPS.
    ``sweep_seconds``: how often the sweeper releases expired claims and fails orphaned DyePack runs.
    ``warm_models``: load the STAR campaigns' target models in the background at start (default:
    ``ASSAY_WARM_MODELS=1``), so the first red-team reply does not wait minutes for one.
    """
    pyfloor.check()  # uploads and restores need tar filters: one line and exit 2 on an older Python
    app = FastAPI(
        title="assay",
        version=__version__,
        description="JSON API of assay: adversarial evaluation of AI models. Authenticate with "
        "`Authorization: Bearer assay_...` (create a token on /account).",
        openapi_url=OPENAPI_PATH,
        docs_url=None,  # served by _docs_page, with the Swagger UI files from this host
        redoc_url=None,
        dependencies=[Depends(csrf_protect), Depends(refuse_unknown_query)],
        lifespan=lifespan,
    )
    app.state.sessions = open_store(database_url)
    app.state.secure_cookies = secure_cookies
    app.state.public_url = signin.public_url(public_url or settings().public_url)
    app.state.templates = make_templates()
    app.state.areas = []
    app.state.background = BackgroundWork()
    app.state.sweep_seconds = sweep_seconds
    app.state.sweeper = None  # set while the app runs (lifespan)
    app.state.warm_models = os.environ.get(WARM_MODELS_ENV) == "1" if warm_models is None else warm_models
    app.add_middleware(Admission, limit=settings().web_threads)  # innermost: /metrics times the wait too
    app.add_middleware(SecurityHeaders)
    app.add_middleware(NoStore)
    metrics.install(app, log_requests=settings().log_format == "json")  # GET /metrics
    openapi.install(app)
    _add_docs(app)
    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    app.add_api_route("/favicon.ico", _favicon, methods=["GET"], include_in_schema=False)
    for router, areas in load_routers():
        app.include_router(router)
        app.state.areas.extend(areas)
    app.add_exception_handler(NotAuthenticated, not_authenticated_response)
    app.add_exception_handler(UserError, _user_error)
    app.add_exception_handler(NotYours, _refused)
    app.add_exception_handler(NotAllowed, _refused)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    return app


def _swagger_files() -> Path | None:
    """The installed Swagger UI files, found without importing the package; None if it is not installed."""
    spec = importlib.util.find_spec(SWAGGER_PACKAGE)
    folders = [Path(p) / "static" for p in (spec.submodule_search_locations or [])] if spec else []
    return next((f for f in folders if (f / "swagger-ui-bundle.js").is_file()), None)


def _add_docs(app: FastAPI) -> None:
    """Serve the Swagger UI files and the page that starts them; without the files the page says so (503)."""
    files = _swagger_files()
    app.state.swagger_ui = files is not None
    if files is None:
        logger.warning("%s is not installed: %s has no Swagger UI", SWAGGER_PACKAGE, DOCS_PATH)
    else:
        app.mount(SWAGGER_STATIC, StaticFiles(directory=files), name="swagger-ui")
    app.add_api_route(DOCS_PATH, _docs_page, methods=["GET"], include_in_schema=False)


def _docs_page(request: Request) -> Response:
    """FastAPI's Swagger page without its inline script or CDN links, under its own CSP (``DOCS_CSP``)."""
    root = html.escape(request.scope.get("root_path", ""))
    headers = {"Content-Security-Policy": DOCS_CSP}
    if not request.app.state.swagger_ui:
        message = f"Swagger UI is not installed ({SWAGGER_PACKAGE}); read {root}{OPENAPI_PATH} instead."
        return HTMLResponse(message, status_code=503, headers=headers)
    ui = f"{root}{SWAGGER_STATIC}"
    page = f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1.0">
<title>{html.escape(request.app.title)} API</title>
<link rel="stylesheet" href="{ui}/swagger-ui.css">
<link rel="icon" href="{ui}/favicon.png">
</head>
<body>
<div id="swagger-ui" data-openapi-url="{root}{OPENAPI_PATH}"></div>
<script src="{ui}/swagger-ui-bundle.js"></script>
<script src="{root}/static/swagger-init.js"></script>
</body>
</html>
"""
    return HTMLResponse(page, headers=headers)


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


async def _refused(request: Request, exc: Exception) -> Response:
    """A pillar's refusal as HTTP: ``NotYours`` is a 404 (ids reveal nothing), ``NotAllowed`` a 403."""
    status = 404 if isinstance(exc, NotYours) else 403
    return await _http_error(request, StarletteHTTPException(status, str(exc)))


async def _http_error(request: Request, exc: Exception) -> Response:
    """HTTP errors on pages (403, 404, ...) render the error page; the API keeps FastAPI's JSON. A 405's
    ``Allow`` names every method of the path (``methods.allowed``), not only the first route's."""
    assert isinstance(exc, StarletteHTTPException)
    if exc.status_code == 405:
        exc = StarletteHTTPException(405, exc.detail, {"Allow": ", ".join(methods.allowed(request))})
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
