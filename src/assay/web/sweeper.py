"""The one periodic job of the web app: each pillar's ``sweep(sessions, now)``, so no page view has to write.

What would otherwise happen on reads happens here, every ``SWEEP_SECONDS`` and once at start-up:
- STAR (``assay.star.workflow.sweep``): claims past their campaign's timeout go back to the queue, and
  shortfalls are re-checked (tasks nobody in the pool may take are marked waiting, and back to open).
- DyePack (``assay.dyepack.registry.sweep``): runs whose key holder stopped are marked failed; the runs this
  process holds (its ``dyepack`` background lane) are alive by definition. At start-up that fails the runs
  a previous server process on this host left behind.
- Sign-in (``assay.web.throttle.prune``): failed-sign-in counts quiet for an hour, with no wait running.

``sweep_all`` is one tick, with the time passed in (tests freeze it); ``Sweeper`` runs it in a daemon thread
started with the app (its lifespan) and keeps the last outcome for the dashboard. A failed tick is logged
and recorded, and the next one tries again. ``python -m assay.web.sweeper [--db URL]`` runs one tick from a
shell. With several server processes each sweeps; every step is idempotent.
"""

from __future__ import annotations

import argparse
import logging
import threading
from collections.abc import Container
from datetime import datetime

from pydantic import BaseModel
from sqlalchemy.orm import Session, sessionmaker

from assay.dyepack import registry
from assay.star import workflow
from assay.store.models import utcnow
from assay.web import throttle

log = logging.getLogger(__name__)

SWEEP_SECONDS = 30.0


class SweepOutcome(BaseModel):
    """One tick: claims released, tasks waiting for a match, DyePack runs failed (or why the tick failed)."""

    at: datetime
    released_claims: int = 0
    waiting_tasks: int = 0
    failed_runs: int = 0
    pruned_signin_counts: int = 0
    error: str | None = None


class SweeperStatus(BaseModel):
    """For the dashboard: how often the sweeper runs and what its last tick did (None before the first)."""

    every_s: float
    last: SweepOutcome | None


def sweep_all(
    sessions: sessionmaker[Session], now: datetime, dyepack_held: Container[int] = ()
) -> SweepOutcome:
    """Every pillar's periodic work at ``now``; ``dyepack_held``: the runs this process holds keys for."""
    star = workflow.sweep(sessions, now)
    failed = registry.sweep(sessions, now, dyepack_held)
    with sessions.begin() as session:
        pruned = throttle.prune(session, now)
    return SweepOutcome(
        at=now,
        released_claims=star.released,
        waiting_tasks=star.waiting,
        failed_runs=failed,
        pruned_signin_counts=pruned,
    )


class Sweeper:
    """``sweep_all`` now and then every ``every`` seconds in a daemon thread, until ``stop``."""

    def __init__(
        self, sessions: sessionmaker[Session], dyepack_held: Container[int] = (), every: float = SWEEP_SECONDS
    ) -> None:
        self._sessions, self._held, self.every = sessions, dyepack_held, every
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.last: SweepOutcome | None = None

    def tick(self, now: datetime | None = None) -> SweepOutcome:
        """One sweep; a failure is logged and recorded in the outcome instead of raised."""
        now = now or utcnow()
        try:
            self.last = sweep_all(self._sessions, now, self._held)
        except Exception as exc:  # a locked database, a restart: the next tick tries again
            log.exception("sweep failed")
            self.last = SweepOutcome(at=now, error=f"{type(exc).__name__}: {exc}")
        return self.last

    def start(self) -> Sweeper:
        """Sweep once now (what a previous process left is settled before the first request), then
        periodically in the background."""
        self.tick()
        self._thread = threading.Thread(target=self._loop, name="assay-sweeper", daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        """Tick every ``every`` seconds until ``stop``."""
        while not self._stop.wait(self.every):
            self.tick()

    def stop(self) -> None:
        """Stop sweeping; returns once the thread has finished its current tick."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def status(self) -> SweeperStatus:
        """How often it sweeps and what the last tick did."""
        return SweeperStatus(every_s=self.every, last=self.last)


def main(argv: list[str] | None = None) -> None:
    """``python -m assay.web.sweeper``: one sweep of the store the server uses, from a shell or cron."""
    from assay.store import open_store

    parser = argparse.ArgumentParser(prog="python -m assay.web.sweeper", description=main.__doc__)
    parser.add_argument(
        "--db", help="database URL (default: ASSAY_DB_URL, else the SQLite file in ASSAY_HOME)"
    )
    outcome = sweep_all(open_store(parser.parse_args(argv).db), utcnow())
    print(outcome.model_dump_json())


if __name__ == "__main__":
    main()
