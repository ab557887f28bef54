"""STAR tables the web pages need beyond the campaign engine's own, all prefixed ``star_web_``.

- ``StarWebSettings``: per campaign, what an organiser sets on the dashboard: the target model people chat
  with (a model spec string), its decoding settings, how long a claim may stay unfinished, and after how
  much continuous work the break reminder shows.
- ``StarDraft`` / ``StarDraftTurn``: a red-team dialogue in progress, written turn by turn as it happens so
  a reload or a lost connection loses nothing; on submission it becomes a ``StarDialogue`` and the draft
  goes. A draft belongs to one claim: when the claim is released the draft is deleted.
- ``StarWebReport``: the latest analysis report built from the dashboard (self-contained HTML).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, Float, ForeignKey, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column, relationship

from assay.store.models import Base, UtcDateTime, utcnow

DEFAULT_MAX_NEW_TOKENS = 512
DEFAULT_TEMPERATURE = 0.7
DEFAULT_CLAIM_TIMEOUT_MINUTES = 120
DEFAULT_BREAK_MINUTES = 50


class StarWebSettings(Base):
    __tablename__ = "star_web_settings"

    id: Mapped[int] = mapped_column(primary_key=True)
    campaign_id: Mapped[int] = mapped_column(ForeignKey("star_campaigns.id"), unique=True)
    target_model: Mapped[str] = mapped_column(String(500), default="")  # a load_model spec; "" = not set
    max_new_tokens: Mapped[int] = mapped_column(Integer, default=DEFAULT_MAX_NEW_TOKENS)
    temperature: Mapped[float] = mapped_column(Float, default=DEFAULT_TEMPERATURE)
    claim_timeout_minutes: Mapped[int] = mapped_column(Integer, default=DEFAULT_CLAIM_TIMEOUT_MINUTES)
    break_minutes: Mapped[int] = mapped_column(Integer, default=DEFAULT_BREAK_MINUTES)  # 0: no reminder
    updated_at: Mapped[datetime] = mapped_column(UtcDateTime(), default=utcnow)


class StarDraft(Base):
    __tablename__ = "star_web_drafts"

    id: Mapped[int] = mapped_column(primary_key=True)
    task_id: Mapped[int] = mapped_column(ForeignKey("star_tasks.id"), unique=True)
    participant_id: Mapped[int] = mapped_column(ForeignKey("star_participants.id"))  # the claimer
    topic: Mapped[str] = mapped_column(Text)  # committed before the first message
    target_model: Mapped[str] = mapped_column(String(500), default="")  # model_id of the replies
    created_at: Mapped[datetime] = mapped_column(UtcDateTime(), default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UtcDateTime(), default=utcnow)  # last turn

    turns: Mapped[list[StarDraftTurn]] = relationship(
        cascade="all, delete-orphan", order_by="StarDraftTurn.index", lazy="selectin"
    )


class StarDraftTurn(Base):
    __tablename__ = "star_web_draft_turns"
    __table_args__ = (UniqueConstraint("draft_id", "index"),)  # two replies to one message: one wins

    id: Mapped[int] = mapped_column(primary_key=True)
    draft_id: Mapped[int] = mapped_column(ForeignKey("star_web_drafts.id", ondelete="CASCADE"))
    index: Mapped[int] = mapped_column(Integer)
    role: Mapped[str] = mapped_column(String(20))  # user or assistant
    text: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime(), default=utcnow)


class StarWebReport(Base):
    __tablename__ = "star_web_reports"

    id: Mapped[int] = mapped_column(primary_key=True)
    campaign_id: Mapped[int] = mapped_column(ForeignKey("star_campaigns.id"), unique=True)  # latest only
    html: Mapped[str] = mapped_column(Text)
    summary: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime(), default=utcnow)
    created_by: Mapped[int | None] = mapped_column(ForeignKey("web_users.id"))
