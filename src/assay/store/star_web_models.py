"""STAR tables the web pages need beyond the campaign engine's own, all prefixed ``star_web_``.

- ``StarWebSettings``: per campaign, what an organiser sets on the dashboard: the target model people chat
  with (a model spec string), its decoding settings, how long a claim may stay unfinished, and after how
  much continuous work the break reminder shows.
- ``StarDraft`` / ``StarDraftTurn``: a red-team dialogue in progress, written turn by turn as it happens so
  a reload or a lost connection loses nothing; on submission it becomes a ``StarDialogue`` and the draft
  goes. A draft belongs to one claim: when the claim is released the draft is deleted.
- ``StarWebReport``: the latest analysis report built from the dashboard (self-contained HTML).
- ``StarThemeCluster`` / ``StarThemeReview``: theme labelling (``assay.star.theme_labels``). A cluster of a
  thematic map is keyed by its dialogues' fingerprint and keeps its member ids, so its label outlives the
  report it was read from; each of its two reviews holds a slot (1 or 2), so a third reviewer arriving at
  the same moment hits the unique constraint instead of slipping in; the agreed or settled label is stored
  on the cluster.
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


class StarThemeCluster(Base):
    __tablename__ = "star_web_theme_clusters"
    __table_args__ = (UniqueConstraint("campaign_id", "key"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    campaign_id: Mapped[int] = mapped_column(ForeignKey("star_campaigns.id"))
    key: Mapped[str] = mapped_column(String(64))  # themes.cluster_key of the members
    members: Mapped[list[str]] = mapped_column(JSON, default=list)  # the map's dialogue ids
    terms: Mapped[list[str]] = mapped_column(JSON, default=list)  # shown to the reviewers
    label: Mapped[str | None] = mapped_column(String(200))  # once agreed or settled
    decision: Mapped[str | None] = mapped_column(String(20))  # agreed / settled; None: not yet
    decided_by: Mapped[int | None] = mapped_column(ForeignKey("web_users.id"))  # the settler
    decided_at: Mapped[datetime | None] = mapped_column(UtcDateTime())
    created_at: Mapped[datetime] = mapped_column(UtcDateTime(), default=utcnow)

    reviews: Mapped[list[StarThemeReview]] = relationship(
        cascade="all, delete-orphan", order_by="StarThemeReview.slot", lazy="selectin"
    )


class StarThemeReview(Base):
    __tablename__ = "star_web_theme_reviews"
    __table_args__ = (UniqueConstraint("cluster_id", "slot"), UniqueConstraint("cluster_id", "user_id"))

    id: Mapped[int] = mapped_column(primary_key=True)
    cluster_id: Mapped[int] = mapped_column(ForeignKey("star_web_theme_clusters.id", ondelete="CASCADE"))
    slot: Mapped[int] = mapped_column(Integer)  # 1 or 2: two reviewers per cluster, never three
    user_id: Mapped[int] = mapped_column(ForeignKey("web_users.id"))
    label: Mapped[str] = mapped_column(String(200))
    created_at: Mapped[datetime] = mapped_column(UtcDateTime(), default=utcnow)
