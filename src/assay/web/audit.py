"""The audit trail of accounts and access: every change an organiser (or the shell) makes to an account,
every invitation and reset link issued and used, kept in ``web_audit_events`` and shown on
``/admin/audit``. The account functions in ``accounts`` record their own events, so the pages, the API and
``assay user`` all leave the same trail; the pillars write theirs where the change is made (a leaderboard
round's settings in ``leaderboard.rounds``, a STAR task given back in ``star.workflow.give_back``), with
their action named here.
"""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from assay.store.paging import Window, page_of
from assay.store.web_models import WebAuditEvent, WebUser

ACTIONS = {
    "user.create": "account created",
    "user.roles": "roles or team changed",
    "user.disable": "account disabled (sessions ended, API tokens revoked)",
    "user.enable": "account enabled",
    "user.unlock": "sign-in waits lifted",
    "signin.throttle": "failed sign-ins past the free limit: further attempts wait (1 s, doubling to 15 min)",
    "signin.origin": "sign-in refused: posted from another site or without the sign-in form's token",
    "user.password_set": "password set from the shell",
    "user.link_member": "linked to a STAR pool member",
    "user.unlink_member": "unlinked from a STAR pool member",
    "password_reset.issue": "password-reset link issued",
    "password_reset.use": "password reset through a link",
    "invitation.issue": "invitation issued",
    "invitation.accept": "invitation accepted",
    "round.settings": "leaderboard round settings changed (the plateau rule)",
    "round.create": "leaderboard round created (its disclosure of test scores, budget and metric)",
    "round.public": "leaderboard round made public or private (its standings readable without signing in)",
    "star.give_back": "STAR task given back by its holder (open for anyone again, not counted against them)",
}
SHELL = "shell"  # how an event without a web user (``assay user``) is shown


def record(session: Session, actor: WebUser | None, action: str, target: str, detail: str = "") -> None:
    """Add one event to the session's transaction: it is kept only if the change itself is committed."""
    if action not in ACTIONS:
        raise ValueError(f"unknown audit action {action!r}")  # a programming error, not user input
    session.add(
        WebAuditEvent(
            actor_id=actor.id if actor else None, action=action, target=target, detail=detail[:1000]
        )
    )


def recent(session: Session, limit: int = 200, target: str | None = None) -> list[WebAuditEvent]:
    """The newest ``limit`` events first (all, or those about one ``target``)."""
    return page(session, Window(limit), target)[0]


def page(session: Session, window: Window, target: str | None = None) -> tuple[list[WebAuditEvent], int]:
    """A window of the events, newest first (all, or those about one ``target``), and how many in all."""
    query = select(WebAuditEvent).order_by(WebAuditEvent.id.desc())
    if target is not None:
        query = query.where(WebAuditEvent.target == target)
    return page_of(session, query, window)


def actor_name(event: WebAuditEvent) -> str:
    return event.actor.username if event.actor else SHELL
