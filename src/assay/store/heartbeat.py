"""A heartbeat: a daemon thread that stamps "still alive" into the store every few seconds while a long
piece of work runs (a leaderboard job, a DyePack verification), so another process can tell a slow holder
from a dead one by the stamp's age.

The stamp itself is the caller's (one UPDATE of its own row). A failed write (a locked SQLite file, a
database restart) is logged and tried again at the next beat: missing one beat is harmless, stopping the
work for it is not.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from sqlalchemy.exc import SQLAlchemyError

logger = logging.getLogger(__name__)


class Heartbeat:
    """Call ``stamp`` every ``every`` seconds from a daemon thread, from ``start`` (or ``with``) on."""

    def __init__(self, stamp: Callable[[], None], every: float, name: str = "assay-heartbeat") -> None:
        self._stamp, self._every = stamp, every
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True, name=name)

    def _loop(self) -> None:
        while not self._stop.wait(self._every):
            try:
                self._stamp()
            except SQLAlchemyError as err:
                logger.warning("%s: heartbeat not written (%s)", self._thread.name, type(err).__name__)

    def start(self) -> Heartbeat:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop beating; returns once the thread is gone, so no stamp lands after the work has ended."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join()

    def __enter__(self) -> Heartbeat:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
