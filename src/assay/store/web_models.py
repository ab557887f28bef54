"""The web application's tables (accounts, sessions, API tokens, invitations, password resets), all prefixed
``web_``.

Secrets never reach the database in the clear: sessions, API tokens, invitations and password resets store
only the sha256 of the random token a browser or script holds, so a leaked database cannot be replayed as a
login. Passwords are argon2 hashes. Roles are a JSON list (a subset of ``ROLES``) because a person often
holds several.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import JSON, Boolean, ForeignKey, Integer, String, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column, relationship

from assay.store.enums import Role
from assay.store.models import Base, Team, UtcDateTime, utcnow

ROLES = tuple(Role)


class WebUser(Base):
    __tablename__ = "web_users"

    id: Mapped[int] = mapped_column(primary_key=True)
    username: Mapped[str] = mapped_column(String(64), unique=True)  # 3-64 chars of [a-z0-9_.-]
    display_name: Mapped[str] = mapped_column(String(200), default="")
    password_hash: Mapped[str] = mapped_column(String(255))  # argon2id, PHC string
    roles: Mapped[list[str]] = mapped_column(JSON, default=list)  # subset of ROLES
    team_id: Mapped[int | None] = mapped_column(ForeignKey("teams.id"))  # for team members
    disabled: Mapped[bool] = mapped_column(Boolean, default=False)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime(), default=utcnow)

    team: Mapped[Team | None] = relationship(lazy="joined")


class WebUserParticipant(Base):
    """A web user acts as this STAR pool member (one campaign each); a participant has at most one user."""

    __tablename__ = "web_user_participants"

    id: Mapped[int] = mapped_column(primary_key=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("web_users.id"), index=True)
    participant_id: Mapped[int] = mapped_column(ForeignKey("star_participants.id"), unique=True)


class WebSession(Base):
    __tablename__ = "web_sessions"

    id: Mapped[int] = mapped_column(primary_key=True)
    token_sha256: Mapped[str] = mapped_column(String(64), unique=True)  # the cookie holds the token
    user_id: Mapped[int] = mapped_column(ForeignKey("web_users.id"), index=True)
    csrf_token: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(UtcDateTime(), default=utcnow)
    expires_at: Mapped[datetime] = mapped_column(UtcDateTime())
    last_seen_at: Mapped[datetime] = mapped_column(UtcDateTime(), default=utcnow)


class WebApiToken(Base):
    __tablename__ = "web_api_tokens"

    id: Mapped[int] = mapped_column(primary_key=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("web_users.id"), index=True)
    name: Mapped[str] = mapped_column(String(100))
    token_sha256: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime(), default=utcnow)
    last_used_at: Mapped[datetime | None] = mapped_column(UtcDateTime())
    revoked: Mapped[bool] = mapped_column(Boolean, default=False)


class WebInvitation(Base):
    """A single-use link that creates an account with these roles (and team or STAR participant)."""

    __tablename__ = "web_invitations"

    id: Mapped[int] = mapped_column(primary_key=True)
    token_sha256: Mapped[str] = mapped_column(String(64), unique=True)
    roles: Mapped[list[str]] = mapped_column(JSON, default=list)
    team_id: Mapped[int | None] = mapped_column(ForeignKey("teams.id"))
    participant_id: Mapped[int | None] = mapped_column(ForeignKey("star_participants.id"))
    created_by: Mapped[int] = mapped_column(ForeignKey("web_users.id"))
    created_at: Mapped[datetime] = mapped_column(UtcDateTime(), default=utcnow)
    expires_at: Mapped[datetime] = mapped_column(UtcDateTime())
    used_at: Mapped[datetime | None] = mapped_column(UtcDateTime())
    used_by: Mapped[int | None] = mapped_column(ForeignKey("web_users.id"))


class WebPasswordReset(Base):
    """A single-use link an organiser issues so a user can set a new password; only its sha256 is kept.

    ``used_at`` is set when the link is used, and also when a newer link for the same user supersedes it,
    so at most one link per user is ever live.
    """

    __tablename__ = "web_password_resets"

    id: Mapped[int] = mapped_column(primary_key=True)
    token_sha256: Mapped[str] = mapped_column(String(64), unique=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("web_users.id"), index=True)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime(), default=utcnow)
    expires_at: Mapped[datetime] = mapped_column(UtcDateTime())
    used_at: Mapped[datetime | None] = mapped_column(UtcDateTime())
    created_by: Mapped[int] = mapped_column(ForeignKey("web_users.id"))  # the organiser who issued it


class WebAuditEvent(Base):
    """One change to accounts or access, for organisers to answer "who did this, and when?".

    ``actor_id`` None: done from the shell (``assay user``), by whoever holds the database. Never holds a
    secret: tokens, links and passwords are named, not written down.
    """

    __tablename__ = "web_audit_events"

    id: Mapped[int] = mapped_column(primary_key=True)
    at: Mapped[datetime] = mapped_column(UtcDateTime(), default=utcnow, index=True)
    actor_id: Mapped[int | None] = mapped_column(ForeignKey("web_users.id"))
    # e.g. user.disable; see assay.web.audit.ACTIONS. Indexed: a STAR claim reads its star.give_back events
    action: Mapped[str] = mapped_column(String(40), index=True)
    target: Mapped[str] = mapped_column(String(200))  # a username, usually
    detail: Mapped[str] = mapped_column(String(1000), default="")

    actor: Mapped[WebUser | None] = relationship(lazy="joined")


class WebLoginThrottle(Base):
    """Failed sign-ins counted per scope: a client address, an (address, name) pair, a name from unknown
    clients, or one known device (see ``assay.web.throttle``). Keyed by the name as typed, so a name that
    exists and one that does not are throttled alike."""

    __tablename__ = "web_login_throttles"
    __table_args__ = (UniqueConstraint("scope", "key"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    scope: Mapped[str] = mapped_column(String(20))  # a ThrottleScope
    key: Mapped[str] = mapped_column(String(300))
    failures: Mapped[int] = mapped_column(Integer, default=0)  # since the last quiet spell or success
    last_failure_at: Mapped[datetime] = mapped_column(UtcDateTime(), default=utcnow)
    blocked_until: Mapped[datetime | None] = mapped_column(UtcDateTime())


class WebDevice(Base):
    """A browser that has signed in to this account before (its ``assay_device`` cookie; sha256 only kept).

    Failures from unknown clients never block a known device: the account's own sign-ins go on under attack.
    """

    __tablename__ = "web_devices"

    id: Mapped[int] = mapped_column(primary_key=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("web_users.id"), index=True)
    token_sha256: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime(), default=utcnow)
    last_used_at: Mapped[datetime] = mapped_column(UtcDateTime(), default=utcnow)
