"""Organiser-only user administration: list users, create one directly, or create an invitation link."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Form, Request
from fastapi.responses import HTMLResponse, Response
from sqlalchemy import select
from sqlalchemy.orm import Session

from assay.errors import UserError
from assay.store.models import Team
from assay.store.star_models import StarParticipant
from assay.store.web_models import ROLES, WebUser
from assay.web import accounts
from assay.web.routes import Area, render
from assay.web.security import DbSession, require

router = APIRouter(prefix="/admin", include_in_schema=False)
AREAS = [Area("Users", "/admin/users", ("organiser",), "Create accounts and invitations.", order=800)]
Organiser = Annotated[WebUser, Depends(require("organiser"))]


def _find_participant(session: Session, participant_id: str) -> StarParticipant | None:
    if not participant_id.strip():
        return None
    if (
        not participant_id.strip().isdigit()
        or (found := session.get(StarParticipant, int(participant_id))) is None
    ):
        raise UserError(f"no STAR participant with id {participant_id.strip()!r}")
    return found


def _users_page(request: Request, session: Session, status_code: int = 200, **extra: object) -> Response:
    return render(
        request,
        "admin_users.html",
        status_code=status_code,
        users=accounts.list_users(session),
        teams=list(session.scalars(select(Team).order_by(Team.name))),
        roles=ROLES,
        **extra,
    )


@router.get("/users", response_class=HTMLResponse)
def users(request: Request, session: DbSession, user: Organiser) -> Response:
    return _users_page(request, session)


@router.post("/users", response_class=HTMLResponse)
def create_user(
    request: Request,
    session: DbSession,
    user: Organiser,
    username: Annotated[str, Form(max_length=200)],
    password: Annotated[str, Form(max_length=1000)],
    roles: Annotated[list[str], Form()] = [],  # noqa: B006 (FastAPI copies form defaults)
    team: Annotated[str, Form()] = "",
    display_name: Annotated[str, Form(max_length=200)] = "",
) -> Response:
    try:
        created = accounts.create_user(
            session, username, password, roles, accounts.find_team(session, team), display_name
        )
    except UserError as err:
        session.rollback()
        return _users_page(request, session, 400, error=err)
    return _users_page(request, session, 201, notice=f"Created user '{created.username}'.")


@router.post("/invitations", response_class=HTMLResponse)
def create_invitation(
    request: Request,
    session: DbSession,
    user: Organiser,
    roles: Annotated[list[str], Form()] = [],  # noqa: B006
    team: Annotated[str, Form()] = "",
    participant: Annotated[str, Form()] = "",
    valid_hours: Annotated[float, Form()] = 72,
) -> Response:
    """The link is shown once, on this response: send it to the invitee over a private channel."""
    try:
        raw = accounts.create_invitation(
            session,
            user,
            roles,
            accounts.find_team(session, team),
            _find_participant(session, participant),
            valid_hours,
        )
    except UserError as err:
        session.rollback()
        return _users_page(request, session, 400, error=err)
    link = str(request.url_for("invite_page", token=raw))
    return _users_page(request, session, 201, invitation_link=link, invitation_hours=valid_hours)
