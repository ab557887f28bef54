"""``/dashboard``: the organiser's overview of everything running, and ``GET /api/v1/dashboard``.

One page answers "is anything stuck?": each leaderboard round's status, the job queue and worker health
(``assay.leaderboard.status``), each STAR campaign's progress, shortfalls, agreement so far and arbitration
rate (``assay.star.progress``, without bootstrap so the page stays fast), and the DyePack verification runs.
The details live on each pillar's own pages, linked from here.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Depends, Request
from fastapi.responses import HTMLResponse
from pydantic import BaseModel
from sqlalchemy import select
from sqlalchemy.orm import Session

from assay.dyepack.registry import DyePackSummary, run_summary
from assay.leaderboard.status import QueueStatus, queue_status
from assay.star.live import latest_report
from assay.star.progress import campaign_progress
from assay.store.models import utcnow
from assay.store.star_models import StarCampaign
from assay.store.web_models import WebUser
from assay.web.routes import Area, render
from assay.web.security import DbSession, require

router = APIRouter()
AREAS = [Area("Dashboard", "/dashboard", ("organiser",), "Rounds, queue, workers, campaigns, DyePack.", 5)]
Organiser = Annotated[WebUser, Depends(require("organiser"))]


class CampaignSummary(BaseModel):
    """One STAR campaign at a glance; ``alpha`` is ordinal Krippendorff alpha over complete first rounds."""

    name: str
    tasks: dict[str, dict[str, int]]
    dialogues: int
    machine_dialogues: int
    complete_first_rounds: int
    shortfall_tasks: int
    alpha: float | None
    alpha_units: int
    arbitration_rate: float | None
    report_at: datetime | None


class Overview(BaseModel):
    generated_at: datetime
    leaderboard: QueueStatus
    campaigns: list[CampaignSummary]
    dyepack: DyePackSummary


def _campaign(session: Session, campaign: StarCampaign) -> CampaignSummary:
    progress = campaign_progress(session, campaign, n_boot=0)
    report = latest_report(session, campaign)
    return CampaignSummary(
        name=campaign.name,
        tasks=progress.tasks,
        dialogues=progress.dialogues,
        machine_dialogues=progress.machine_dialogues,
        complete_first_rounds=progress.complete_first_rounds,
        shortfall_tasks=sum(s.tasks for s in progress.shortfalls),
        alpha=progress.agreement.alpha,
        alpha_units=progress.agreement.n_units,
        arbitration_rate=progress.arbitration.rate,
        report_at=report.created_at if report else None,
    )


def overview(session: Session) -> Overview:
    """Everything the dashboard shows, from each pillar's own summary function."""
    campaigns = session.scalars(select(StarCampaign).order_by(StarCampaign.name))
    return Overview(
        generated_at=utcnow(),
        leaderboard=queue_status(session),
        campaigns=[_campaign(session, c) for c in campaigns],
        dyepack=run_summary(session),
    )


@router.get("/dashboard", response_class=HTMLResponse, include_in_schema=False)
def dashboard(request: Request, session: DbSession, user: Organiser) -> HTMLResponse:
    return render(request, "dashboard.html", o=overview(session))


@router.get(
    "/api/v1/dashboard",
    response_model=Overview,
    tags=["dashboard"],
    summary="Organisers: rounds, queue and worker health, campaign progress, DyePack runs",
    responses={401: {"description": "not signed in"}, 403: {"description": "not an organiser"}},
)
def dashboard_api(session: DbSession, user: Organiser) -> Overview:
    return overview(session)
