"""Split a generated round into train, test and holdout, and write the sequestered view detectors are given.

The split is stratified: models are ordered by poisoned, then data set, architecture and trigger kind (the
groups at each level in an order shuffled by the seed, members shuffled too) and positions are dealt to the
splits by largest running deficit, so the round, the poisoned and clean models, and every nested group get
their share to within one model. The same round and seed give the same split. A round from elsewhere (NIST's
METADATA.csv, ``assay zoo import-nist``) is stratified by the strata columns it has, under our names or
NIST's (``source_dataset``, ``model_architecture``, ``trigger_type``); only the ground truth (``poisoned``
or NIST's ``ground_truth``) is required.

Layout written under ``OUT`` (by default ``DIR/splits``)::

    split.json                 fractions, seed, stratification columns, model -> split
    train/                     a full round (models with ground truth, METADATA.csv): what performers get
    test/, holdout/            full rounds: the organiser's answer keys
    test-sequestered/          what a detector may see: models/id-*/ with only model.pt,
    holdout-sequestered/       reduced-config.json and clean-example-data/

Model files are hard-linked from the round when the file system allows (no copies of the weights), else
copied. The whole ``OUT`` folder appears at once or not at all.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
from pathlib import Path

import numpy as np
from pydantic import BaseModel

from assay.errors import UserError, input_error
from assay.fileio import atomic_path

SPLITS: tuple[str, ...] = ("train", "test", "holdout")
SEQUESTERED: tuple[str, ...] = ("test", "holdout")
STRATA_COLUMNS: tuple[str, ...] = ("poisoned", "dataset", "architecture", "trigger_kind")
# Each stratum under the names it may carry: ours first, then NIST's (its METADATA.csv and summary CSVs).
STRATA_ALIASES: tuple[tuple[str, ...], ...] = (
    ("poisoned", "ground_truth"),
    ("dataset", "source_dataset"),
    ("architecture", "model_architecture"),
    ("trigger_kind", "trigger_type"),
)
TRUTH_COLUMNS: tuple[str, ...] = STRATA_ALIASES[0]
_TRUE = frozenset({"true", "1", "1.0"})
_FALSE = frozenset({"false", "0", "0.0"})
# What a detector may see of a model; the rest (ground truth, config, trigger) stays with the organiser.
VISIBLE_FILES: tuple[str, ...] = ("model.pt", "model.safetensors", "reduced-config.json")
VISIBLE_FOLDERS: tuple[str, ...] = ("clean-example-data",)


class SplitSummary(BaseModel):
    """What ``split_round`` wrote."""

    out_dir: str
    seed: int | None  # None: the assignment was given (NIST's), not drawn
    fractions: dict[str, float]
    counts: dict[str, int]
    poisoned: dict[str, int]
    assignment: dict[str, str]


def parse_truth(text: str | None) -> bool | None:
    """A ground-truth cell as a bool: ``True``/``False`` (ours, pandas'), ``1``/``0`` or ``1.0``/``0.0``
    (NIST's ``ground_truth``); None for anything else, so the caller names the bad value."""
    value = (text or "").strip().lower()
    return True if value in _TRUE else False if value in _FALSE else None


def truth_column(columns: list[str] | tuple[str, ...], path: Path) -> str:
    """The column holding the ground truth: ``poisoned``, else NIST's ``ground_truth``."""
    for name in TRUTH_COLUMNS:
        if name in columns:
            return name
    raise UserError(
        f"{path}:1: field 'poisoned' is missing from the header: a round needs its ground truth "
        "(a 'poisoned' or 'ground_truth' column)"
    )


def strata_of(columns: list[str] | tuple[str, ...], path: Path) -> list[str]:
    """The columns to stratify by: the ground truth, then each other stratum under the first name present."""
    strata = [truth_column(columns, path)]
    for names in STRATA_ALIASES[1:]:
        strata += [name for name in names if name in columns][:1]
    return strata


def read_metadata(round_dir: Path) -> list[dict[str, str]]:
    """The rows of ``round_dir/METADATA.csv``; a one-line ``UserError`` when it is missing or incomplete."""
    path = round_dir / "METADATA.csv"
    if not path.is_file():
        raise UserError(f"{path}: not found; is {round_dir} a round made by 'assay zoo generate'?")
    with path.open(newline="", encoding="utf-8-sig") as handle:
        reader = csv.DictReader(handle)
        columns = list(reader.fieldnames or [])
        rows = list(reader)
    if "model_name" not in columns:
        raise UserError(f"{path}:1: field 'model_name' is missing from the header")
    truth = truth_column(columns, path)
    seen: set[str] = set()
    for line, row in enumerate(rows, start=2):
        missing = [c for c in columns if row.get(c) is None]
        if missing:
            raise UserError(f"{path}:{line}: field '{missing[0]}' is missing")
        if parse_truth(row[truth]) is None:
            raise input_error(path, line, truth, row[truth], "must be True/False or 1/0")
        if row["model_name"] in seen:
            raise input_error(path, line, "model_name", row["model_name"], "repeats an earlier model")
        seen.add(row["model_name"])
        if not (round_dir / "models" / row["model_name"] / "model.pt").is_file():
            raise input_error(path, line, "model_name", row["model_name"], "names a model without model.pt")
    if not rows:
        raise UserError(f"{path}: lists no models")
    return rows


def _check_fractions(fractions: dict[str, float]) -> None:
    for name, value in fractions.items():
        if not 0.0 <= value <= 1.0:
            raise UserError(f"--{name} must be a share in [0, 1], got {value}")
    total = sum(fractions.values())
    if abs(total - 1.0) > 1e-9:
        raise UserError(f"--train, --test and --holdout must add up to 1, got {total:g}")


def assign_splits(
    rows: list[dict[str, str]],
    fractions: dict[str, float],
    seed: int,
    strata: list[str] | tuple[str, ...] = STRATA_COLUMNS,
) -> dict[str, str]:
    """Map each model name to a split, stratified by ``strata`` (nested, in that order) and reproducible
    from ``seed``."""
    rng = np.random.default_rng(np.random.SeedSequence([seed, len(rows)]))
    # Nested order: grouped by the first column, within that by the second, and so on, each level's groups
    # in a seeded random order; dealing a contiguous run gives every group at every level its share +-1.
    ranks = []
    for column in strata:
        values = sorted({row[column] for row in rows})
        ranks.append(dict(zip(values, rng.permutation(len(values)), strict=True)))
    ties = rng.permutation(len(rows))
    keyed = sorted(
        range(len(rows)),
        key=lambda i: (*(rank[rows[i][c]] for rank, c in zip(ranks, strata, strict=True)), ties[i]),
    )
    order = [rows[i]["model_name"] for i in keyed]
    names = list(fractions)
    share = np.array([fractions[n] for n in names])
    dealt = np.zeros(len(names))
    assignment: dict[str, str] = {}
    for position, model in enumerate(order, start=1):
        pick = int(np.argmax(share * position - dealt))  # ties go to the earlier split (train first)
        dealt[pick] += 1
        assignment[str(model)] = names[pick]
    return assignment


def link_or_copy(source: Path, target: Path) -> None:
    """Hard-link ``source`` as ``target`` (no second copy of the weights), or copy where links fail."""
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


def _copy_tree(
    source: Path, target: Path, files: tuple[str, ...] | None = None, folders: tuple[str, ...] | None = None
) -> None:
    """Hard-link ``source`` into ``target``: everything, or only the named files and folders."""
    target.mkdir(parents=True)
    for entry in sorted(source.iterdir()):
        if entry.is_dir():
            if folders is None or entry.name in folders:
                shutil.copytree(entry, target / entry.name, copy_function=link_or_copy)
        elif files is None or entry.name in files:
            link_or_copy(entry, target / entry.name)


def write_table(folder: Path, columns: list[str], rows: list[dict[str, str]]) -> None:
    """Write ``folder/METADATA.csv``: ``rows`` under ``columns``, in the zoo's CSV dialect."""
    with (folder / "METADATA.csv").open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns, lineterminator="\n", extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)


def write_split(
    round_dir: Path,
    rows: list[dict[str, str]],
    assignment: dict[str, str],
    out: Path,
    seed: int | None,
    fractions: dict[str, float] | None = None,
    strata: list[str] | None = None,
) -> SplitSummary:
    """Write the split layout under ``out`` (all at once or not at all) for ``assignment`` (model -> split).

    Each split's METADATA.csv holds the round's own rows for its models, so columns of any origin (the zoo's,
    NIST's) pass through unchanged. ``seed`` None and ``fractions`` None: an assignment given rather than
    drawn (``assay zoo import-nist``); ``split.json`` then records the shares it has.
    """
    if out.exists():
        raise UserError(f"{out}: already exists; remove it or choose another --out")
    columns = [c for c in rows[0] if c is not None]  # None: extra fields of a ragged row
    truth = truth_column(columns, round_dir / "METADATA.csv")
    poisoned_of = {row["model_name"]: bool(parse_truth(row[truth])) for row in rows}
    members = {name: sorted(m for m, s in assignment.items() if s == name) for name in SPLITS}
    if fractions is None:
        fractions = {name: round(len(models) / len(assignment), 6) for name, models in members.items()}
    dictionary = round_dir / "METADATA_DICTIONARY.csv"
    with atomic_path(out) as tmp:
        tmp.mkdir()
        for name, models in members.items():
            for model in models:
                source = round_dir / "models" / model
                _copy_tree(source, tmp / name / "models" / model)
                if name in SEQUESTERED:
                    view = tmp / f"{name}-sequestered" / "models" / model
                    _copy_tree(source, view, VISIBLE_FILES, VISIBLE_FOLDERS)
            if name in SEQUESTERED:
                (tmp / f"{name}-sequestered" / "models").mkdir(parents=True, exist_ok=True)
            (tmp / name / "models").mkdir(parents=True, exist_ok=True)
            chosen = set(models)
            write_table(tmp / name, columns, [row for row in rows if row["model_name"] in chosen])
            if dictionary.is_file():
                shutil.copy2(dictionary, tmp / name / dictionary.name)
        summary = SplitSummary(
            out_dir=str(out),
            seed=seed,
            fractions=fractions,
            counts={name: len(models) for name, models in members.items()},
            poisoned={name: sum(poisoned_of[m] for m in models) for name, models in members.items()},
            assignment=dict(sorted(assignment.items())),
        )
        payload = {**summary.model_dump(exclude={"out_dir"}), "strata_columns": strata}
        (tmp / "split.json").write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    return summary


def split_round(
    round_dir: str | Path, fractions: dict[str, float], seed: int = 0, out_dir: str | Path | None = None
) -> SplitSummary:
    """Split ``round_dir`` into ``fractions`` (keys train, test, holdout) and write the layout above."""
    round_dir = Path(round_dir)
    _check_fractions(fractions)
    rows = read_metadata(round_dir)
    out = Path(out_dir) if out_dir is not None else round_dir / "splits"
    if out.exists():
        raise UserError(f"{out}: already exists; remove it or choose another --out")
    strata = strata_of(list(rows[0]), round_dir / "METADATA.csv")
    # The ground truth by its meaning, not its spelling: "1" and "True" are one stratum.
    keyed = [{**row, strata[0]: str(parse_truth(row[strata[0]]))} for row in rows]
    assignment = assign_splits(keyed, fractions, seed, strata)
    return write_split(round_dir, rows, assignment, out, seed, fractions, strata)
