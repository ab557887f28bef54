"""Theme labels without a database: the label's form, putting decided labels on a map's clusters, and the
CSV / JSON label files.

Pure: what the report needs of the labels is here, so ``assay.star.analysis.report`` builds from the labels
it is handed and never reaches into the store. The review rules and the stored labels are
``assay.star.theme_labels``, which builds on this module (never the other way round).
"""

from __future__ import annotations

import csv
import io
import json
import unicodedata
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError

from assay.errors import UserError, input_error, validation_error

MAX_LABEL = 120
MIN_OVERLAP = 0.5  # a label carries over to a new cluster sharing strictly more of its dialogues than this
FILE_COLUMNS = ["key", "label", "decision", "n", "members"]
Decision = Literal["agreed", "settled", "given"]  # given: read from a file, decided elsewhere


# --- labels and clusters, without a database ------------------------------------------------------------


def normalise(label: str) -> str:
    """The form two labels are compared in: NFKC, case-folded, runs of spaces as one, no end punctuation."""
    folded = " ".join(unicodedata.normalize("NFKC", label).casefold().split())
    return folded.strip(" .,;:!?-")


def check_label(label: str, where: str = "label") -> str:
    """A label as given (trimmed), or a one-line ``UserError``: one line, 1 to ``MAX_LABEL`` characters."""
    text = " ".join(label.split())
    if not normalise(text):
        raise UserError(f"{where}: a label needs at least one letter or digit (value: {label!r})")
    if len(text) > MAX_LABEL:
        raise UserError(f"{where}: a label is at most {MAX_LABEL} characters (it has {len(text)})")
    return text


class ThemeLabel(BaseModel):
    """One decided label as stored, exported and imported: the cluster's key, the label, how it was
    decided, and the cluster's dialogue ids (optional in a file; without them a label applies only to the
    very same cluster)."""

    key: str = Field(min_length=1, max_length=64)
    label: str = Field(min_length=1, max_length=MAX_LABEL)
    decision: Decision = "given"
    members: list[str] = Field(default_factory=list)


class AppliedLabel(BaseModel):
    """A label on a cluster of the current map: ``overlap`` 1.0 when it was given to this very cluster,
    else the Jaccard overlap with the earlier cluster ``source_key`` it was given to."""

    cluster: int
    key: str
    label: str
    decision: Decision
    overlap: float
    source_key: str

    @property
    def carried(self) -> bool:
        return self.key != self.source_key


class LabelMatch(BaseModel):
    """Labels on the clusters of a map (by cluster number) and the labels no cluster carries."""

    applied: dict[int, AppliedLabel]
    unmatched: list[ThemeLabel]


def _jaccard(a: set[str], b: set[str]) -> float:
    return len(a & b) / len(a | b) if a or b else 0.0


def apply_labels(clusters: Sequence[Mapping[str, Any]], labels: Sequence[ThemeLabel]) -> LabelMatch:
    """Put ``labels`` (later ones win) on ``clusters`` (``themes.cluster_summary`` rows: cluster, key,
    members): by key first, else by the best overlap above ``MIN_OVERLAP`` (ties: the later label)."""
    by_key = {label.key: label for label in labels}
    applied: dict[int, AppliedLabel] = {}
    for row in clusters:
        cluster, key, members = int(row["cluster"]), str(row["key"]), set(row["members"])
        found, overlap = by_key.get(key), 1.0
        if found is None:
            scored = [(_jaccard(members, set(lab.members)), i) for i, lab in enumerate(labels) if lab.members]
            best = max(scored, default=(0.0, -1))
            found, overlap = (labels[best[1]], best[0]) if best[0] > MIN_OVERLAP else (None, 0.0)
        if found is not None:
            applied[cluster] = AppliedLabel(
                cluster=cluster,
                key=key,
                label=found.label,
                decision=found.decision,
                overlap=overlap,
                source_key=found.key,
            )
    used = {a.source_key for a in applied.values()}
    return LabelMatch(applied=applied, unmatched=[lab for lab in by_key.values() if lab.key not in used])


def match_summary(match: LabelMatch) -> dict[str, Any]:
    """The labels part of a report's summary: by cluster number, and those no cluster of this map carries."""
    return {
        "labels": {str(c): a.model_dump() for c, a in sorted(match.applied.items())},
        "labels_unmatched": [lab.model_dump(exclude={"members"}) for lab in match.unmatched],
        "labels_rule": (
            f"two reviewers, a third settles; a label carries over to a changed cluster sharing more than "
            f"{MIN_OVERLAP:.0%} of its dialogues (Jaccard)"
        ),
    }


# --- files ------------------------------------------------------------------------------------------------


def read_labels(path: Path) -> list[ThemeLabel]:
    """Labels from a CSV (columns ``key`` and ``label``; ``decision``, and ``members`` as space-separated
    ids, optional) or JSON / JSONL file (a list of such objects, or ``{"labels": [...]}``). Rows with an
    empty label are skipped, so a report's ``themes_clusters.csv`` with labels filled in reads back."""
    from assay.data.tables import read_table

    table = read_table(path)
    if table.file_format not in ("csv", "json", "jsonl"):
        raise UserError(f"{path}: theme labels are read from .csv, .json or .jsonl (not {table.file_format})")
    labels = []
    for row, where in zip(table.rows, table.locations, strict=True):
        for column in ("key", "label"):
            if column not in row:
                raise input_error(path, where, column, None, "is missing")
        if not str(row["label"] or "").strip():
            continue
        members = row.get("members") or []
        fields = {
            "key": str(row["key"]).strip(),
            "label": check_label(str(row["label"]), f"{path}:{where}: field 'label'"),
            "decision": row.get("decision") or "given",
            "members": members.split() if isinstance(members, str) else members,
        }
        try:
            labels.append(ThemeLabel.model_validate(fields))
        except ValidationError as err:
            raise validation_error(err, f"{path}:{where}") from None
    return labels


def file_rows(labels: Sequence[ThemeLabel]) -> list[dict[str, Any]]:
    """Labels as flat rows with ``FILE_COLUMNS`` (members space-separated), for CSV files and tables."""
    return [lab.model_dump() | {"n": len(lab.members), "members": " ".join(lab.members)} for lab in labels]


def labels_csv(labels: Sequence[ThemeLabel]) -> str:
    """``file_rows`` as CSV, what ``read_labels`` reads back."""
    out = io.StringIO()
    writer = csv.DictWriter(out, FILE_COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(file_rows(labels))
    return out.getvalue()


def labels_json(labels: Sequence[ThemeLabel]) -> str:
    """``{"labels": [...]}``, what ``read_labels`` reads back."""
    return json.dumps({"labels": [lab.model_dump() for lab in labels]}, indent=2) + "\n"


# --- into a report ------------------------------------------------------------------------------------------


def for_report(
    clusters: Sequence[Mapping[str, Any]], labels: Sequence[ThemeLabel]
) -> tuple[dict[str, Any], dict[int, str], list[ThemeLabel]]:
    """What a report needs of the labels on its map: the summary part (``match_summary``), the name of
    each labelled cluster for the map and table, and the labels re-keyed to this map's clusters with their
    members (``tables/themes_labels.csv``, which ``read_labels`` reads back for the next build)."""
    match = apply_labels(clusters, labels)
    members = {int(c["cluster"]): list(c["members"]) for c in clusters}
    rekeyed = [
        ThemeLabel(key=a.key, label=a.label, decision=a.decision, members=members[c])
        for c, a in sorted(match.applied.items())
    ]
    return match_summary(match), {c: a.label for c, a in match.applied.items()}, rekeyed
