"""The report's contract with the scripts that read it: which CSV tables ``assay star report`` writes, their
columns in order, and the top-level fields of ``summary.json``, under one ``SCHEMA_VERSION``.

The columns live in ``report_contract.json`` beside this module (and, with their meaning and test, in
docs/star-analysis.md). A change to any column (renamed, added, dropped, moved) is a new ``SCHEMA_VERSION``
with a line in ``NOTES``, a new contract file and the docs' note; ``check`` is what the test suite runs over
a report, so a column that changes without a bump fails it. ``conform`` gives a table with no rows its
contracted header, so a script finds the same columns whether a campaign is large or a pilot.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

import pandas as pd

SCHEMA_VERSION = 2
NOTES = {
    1: "the release before the clustered tests: in_group_annotation and red_team_success had the naive "
    "z-test as `z` and `p_value`; odds_ratios had no `measure`, `pooled`, `p_value` or `reason`; "
    "interactions had `lr`, `df`, a naive `p_value` and `skipped` only",
    2: "`p_value` is the default test that respects clustering (`statistic`, `df`, `method`, `n_clusters`); "
    "the naive test moved to `naive_z` / `naive_p`; `measure` (targeted or any rule) and `pooled` added; "
    "summary.json has `schema_version` and `settings`",
}
CONTRACT_FILE = Path(__file__).with_name("report_contract.json")
# When a conditional table is written: paper tests asked for, a participants table in the input, a map drawn.
CONDITIONS = ("always", "paper_tests", "participants", "themes")
SOURCE = "{source}"  # a contracted column standing for one column per data set on the map (count_{source})


@lru_cache(maxsize=1)
def contract() -> dict[str, Any]:
    """The committed contract: ``schema_version``, ``tables`` (name -> ``when`` and ``columns``) and
    ``summary`` (the top-level fields, and which are conditional)."""
    return json.loads(CONTRACT_FILE.read_text(encoding="utf-8"))


def conform(tables: Mapping[str, pd.DataFrame]) -> dict[str, pd.DataFrame]:
    """Tables with no columns (no rows to flatten) get their contracted header; the rest stay as built, so
    ``check`` still sees a column the code changed."""
    columns = {name: [c for c in t["columns"] if SOURCE not in c] for name, t in contract()["tables"].items()}
    return {
        name: pd.DataFrame(columns=columns[name]) if frame.columns.empty and name in columns else frame
        for name, frame in tables.items()
    }


def expected_tables(conditions: Sequence[str]) -> list[str]:
    """The tables a report built under ``conditions`` (besides ``always``) must write."""
    held = {"always", *conditions}
    return sorted(name for name, t in contract()["tables"].items() if t["when"] in held)


def check(
    tables: Mapping[str, Sequence[str]], summary: Mapping[str, Any], conditions: Sequence[str] = ()
) -> list[str]:
    """Every way a report's tables (name -> columns written) and summary differ from the contract, one line
    each, naming the table, the columns and what to do; empty when they agree."""
    found = contract()
    problems = []
    if found["schema_version"] != SCHEMA_VERSION or SCHEMA_VERSION not in NOTES:
        problems.append(
            f"SCHEMA_VERSION is {SCHEMA_VERSION} but {CONTRACT_FILE.name} describes version "
            f"{found['schema_version']}: write the new columns there, with a note in NOTES and in "
            "docs/star-analysis.md"
        )
    if summary.get("schema_version") != SCHEMA_VERSION:
        problems.append(
            f"summary.json schema_version is {summary.get('schema_version')!r}, not {SCHEMA_VERSION}"
        )
    contracted = found["tables"]
    for name in sorted(set(tables) | set(expected_tables(conditions))):
        if name not in contracted:
            problems.append(f"table {name} is not in the contract: a new table is a schema_version bump")
        elif name not in tables:
            problems.append(f"table {name} ({contracted[name]['when']}) was not written")
        else:
            written = _collapsed(list(tables[name]), contracted[name]["columns"])
            if written != contracted[name]["columns"]:
                problems.append(_column_change(name, written, contracted[name]["columns"]))
    keys = found["summary"]
    wanted = set(keys["always"]) | {k for k, when in keys["conditional"].items() if when in conditions}
    problems += _fields("summary.json", list(summary), wanted)
    for part in ("n", "settings"):
        problems += _fields(f"summary.json {part}", list(summary.get(part) or {}), set(keys[part]))
    return problems


def _fields(where: str, written: list[str], wanted: set[str]) -> list[str]:
    if set(written) == wanted:
        return []
    new, gone = sorted(set(written) - wanted), sorted(wanted - set(written))
    return [f"{where}: fields changed without a schema_version bump: new {new}, gone {gone}"]


def _collapsed(written: list[str], contracted: list[str]) -> list[str]:
    """``written`` with each run of per-data-set columns (``count_demo``, ``count_hh``) as its contracted
    pattern (``count_{source}``)."""
    prefixes = {c.split(SOURCE)[0]: c for c in contracted if SOURCE in c}
    out: list[str] = []
    for column in written:
        if column not in contracted:
            column = next((p for prefix, p in prefixes.items() if column.startswith(prefix)), column)
        if not out or out[-1] != column or SOURCE not in column:
            out.append(column)
    return out


def _column_change(name: str, written: list[str], contracted: list[str]) -> str:
    new = [c for c in written if c not in contracted]
    gone = [c for c in contracted if c not in written]
    what = f"new {new}, gone {gone}" if new or gone else "same columns in another order"
    return (
        f"table {name}: columns changed without a schema_version bump ({what}); if meant, bump "
        f"SCHEMA_VERSION in assay.star.analysis.contract with a note, and write these columns to "
        f"{CONTRACT_FILE.name}: {json.dumps(written)}"
    )
