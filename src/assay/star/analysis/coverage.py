"""Design coverage of a STAR campaign: how the collected dialogues spread over rules, instruction parameters,
target groups and intersections, compared with the planned design.

Planned counts are the instructions (the design), achieved counts the dialogues collected from them. The
chi-square compares achieved *proportions* with planned ones, so a campaign that is uniformly half done still
fits perfectly; the shortfall of a cell is likewise measured against its planned share of what was achieved.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
from pydantic import BaseModel, ConfigDict
from scipy import stats

from assay.star.analysis.groups import parse_group_label

CHI2_TEST = "chi-square goodness of fit, achieved vs planned proportions (scipy.stats.chisquare)"


class CoverageCell(BaseModel):
    """One design cell: planned instructions, achieved dialogues, and the expected count under the plan."""

    model_config = ConfigDict(frozen=True)
    value: str
    planned: int
    achieved: int
    expected: float
    shortfall: float


class CoverageTable(BaseModel):
    """Coverage along one dimension (rule, a parameter, group or intersection)."""

    model_config = ConfigDict(frozen=True)
    dimension: str
    cells: list[CoverageCell]
    n_planned: int
    n_achieved: int
    evenness: float | None
    chi2: float | None
    df: int | None
    p_value: float | None
    biggest_shortfall: list[str]
    test: str = CHI2_TEST
    evenness_measure: str = "Shannon entropy of achieved counts / log(number of planned cells)"
    reason: str = ""


def evenness(counts: np.ndarray) -> float | None:
    """Normalised Shannon entropy (Pielou's J): 1 when every cell has the same count, towards 0 when one
    cell has everything; None for fewer than 2 cells or no counts, where evenness means nothing."""
    counts = np.asarray(counts, dtype=float)
    total = counts.sum()
    if counts.size < 2 or total <= 0:
        return None
    p = counts[counts > 0] / total
    return float(-(p * np.log(p)).sum() / math.log(counts.size))


def _parameters(value: object) -> dict:
    """Instruction parameters as a dict; Parquet exports store them as JSON strings."""
    if isinstance(value, str):
        return json.loads(value)
    return dict(value) if isinstance(value, dict) else {}


def _cells(planned: pd.Series, achieved: pd.Series) -> list[CoverageCell]:
    """Join planned and achieved counts per value; expected = planned share x achieved total."""
    values = sorted(set(planned.index) | set(achieved.index), key=str)
    n_planned, n_achieved = int(planned.sum()), int(achieved.sum())
    found = []
    for value in values:
        p, a = int(planned.get(value, 0)), int(achieved.get(value, 0))
        expected = p / n_planned * n_achieved if n_planned else 0.0
        found.append(
            CoverageCell(value=str(value), planned=p, achieved=a, expected=expected, shortfall=expected - a)
        )
    return found


def coverage_table(dimension: str, planned: pd.Series, achieved: pd.Series, top: int = 3) -> CoverageTable:
    """Counts, evenness, chi-square and the ``top`` cells furthest below their planned share."""
    cells = _cells(planned, achieved)
    n_planned, n_achieved = int(planned.sum()), int(achieved.sum())
    planned_cells = [c for c in cells if c.planned > 0]
    short = sorted((c for c in cells if c.shortfall > 1e-9), key=lambda c: -c.shortfall)[:top]
    base = dict(
        dimension=dimension,
        cells=cells,
        n_planned=n_planned,
        n_achieved=n_achieved,
        evenness=evenness(np.array([c.achieved for c in planned_cells])),
        biggest_shortfall=[c.value for c in short],
    )
    reason = _chi2_skip(cells, planned_cells, n_achieved)
    if reason:
        return CoverageTable(chi2=None, df=None, p_value=None, reason=reason, **base)
    observed = np.array([c.achieved for c in planned_cells], dtype=float)
    expected = np.array([c.expected for c in planned_cells])
    chi2, p = stats.chisquare(observed, expected)
    return CoverageTable(chi2=float(chi2), df=len(planned_cells) - 1, p_value=float(p), **base)


def _chi2_skip(cells: list[CoverageCell], planned_cells: list[CoverageCell], n_achieved: int) -> str:
    """Why the goodness-of-fit test cannot run, or '' if it can."""
    if len(planned_cells) < 2:
        return "fewer than 2 planned cells"
    if n_achieved == 0:
        return "no dialogues collected"
    if any(c.planned == 0 and c.achieved > 0 for c in cells):
        return "dialogues in a cell the design did not plan"
    return ""


def _with_instruction(dialogues: pd.DataFrame, instructions: pd.DataFrame) -> pd.DataFrame:
    """Dialogues with their instruction's parameters (dialogues carry only the instruction id)."""
    cols = instructions[["id", "parameters"]].rename(columns={"id": "instruction_id"})
    return dialogues.merge(cols, on="instruction_id", how="left")


def _parameter_counts(frame: pd.DataFrame) -> dict[str, pd.Series]:
    """Per parameter name, counts of each value."""
    params = pd.DataFrame([_parameters(v) for v in frame["parameters"]], index=frame.index)
    return {name: params[name].dropna().astype(str).value_counts() for name in params.columns}


def _group_kind(label: str) -> str:
    """Single-attribute targets and intersections are separate designs, so they get separate tables."""
    return "intersection" if len(parse_group_label(label)) >= 2 else "group"


def _group_counts(frame: pd.DataFrame, kind: str) -> pd.Series:
    """Counts per target label of one kind; untargeted rows (empty label) are not part of the group design."""
    labels = frame["group_label"].fillna("").astype(str)
    labels = labels[labels.ne("")]
    return labels[labels.map(_group_kind) == kind].value_counts()


def coverage(instructions: pd.DataFrame, dialogues: pd.DataFrame, top: int = 3) -> list[CoverageTable]:
    """Section 3: coverage per rule, per parameter, per single-attribute group and per intersection."""
    achieved = _with_instruction(dialogues.drop(columns=["parameters"], errors="ignore"), instructions)
    tables = [
        coverage_table(
            "rule", instructions["rule_id"].value_counts(), achieved["rule_id"].value_counts(), top
        )
    ]
    planned_params, achieved_params = _parameter_counts(instructions), _parameter_counts(achieved)
    for name in sorted(planned_params):
        got = achieved_params.get(name, pd.Series(dtype=int))
        tables.append(coverage_table(f"parameter:{name}", planned_params[name], got, top))
    for kind in ("group", "intersection"):
        planned = _group_counts(instructions, kind)
        if not planned.empty:
            tables.append(coverage_table(kind, planned, _group_counts(achieved, kind), top))
    return tables
