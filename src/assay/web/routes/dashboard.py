"""``/dashboard``: the organiser's overview of everything running, and ``GET /api/v1/dashboard``.

One page answers "is anything stuck?": each leaderboard round's status, the job queue and worker health
(``assay.leaderboard.status``), each STAR campaign's progress, shortfalls, agreement so far and arbitration
rate (``assay.star.status``), the DyePack verification runs (``assay.dyepack.registry``), and this server
process's background work and sweeper (``assay.web.background``, ``assay.web.sweeper``). Every figure comes
from its owner's summary function; the details live on each pillar's own pages, linked from here.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Depends, Request
from fastapi.responses import HTMLResponse
from pydantic import BaseModel
from sqlalchemy.orm import Session

from assay.dyepack.registry import DyePackSummary, run_summary
from assay.leaderboard.status import QueueStatus, queue_status
from assay.star.status import CampaignSummary, campaign_summaries
from assay.store.enums import Role
from assay.store.models import utcnow
from assay.store.web_models import WebUser
from assay.web.background import BackgroundStatus
from assay.web.routes import Area, render
from assay.web.security import DbSession, require
from assay.web.sweeper import SWEEP_SECONDS, SweeperStatus

router = APIRouter()
AREAS = [Area("Dashboard", "/dashboard", (Role.ORGANISER,), "Rounds, queue, workers, campaigns, DyePack.", 5)]
Organiser = Annotated[WebUser, Depends(require(Role.ORGANISER))]


class Overview(BaseModel):
    generated_at: datetime
    leaderboard: QueueStatus
    campaigns: list[CampaignSummary]
    dyepack: DyePackSummary
    background: BackgroundStatus  # this server process's
    sweeper: SweeperStatus  # this server process's


def _sweeper(request: Request) -> SweeperStatus:
    """The running sweeper's status; an app served without its lifespan has none yet."""
    sweeper = request.app.state.sweeper
    return sweeper.status() if sweeper is not None else SweeperStatus(every_s=SWEEP_SECONDS, last=None)


def overview(request: Request, session: Session) -> Overview:
    """Everything the dashboard shows, from each owner's own summary function."""
    return Overview(
        generated_at=utcnow(),
        leaderboard=queue_status(session),
        campaigns=campaign_summaries(session),
        dyepack=run_summary(session),
        background=request.app.state.background.status(),
        sweeper=_sweeper(request),
    )


@router.get("/dashboard", response_class=HTMLResponse, include_in_schema=False)
def dashboard(request: Request, session: DbSession, user: Organiser) -> HTMLResponse:
    return render(request, "dashboard.html", o=overview(request, session))


@router.get(
    "/api/v1/dashboard",
    response_model=Overview,
    tags=["dashboard"],
    summary="Organisers: rounds, queue and worker health, campaign progress, DyePack runs, background work",
    responses={401: {"description": "not signed in"}, 403: {"description": "not an organiser"}},
)
def dashboard_api(request: Request, session: DbSession, user: Organiser) -> Overview:
    return overview(request, session)
