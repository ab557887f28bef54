"""The JSON API's account endpoints under ``/api/v1``: who am I, and is the service up.

Other pillars add their own ``/api/v1`` routers; each response is a pydantic model, so the OpenAPI document
at ``/api/v1/openapi.json`` describes it exactly.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from assay import __version__
from assay.web.ops import Readiness, readiness
from assay.web.security import CurrentUser

router = APIRouter(prefix="/api/v1", tags=["account"])


class Health(BaseModel):
    status: str
    version: str


class Me(BaseModel):
    username: str
    display_name: str
    roles: list[str]
    team: str | None


@router.get("/health", response_model=Health, summary="Is the service up (no sign-in needed)")
def health() -> Health:
    return Health(status="ok", version=__version__)


@router.get(
    "/ready",
    response_model=Readiness,
    summary="Can the service take traffic: database reachable and at head (503 if not; no sign-in needed)",
    responses={503: {"model": Readiness, "description": "database unreachable or migrations pending"}},
)
def ready(request: Request) -> JSONResponse:
    state = readiness(request.app.state.sessions.kw["bind"])
    return JSONResponse(state.model_dump(), status_code=200 if state.ready else 503)


@router.get("/me", response_model=Me, summary="The signed-in user: name, roles and team")
def me(user: CurrentUser) -> Me:
    return Me(
        username=user.username,
        display_name=user.display_name,
        roles=list(user.roles),
        team=user.team.name if user.team else None,
    )
