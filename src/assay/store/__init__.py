"""assay.store: the SQLAlchemy tables and the one engine and session factory (SQLite, or PostgreSQL).

The names below load on first use (PEP 562): ``from assay.store.enums import Role`` (a face's help text, a
light command) does not pull SQLAlchemy and every table in with it. Any one of them loads the engine and all
the tables together, so the metadata is always complete.
"""

from __future__ import annotations

import importlib

from assay.lazy import lazy_attributes

_HOME = {
    "make_engine": "engine",
    "open_store": "engine",
    "upgrade": "engine",
    "Base": "models",
    "Job": "models",
    "MetricResult": "models",
    "ModelResult": "models",
    "Round": "models",
    "Split": "models",
    "Submission": "models",
    "Team": "models",
    "StarAnnotation": "star_models",
    "StarCampaign": "star_models",
    "StarDialogue": "star_models",
    "StarInstruction": "star_models",
    "StarParticipant": "star_models",
    "StarTask": "star_models",
    "StarTurn": "star_models",
    "WebApiToken": "web_models",
    "WebInvitation": "web_models",
    "WebSession": "web_models",
    "WebUser": "web_models",
    "WebUserParticipant": "web_models",
}
__all__ = sorted(_HOME)


def _load_tables() -> None:
    """The engine and every table module, so the metadata is complete whichever name is asked for."""
    for module in ("engine", *importlib.import_module("assay.store.engine").TABLE_MODULES):
        importlib.import_module(f"assay.store.{module}")


__getattr__ = lazy_attributes(__name__, _HOME, _load_tables)
