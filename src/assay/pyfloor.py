"""The oldest Python assay runs on, checked when the ``assay`` command and the web app start.

Why: tarfile's extraction filters (``filter="data"``, ``tarfile.FilterError``) arrived in 3.11.4. On an
older 3.11 every ``.tar.gz`` upload failed with "module 'tarfile' has no attribute 'FilterError'" and
``assay admin restore`` crashed with a traceback (issue 36). pip refuses to install assay there
(``requires-python``), but a checkout on ``PYTHONPATH`` or an image built on an old base still gets in: this
says why in one line, exit code 2, before any work starts. Imports nothing beyond ``sys``.
"""

from __future__ import annotations

import sys

FLOOR = (3, 11, 4)
WHY = "tar extraction filters"


def problem() -> str | None:
    """The one-line reason this interpreter is too old, or None when it will do."""
    found = tuple(sys.version_info[:3])
    if found >= FLOOR:
        return None
    need, have = ".".join(map(str, FLOOR)), ".".join(map(str, found))
    return f"assay needs Python {need} or newer ({WHY}); {sys.executable} is Python {have}"


def check() -> None:
    """Exit with code 2 and one line on stderr when this Python is older than ``FLOOR``."""
    reason = problem()
    if reason is not None:
        print(f"error: {reason}", file=sys.stderr)
        raise SystemExit(2)
