"""The sign-in form's own defences, and the public address every emailed link is built from.

- Login CSRF: a third-party page must not be able to sign a visitor into the attacker's account. ``GET
  /login`` sets a random pre-session token in the ``assay_login`` cookie (HttpOnly, SameSite=Strict) and in
  the form; ``POST /login`` must carry both, equal, and any ``Origin`` (else ``Referer``) it carries must be
  this site's own (its public URL's, or the address the request came to).
- Known devices: a successful sign-in leaves an ``assay_device`` cookie (a year, HttpOnly); failures from
  strangers never hold that browser back (``assay.web.throttle``).
- Links (invitations, password resets) are built from the configured public URL (``assay serve
  --public-url`` or ``ASSAY_PUBLIC_URL``), never from the request's ``Host`` header, which the client
  chooses; with none configured, issuing a link is refused.
"""

from __future__ import annotations

import hmac
import secrets
from urllib.parse import urlsplit

from fastapi import Request
from fastapi.responses import Response

from assay.errors import UserError

LOGIN_COOKIE = "assay_login"
LOGIN_FIELD = "login_token"
DEVICE_COOKIE = "assay_device"
DEVICE_LIFETIME_S = 365 * 24 * 3600
NO_PUBLIC_URL = (
    "this server has no public address, so it cannot build a link: start it with "
    "`assay serve --public-url https://...` (or set ASSAY_PUBLIC_URL)"
)


def public_url(text: str | None) -> str | None:
    """``text`` as a public base URL (``http(s)://host[:port][/prefix]``, no trailing slash), or a
    ``UserError`` naming what is wrong with it; None stays None."""
    if not text:
        return None
    parts = urlsplit(text.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment:
        raise UserError(f"public URL: must look like https://host[:port][/path] (value: {text[:80]!r})")
    return text.strip().rstrip("/")


def public_link(request: Request, route: str, **params: str) -> str:
    """The absolute URL of ``route`` on the configured public address (``NO_PUBLIC_URL`` if there is none)."""
    base = request.app.state.public_url
    if base is None:
        raise UserError(NO_PUBLIC_URL)
    return base + str(request.app.url_path_for(route, **params))


def _origin(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}".lower()


def own_origins(request: Request) -> set[str]:
    """This site's origins as browsers name them: the public URL's and the address the request came to (a
    cross-site form names the other site, whatever ``Host`` the victim's browser sends us)."""
    base = request.app.state.public_url
    return {_origin(str(request.base_url))} | ({_origin(base)} if base else set())


def login_form_token(request: Request) -> str:
    """The pre-session token for a sign-in form: the browser's current one, or a new one."""
    token = request.cookies.get(LOGIN_COOKIE, "")
    return token if len(token) == 43 else secrets.token_urlsafe(32)  # 43: secrets.token_urlsafe(32)


def set_login_cookie(request: Request, response: Response, token: str) -> None:
    response.set_cookie(
        LOGIN_COOKIE,
        token,
        path="/",
        httponly=True,
        samesite="strict",
        secure=request.app.state.secure_cookies,
    )
    return token


def login_post_problem(request: Request, sent: str) -> str | None:
    """Why this sign-in POST must be refused (another site's page, no form token), or None to go on."""
    claimed = request.headers.get("origin") or request.headers.get("referer")
    if claimed is not None and (claimed == "null" or _origin(claimed) not in own_origins(request)):
        return "sign-in refused: the form was posted from another site"
    cookie = request.cookies.get(LOGIN_COOKIE, "")
    if not cookie or not sent or not hmac.compare_digest(cookie.encode(), sent.encode()):
        return "sign-in refused: the form's token is missing or stale: reload the sign-in page and try again"
    return None


def set_device_cookie(request: Request, response: Response, raw: str) -> None:
    response.set_cookie(
        DEVICE_COOKIE,
        raw,
        max_age=DEVICE_LIFETIME_S,
        path="/",
        httponly=True,
        samesite="lax",
        secure=request.app.state.secure_cookies,
    )


def client_address(request: Request) -> str:
    """The client's address (uvicorn puts a trusted proxy's X-Forwarded-For here), or ``unknown``."""
    return request.client.host if request.client is not None else "unknown"
