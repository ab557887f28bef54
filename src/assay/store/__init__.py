"""assay.store: the SQLAlchemy tables and the one engine and session factory (SQLite, or PostgreSQL)."""

from assay.store.engine import make_engine, open_store, upgrade
from assay.store.models import Base, Job, MetricResult, ModelResult, Round, Split, Submission, Team
from assay.store.star_models import (
    StarAnnotation,
    StarCampaign,
    StarDialogue,
    StarInstruction,
    StarParticipant,
    StarTask,
    StarTurn,
)
from assay.store.web_models import (
    WebApiToken,
    WebInvitation,
    WebSession,
    WebUser,
    WebUserParticipant,
)

__all__ = [
    "Base",
    "Job",
    "MetricResult",
    "ModelResult",
    "Round",
    "Split",
    "StarAnnotation",
    "StarCampaign",
    "StarDialogue",
    "StarInstruction",
    "StarParticipant",
    "StarTask",
    "StarTurn",
    "Submission",
    "Team",
    "WebApiToken",
    "WebInvitation",
    "WebSession",
    "WebUser",
    "WebUserParticipant",
    "make_engine",
    "open_store",
    "upgrade",
]
