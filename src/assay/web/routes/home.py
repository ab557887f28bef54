"""``GET /``: the landing page: a sign-in link for visitors, the areas their roles open for users."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse

from assay.web.routes import render
from assay.web.security import OptionalUser

router = APIRouter(include_in_schema=False)


@router.get("/", response_class=HTMLResponse)
def home(request: Request, user: OptionalUser) -> HTMLResponse:
    return render(request, "home.html")
