"""Server logs as text (the default) or as one JSON object a line (``ASSAY_LOG_FORMAT=json``), for a log
collector in a pod or a cluster.

A JSON record has ``time`` (UTC, ISO 8601 with milliseconds), ``level``, ``logger`` and ``message``, the
exception's traceback as ``exception`` when there is one, and a request's fields (method, route, path,
status, duration_ms, client) for ``assay.web.access`` records, which ``assay.web.metrics`` writes in place
of uvicorn's own access log. ``uvicorn_log_config`` hands the same formatter to uvicorn, whose worker
processes configure their logging from it.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from typing import Any

FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class JsonFormatter(logging.Formatter):
    """One JSON object per record, ASCII only, so a line is always one record whatever the message holds."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            out.update(fields)
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=True, default=str)


def check_format(log_format: str) -> str:
    from assay.errors import UserError

    if log_format not in FORMATS:
        raise UserError(f"log format {log_format!r}: use one of {', '.join(FORMATS)} (ASSAY_LOG_FORMAT)")
    return log_format


def uvicorn_log_config(log_format: str, level: str = "info") -> dict[str, Any]:
    """A ``logging.config.dictConfig`` for uvicorn and assay's own loggers, one handler on stderr."""
    formatter = (
        {"()": f"{__name__}.JsonFormatter"} if check_format(log_format) == "json" else {"format": TEXT_FORMAT}
    )
    handler = {"class": "logging.StreamHandler", "formatter": "main", "stream": "ext://sys.stderr"}
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"main": formatter},
        "handlers": {"main": handler},
        "root": {"handlers": ["main"], "level": level.upper()},
        "loggers": {
            name: {"handlers": [], "level": level.upper(), "propagate": True}
            for name in ("uvicorn", "uvicorn.error", "uvicorn.access", "assay")
        },
    }


def configure(log_format: str, level: str = "info") -> None:
    """Configure this process's logging (the CLI's commands and tests; ``assay serve`` passes
    ``uvicorn_log_config`` to uvicorn instead)."""
    import logging.config

    logging.config.dictConfig(uvicorn_log_config(log_format, level))
