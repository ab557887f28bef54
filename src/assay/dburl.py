"""The database URL from the environment: ``ASSAY_DB_URL``, or the file ``ASSAY_DB_URL_FILE`` names.

Why a file: a URL in the environment shows in ``podman inspect``, ``/proc/PID/environ`` and every child
process, while a secret mounted as a file (``podman secret``, a Kubernetes Secret volume) does not. Shared by
``assay.config`` and ``assay.store.fastread`` (which must not import pydantic), so both read the same
database. A password alone can also come from libpq's own ``PGPASSFILE`` (docs/deploy.md).
"""

from __future__ import annotations

from pathlib import Path

from assay.errors import UserError

URL_ENV, FILE_ENV = "ASSAY_DB_URL", "ASSAY_DB_URL_FILE"


def resolve(url: str | None, file: str | Path | None) -> str | None:
    """The URL given directly or read from ``file`` (surrounding whitespace dropped); None when neither is
    set. Both set, or a file that is missing, unreadable or empty, is a one-line ``UserError``."""
    if url and file:
        raise UserError(f"set {URL_ENV} or {FILE_ENV}, not both")
    if not file:
        return url or None
    try:
        text = Path(file).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as err:
        raise UserError(f"{FILE_ENV}: cannot read {file}: {getattr(err, 'strerror', None) or err}") from None
    if not text:
        raise UserError(f"{FILE_ENV}: {file} is empty; it must hold the database URL")
    return text
