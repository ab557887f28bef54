"""Request dependencies: the database session, who is asking (cookie or Bearer token), what they may do.

- ``DbSession``: one SQLAlchemy session per request, committed when the route returns and before the response
  is sent (``scope="function"``), rolled back if it raises.
- ``CurrentUser`` / ``OptionalUser``: the signed-in ``WebUser``. A browser proves itself with the
  ``assay_session`` cookie, a script with ``Authorization: Bearer assay_...``.
- ``require(*roles)``: 403 unless the user holds one of ``roles`` (organisers hold them all).
- CSRF: the app applies ``csrf_protect`` to every route. An unsafe request (POST, PUT, PATCH, DELETE) that
  carries a valid session cookie must also carry that session's token in the form field ``csrf_token`` or
  the ``X-CSRF-Token`` header. Bearer requests are exempt: a browser never adds that header on its own.

Anonymous requests: an HTML page redirects to ``/login?next=...``; anything under ``/api`` gets a 401 JSON.
The few routes a visitor may read too (the public leaderboard) take ``Visitor`` instead: the user or None,
and their anonymous answers carry ``PUBLIC_HEADERS``, the one answer ``app.NoStore`` lets caches keep.
"""

from __future__ import annotations

import hmac
from collections.abc import Callable, Iterator
from typing import Annotated, Any
from urllib.parse import quote

from fastapi import Depends, HTTPException, Request
from fastapi.responses import JSONResponse, RedirectResponse, Response
from fastapi.security import HTTPBearer
from sqlalchemy.orm import Session
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from assay.store.web_models import WebUser
from assay.web import accounts

SESSION_COOKIE = "assay_session"
CSRF_FIELD = "csrf_token"
CSRF_HEADER = "X-CSRF-Token"
UNSAFE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
API_PREFIX = "/api"

SECURITY_HEADERS = {
    # No inline scripts or styles: the pages use one stylesheet from /static and no JavaScript framework.
    "content-security-policy": "default-src 'self'; frame-ancestors 'none'; form-action 'self'; "
    "base-uri 'self'; object-src 'none'",
    "x-frame-options": "DENY",
    "x-content-type-options": "nosniff",
    "referrer-policy": "same-origin",
}
# An anonymous answer of a public page: the same for every visitor, so any cache may keep it a minute. Vary
# keeps a cache from handing it to a signed-in browser (its cookie) or script (its token), whose answers
# are never stored (``app.NoStore``).
PUBLIC_CACHE = "public, max-age=60"
PUBLIC_HEADERS = {"Cache-Control": PUBLIC_CACHE, "Vary": "Cookie, Authorization"}


class NotAuthenticated(Exception):
    """Nobody is signed in; the app turns it into a redirect to /login (pages) or a 401 (API)."""


def db(request: Request) -> Iterator[Session]:
    """One session per request from the factory on ``app.state.sessions``: commit on success."""
    session = request.app.state.sessions()
    try:
        yield session
        session.commit()
    except BaseException:
        user = getattr(request.state, "user", None)
        if user is not None and user in session:
            session.expunge(user)  # keep it loaded: the error page still shows the nav for this user
        session.rollback()
        raise
    finally:
        session.close()


DbSession = Annotated[Session, Depends(db, scope="function")]
_bearer = HTTPBearer(auto_error=False, description="An API token from /account: `assay_...`")


def _bearer_token(request: Request) -> str | None:
    scheme, _, credentials = request.headers.get("authorization", "").partition(" ")
    return credentials.strip() if scheme.lower() == "bearer" and credentials.strip() else None


def optional_user(request: Request, session: DbSession) -> WebUser | None:
    """The signed-in user, or ``None``; also sets ``request.state.user``/``auth``/``csrf_token``.

    A Bearer header that does not match a live token is a 401 rather than anonymous, so a script with a
    revoked token fails loudly instead of seeing public data only.
    """
    request.state.user, request.state.auth, request.state.csrf_token = None, None, ""
    raw = _bearer_token(request)
    if raw is not None:
        user = accounts.token_user(session, raw)
        if user is None:
            raise HTTPException(401, "invalid or revoked API token", headers={"WWW-Authenticate": "Bearer"})
        request.state.user, request.state.auth = user, "bearer"
        _release(session)
        return user
    found = accounts.session_user(session, request.cookies.get(SESSION_COOKIE))
    if found is None:
        session.commit()  # an expired session the lookup found is deleted (already flushed)
        return None
    _release(session)
    user, web_session = found
    request.state.user, request.state.auth = user, "session"
    request.state.csrf_token = web_session.csrf_token
    return user


def _release(session: Session) -> None:
    """Commit the sign-in lookup's bookkeeping (a last-used/last-seen time) at once, so no request holds
    SQLite's write lock while it waits for its route's thread.

    A lookup that only read keeps its transaction, and its connection, for the route: one checkout (and
    its ping, BEGIN and COMMIT) fewer per request. That is safe because of the admission gate
    (``assay.web.admission``): an admitted request never waits for a connection. Before the gate this
    committed every time, which did not stop the crowd stall either (``docs/deploy.md``).
    """
    if session.dirty or session.new or session.deleted:
        session.commit()


OptionalUser = Annotated[WebUser | None, Depends(optional_user)]


async def csrf_protect(request: Request, user: OptionalUser) -> None:
    """403 for an unsafe request authenticated by cookie without the session's CSRF token."""
    if request.method not in UNSAFE_METHODS or request.state.auth != "session":
        return
    sent = request.headers.get(CSRF_HEADER)
    if sent is None and "form" in request.headers.get("content-type", ""):
        sent = (await request.form()).get(CSRF_FIELD)  # parsed once: FastAPI reuses it for Form() params
    if not isinstance(sent, str) or not hmac.compare_digest(sent.encode(), request.state.csrf_token.encode()):
        raise HTTPException(403, "missing or wrong CSRF token: reload the page and try again")


async def current_user(user: OptionalUser, _token: Any = Depends(_bearer)) -> WebUser:
    """The signed-in user, or ``NotAuthenticated`` (redirect to /login, or 401 under /api).

    ``async``, like ``require``'s check, though neither awaits anything: FastAPI runs a plain ``def``
    dependency on a thread, and these only read the user already loaded. Each hop saved is one wait less for
    a thread under load (issue 27)."""
    if user is None:
        raise NotAuthenticated()
    return user


CurrentUser = Annotated[WebUser, Depends(current_user)]


async def visitor(user: OptionalUser, _token: Any = Depends(_bearer)) -> WebUser | None:
    """The signed-in user or None, for the routes a visitor who is not signed in may read too (the public
    leaderboard). Unlike ``OptionalUser`` it keeps the Bearer scheme in the API's description: a script
    still signs in with its token, and a revoked one is still a 401."""
    return user


Visitor = Annotated[WebUser | None, Depends(visitor)]


def require(*roles: str) -> Callable[..., WebUser]:
    """A dependency: the current user if they hold any of ``roles`` (organisers pass), else 403.

    Use as ``user: Annotated[WebUser, Depends(require("annotator"))]`` or in ``dependencies=[...]``.
    """

    async def check(user: CurrentUser) -> WebUser:  # no I/O: the loaded user's roles (see current_user)
        if not accounts.has_role(user, *roles):
            raise HTTPException(403, f"this page needs one of the roles: {', '.join(roles)}")
        return user

    check.__name__ = f"require_{'_'.join(roles)}"
    return check


def is_api(request: Request) -> bool:
    return request.url.path.startswith(API_PREFIX)


def not_authenticated_response(request: Request, _exc: Exception) -> Response:
    if is_api(request):
        return JSONResponse(
            {"detail": "not authenticated"}, status_code=401, headers={"WWW-Authenticate": "Bearer"}
        )
    target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    return RedirectResponse(f"/login?next={quote(target, safe='')}", status_code=303)


def set_session_cookie(request: Request, response: Response, raw_token: str) -> None:
    """HttpOnly (no script reads it), SameSite=Lax (no cross-site POSTs), Secure behind HTTPS."""
    response.set_cookie(
        SESSION_COOKIE,
        raw_token,
        max_age=int(accounts.SESSION_LIFETIME.total_seconds()),
        path="/",
        httponly=True,
        samesite="lax",
        secure=request.app.state.secure_cookies,
    )


def clear_session_cookie(request: Request, response: Response) -> None:
    response.delete_cookie(
        SESSION_COOKIE, path="/", httponly=True, samesite="lax", secure=request.app.state.secure_cookies
    )


class SecurityHeaders:
    """Pure ASGI middleware adding ``SECURITY_HEADERS`` to every response (streaming ones too)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                present = {name.decode().lower() for name, _ in headers}
                for name, value in SECURITY_HEADERS.items():
                    if name not in present:  # a route may set its own, e.g. the report's or the docs' CSP
                        headers.append((name.encode(), value.encode()))
                message["headers"] = headers
            await send(message)

        await self.app(scope, receive, send_with_headers)
