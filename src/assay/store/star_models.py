"""The STAR red-teaming tables (SQLAlchemy 2.0 declarative), one class per table, all prefixed ``star_``.

A ``StarCampaign`` holds its validated spec as JSON; its ``StarParticipant`` pool (demographics, expertise,
roles, daily cap, opt-out) claims ``StarTask``s: one red-team task per ``StarInstruction``, then annotate
tasks per ``StarDialogue`` (with its ``StarTurn``s), then at most one arbitrate task per dialogue. Each
finished annotate/arbitrate task leaves one ``StarAnnotation``. Two constraints carry the rules that must
hold under concurrent claimers: a person appears at most once among a dialogue's tasks (so nobody sees a
dialogue twice, in any role), and a dialogue has at most one arbitration task. Times are UTC.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import JSON, Boolean, ForeignKey, Index, Integer, String, Text, UniqueConstraint, text
from sqlalchemy.orm import Mapped, mapped_column, relationship

from assay.store.enums import STAR_ROLES, TaskKind, TaskStatus
from assay.store.models import Base, UtcDateTime, utcnow

ROLES = STAR_ROLES
TASK_KINDS = tuple(TaskKind)
TASK_STATUSES = tuple(TaskStatus)
TURN_ROLES = ("user", "assistant")


class StarCampaign(Base):
    __tablename__ = "star_campaigns"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(100), unique=True)
    spec_json: Mapped[str] = mapped_column(
        Text
    )  # CampaignSpec.model_dump_json(): the rules the engine applies
    seed: Mapped[int] = mapped_column(Integer, default=0)  # in-group balance and ablation draws
    created_at: Mapped[datetime] = mapped_column(UtcDateTime(), default=utcnow)


class StarParticipant(Base):
    __tablename__ = "star_participants"
    __table_args__ = (UniqueConstraint("campaign_id", "external_id"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    campaign_id: Mapped[int] = mapped_column(ForeignKey("star_campaigns.id"))
    external_id: Mapped[str] = mapped_column(String(100))  # the id in the imported pool file
    name: Mapped[str] = mapped_column(String(200), default="")
    demographics: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)  # {attribute: [values]}
    expertise: Mapped[list[str]] = mapped_column(JSON, default=list)
    roles: Mapped[list[str]] = mapped_column(JSON, default=list)  # subset of ROLES
    daily_cap: Mapped[int] = mapped_column(Integer, default=20)  # tasks claimed per UTC day
    opted_out: Mapped[bool] = mapped_column(Boolean, default=False)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime(), default=utcnow)


class StarInstruction(Base):
    __tablename__ = "star_instructions"
    __table_args__ = (UniqueConstraint("campaign_id", "instruction_id"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    campaign_id: Mapped[int] = mapped_column(ForeignKey("star_campaigns.id"))
    number: Mapped[int] = mapped_column(Integer)
    instruction_id: Mapped[str] = mapped_column(String(40))  # "ins-00001", from the design
    rule_id: Mapped[str] = mapped_column(String(100))
    rule_area: Mapped[str] = mapped_column(String(200), default="")
    group_json: Mapped[dict[str, str] | None] = mapped_column(JSON)  # None: the rule targets no group
    group_label: Mapped[str] = mapped_column(String(400), default="")
    parameters_json: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    template: Mapped[str] = mapped_column(String(100), default="")
    text: Mapped[str] = mapped_column(Text)


class StarTask(Base):
    __tablename__ = "star_tasks"
    __table_args__ = (
        UniqueConstraint("dialogue_id", "participant_id"),  # nobody twice on a dialogue, in any role
        UniqueConstraint("arbitration_of"),  # at most one arbitration task per dialogue
        Index("ix_star_tasks_queue", "campaign_id", "kind", "status"),
        Index("ix_star_tasks_participant_claimed", "participant_id", "claimed_at"),
        # Only the claimable tasks, oldest first: the claim's candidate without filtering finished work.
        Index(
            "ix_star_tasks_claimable",
            "campaign_id",
            "kind",
            "id",
            postgresql_where=text("status IN ('open', 'waiting')"),
            sqlite_where=text("status IN ('open', 'waiting')"),
        ),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    campaign_id: Mapped[int] = mapped_column(ForeignKey("star_campaigns.id"))
    kind: Mapped[str] = mapped_column(String(20))  # TASK_KINDS
    instruction_id: Mapped[int] = mapped_column(ForeignKey("star_instructions.id"))
    # Copied from the instruction so one conditional UPDATE can check eligibility without a join.
    rule_id: Mapped[str] = mapped_column(String(100))
    group_label: Mapped[str] = mapped_column(String(400), default="")
    dialogue_id: Mapped[int | None] = mapped_column(ForeignKey("star_dialogues.id"))  # set on red-team too
    arbitration_of: Mapped[int | None] = mapped_column(ForeignKey("star_dialogues.id"))  # arbitrate only
    in_group: Mapped[bool | None] = mapped_column(Boolean)  # True in-group, False out-group, None: anyone
    ablation: Mapped[bool] = mapped_column(Boolean, default=False)  # extra out-group annotation
    status: Mapped[str] = mapped_column(String(20), default="open")  # TASK_STATUSES
    participant_id: Mapped[int | None] = mapped_column(ForeignKey("star_participants.id"))
    created_at: Mapped[datetime] = mapped_column(UtcDateTime(), default=utcnow)
    claimed_at: Mapped[datetime | None] = mapped_column(UtcDateTime())
    done_at: Mapped[datetime | None] = mapped_column(UtcDateTime())
    machine: Mapped[bool] = mapped_column(Boolean, default=False)  # finished by a model, not a person

    instruction: Mapped[StarInstruction] = relationship()


class StarDialogue(Base):
    __tablename__ = "star_dialogues"

    id: Mapped[int] = mapped_column(primary_key=True)
    campaign_id: Mapped[int] = mapped_column(ForeignKey("star_campaigns.id"))
    instruction_id: Mapped[int] = mapped_column(ForeignKey("star_instructions.id"))
    red_teamer_id: Mapped[int | None] = mapped_column(ForeignKey("star_participants.id"))
    topic: Mapped[str] = mapped_column(Text, default="")
    target_model: Mapped[str] = mapped_column(String(200), default="")
    machine: Mapped[bool] = mapped_column(Boolean, default=False)  # written by a model red teamer
    started_at: Mapped[datetime | None] = mapped_column(UtcDateTime())
    finished_at: Mapped[datetime | None] = mapped_column(UtcDateTime())
    pre_annotation: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)  # the red teamer's own view

    instruction: Mapped[StarInstruction] = relationship()
    turns: Mapped[list[StarTurn]] = relationship(
        back_populates="dialogue", cascade="all, delete-orphan", order_by="StarTurn.index"
    )


class StarTurn(Base):
    __tablename__ = "star_turns"
    __table_args__ = (UniqueConstraint("dialogue_id", "index"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    dialogue_id: Mapped[int] = mapped_column(ForeignKey("star_dialogues.id"))
    index: Mapped[int] = mapped_column(Integer)
    role: Mapped[str] = mapped_column(String(20))  # TURN_ROLES
    text: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime(), default=utcnow)

    dialogue: Mapped[StarDialogue] = relationship(back_populates="turns")


class StarAnnotation(Base):
    __tablename__ = "star_annotations"

    id: Mapped[int] = mapped_column(primary_key=True)
    dialogue_id: Mapped[int] = mapped_column(ForeignKey("star_dialogues.id"), index=True)
    task_id: Mapped[int] = mapped_column(ForeignKey("star_tasks.id"), unique=True)
    annotator_id: Mapped[int | None] = mapped_column(ForeignKey("star_participants.id"))
    rating: Mapped[int] = mapped_column(Integer)  # 0-based Likert point: 0 = definitely broken
    reason: Mapped[str] = mapped_column(Text)
    kind: Mapped[str] = mapped_column(String(20))  # annotate or arbitrate
    ablation: Mapped[bool] = mapped_column(Boolean, default=False)  # an extra out-group annotation
    machine: Mapped[bool] = mapped_column(Boolean, default=False)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime(), default=utcnow)
