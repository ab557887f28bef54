"""Organiser-only user administration, as pages under ``/admin`` and JSON under ``/api/v1/admin``.

Organisers list users, create one directly or by invitation link, and manage an existing account: disable
or enable it, change its roles and team, lift a lockout early, issue a single-use password-reset link, and
link it to (or unlink it from) STAR pool members, picked by campaign name and the member's id in the pool
file. The rules live in ``assay.web.accounts`` (shared with the CLI); these routes only parse and render.

A page form that fails comes back with its one-line error (400) and nothing half-done (the transaction is
rolled back); the API turns the same ``UserError`` into a 400 JSON body, and an unknown user is a 404.
Nobody can lock the platform out: an organiser cannot disable themself or drop their own organiser role.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Form, HTTPException, Query, Request
from fastapi import Path as PathParam
from fastapi.responses import HTMLResponse, Response
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictBool
from sqlalchemy.orm import Session

from assay.errors import UserError
from assay.store.enums import Role
from assay.store.models import as_utc
from assay.store.paging import Window
from assay.store.web_models import ROLES, WebUser
from assay.web import accounts, audit
from assay.web.paging import Page, Paging
from assay.web.params import path_id, plain_text
from assay.web.routes import Area, render
from assay.web.security import DbSession, require
from assay.web.signin import public_link

AREAS = [Area("Users", "/admin/users", (Role.ORGANISER,), "Create and manage accounts.", order=800)]
Organiser = Annotated[WebUser, Depends(require(Role.ORGANISER))]
ParticipantId = Annotated[int, path_id("A pool member's database id.")]
pages = APIRouter(prefix="/admin", include_in_schema=False)
api = APIRouter(prefix="/api/v1/admin", tags=["admin"])


# ---- pages: the user list, creating users and invitations ----------------------------------------


def _users_page(
    request: Request, session: Session, status_code: int = 200, window: Window | None = None, **extra: object
) -> Response:
    window = window or Window()
    users, total = accounts.list_users(session, window)
    return render(
        request,
        "admin_users.html",
        status_code=status_code,
        users=users,
        total=total,
        window=window,
        waiting=accounts.waiting(session, users),
        teams=accounts.list_teams(session),
        campaigns=accounts.campaign_names(session),
        roles=ROLES,
        **extra,
    )


@pages.get("/users", response_class=HTMLResponse)
def users(request: Request, session: DbSession, user: Organiser, window: Paging) -> Response:
    return _users_page(request, session, window=window)


@pages.post("/users", response_class=HTMLResponse)
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
            session, username, password, roles, accounts.find_team(session, team), display_name, actor=user
        )
    except UserError as err:
        session.rollback()
        return _users_page(request, session, 400, error=err)
    return _users_page(request, session, 201, notice=f"Created user '{created.username}'.")


@pages.post("/invitations", response_class=HTMLResponse)
def create_invitation(
    request: Request,
    session: DbSession,
    user: Organiser,
    roles: Annotated[list[str], Form()] = [],  # noqa: B006
    team: Annotated[str, Form()] = "",
    campaign: Annotated[str, Form(max_length=200)] = "",
    member: Annotated[str, Form(max_length=200)] = "",
    valid_hours: Annotated[float, Form()] = 72,
) -> Response:
    """The link is shown once, on this response: send it to the invitee over a private channel.

    ``campaign`` and ``member`` (the member's id in the pool file, or their name) pick the STAR pool member
    the new account will act as; both blank: none."""
    try:
        raw = accounts.create_invitation(
            session,
            user,
            roles,
            accounts.find_team(session, team),
            accounts.find_pool_member(session, campaign, member),
            valid_hours,
        )
        link = public_link(request, "invite_page", token=raw)
    except UserError as err:
        session.rollback()
        return _users_page(request, session, 400, error=err)
    return _users_page(request, session, 201, invitation_link=link, invitation_hours=valid_hours)


# ---- pages: one account --------------------------------------------------------------------------


def _target(session: Session, username: str) -> WebUser:
    """The account an organiser acts on; 404 if there is none by that name."""
    found = accounts.get_user(session, username)
    if found is None:
        raise HTTPException(404, f"no user '{username}'")
    return found


def _user_page(
    request: Request, session: Session, target: WebUser, status_code: int = 200, **extra: object
) -> Response:
    return render(
        request,
        "admin_user.html",
        status_code=status_code,
        target=target,
        waiting_until=accounts.waiting(session, [target]).get(target.id),
        members=accounts.linked_members(session, target),
        events=audit.recent(session, 50, target=target.username),
        actor_name=audit.actor_name,
        teams=accounts.list_teams(session),
        campaigns=accounts.campaign_names(session),
        roles=ROLES,
        **extra,
    )


@pages.get("/audit", response_class=HTMLResponse)
def audit_page(request: Request, session: DbSession, user: Organiser, window: Paging) -> Response:
    """Changes to accounts and access, newest first, a page at a time: every event can be read, where the
    page once stopped at the latest 500."""
    events, total = audit.page(session, window)
    return render(
        request,
        "admin_audit.html",
        events=events,
        total=total,
        window=window,
        actions=audit.ACTIONS,
        actor_name=audit.actor_name,
    )


def _act(
    request: Request, session: Session, target: WebUser, change: Callable[[], object], notice: str
) -> Response:
    """Apply one change to ``target`` and show its page: the notice on success; on a ``UserError`` its one
    line (400) and nothing of the change, since the transaction is rolled back."""
    try:
        change()
    except UserError as err:
        session.rollback()
        return _user_page(request, session, target, 400, error=err)
    return _user_page(request, session, target, notice=notice)


@pages.get("/users/{username}", response_class=HTMLResponse)
def user_page(request: Request, session: DbSession, user: Organiser, username: str) -> Response:
    return _user_page(request, session, _target(session, username))


@pages.post("/users/{username}/roles", response_class=HTMLResponse)
def change_roles(
    request: Request,
    session: DbSession,
    user: Organiser,
    username: str,
    roles: Annotated[list[str], Form()] = [],  # noqa: B006
    team: Annotated[str, Form(max_length=200)] = "",
) -> Response:
    target = _target(session, username)

    def change() -> None:
        accounts.set_roles(session, user, target, roles, accounts.find_team(session, team))

    return _act(request, session, target, change, f"Saved the roles and team of '{target.username}'.")


@pages.post("/users/{username}/disable", response_class=HTMLResponse)
def disable(request: Request, session: DbSession, user: Organiser, username: str) -> Response:
    target = _target(session, username)
    notice = f"Disabled '{target.username}': signed out everywhere, API tokens revoked."
    return _act(request, session, target, lambda: accounts.set_disabled(session, user, target, True), notice)


@pages.post("/users/{username}/enable", response_class=HTMLResponse)
def enable(request: Request, session: DbSession, user: Organiser, username: str) -> Response:
    target = _target(session, username)
    notice = f"Enabled '{target.username}': they can sign in again."
    return _act(request, session, target, lambda: accounts.set_disabled(session, user, target, False), notice)


@pages.post("/users/{username}/unlock", response_class=HTMLResponse)
def unlock(request: Request, session: DbSession, user: Organiser, username: str) -> Response:
    target = _target(session, username)
    notice = f"Lifted the sign-in waits on '{target.username}'."
    return _act(request, session, target, lambda: accounts.unlock(session, target, actor=user), notice)


@pages.post("/users/{username}/password-reset", response_class=HTMLResponse)
def password_reset(request: Request, session: DbSession, user: Organiser, username: str) -> Response:
    """The link is shown once, on this response; an older unused link of this user stops working."""
    target = _target(session, username)
    try:
        raw = accounts.create_password_reset(session, user, target)
        link = public_link(request, "reset_page", token=raw)
    except UserError as err:
        session.rollback()
        return _user_page(request, session, target, 400, error=err)
    hours = accounts.RESET_LIFETIME.total_seconds() / 3600
    return _user_page(request, session, target, 201, reset_link=link, reset_hours=hours)


@pages.post("/users/{username}/participants", response_class=HTMLResponse)
def link_member(
    request: Request,
    session: DbSession,
    user: Organiser,
    username: str,
    campaign: Annotated[str, Form(max_length=200)] = "",
    member: Annotated[str, Form(max_length=200)] = "",
) -> Response:
    target = _target(session, username)

    def change() -> None:
        found = accounts.find_pool_member(session, campaign, member)
        if found is None:
            raise UserError("pick a campaign and name the pool member")
        accounts.link_participant(session, target, found, actor=user)

    notice = f"'{target.username}' now acts as pool member '{member.strip()}' of '{campaign.strip()}'."
    return _act(request, session, target, change, notice)


@pages.post("/users/{username}/participants/{participant_id}/unlink", response_class=HTMLResponse)
def unlink_member(
    request: Request, session: DbSession, user: Organiser, username: str, participant_id: ParticipantId
) -> Response:
    target = _target(session, username)

    def change() -> None:
        if accounts.unlink_participant(session, target, participant_id, actor=user) is None:
            raise UserError(f"'{target.username}' does not act as that pool member")

    notice = f"Unlinked the pool member from '{target.username}'."
    return _act(request, session, target, change, notice)


# ---- JSON API ------------------------------------------------------------------------------------


Name = Annotated[str, Field(max_length=200), AfterValidator(plain_text)]
Username = Annotated[str, PathParam(min_length=1, max_length=200, description="The account's username.")]
REFUSED = {400: {"description": "Refused: one line says why (bad value, or it would lock you out)"}}
NO_USER = {404: {"description": "No such user"}}
FORBIDDEN = {403: {"description": "Not an organiser"}}


class PoolMemberOut(BaseModel):
    participant_id: int = Field(description="the database id; unlink with it")
    campaign: str
    member: str = Field(description="the member's id in the campaign's pool file")
    name: str


class UserOut(BaseModel):
    username: str
    display_name: str
    roles: list[str]
    team: str | None
    disabled: bool
    locked_until: datetime | None = Field(
        description="set while sign-ins from clients this account has not used must wait after many failures"
    )
    created_at: datetime
    pool_members: list[PoolMemberOut] = Field(description="the STAR pool members this account acts as")


class UserChange(BaseModel):
    """Only the fields given change; ``team`` null or "" means no team."""

    model_config = ConfigDict(extra="forbid")
    roles: list[Role] | None = Field(None, min_length=1)
    team: Name | None = None
    disabled: StrictBool | None = Field(None, description="true or false; 0, 1 and strings are refused")


class PoolMemberIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    campaign: Name = Field(description="the campaign's name")
    member: Name = Field(description="the member's id in the pool file, or their name if only one has it")


class InvitationIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    roles: list[Role] = Field(min_length=1)
    team: Name = ""
    campaign: Name = Field("", description="with member: the STAR pool member the new account acts as")
    member: Name = ""
    valid_hours: float = Field(72, gt=0, le=24 * 90)


class AuditEventOut(BaseModel):
    at: datetime
    actor: str = Field(description=f"the organiser's (or user's) username; '{audit.SHELL}' for `assay user`")
    action: str = Field(description="one of: " + ", ".join(audit.ACTIONS))
    target: str = Field(description="the account concerned, usually")
    detail: str


class LinkOut(BaseModel):
    url: str = Field(description="shown once: send it privately; it works once")
    expires_at: datetime


NEW_LINK: dict[str, Any] = {"response_model": LinkOut, "status_code": 201}  # what the link routes answer


def _link_out(request: Request, page: str, raw: str, expires_at: datetime) -> LinkOut:
    """The single-use link to ``page`` (``invite_page``, ``reset_page``) for the raw token."""
    return LinkOut(url=public_link(request, page, token=raw), expires_at=as_utc(expires_at))


def _users_out(session: Session, targets: list[WebUser]) -> list[UserOut]:
    """The API records of ``targets``, in three queries whatever their number (members, waits, the users)."""
    members = accounts.members_of(session, [t.id for t in targets])
    waiting = accounts.waiting(session, targets)
    return [
        UserOut(
            username=t.username,
            display_name=t.display_name,
            roles=list(t.roles),
            team=t.team.name if t.team else None,
            disabled=t.disabled,
            locked_until=waiting.get(t.id),
            created_at=as_utc(t.created_at),
            pool_members=[
                PoolMemberOut(participant_id=p.id, campaign=campaign, member=p.external_id, name=p.name)
                for p, campaign in members.get(t.id, [])
            ],
        )
        for t in targets
    ]


def _user_out(session: Session, target: WebUser) -> UserOut:
    return _users_out(session, [target])[0]


@api.get(
    "/audit",
    response_model=Page[AuditEventOut],
    summary="The newest changes to accounts and access, newest first",
    responses=FORBIDDEN,
)
def api_audit(
    session: DbSession,
    user: Organiser,
    window: Paging,
    target: Annotated[str | None, Query(min_length=1, max_length=200)] = None,
) -> Page[AuditEventOut]:
    events, total = audit.page(session, window, target)
    items = [
        AuditEventOut(
            at=as_utc(e.at), actor=audit.actor_name(e), action=e.action, target=e.target, detail=e.detail
        )
        for e in events
    ]
    return Page.of(items, total, window)


@api.get(
    "/users",
    response_model=Page[UserOut],
    summary="Accounts by username, a page at a time",
    responses=FORBIDDEN,
)
def api_users(session: DbSession, user: Organiser, window: Paging) -> Page[UserOut]:
    users, total = accounts.list_users(session, window)
    return Page.of(_users_out(session, users), total, window)


@api.get(
    "/users/{username}", response_model=UserOut, summary="One account", responses={**FORBIDDEN, **NO_USER}
)
def api_user(session: DbSession, user: Organiser, username: Username) -> UserOut:
    return _user_out(session, _target(session, username))


@api.patch(
    "/users/{username}",
    response_model=UserOut,
    summary="Change an account's roles and team, or disable or enable it",
    description="Disabling ends the account's sessions and revokes its API tokens at once. You cannot "
    "disable yourself or drop your own organiser role.",
    responses={**FORBIDDEN, **NO_USER, **REFUSED},
)
def api_change_user(session: DbSession, user: Organiser, username: Username, body: UserChange) -> UserOut:
    target = _target(session, username)
    team_given = "team" in body.model_fields_set
    if body.roles is not None or team_given:
        team = accounts.find_team(session, body.team or "") if team_given else target.team
        accounts.set_roles(session, user, target, body.roles or target.roles, team)
    if body.disabled is not None:
        accounts.set_disabled(session, user, target, body.disabled)
    return _user_out(session, target)


@api.post(
    "/users/{username}/unlock",
    response_model=UserOut,
    summary="Lift a lockout from failed sign-ins",
    responses={**FORBIDDEN, **NO_USER},
)
def api_unlock(session: DbSession, user: Organiser, username: Username) -> UserOut:
    target = _target(session, username)
    accounts.unlock(session, target, actor=user)
    return _user_out(session, target)


@api.post(
    "/users/{username}/password-reset",
    **NEW_LINK,
    summary="A single-use password-reset link, valid 24 hours (an older unused one stops working)",
    responses={**FORBIDDEN, **NO_USER, **REFUSED},
)
def api_password_reset(request: Request, session: DbSession, user: Organiser, username: Username) -> LinkOut:
    target = _target(session, username)
    raw = accounts.create_password_reset(session, user, target)
    return _link_out(request, "reset_page", raw, accounts.open_password_reset(session, raw).expires_at)


@api.post(
    "/users/{username}/pool-members",
    response_model=UserOut,
    summary="Let the account act as a STAR pool member (campaign name and the member's id or name)",
    responses={**FORBIDDEN, **NO_USER, **REFUSED},
)
def api_link(session: DbSession, user: Organiser, username: Username, body: PoolMemberIn) -> UserOut:
    target = _target(session, username)
    found = accounts.find_pool_member(session, body.campaign, body.member)
    if found is None:
        raise UserError("give the campaign and the pool member")
    accounts.link_participant(session, target, found, actor=user)
    return _user_out(session, target)


@api.delete(
    "/users/{username}/pool-members/{participant_id}",
    response_model=UserOut,
    summary="End the account's link to a STAR pool member",
    responses={**FORBIDDEN, 404: {"description": "No such user, or it does not act as that member"}},
)
def api_unlink(
    session: DbSession,
    user: Organiser,
    username: Username,
    participant_id: ParticipantId,
) -> UserOut:
    target = _target(session, username)
    if accounts.unlink_participant(session, target, participant_id, actor=user) is None:
        raise HTTPException(404, f"'{target.username}' does not act as pool member {participant_id}")
    return _user_out(session, target)


@api.post(
    "/invitations",
    **NEW_LINK,
    summary="A single-use invitation link with roles, and optionally a team and a STAR pool member",
    responses={**FORBIDDEN, **REFUSED},
)
def api_invitation(request: Request, session: DbSession, user: Organiser, body: InvitationIn) -> LinkOut:
    raw = accounts.create_invitation(
        session,
        user,
        body.roles,
        accounts.find_team(session, body.team),
        accounts.find_pool_member(session, body.campaign, body.member),
        body.valid_hours,
    )
    return _link_out(request, "invite_page", raw, accounts.open_invitation(session, raw).expires_at)


router = APIRouter()
router.include_router(pages)
router.include_router(api)
