"""How hard a round is before it opens: the baseline detectors, cross-validated on its training split.

Each baseline runs through its own TrojAI command line, as a performer's would: ``configure
--automatic_configuration`` on the training split, in a scratch copy of the detector. A learned baseline
(``meta_classifier``, ``text_meta``) records every training model's out-of-fold probability in its learned
parameters (``cross_validation.out_of_fold``); a baseline that learns nothing from the models (``constant``)
has ``infer`` run on each. Those probabilities are scored with ``assay.stats`` (NIST's cross entropy and its
95% half-width, ROC-AUC with Hanley and McNeil's half-width) over the whole split and per factor:

- ``architecture``: every model of that architecture;
- ``trigger_kind``, ``poison_fraction`` (below or above the split's median), ``source_specific``: the
  trojaned models with that value and every clean model, so each group has both classes and an AUC.

The out-of-fold probabilities come from the folds that chose the regularisation, so they are slightly
optimistic; the report orders rounds, it does not predict a test score to the second decimal.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
from pydantic import BaseModel

from assay.errors import UserError
from assay.stats.detection import cross_entropy, cross_entropy_ci, roc_auc, roc_auc_ci
from assay.zoo.split import parse_truth, read_metadata, truth_column

TEXT_BASELINES = ("constant", "text_meta")
IMAGE_BASELINES = ("constant", "meta_classifier")
# Our METADATA column, then NIST's name for the same factor.
FACTOR_COLUMNS: dict[str, tuple[str, ...]] = {
    "architecture": ("architecture", "model_architecture"),
    "trigger_kind": ("trigger_kind", "trigger_type"),
    "poison_fraction": ("poison_fraction", "triggered_fraction"),
    "source_specific": ("source_class", "trigger_source_class"),
}


class Cell(BaseModel):
    """One detector's scores on one group of the training split."""

    detector: str
    factor: str
    value: str
    models: int
    trojaned: int
    cross_entropy: float
    cross_entropy_ci: float
    roc_auc: float | None
    roc_auc_ci: float | None


class DifficultyReport(BaseModel):
    """What ``difficulty`` measured on a round's training split."""

    round: str
    training_split: str
    models: int
    trojaned: int
    cells: list[Cell]

    def overall(self, detector: str) -> Cell:
        """The detector's scores over the whole training split."""
        return next(c for c in self.cells if c.detector == detector and c.factor == "all")


def training_split(round_dir: Path) -> Path:
    """The folder whose models a performer configures on: ``splits/train``, ``train`` or the round itself."""
    for candidate in (round_dir / "splits" / "train", round_dir / "train", round_dir):
        if (candidate / "METADATA.csv").is_file() and (candidate / "models").is_dir():
            return candidate
    raise UserError(f"{round_dir}: no training split (splits/train/, train/ or a round with METADATA.csv)")


def default_baselines(rows: list[dict[str, str]], detectors_dir: Path) -> list[Path]:
    """The baselines for the round's domain (text when its data set is text), found in ``detectors_dir``."""
    from assay.zoo.textdata import TEXT_DATASETS

    datasets = {r.get("dataset") or r.get("source_dataset") or "" for r in rows}
    names = TEXT_BASELINES if datasets and datasets <= set(TEXT_DATASETS) else IMAGE_BASELINES
    found = [detectors_dir / name for name in names]
    missing = [p for p in found if not (p / "entrypoint.py").is_file()]
    if missing:
        raise UserError(f"{missing[0]}: no baseline detector here (entrypoint.py); pass --detectors-dir")
    return found


def _command(detector: Path, mode: str, options: dict[str, Path]) -> list[str]:
    """The TrojAI command line of ``detector`` in ``mode`` with its own metaparameters and schema."""
    options = {
        **options,
        "metaparameters_filepath": detector / "metaparameters.json",
        "schema_filepath": detector / "metaparameters_schema.json",
    }
    argv = [sys.executable, str(detector / "entrypoint.py"), mode]
    return argv + [part for name, path in options.items() for part in (f"--{name}", str(path))]


def _run(argv: list[str], detector: Path) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise UserError(f"{detector}: {argv[2]} failed (exit {done.returncode}): {last}")


def held_out(detector: Path, split: Path, names: list[str], scratch: Path) -> dict[str, float]:
    """Each training model's probability from ``detector`` without having learned from that model."""
    copy = scratch / detector.name
    shutil.copytree(detector, copy)
    learned = copy / "learned_parameters"
    learned.mkdir(exist_ok=True)
    options = {"scratch_dirpath": scratch / "work", "learned_parameters_dirpath": learned}
    _run(
        [
            *_command(copy, "configure", {**options, "configure_models_dirpath": split}),
            "--automatic_configuration",
        ],
        copy,
    )
    for path in sorted(learned.glob("*.json")):
        record = json.loads(path.read_text(encoding="utf-8"))
        if isinstance(record, dict) and "cross_validation" in record:
            found = record["cross_validation"].get("out_of_fold")
            if not found:  # it learned from the models but could not hold any out: its answers would flatter
                raise UserError(
                    f"{split}: too few models for {detector.name} to cross-validate (2 of each class)"
                )
            return {name: float(found[name]) for name in names}
    answers = {}
    for name in names:  # learned nothing from the models: its answers on them are already held out
        model = split / "models" / name
        result = scratch / f"{name}.txt"
        infer = {**options, "model_filepath": model / "model.pt", "result_filepath": result}
        _run(_command(copy, "infer", {**infer, "examples_dirpath": model / "clean-example-data"}), copy)
        answers[name] = float(result.read_text(encoding="utf-8"))
    return answers


def _column(rows: list[dict[str, str]], factor: str) -> str | None:
    return next((c for c in FACTOR_COLUMNS[factor] if rows and c in rows[0]), None)


def factor_groups(rows: list[dict[str, str]], truth: list[bool]) -> list[tuple[str, str, np.ndarray]]:
    """(factor, value, mask) for the whole split and every factor value the split holds."""
    groups = [("all", "all", np.ones(len(rows), dtype=bool))]
    clean = ~np.asarray(truth)
    column = _column(rows, "architecture")
    if column:
        for value in sorted({r[column] for r in rows}):
            groups.append(("architecture", value, np.asarray([r[column] == value for r in rows])))
    trojaned_values: dict[str, Callable[[dict[str, str]], str]] = {}
    if column := _column(rows, "trigger_kind"):
        trojaned_values["trigger_kind"] = lambda r, c=column: r[c]
    if column := _column(rows, "source_specific"):
        trojaned_values["source_specific"] = lambda r, c=column: "yes" if r[c] not in ("", "None") else "no"
    if column := _column(rows, "poison_fraction"):
        median = float(np.median([float(r[column]) for r, t in zip(rows, truth, strict=True) if t]))
        trojaned_values["poison_fraction"] = lambda r, c=column: (
            ("<= " if float(r[c]) <= median else "> ") + f"{median:.3g}"
        )
    for factor, value_of in trojaned_values.items():
        values = [value_of(r) if t else None for r, t in zip(rows, truth, strict=True)]
        for value in sorted({v for v in values if v is not None}):
            groups.append((factor, value, clean | np.asarray([v == value for v in values])))
    return groups


def _cell(detector: str, factor: str, value: str, y: np.ndarray, p: np.ndarray) -> Cell:
    auc = roc_auc(y, p)
    return Cell(
        detector=detector,
        factor=factor,
        value=value,
        models=len(y),
        trojaned=int(y.sum()),
        cross_entropy=cross_entropy(y, p),
        cross_entropy_ci=cross_entropy_ci(y, p),
        roc_auc=None if np.isnan(auc) else auc,
        roc_auc_ci=None if np.isnan(auc) else roc_auc_ci(y, p),
    )


def difficulty(
    round_dir: str | Path, detectors: list[Path] | None = None, detectors_dir: Path = Path("detectors")
) -> DifficultyReport:
    """Run the baselines on ``round_dir``'s training split by cross-validation and score them per factor."""
    round_dir = Path(round_dir)
    split = training_split(round_dir)
    rows = read_metadata(split)
    column = truth_column(list(rows[0]), split / "METADATA.csv")
    truth = [bool(parse_truth(r[column])) for r in rows]
    if len(set(truth)) < 2:
        raise UserError(f"{split / 'METADATA.csv'}: the training split needs clean and trojaned models")
    names = [r["model_name"] for r in rows]
    y = np.asarray(truth, dtype=np.float64)
    cells = []
    for detector in detectors or default_baselines(rows, detectors_dir):
        with tempfile.TemporaryDirectory(prefix="assay-difficulty-") as scratch:
            answers = held_out(detector, split, names, Path(scratch))
        p = np.asarray([answers[n] for n in names])
        cells += [_cell(detector.name, f, v, y[m], p[m]) for f, v, m in factor_groups(rows, truth)]
    return DifficultyReport(
        round=str(round_dir), training_split=str(split), models=len(rows), trojaned=int(y.sum()), cells=cells
    )
