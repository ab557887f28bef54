"""Read a YAML config file into a pydantic model, with the one-line errors every config loader needs."""

from __future__ import annotations

from pathlib import Path
from typing import TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from assay import textfile
from assay.errors import UserError, validation_error

M = TypeVar("M", bound=BaseModel)


def load_yaml_model(path: str | Path, model: type[M], what: str) -> M:
    """Parse ``path`` as a YAML mapping (an empty file is an empty mapping) and validate it as ``model``.

    Every problem is one ``UserError`` naming the file, and the line (bad YAML) or field and value.
    """
    path = Path(path)
    text = textfile.read(path, what)
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f":{mark.line + 1}" if mark is not None else ""
        problem = str(getattr(exc, "problem", None) or "invalid YAML")
        raise UserError(f"{path}{line}: not valid YAML ({problem})") from exc
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise UserError(f"{path}: a {what} must be a YAML mapping of fields, got {type(raw).__name__}")
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        raise validation_error(exc, path) from exc
