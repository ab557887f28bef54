"""The routers and what page routes share: the list of router modules, the nav areas and ``render``.

To add a router: write ``assay/web/routes/NAME.py`` with ``router = APIRouter(...)`` (pages:
``include_in_schema=False``; JSON: ``prefix="/api/v1"``), optionally an ``AREAS`` list of ``Area`` for the nav
and the landing page, and add ``"NAME"`` to ``ROUTER_MODULES``. ``create_app`` includes them in that order.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse

from assay.store.web_models import WebUser
from assay.web.accounts import has_role

ROUTER_MODULES = ("home", "auth", "admin", "api", "leaderboard", "star", "dyepack", "dashboard")


@dataclass(frozen=True)
class Area:
    """A part of the site shown in the nav to users holding any of ``roles`` (empty: anyone signed in), and
    to visitors who are not signed in when ``public`` (the page then shows them what is public)."""

    label: str
    href: str
    roles: tuple[str, ...] = ()
    description: str = ""
    order: int = 100  # nav position: lower first
    public: bool = False


def load_routers() -> list[tuple[APIRouter, list[Area]]]:
    """Each module's ``router`` and ``AREAS``, in ``ROUTER_MODULES`` order."""
    found = []
    for name in ROUTER_MODULES:
        module = importlib.import_module(f"{__name__}.{name}")
        found.append((module.router, list(getattr(module, "AREAS", []))))
    return found


def areas_for(user: WebUser | None, areas: list[Area]) -> list[Area]:
    """The areas this user may open, in nav order; an anonymous visitor's: the public ones."""
    if user is None:
        allowed = [a for a in areas if a.public]
    else:
        allowed = [a for a in areas if not a.roles or has_role(user, *a.roles)]
    return sorted(allowed, key=lambda a: (a.order, a.label))


def page_context(request: Request) -> dict[str, Any]:
    """What every template sees: ``user``, ``csrf_token`` (for forms) and the nav ``areas``."""
    user = getattr(request.state, "user", None)
    return {
        "user": user,
        "csrf_token": getattr(request.state, "csrf_token", ""),
        "areas": areas_for(user, request.app.state.areas),
    }


def render(
    request: Request,
    template: str,
    status_code: int = 200,
    headers: Mapping[str, str] | None = None,
    **context: Any,
) -> HTMLResponse:
    """Render ``templates/TEMPLATE`` with ``context`` plus ``page_context``."""
    return request.app.state.templates.TemplateResponse(
        request, template, context, status_code=status_code, headers=headers
    )


def redirect(url: str) -> RedirectResponse:
    """303 See Other: after a POST the browser GETs the next page, so reload does not resubmit."""
    return RedirectResponse(url, status_code=303)


def safe_next(target: str | None) -> str:
    """A local path to go to after login; anything else (another site, ``//host``) becomes ``/``."""
    if not target or not target.startswith("/") or target.startswith(("//", "/\\")):
        return "/"
    return target
