"""Accounts, logins, sessions, API tokens, invitations and organisers' account management (disable,
roles and team, unlock, password-reset links, links to STAR pool members): plain functions over a
SQLAlchemy ``Session``.

No FastAPI here, so the CLI (``assay user``) and the web share one set of rules and tests can call them
directly. The caller owns the transaction: these functions flush, never commit. ``authenticate`` records a
failed attempt before raising ``LoginFailed``, so the caller must commit even when it fails (the login route
catches the error and commits), or the lockout counter never grows.

Random tokens come from ``secrets``; only their sha256 is stored. Times are UTC and every function that
depends on the time takes ``now`` (default: ``clock()``, which tests may monkeypatch).
"""

from __future__ import annotations

import hashlib
import os
import secrets
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import cache
from typing import Any

from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError
from sqlalchemy import delete, select, update
from sqlalchemy.orm import Session

from assay.errors import UserError
from assay.names import check_username
from assay.store.enums import Role
from assay.store.models import Team, as_utc, utcnow
from assay.store.paging import Window, page_of
from assay.store.star_models import StarCampaign, StarParticipant
from assay.store.web_models import (
    ROLES,
    WebApiToken,
    WebDevice,
    WebInvitation,
    WebPasswordReset,
    WebSession,
    WebUser,
    WebUserParticipant,
)
from assay.web import throttle
from assay.web.audit import record

HASH_SLOTS = int(os.environ.get("ASSAY_HASH_SLOTS", "0")) or max(2, os.cpu_count() or 2)  # per process
_HASH_SLOTS = threading.BoundedSemaphore(HASH_SLOTS)
SESSION_LIFETIME = timedelta(hours=12)
RESET_LIFETIME = timedelta(hours=24)  # a password-reset link
SEEN_EVERY = timedelta(minutes=5)  # last_seen_at is refreshed at most this often: fewer writes
MIN_PASSWORD = 10
API_TOKEN_PREFIX = "assay_"
LOGIN_FAILED = "login failed: wrong username or password"


class LoginFailed(UserError):
    """A login was refused; the message is the same whatever the reason, so it reveals no usernames."""

    def __init__(self) -> None:
        super().__init__(LOGIN_FAILED)


class Throttled(UserError):
    """Too many failed sign-ins in one of the attempt's scopes: wait ``retry_after`` seconds (a 429)."""

    def __init__(self, retry_after: int) -> None:
        super().__init__(f"too many failed sign-ins: try again in {retry_after} s")
        self.retry_after = retry_after


class Busy(UserError):
    """Every password-hashing slot of this process is taken: try again in a second (a 429)."""

    retry_after = 1

    def __init__(self) -> None:
        super().__init__("the server is busy checking other sign-ins: try again in a second")


def clock() -> datetime:
    """The time every function uses when no ``now`` is given; tests monkeypatch it to skip ahead."""
    return utcnow()


def sha256(token: str) -> str:
    """What the database keeps of a session, API or invitation token."""
    return hashlib.sha256(token.encode()).hexdigest()


# ---- passwords ----------------------------------------------------------------------------------


def password_hasher() -> PasswordHasher:
    """argon2-cffi's defaults (argon2id); ``ASSAY_ARGON2_FAST=1`` picks tiny costs, for tests only."""
    return _fast_hasher() if os.environ.get("ASSAY_ARGON2_FAST") == "1" else _default_hasher()


@cache
def _default_hasher() -> PasswordHasher:
    return PasswordHasher()


@cache
def _fast_hasher() -> PasswordHasher:
    return PasswordHasher(time_cost=1, memory_cost=8, parallelism=1)


@cache
def _decoy_hash(hasher: PasswordHasher) -> str:
    return hasher.hash(secrets.token_urlsafe(16))


def hash_password(password: str) -> str:
    """An argon2id PHC string (``$argon2id$...``)."""
    return password_hasher().hash(password)


def _verify(password_hash: str, password: str) -> bool:
    try:
        return password_hasher().verify(password_hash, password)
    except (VerificationError, InvalidHashError):
        return False


def _check_password(password: str) -> None:
    if len(password) < MIN_PASSWORD:
        raise UserError(f"password too short: use at least {MIN_PASSWORD} characters")


# ---- users --------------------------------------------------------------------------------------


def _check_roles(roles: list[str] | tuple[str, ...]) -> list[str]:
    unknown = [r for r in roles if r not in ROLES]
    if unknown:
        raise UserError(f"unknown role '{unknown[0]}': choose from {', '.join(ROLES)}")
    if not roles:
        raise UserError(f"give the user at least one role: {', '.join(ROLES)}")
    return sorted(set(roles), key=ROLES.index)


def create_user(
    session: Session,
    username: str,
    password: str,
    roles: list[str] | tuple[str, ...],
    team: Team | None = None,
    display_name: str = "",
    *,
    actor: WebUser | None = None,
) -> WebUser:
    """A new account; a bad username, short password, unknown role or taken name is a ``UserError``.
    ``actor``: the organiser who made it (None: the shell, or the person accepting an invitation)."""
    username = check_username(username)
    _check_password(password)
    roles = _check_roles(roles)
    if get_user(session, username) is not None:
        raise UserError(f"username '{username}' is already taken")
    user = WebUser(
        username=username,
        display_name=display_name.strip()[:200],
        password_hash=hash_password(password),
        roles=roles,
        team=team,
        disabled=False,
    )
    session.add(user)
    session.flush()
    record(session, actor, "user.create", username, _roles_detail(roles, team))
    return user


def _roles_detail(roles: list[str], team: Team | None) -> str:
    return f"roles: {', '.join(roles)}" + (f"; team: {team.name}" if team else "")


def get_user(session: Session, username: str) -> WebUser | None:
    return session.scalar(select(WebUser).where(WebUser.username == username.strip()))


def list_users(session: Session, window: Window | None = None) -> tuple[list[WebUser], int]:
    """Accounts by username: a window of them (default: the first ``DEFAULT_LIMIT``) and how many in all."""
    return page_of(session, select(WebUser).order_by(WebUser.username), window or Window())


def list_teams(session: Session) -> list[Team]:
    """Every leaderboard team by name: the choices when an organiser links an account to a team."""
    return list(session.scalars(select(Team).order_by(Team.name)))


def find_team(session: Session, name: str) -> Team | None:
    """The leaderboard team called ``name``; blank is no team; an unknown name is a ``UserError``."""
    if not name.strip():
        return None
    team = session.scalar(select(Team).where(Team.name == name.strip()))
    if team is None:
        raise UserError(f"no team '{name.strip()}': add it with `assay leaderboard team add`")
    return team


def has_role(user: WebUser, *roles: str) -> bool:
    """True if the user holds any of ``roles``; an organiser holds them all."""
    return Role.ORGANISER in user.roles or any(role in user.roles for role in roles)


def authenticate(
    session: Session,
    username: str,
    password: str,
    *,
    client: str = "local",
    device: str | None = None,
    now: datetime | None = None,
) -> WebUser:
    """The user whose password this is, or ``LoginFailed`` (counted by ``throttle``), ``Throttled`` (wait
    first, nothing hashed) or ``Busy`` (every hashing slot taken).

    ``client`` is the address the attempt comes from, ``device`` the raw ``assay_device`` cookie if any. An
    unknown or disabled name costs one argon2 verification like a known one, and throttling is keyed by the
    name as typed, so neither the answer nor its timing tells which names exist.
    """
    now = now or clock()
    user = get_user(session, username)
    attempt = throttle.Attempt(client, username, _known_device(session, user, device))
    wait = throttle.retry_after(session, attempt, now)
    if wait is not None:
        raise Throttled(wait)
    usable = user is not None and not user.disabled
    with hashing_slot():
        matches = _verify(user.password_hash if usable else _decoy_hash(password_hasher()), password)  # type: ignore[union-attr]
    if not (usable and matches):
        throttle.record_failure(session, attempt, now)
        raise LoginFailed()
    assert user is not None
    throttle.record_success(session, attempt)
    if password_hasher().check_needs_rehash(user.password_hash):
        user.password_hash = hash_password(password)  # parameters were raised since this hash was made
    session.flush()
    return user


@contextmanager
def hashing_slot() -> Iterator[None]:
    """Hold one of the process's ``HASH_SLOTS`` for a password check, or raise ``Busy`` at once: a flood of
    sign-ins queues no argon2 work, so the server keeps answering everything else."""
    if not _HASH_SLOTS.acquire(blocking=False):
        raise Busy()
    try:
        yield
    finally:
        _HASH_SLOTS.release()


def remember_device(
    session: Session, user: WebUser, raw: str | None, now: datetime | None = None
) -> str | None:
    """After a sign-in: the raw token of a new device cookie for ``user``, or None if ``raw`` is already one
    of theirs (its last use is refreshed)."""
    now = now or clock()
    known = session.scalar(select(WebDevice).where(WebDevice.token_sha256 == sha256(raw))) if raw else None
    if known is not None and known.user_id == user.id:
        known.last_used_at = now
        return None
    fresh = secrets.token_urlsafe(32)
    session.add(WebDevice(user_id=user.id, token_sha256=sha256(fresh), created_at=now, last_used_at=now))
    session.flush()
    return fresh


def _known_device(session: Session, user: WebUser | None, raw: str | None) -> str | None:
    """The sha256 of ``raw`` if it is a device cookie of ``user``'s account, else None."""
    if user is None or not raw:
        return None
    found = session.scalar(select(WebDevice.user_id).where(WebDevice.token_sha256 == sha256(raw)))
    return sha256(raw) if found == user.id else None


def set_password(session: Session, user: WebUser, password: str) -> None:
    _check_password(password)
    user.password_hash = hash_password(password)
    session.flush()


# ---- browser sessions ---------------------------------------------------------------------------


def start_session(session: Session, user: WebUser, now: datetime | None = None) -> str:
    """A new login session; returns the raw token for the cookie (the database keeps its sha256)."""
    now = now or clock()
    raw = secrets.token_urlsafe(32)
    session.add(
        WebSession(
            token_sha256=sha256(raw),
            user_id=user.id,
            csrf_token=secrets.token_urlsafe(32),
            created_at=now,
            expires_at=now + SESSION_LIFETIME,
            last_seen_at=now,
        )
    )
    session.flush()
    return raw


def session_user(
    session: Session, raw_token: str | None, now: datetime | None = None
) -> tuple[WebUser, WebSession] | None:
    """The user and session behind a cookie; ``None`` if unknown, expired, or the user is disabled."""
    if not raw_token:
        return None
    now = now or clock()
    row = session.scalar(select(WebSession).where(WebSession.token_sha256 == sha256(raw_token)))
    if row is None:
        return None
    if as_utc(row.expires_at) <= now:
        session.delete(row)
        session.flush()
        return None
    user = session.get(WebUser, row.user_id)
    if user is None or user.disabled:
        return None
    if now - as_utc(row.last_seen_at) > SEEN_EVERY:
        row.last_seen_at = now
    return user, row


def end_session(session: Session, raw_token: str | None) -> None:
    """Log out: the session row goes, so the cookie is worthless even if someone copied it."""
    if raw_token:
        row = session.scalar(select(WebSession).where(WebSession.token_sha256 == sha256(raw_token)))
        if row is not None:
            session.delete(row)
            session.flush()


# ---- API tokens ---------------------------------------------------------------------------------


def create_api_token(session: Session, user: WebUser, name: str, now: datetime | None = None) -> str:
    """A new API token (``assay_...``) for scripts; shown once, the database keeps its sha256."""
    name = name.strip()
    if not 1 <= len(name) <= 100:
        raise UserError("token name must be 1-100 characters")
    if user.disabled:  # it would be refused at once; say so instead of handing out a dead token
        raise UserError(f"user '{user.username}' is disabled: enable the account first")
    raw = API_TOKEN_PREFIX + secrets.token_urlsafe(32)
    session.add(
        WebApiToken(
            user_id=user.id, name=name, token_sha256=sha256(raw), created_at=now or clock(), revoked=False
        )
    )
    session.flush()
    return raw


def token_user(session: Session, raw: str | None, now: datetime | None = None) -> WebUser | None:
    """The user behind a Bearer token; ``None`` if unknown, revoked or the user is disabled."""
    if not raw or not raw.startswith(API_TOKEN_PREFIX):
        return None
    token = session.scalar(select(WebApiToken).where(WebApiToken.token_sha256 == sha256(raw)))
    if token is None or token.revoked:
        return None
    user = session.get(WebUser, token.user_id)
    if user is None or user.disabled:
        return None
    now = now or clock()
    if token.last_used_at is None or now - as_utc(token.last_used_at) > SEEN_EVERY:
        token.last_used_at = now
    return user


def list_api_tokens(session: Session, user: WebUser) -> list[WebApiToken]:
    return list(
        session.scalars(select(WebApiToken).where(WebApiToken.user_id == user.id).order_by(WebApiToken.id))
    )


def revoke_api_token(session: Session, user: WebUser, token_id: int) -> None:
    """Revoke one of ``user``'s own tokens (organisers may revoke anyone's)."""
    token = session.get(WebApiToken, token_id)
    if token is None or (token.user_id != user.id and Role.ORGANISER not in user.roles):
        raise UserError(f"no API token {token_id} of yours")
    token.revoked = True
    session.flush()


# ---- single-use links: invitations and password resets ------------------------------------------


@dataclass(frozen=True)
class _LinkKind:
    """A kind of single-use link (``/invite/TOKEN``, ``/reset/TOKEN``): its table and what a person is told
    when a link of it cannot be used. ``owners``: (column, message) pairs checked in order after the expiry,
    each refusing the link once the account that column names is disabled."""

    table: type[WebInvitation] | type[WebPasswordReset]
    invalid: str
    used: str
    expired: str
    owners: tuple[tuple[str, str], ...]


INVITATION = _LinkKind(
    WebInvitation,
    invalid="this invitation link is not valid",
    used="this invitation has already been used",
    expired="this invitation has expired: ask the organiser for a new one",
    # whoever was disabled, their links die too
    owners=(("created_by", "this invitation is no longer valid: ask an organiser for a new one"),),
)
PASSWORD_RESET = _LinkKind(
    WebPasswordReset,
    invalid="this password-reset link is not valid",
    used="this password-reset link has already been used: ask an organiser for a new one",
    expired="this password-reset link has expired: ask an organiser for a new one",
    owners=(
        ("user_id", "this account is disabled: ask an organiser"),
        ("created_by", "this password-reset link is no longer valid: ask an organiser for a new one"),
    ),
)


def _issue_link(session: Session, kind: _LinkKind, **columns: object) -> str:
    """A new link's raw token (shown once); the database keeps its sha256 with ``columns``."""
    raw = secrets.token_urlsafe(32)
    session.add(kind.table(token_sha256=sha256(raw), **columns))
    return raw


def _open_link(session: Session, kind: _LinkKind, raw: str, now: datetime) -> Any:
    """The row behind a link if it is still usable; else a ``UserError`` saying why."""
    row = session.scalar(select(kind.table).where(kind.table.token_sha256 == sha256(raw)))
    if row is None:
        raise UserError(kind.invalid)
    if row.used_at is not None:
        raise UserError(kind.used)
    if as_utc(row.expires_at) <= now:
        raise UserError(kind.expired)
    for column, message in kind.owners:
        if session.get_one(WebUser, getattr(row, column)).disabled:
            raise UserError(message)
    return row


def _use_link(session: Session, kind: _LinkKind, row_id: int, now: datetime, **columns: object) -> None:
    """Mark the link used, with ``columns``: a conditional update, so two simultaneous uses cannot both
    win; the loser gets the ``used`` message."""
    claimed = session.execute(
        update(kind.table)
        .where(kind.table.id == row_id, kind.table.used_at.is_(None))
        .values(used_at=now, **columns)
    )
    if claimed.rowcount != 1:  # type: ignore[attr-defined]
        raise UserError(kind.used)


# ---- invitations and STAR participants ----------------------------------------------------------


def create_invitation(
    session: Session,
    creator: WebUser,
    roles: list[str] | tuple[str, ...],
    team: Team | None = None,
    participant: StarParticipant | None = None,
    valid_hours: float = 72,
    now: datetime | None = None,
) -> str:
    """A single-use invitation token; whoever opens ``/invite/TOKEN`` first picks a name and password."""
    roles = _check_roles(roles)
    if not 0 < valid_hours <= 24 * 90:
        raise UserError(f"invitation validity must be between 0 and 2160 hours (value: {valid_hours})")
    if participant is not None:
        _unlinked_or_of(session, participant, None)  # say so now, not when the invitee accepts
    now = now or clock()
    raw = _issue_link(
        session,
        INVITATION,
        roles=roles,
        team_id=team.id if team else None,
        participant_id=participant.id if participant else None,
        created_by=creator.id,
        created_at=now,
        expires_at=now + timedelta(hours=valid_hours),
    )
    session.flush()
    member = f"; pool member: {participant.external_id}" if participant else ""
    record(session, creator, "invitation.issue", "(new account)", _roles_detail(roles, team) + member)
    return raw


def open_invitation(session: Session, raw: str, now: datetime | None = None) -> WebInvitation:
    """The invitation behind a link, if it is still usable; else a ``UserError`` saying why."""
    return _open_link(session, INVITATION, raw, now or clock())


def accept_invitation(
    session: Session, raw: str, username: str, password: str, now: datetime | None = None
) -> WebUser:
    """Create the invited account; the invitation is marked used in the same transaction (single use)."""
    now = now or clock()
    invitation = open_invitation(session, raw, now)
    team = session.get(Team, invitation.team_id) if invitation.team_id else None
    user = create_user(session, username, password, invitation.roles, team=team)
    _use_link(session, INVITATION, invitation.id, now, used_by=user.id)
    if invitation.participant_id is not None:
        link_participant(session, user, session.get_one(StarParticipant, invitation.participant_id))
    issuer = session.get_one(WebUser, invitation.created_by)
    record(session, user, "invitation.accept", user.username, f"invited by {issuer.username}")
    session.flush()
    return user


def link_participant(
    session: Session, user: WebUser, participant: StarParticipant, *, actor: WebUser | None = None
) -> None:
    """Let ``user`` act as this STAR pool member; a member belongs to one user at most, and a user acts as
    one member per campaign (the task pages pick the member by campaign)."""
    if _unlinked_or_of(session, participant, user) is not None:
        return  # already this user's
    for other, campaign in linked_members(session, user):
        if other.campaign_id == participant.campaign_id:
            raise UserError(
                f"user '{user.username}' already acts as pool member '{other.external_id}' of campaign "
                f"'{campaign}': unlink that one first"
            )
    session.add(WebUserParticipant(user_id=user.id, participant_id=participant.id))
    session.flush()
    if actor is not None:  # an organiser's act; an accepted invitation is recorded as such
        record(session, actor, "user.link_member", user.username, _member_detail(session, participant))


def _member_detail(session: Session, participant: StarParticipant) -> str:
    campaign = session.get_one(StarCampaign, participant.campaign_id)
    return f"campaign: {campaign.name}; pool member: {participant.external_id}"


def _unlinked_or_of(
    session: Session, participant: StarParticipant, user: WebUser | None
) -> WebUserParticipant | None:
    """The member's link if it is ``user``'s, ``None`` if it has none; a ``UserError`` naming the owner if it
    belongs to someone else."""
    link = session.scalar(
        select(WebUserParticipant).where(WebUserParticipant.participant_id == participant.id)
    )
    if link is None or (user is not None and link.user_id == user.id):
        return link
    owner = session.get_one(WebUser, link.user_id)
    campaign = session.get_one(StarCampaign, participant.campaign_id)
    raise UserError(
        f"pool member '{participant.external_id}' of campaign '{campaign.name}' is already linked to "
        f"user '{owner.username}'"
    )


def unlink_participant(
    session: Session, user: WebUser, participant_id: int, *, actor: WebUser | None = None
) -> StarParticipant | None:
    """End ``user``'s link to this pool member (their finished work stays with the member); ``None`` if
    the user did not act as it."""
    link = session.scalar(
        select(WebUserParticipant).where(
            WebUserParticipant.user_id == user.id, WebUserParticipant.participant_id == participant_id
        )
    )
    if link is None:
        return None
    session.delete(link)
    session.flush()
    member = session.get_one(StarParticipant, participant_id)
    record(session, actor, "user.unlink_member", user.username, _member_detail(session, member))
    return member


def participants_of(session: Session, user: WebUser) -> list[StarParticipant]:
    """The STAR pool members this user acts as (one per campaign)."""
    query = (
        select(StarParticipant)
        .join(WebUserParticipant, WebUserParticipant.participant_id == StarParticipant.id)
        .where(WebUserParticipant.user_id == user.id)
    )
    return list(session.scalars(query))


def linked_members(session: Session, user: WebUser) -> list[tuple[StarParticipant, str]]:
    """The pool members this user acts as, each with its campaign's name, by campaign name: what an
    organiser needs to read, since a member's id in the pool file is unique only within its campaign."""
    return members_of(session, [user.id]).get(user.id, [])


def members_of(session: Session, user_ids: list[int]) -> dict[int, list[tuple[StarParticipant, str]]]:
    """``linked_members`` of many users in one query (a page of the user list), by user id."""
    query = (
        select(WebUserParticipant.user_id, StarParticipant, StarCampaign.name)
        .join(StarParticipant, WebUserParticipant.participant_id == StarParticipant.id)
        .join(StarCampaign, StarCampaign.id == StarParticipant.campaign_id)
        .where(WebUserParticipant.user_id.in_(user_ids))
        .order_by(StarCampaign.name)
    )
    found: dict[int, list[tuple[StarParticipant, str]]] = {}
    for user_id, member, name in session.execute(query):
        found.setdefault(user_id, []).append((member, name))
    return found


def campaign_names(session: Session) -> list[str]:
    """Every STAR campaign's name, for the organiser's pick lists."""
    return list(session.scalars(select(StarCampaign.name).order_by(StarCampaign.name)))


def find_pool_member(session: Session, campaign: str, member: str) -> StarParticipant | None:
    """The pool member an organiser names: a campaign by name, then the member by their id in the pool
    file or, if no id matches and exactly one member has it, by their name. Both blank: ``None``.

    Organisers know people by the pool file, not by database ids; each miss is a ``UserError`` saying which.
    """
    campaign, member = campaign.strip(), member.strip()
    if not campaign and not member:
        return None
    if not campaign:
        raise UserError(f"pick the STAR campaign of pool member '{member}'")
    if not member:
        raise UserError(f"name the pool member of campaign '{campaign}': their id in the pool file, or name")
    found = session.scalar(select(StarCampaign).where(StarCampaign.name == campaign))
    if found is None:
        raise UserError(f"no STAR campaign '{campaign}'")
    in_campaign = select(StarParticipant).where(StarParticipant.campaign_id == found.id)
    by_id = session.scalar(in_campaign.where(StarParticipant.external_id == member))
    if by_id is not None:
        return by_id
    named = list(session.scalars(in_campaign.where(StarParticipant.name == member).limit(2)))
    if len(named) > 1:
        raise UserError(f"campaign '{campaign}' has several pool members named '{member}': give the id")
    if not named:
        raise UserError(f"campaign '{campaign}' has no pool member '{member}' (give their id or name)")
    return named[0]


# ---- account management (organisers) ------------------------------------------------------------


def waiting(session: Session, users: list[WebUser], now: datetime | None = None) -> dict[int, datetime]:
    """Of ``users``, those whose sign-ins from unknown clients must wait after many failures, and until when,
    by user id (their known devices are never held back)."""
    until = throttle.names_waiting(session, [u.username for u in users], now or clock())
    return {u.id: until[u.username] for u in users if u.username in until}


def end_all_sessions(session: Session, user: WebUser) -> None:
    """Delete every browser session of ``user``: each of their cookies is refused from the next request."""
    session.execute(delete(WebSession).where(WebSession.user_id == user.id))
    session.flush()


def _revoke_tokens(session: Session, user: WebUser) -> None:
    session.execute(update(WebApiToken).where(WebApiToken.user_id == user.id).values(revoked=True))


def set_disabled(session: Session, actor: WebUser | None, user: WebUser, disabled: bool) -> None:
    """Disable ``user`` (or enable them again). Disabling ends their sessions and revokes their API tokens at
    once, so re-enabling never revives a credential from before. Nobody may disable themselves: the organiser
    who acts always stays able to undo it (``actor`` None: the shell, which can always undo it)."""
    if disabled and actor is not None and actor.id == user.id:
        raise UserError("you cannot disable your own account: ask another organiser")
    user.disabled = disabled
    if disabled:
        end_all_sessions(session, user)
        _revoke_tokens(session, user)
    record(session, actor, "user.disable" if disabled else "user.enable", user.username)
    session.flush()


def set_roles(
    session: Session, actor: WebUser, user: WebUser, roles: list[str] | tuple[str, ...], team: Team | None
) -> None:
    """Replace ``user``'s roles and team, checked as ``create_user`` checks them; they apply from the user's
    next request. An organiser cannot drop their own organiser role, so someone can always undo a mistake."""
    roles = _check_roles(roles)
    if actor.id == user.id and Role.ORGANISER not in roles:
        raise UserError("you cannot remove your own organiser role: ask another organiser")
    before = _roles_detail(list(user.roles), user.team)
    user.roles, user.team = roles, team
    record(session, actor, "user.roles", user.username, f"{before} -> {_roles_detail(roles, team)}")
    session.flush()


def unlock(session: Session, user: WebUser, *, actor: WebUser | None = None, quiet: bool = False) -> None:
    """Clear every failed-sign-in count about ``user`` (its name, each address's count for it, its devices'),
    so waits end now; ``quiet`` when it is part of another recorded change (a password reset)."""
    devices = session.scalars(select(WebDevice.token_sha256).where(WebDevice.user_id == user.id))
    throttle.forget_name(session, user.username, list(devices))
    if not quiet:
        record(session, actor, "user.unlock", user.username)
    session.flush()


def create_password_reset(
    session: Session, creator: WebUser, user: WebUser, now: datetime | None = None
) -> str:
    """A single-use token for ``/reset/TOKEN``, valid ``RESET_LIFETIME``; the database keeps its sha256.

    An older unused link of the same user is marked used, so only the newest one works.
    """
    if user.disabled:
        raise UserError(
            f"user '{user.username}' is disabled: enable the account before resetting its password"
        )
    now = now or clock()
    session.execute(
        update(WebPasswordReset)
        .where(WebPasswordReset.user_id == user.id, WebPasswordReset.used_at.is_(None))
        .values(used_at=now)
    )
    raw = _issue_link(
        session,
        PASSWORD_RESET,
        user_id=user.id,
        created_at=now,
        expires_at=now + RESET_LIFETIME,
        created_by=creator.id,
    )
    record(session, creator, "password_reset.issue", user.username)
    session.flush()
    return raw


def open_password_reset(session: Session, raw: str, now: datetime | None = None) -> WebPasswordReset:
    """The reset behind a link, if it is still usable; else a ``UserError`` saying why."""
    return _open_link(session, PASSWORD_RESET, raw, now or clock())


def use_password_reset(
    session: Session, raw: str, password: str, now: datetime | None = None, *, keep_tokens: bool = False
) -> WebUser:
    """Set a new password through a reset link: the link is marked used in the same transaction (a conditional
    update, so two requests cannot both use it), the user's sessions end, their API tokens are revoked unless
    they choose to keep them (``keep_tokens``), and every sign-in wait on the account is lifted."""
    now = now or clock()
    reset = open_password_reset(session, raw, now)
    _check_password(password)  # before using the link up: a too-short password leaves it usable
    _use_link(session, PASSWORD_RESET, reset.id, now)
    user = session.get_one(WebUser, reset.user_id)
    set_password(session, user, password)
    unlock(session, user, quiet=True)
    end_all_sessions(session, user)
    if not keep_tokens:
        _revoke_tokens(session, user)
    record(
        session,
        user,
        "password_reset.use",
        user.username,
        "API tokens kept" if keep_tokens else "API tokens revoked",
    )
    return user
