"""Who took part, as counts only: the report's participants section (the seed paper's appendices report
demographics, expertise and hours the same way).

Input: the export's ``participants`` table, one row per pool member with no id or name (roles, expertise,
demographics, opted_out, tasks done by kind, hours). Output: counts of people per role, per declared
attribute value, per expertise tag, and per band of tasks done and of hours spent, with totals and medians.
Nothing per person leaves this module: a count of one is still a count, never a row.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import pandas as pd
from pydantic import BaseModel, ConfigDict

from assay.star.spec import PREFER_NOT_TO_SAY, CampaignSpec
from assay.store.enums import STAR_ROLES, TaskKind

NOT_STATED = "not stated"
NO_EXPERTISE = "none"
INF = float("inf")
Bands = tuple[tuple[str, float, float], ...]  # name, from (included), to (excluded)
TASK_BANDS: Bands = (
    *(("1", 1, 2), ("2-5", 2, 6), ("6-10", 6, 11), ("11-25", 11, 26)),
    *(("26-50", 26, 51), ("51-100", 51, 101), ("over 100", 101, INF)),
)
HOUR_BANDS: Bands = (
    *(("under 1 h", 0, 1), ("1-2 h", 1, 2), ("2-5 h", 2, 5)),
    *(("5-10 h", 5, 10), ("10-20 h", 10, 20), ("20 h or more", 20, INF)),
)


class ParticipantsSummary(BaseModel):
    """Counts of people; ``took_part`` are those with at least one finished task in the exported rows, and
    every count below is over them (the pool as recruited is only counted as a whole)."""

    model_config = ConfigDict(frozen=True)
    pool: int
    took_part: int
    opted_out: int
    roles: dict[str, int]
    # attribute -> value -> people; a person who declared several values counts under each
    demographics: dict[str, dict[str, int]]
    expertise: dict[str, int]
    tasks: dict[str, dict[str, int]]  # task kind -> band of tasks done -> people who did that kind
    hours: dict[str, int]  # band of hours -> people
    total_tasks: dict[str, int]
    total_hours: float
    median_tasks: float | None
    median_hours: float | None


def _column(frame: pd.DataFrame, name: str, default: Any) -> pd.Series:
    return (
        frame[name] if name in frame else pd.Series([default] * len(frame), index=frame.index, dtype=object)
    )


def _as_list(value: Any) -> list[str]:
    return [str(v) for v in value] if isinstance(value, list | tuple | np.ndarray) else []


def participants_summary(participants: pd.DataFrame, spec: CampaignSpec) -> ParticipantsSummary:
    """Count the people in an export's participants table (see the module docstring)."""
    kinds = [str(kind) for kind in TaskKind]
    done = pd.DataFrame(
        {k: pd.to_numeric(_column(participants, f"{k}_tasks", 0), errors="coerce").fillna(0) for k in kinds},
        index=participants.index,
    )
    hours = pd.to_numeric(_column(participants, "hours", 0.0), errors="coerce").fillna(0.0)
    active = done.sum(axis=1) > 0
    people = participants[active]
    demographics = _column(people, "demographics", None)
    counts: dict[str, dict[str, int]] = {}
    for attribute, values in spec.demographics.attributes.items():
        seen: Counter[str] = Counter()
        for declared in demographics:
            chosen = _as_list(declared.get(attribute)) if isinstance(declared, dict) else []
            seen.update(chosen or [NOT_STATED])
        counts[attribute] = {v: seen[v] for v in [*values, PREFER_NOT_TO_SAY, NOT_STATED] if seen[v]}
    expertise: Counter[str] = Counter()
    for tags in _column(people, "expertise", None):
        expertise.update(_as_list(tags) or [NO_EXPERTISE])
    roles: Counter[str] = Counter(r for listed in _column(people, "roles", None) for r in _as_list(listed))
    per_person = done[active].sum(axis=1)
    return ParticipantsSummary(
        pool=len(participants),
        took_part=int(active.sum()),
        opted_out=int(_column(participants, "opted_out", False).eq(True).sum()),
        roles={str(r): roles[str(r)] for r in STAR_ROLES},
        demographics=counts,
        expertise=dict(sorted(expertise.items())),
        tasks={k: _banded(done.loc[active & (done[k] > 0), k], TASK_BANDS) for k in kinds if done[k].any()},
        hours=_banded(hours[active], HOUR_BANDS),
        total_tasks={k: int(done[k].sum()) for k in kinds},
        total_hours=round(float(hours[active].sum()), 2),
        median_tasks=float(per_person.median()) if len(per_person) else None,
        median_hours=round(float(hours[active].median()), 2) if active.any() else None,
    )


def _banded(values: pd.Series, bands: Bands) -> dict[str, int]:
    """People per band, every band listed in order (zeros too), so tables line up across campaigns."""
    return {name: int(((values >= low) & (values < high)).sum()) for name, low, high in bands}


def participants_table(summary: ParticipantsSummary) -> pd.DataFrame:
    """The summary as one long CSV table: section, category, people (still counts only)."""
    rows = [("pool", "in the pool", summary.pool), ("pool", "took part", summary.took_part)]
    rows += [("pool", "opted out", summary.opted_out)]
    rows += [("role", role, n) for role, n in summary.roles.items()]
    rows += [
        (f"demographics: {a}", v, n) for a, values in summary.demographics.items() for v, n in values.items()
    ]
    rows += [("expertise", tag, n) for tag, n in summary.expertise.items()]
    rows += [
        (f"{kind} tasks done", band, n) for kind, bands in summary.tasks.items() for band, n in bands.items()
    ]
    rows += [("hours", band, n) for band, n in summary.hours.items()]
    return pd.DataFrame(rows, columns=["section", "category", "people"])
