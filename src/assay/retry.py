"""Try an action again after a transient failure: a database lock past its busy timeout, a lost race for a
row, a cgroup folder still being torn down. The one retry loop of the package (model servers are retried
by the ``openai`` client itself, see ``assay.models.openai_backend``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")
_RAISE: Any = object()


def retry(
    action: Callable[[], T],
    *,
    on: type[BaseException] | tuple[type[BaseException], ...],
    attempts: int,
    wait: float | Callable[[int], float],
    default: T = _RAISE,
) -> T:
    """``action()``'s result, calling it up to ``attempts`` times while it raises one of ``on``.

    After failed attempt ``i`` (0-based) it sleeps ``wait`` seconds, or ``wait(i)`` when ``wait`` is a
    function (back-off and jitter). When every attempt fails: the last error is raised again, or, given a
    ``default``, that is returned (after the last wait) instead. Any other exception passes at once.
    """
    for attempt in range(attempts):
        try:
            return action()
        except on:
            if attempt == attempts - 1 and default is _RAISE:
                raise
            time.sleep(wait(attempt) if callable(wait) else wait)
    return default
