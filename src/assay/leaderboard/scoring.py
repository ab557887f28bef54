"""Score a detector's predictions for a round: read the files, fill gaps as NIST does, compute the metrics.

Inputs are the leaderboard's: a predictions CSV (model id, P(trojaned)), a truth CSV (model id, 0/1) or a
round folder with ``models/*/ground_truth.csv``, and optionally the round's ``METADATA.csv`` to break the
scores down by factor, or by a cross product of factors as NIST's harness does (``"a*b"``: one group per
combination of values that occurs, keyed ``[a=x][b=y]`` as NIST's ``build_model_lists`` keys them). A model
with no prediction gets 0.5 and the report carries NIST's ``:Missing Results:`` flag, so a detector cannot
gain by skipping the models it finds hard. Every bad value in a file is a ``UserError`` naming file, line,
field and value. The arithmetic lives in ``assay.stats.detection``.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import BaseModel

from assay.errors import UserError, input_error
from assay.stats.detection import detection_metrics, grouped_metrics
from assay.trojai import training_models

DEFAULT_PREDICTION = 0.5  # NIST's get_default_prediction_result: a missing answer is a coin flip
MISSING_FLAG = ":Missing Results:"
NO_RESULTS_FLAG = ":No Results:"
ID_COLUMN = "model_name"
# Columns that are the answer or name each model, never a factor to group by.
NOT_FACTORS = frozenset({"model_name", "poisoned", "ground_truth", "trojaned", "label", "target"})
MAX_GROUPS = 20
CROSS = "*"  # "a*b": the cross product of columns a and b

Metrics = dict[str, float | int]
GroupSpec = str | Sequence[str]  # a column, "a*b", or the columns of a cross product


class ScoreReport(BaseModel):
    """The scores of one submission; NaN (a class absent) is written as null in JSON."""

    models: int
    predicted: int
    missing: list[str]
    flags: str
    overall: Metrics
    group_by: list[str]
    groups: dict[str, dict[str, Metrics]]


def _rows(path: Path) -> Iterator[tuple[int, list[str]]]:
    """Non-blank CSV rows with their 1-based line numbers, whitespace stripped."""
    if not path.is_file():
        raise UserError(f"{path}: not found")
    with path.open(newline="", encoding="utf-8-sig") as handle:
        reader = csv.reader(handle)
        for row in reader:
            fields = [field.strip() for field in row]
            if any(fields):
                yield reader.line_num, fields


def _is_header(fields: list[str]) -> bool:
    """A first row is a header when it names the id column or its value is not a number."""
    if fields[0] == ID_COLUMN:
        return True
    try:
        float(fields[1])
    except (ValueError, IndexError):
        return not fields[0].startswith("id-")
    return False


def _value(path: Path, line: int, field: str, text: str, what: str) -> float:
    """One checked value: a probability in [0, 1] for predictions, exactly 0 or 1 for the truth."""
    try:
        value = float(text)
    except ValueError:
        raise input_error(path, line, field, text, "is not a number") from None
    if what == "prediction" and not (math.isfinite(value) and 0.0 <= value <= 1.0):
        raise input_error(path, line, field, text, "must be a probability in [0, 1]")
    if what == "ground_truth" and value not in (0.0, 1.0):
        raise input_error(path, line, field, text, "must be 0 (clean) or 1 (trojaned)")
    return value


def read_scores(path: str | Path, what: Literal["prediction", "ground_truth"]) -> dict[str, float]:
    """Model id -> value from a two-column CSV, header optional (``model_name,<anything>`` or none).

    Duplicate ids are an error rather than last-one-wins: which answer counts would otherwise be an accident.
    """
    path = Path(path)
    field: str = what
    seen: dict[str, int] = {}
    values: dict[str, float] = {}
    for index, (line, fields) in enumerate(_rows(path)):
        if index == 0 and _is_header(fields):
            field = fields[1] if len(fields) > 1 and fields[1] else what
            continue
        if len(fields) != 2:
            raise input_error(path, line, field, ",".join(fields), f"expected 2 fields, got {len(fields)}")
        name, text = fields
        if not name:
            raise input_error(path, line, ID_COLUMN, name, "is empty")
        if name in seen:
            raise input_error(path, line, ID_COLUMN, name, f"repeats the model of line {seen[name]}")
        seen[name] = line
        values[name] = _value(path, line, field, text, what)
    return values


def read_truth(path: str | Path) -> dict[str, int]:
    """Ground truth from a CSV, or from a round folder's ``models/*/ground_truth.csv`` (e.g. splits/test)."""
    path = Path(path)
    if path.is_dir():
        return {model.name: int(model.poisoned) for model in training_models(path)}
    truth = {name: int(value) for name, value in read_scores(path, "ground_truth").items()}
    if not truth:
        raise UserError(f"{path}: lists no models")
    return truth


def read_metadata(path: str | Path) -> dict[str, dict[str, str]]:
    """Model id -> factor column -> value, from a ``METADATA.csv`` as ``assay zoo generate`` writes it."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: not found")
    with path.open(newline="", encoding="utf-8-sig") as handle:
        reader = csv.DictReader(handle)
        if ID_COLUMN not in (reader.fieldnames or []):
            raise UserError(f"{path}:1: field '{ID_COLUMN}' is missing from the header")
        table: dict[str, dict[str, str]] = {}
        for row in reader:
            name = (row.get(ID_COLUMN) or "").strip()
            if name in table:
                raise input_error(path, reader.line_num, ID_COLUMN, name, "repeats an earlier model")
            table[name] = {key: (value or "").strip() for key, value in row.items() if key is not None}
    return table


def default_factors(metadata: dict[str, dict[str, str]], models: list[str]) -> list[str]:
    """Columns worth grouping by: 2 to 20 distinct values over the scored models, some value shared.

    A column unique per model (an index, a seed, an accuracy) would give one-model groups that say nothing.
    """
    columns = next(iter(metadata.values())).keys() if metadata else []
    chosen = []
    for column in columns:
        if column in NOT_FACTORS:
            continue
        distinct = len({metadata[name][column] for name in models})
        if 2 <= distinct <= MAX_GROUPS and distinct < len(models):
            chosen.append(column)
    return chosen


def _check_rows(metadata: dict[str, dict[str, str]], models: list[str], source: str) -> None:
    """Every scored model needs a metadata row, or it would silently fall out of every group."""
    lacking = [name for name in models if name not in metadata]
    if lacking:
        raise UserError(f"{source}: no row for {len(lacking)} scored model(s), first {lacking[0]!r}")


def group_columns(spec: GroupSpec) -> tuple[str, ...]:
    """The columns of a group spec: ``"a"`` -> (a,), ``"a*b"`` or ``["a", "b"]`` -> (a, b)."""
    parts = [spec] if isinstance(spec, str) else list(spec)
    columns = tuple(c.strip() for part in parts for c in part.split(CROSS))
    if not columns or "" in columns:
        raise UserError(f"--group-by: {CROSS.join(parts)!r} has an empty column name (expected 'a' or 'a*b')")
    repeated = next((c for c in columns if columns.count(c) > 1), None)
    if repeated is not None:
        raise UserError(f"--group-by: {CROSS.join(parts)!r} names column {repeated!r} twice")
    return columns


def group_key(row: dict[str, str], columns: tuple[str, ...]) -> str:
    """A model's group: its value for one column; ``[a=x][b=y]`` for a cross (NIST's key, unambiguous)."""
    if len(columns) == 1:
        return row[columns[0]]
    return "".join(f"[{column}={row[column]}]" for column in columns)


def _check_columns(metadata: dict[str, dict[str, str]], group_by: list[tuple[str, ...]], source: str) -> None:
    """A factor to group by must be a column of the metadata."""
    columns = next(iter(metadata.values())).keys()
    for column in (c for cross in group_by for c in cross):
        if column not in columns:
            raise UserError(f"{source}: no column {column!r} to group by (columns: {', '.join(columns)})")


def score(
    predictions: dict[str, float],
    truth: dict[str, int],
    metadata: dict[str, dict[str, str]] | None = None,
    group_by: Sequence[GroupSpec] | None = None,
    metadata_source: str = "metadata",
) -> ScoreReport:
    """Score predictions against the truth, overall and per factor of the metadata.

    Missing models score as 0.5 (flagged); a prediction for a model not in the truth is an error, since it
    most likely means the wrong round or split. ``group_by`` None picks ``default_factors``; each entry is a
    column or a cross product (``"a*b"`` or ``["a", "b"]``), reported under ``"a*b"`` with one group per
    combination that occurs (``group_key``). ``metadata_source`` names the metadata in error messages.
    """
    unknown = sorted(set(predictions) - set(truth))
    if unknown:
        raise UserError(
            f"predictions: {len(unknown)} model(s) not in the ground truth, first {unknown[0]!r}; "
            "wrong round or split?"
        )
    models = sorted(truth)
    missing = [name for name in models if name not in predictions]
    flags = (NO_RESULTS_FLAG if len(missing) == len(models) else "") + (MISSING_FLAG if missing else "")
    y = np.array([truth[name] for name in models], dtype=np.float64)
    p = np.array([predictions.get(name, DEFAULT_PREDICTION) for name in models], dtype=np.float64)
    factors: list[str] = []
    groups: dict[str, dict[str, Metrics]] = {}
    if metadata is not None:
        _check_rows(metadata, models, metadata_source)
        specs = group_by if group_by is not None else default_factors(metadata, models)
        specs = [specs] if isinstance(specs, str) else specs  # one spec given bare: "a*b", not "a", "*", "b"
        crosses = [group_columns(spec) for spec in specs]
        _check_columns(metadata, crosses, metadata_source)
        for columns in crosses:
            factors.append(CROSS.join(columns))
            groups[factors[-1]] = grouped_metrics(
                y, p, [group_key(metadata[name], columns) for name in models]
            )
    elif group_by:
        raise UserError("--group-by needs metadata: pass --metadata or a round folder as --truth")
    return ScoreReport(
        models=len(models),
        predicted=len(models) - len(missing),
        missing=missing,
        flags=flags,
        overall=detection_metrics(y, p),
        group_by=factors,
        groups=groups,
    )


def score_files(
    predictions_path: str | Path,
    truth_path: str | Path,
    metadata_path: str | Path | None = None,
    group_by: Sequence[GroupSpec] | None = None,
) -> ScoreReport:
    """Read the files and score; with a round folder as truth, its METADATA.csv is used when present."""
    truth_path = Path(truth_path)
    if metadata_path is None and truth_path.is_dir() and (truth_path / "METADATA.csv").is_file():
        metadata_path = truth_path / "METADATA.csv"
    predictions = read_scores(predictions_path, "prediction")
    truth = read_truth(truth_path)
    if metadata_path is None:
        return score(predictions, truth, None, group_by)
    return score(predictions, truth, read_metadata(metadata_path), group_by, str(metadata_path))
