"""STAR analysis reports built in the background.

With the thematic map a build embeds every dialogue and runs UMAP: tens of seconds for a small campaign
(most of it numba compiling UMAP once per process), minutes for a big one, too long to hold a request. So
the dashboard's button starts a build in a worker thread and the page says a build is under way, or why
the last one failed. One build per campaign at a time, tracked per server process: with several uvicorn
workers a page served by another worker shows the previous report until the new one is stored.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime

from fastapi import Request
from sqlalchemy.orm import Session, sessionmaker

from assay.errors import UserError
from assay.star import live
from assay.store.models import utcnow
from assay.store.star_models import StarCampaign

log = logging.getLogger(__name__)

EMBEDDERS = {  # the map choices offered on the dashboard: make_embedder names and what they mean
    "minilm": "all-MiniLM-L6-v2, as in the STAR paper",
    "hashing": "hashing, fast and without a model",
    "none": "no thematic map",
}


@dataclass(frozen=True)
class BuildState:
    """A campaign's build: ``started_at`` while one runs, ``error`` when the last one failed."""

    started_at: datetime | None = None
    error: str | None = None


class ReportBuilds:
    """The builds of one application; a single worker thread, since each build uses every core in UMAP."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._states: dict[int, BuildState] = {}
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="assay-star-report")

    def state(self, campaign_id: int) -> BuildState:
        with self._lock:
            return self._states.get(campaign_id, BuildState())

    def start(
        self, sessions: sessionmaker[Session], campaign_id: int, user_id: int | None, embedder: str
    ) -> bool:
        """Queue a build unless one is already under way for the campaign; True when queued."""
        with self._lock:
            if self._states.get(campaign_id, BuildState()).started_at is not None:
                return False
            self._states[campaign_id] = BuildState(started_at=utcnow())
        self._pool.submit(self._build, sessions, campaign_id, user_id, embedder)
        return True

    def _build(
        self, sessions: sessionmaker[Session], campaign_id: int, user_id: int | None, embedder: str
    ) -> None:
        error = None
        try:
            with sessions.begin() as session:
                campaign = session.get_one(StarCampaign, campaign_id)
                live.build_latest_report(session, campaign, user_id, embedder)
        except UserError as exc:  # e.g. the embedding model is not installed
            error = str(exc)
        except Exception as exc:  # shown to the organiser and logged; the server goes on
            log.exception("report build for campaign %s failed", campaign_id)
            error = f"{type(exc).__name__}: {exc}"
        with self._lock:
            self._states[campaign_id] = BuildState(error=error)


def report_builds(request: Request) -> ReportBuilds:
    """The application's build tracker (``create_app`` makes one per application)."""
    return request.app.state.report_builds  # type: ignore[no-any-return]
