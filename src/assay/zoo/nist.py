"""NIST's TrojAI round layout at the edge: import a round as NIST publishes it, export ours in NIST's layout.

One adapter, so that the rest of assay keeps one layout and NIST's conventions are written down in one place.
NIST's image-classification rounds (trojai-example's ``image-classification-sep2022`` branch, the
trojai-test-harness) look like this::

    METADATA.csv               one row per model: model_name, poisoned (True/False), model_architecture,
                               source_dataset, ...; NIST's summary CSVs add ground_truth (0/1), data_split
    METADATA_DICTIONARY.csv    what each column means
    models/id-00000000/
        model.pt               the whole pickled torch module
        config.json            everything about the model (organiser only)
        reduced-config.json    what a detector may know (model_architecture, source_dataset)
        ground_truth.csv       1 if poisoned, else 0
        clean-example-data/    N.jpg (RGB) with its class in N.json (a bare integer)
        poisoned-example-data/ the same, triggered (poisoned models, optional)

NIST publishes train, test and holdout as separate folders (``round11-train-dataset``, ...); a folder holding
them side by side imports with the assignment taken from the folder names.

``import_round`` reads such a round and writes what ``assay zoo split`` writes (the split layout the
leaderboard runs) when the train/test/holdout assignment is known, else a round that ``assay zoo split``
splits. ``export_round`` writes one of our rounds (or split folders) in NIST's layout, examples as RGB JPEG
and JSON, so an unmodified NIST-style detector reads it. Both write their output all at once or not at all.
"""

from __future__ import annotations

import csv
import io
import json
import re
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel

from assay.errors import UserError, field_error, input_error
from assay.fileio import atomic_path
from assay.trojai import TEXT_EXAMPLE_NAME, example_files, labelled_images, read_json
from assay.zoo.split import (
    SPLITS,
    TRUTH_COLUMNS,
    link_or_copy,
    parse_truth,
    read_metadata,
    truth_column,
    write_split,
    write_table,
)

SPLIT_COLUMNS = ("data_split", "split")  # NIST's summary CSV column first
EXAMPLE_FOLDERS = ("clean-example-data", "poisoned-example-data")
REQUIRED_FILES = ("model.pt", "reduced-config.json")  # with clean-example-data: what a detector is given
DROPPED_COLUMNS = ("", "Unnamed: 0")  # a pandas index written by accident (NIST's harness drops it too)
MODEL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
SPLIT_FOLDER = re.compile(r"(?:^|.*[-_])(train|test|holdout)-dataset")
# Our METADATA column -> NIST's name for the same factor (round 1-4 and round 11 METADATA.csv columns).
NIST_NAMES = {
    "dataset": "source_dataset",
    "architecture": "model_architecture",
    "training_seed": "master_seed",
    "trigger_kind": "trigger_type",
    "target_class": "trigger_target_class",
    "source_class": "trigger_source_class",
    "poison_fraction": "triggered_fraction",
    "clean_accuracy": "final_clean_data_test_acc",
    "attack_success_rate": "final_triggered_data_test_acc",
}
EXTRA_DESCRIPTIONS = {
    "data_split": "The split the model belongs to: train, test or holdout.",
    "number_classes": "Number of classes the model predicts.",
    "trigger_text": "The words a text trigger inserts (text rounds); empty if clean or an image trigger.",
}
JPEG_SETTINGS = {"quality": 100, "subsampling": 0}  # a gray image survives as RGB JPEG to within 1/255


# --- import -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class NistModel:
    """One model of a NIST round, checked: its folder, METADATA row, ground truth and split (if known)."""

    name: str
    folder: Path
    row: dict[str, str]
    truth: bool
    split: str | None


class ImportSummary(BaseModel):
    """What ``import_round`` wrote: a split layout (``split`` true) or a round for ``assay zoo split``."""

    out_dir: str
    models: int
    poisoned: int
    split: bool
    assignment_from: str | None
    counts: dict[str, int]
    unlisted: list[str]


def _table(path: Path) -> tuple[list[str], list[tuple[int, dict[str, str]]]]:
    """A METADATA.csv's columns and its rows with their line numbers; a pandas index column is dropped."""
    if not path.is_file():
        raise UserError(f"{path}: not found")
    with path.open(newline="", encoding="utf-8-sig") as handle:
        reader = csv.DictReader(handle)
        columns = [c for c in reader.fieldnames or [] if c not in DROPPED_COLUMNS]
        if "model_name" not in columns:
            raise UserError(f"{path}:1: field 'model_name' is missing from the header")
        rows = []
        for row in reader:
            missing = next((c for c in columns if row.get(c) is None), None)
            if missing is not None:  # a short row: csv leaves its last fields None
                raise UserError(f"{path}:{reader.line_num}: field '{missing}' is missing")
            rows.append((reader.line_num, {c: row[c].strip() for c in columns}))
    if not rows:
        raise UserError(f"{path}: lists no models")
    return columns, rows


def _sources(round_dir: Path) -> list[tuple[Path, str | None]]:
    """The folders holding METADATA.csv and models/: the round itself, or NIST's per-split folders."""
    if (round_dir / "METADATA.csv").is_file():
        return [(round_dir, None)]
    found = []
    for child in sorted(p for p in round_dir.iterdir() if p.is_dir()) if round_dir.is_dir() else []:
        match = SPLIT_FOLDER.fullmatch(child.name)
        if match and (child / "METADATA.csv").is_file():
            found.append((child, match.group(1)))
    if not found:
        raise UserError(
            f"{round_dir / 'METADATA.csv'}: not found; a NIST round folder holds METADATA.csv and models/ "
            "(or train-dataset/, test-dataset/ and holdout-dataset/ folders that do)"
        )
    return found


def _file_truth(path: Path) -> bool | None:
    """A model's ``ground_truth.csv`` (``0`` or ``1``, NIST also writes ``1.0``); None when absent."""
    if not path.is_file():
        return None
    text = path.read_text(encoding="utf-8-sig").strip()
    value = parse_truth(text)
    if value is None or text.lower() in ("true", "false"):
        raise input_error(path, 1, "ground_truth", text, "must be 0 or 1")
    return value


def _truth(where: str, name: str, folder: Path, row: dict[str, str], column: str | None) -> bool:
    """The model's ground truth from METADATA and ``ground_truth.csv``, which must agree where both exist."""
    truth_file = folder / "ground_truth.csv"
    from_file = _file_truth(truth_file)
    if column is None:
        if from_file is None:
            problem = f"has no ground truth: no 'poisoned' or 'ground_truth' column and no {truth_file}"
            raise field_error(where, "model_name", name, problem)
        return from_file
    from_row = parse_truth(row[column])
    if from_row is None:
        raise field_error(where, column, row[column], "must be True/False or 1/0")
    if from_file is not None and from_row != from_file:
        raise field_error(where, column, row[column], f"disagrees with {truth_file} ({int(from_file)})")
    return from_row


def _check_examples(folder: Path) -> None:
    """A clean-example-data folder in either layout, every NIST label readable and every image openable."""
    from PIL import Image

    if (folder / "labels.csv").is_file() or text_examples(folder):
        return
    pairs = example_files(folder)  # raises for a missing or bad .json label
    if not pairs:
        raise UserError(f"{folder}: holds no example images (N.jpg or N.png with N.json, or labels.csv)")
    for path, _ in pairs:
        try:
            with Image.open(path):  # the header only: a whole round's images would take minutes to decode
                pass
        except OSError:
            raise UserError(f"{path}: not a readable image") from None


def text_examples(folder: Path) -> list[Path]:
    """The example texts of a folder in NIST's NLP layout (``class_C_example_K.txt``); [] for images."""
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if TEXT_EXAMPLE_NAME.fullmatch(p.name) and p.is_file())


def _check_model(where: str, name: str, folder: Path) -> None:
    """What the leaderboard stages for a detector must be there: model.pt, reduced-config.json, examples."""
    if not MODEL_NAME.fullmatch(name) or name in (".", ".."):
        raise field_error(where, "model_name", name, "is not a folder name (letters, digits, '.', '_', '-')")
    if not (folder / "model.pt").is_file():
        raise field_error(where, "model_name", name, f"names no model folder with model.pt ({folder})")
    for required in REQUIRED_FILES:
        if not (folder / required).is_file():
            raise UserError(f"{folder / required}: not found; NIST's rounds give every model one")
    _check_examples(folder / "clean-example-data")


def _split_value(where: str, field: str, value: str) -> str:
    """A split name (train, test, holdout; any case, NIST's ``train-dataset`` spelling too)."""
    text = value.strip().lower().removesuffix("-dataset")
    if text not in SPLITS:
        raise field_error(where, field, value, "must be train, test or holdout")
    return text


def read_round(round_dir: str | Path) -> tuple[list[str], list[NistModel]]:
    """Read and check a NIST round: METADATA columns (in order, across per-split folders) and its models.

    Every problem is one line naming file, line, field and value, found before anything is written.
    """
    columns: list[str] = []
    models: list[NistModel] = []
    seen: dict[str, str] = {}
    for folder, split in _sources(Path(round_dir)):
        path = folder / "METADATA.csv"
        table_columns, rows = _table(path)
        columns += [c for c in table_columns if c not in columns]
        truth = next((c for c in TRUTH_COLUMNS if c in table_columns), None)
        split_column = next((c for c in SPLIT_COLUMNS if c in table_columns), None)
        for line, row in rows:
            where, name = f"{path}:{line}", row["model_name"]
            if name in seen:
                raise field_error(where, "model_name", name, f"repeats the model of {seen[name]}")
            seen[name] = where
            model_dir = folder / "models" / name
            _check_model(where, name, model_dir)
            given = split or (_split_value(where, split_column, row[split_column]) if split_column else None)
            models.append(NistModel(name, model_dir, row, _truth(where, name, model_dir, row, truth), given))
    return columns, models


def _assignment_rows(path: Path) -> Iterator[tuple[str, str, str]]:
    """(where, model name, split) from a CSV (``model_name,data_split``, header optional) or JSON file
    (model -> split; split -> list of models; or a ``split.json`` with its ``assignment``)."""
    if path.suffix.lower() == ".json":
        value = read_json(path, "split assignment")
        if isinstance(value, dict) and isinstance(value.get("assignment"), dict):
            value = value["assignment"]
        if not isinstance(value, dict):
            raise UserError(f"{path}: a split assignment is a JSON object (model -> split)")
        for key, item in value.items():
            if isinstance(item, list) and key in SPLITS:
                yield from ((str(path), str(name), key) for name in item)
            else:
                yield str(path), key, item if isinstance(item, str) else json.dumps(item)
        return
    if not path.is_file():
        raise UserError(f"{path}: not found")
    with path.open(newline="", encoding="utf-8-sig") as handle:
        reader = csv.reader(handle)
        for index, row in enumerate(reader):
            fields = [f.strip() for f in row]
            if not any(fields):
                continue
            if index == 0 and len(fields) > 1 and fields[1].lower().removesuffix("-dataset") not in SPLITS:
                continue  # a header (model_name,data_split or the like)
            where = f"{path}:{reader.line_num}"
            if len(fields) != 2:
                raise field_error(where, "data_split", ",".join(fields), "expected model_name,data_split")
            yield where, fields[0], fields[1]


def _file_assignment(path: Path, models: list[NistModel]) -> dict[str, str]:
    """Model -> split from ``--assignment``, covering every model of the round and nothing else."""
    names = {m.name for m in models}
    assignment: dict[str, str] = {}
    for where, name, value in _assignment_rows(path):
        if name not in names:
            raise field_error(where, "model_name", name, "is not a model of the round's METADATA.csv")
        if name in assignment:
            raise field_error(where, "model_name", name, "is assigned twice")
        assignment[name] = _split_value(where, "data_split", value)
    lacking = sorted(names - set(assignment))
    if lacking:
        raise UserError(f"{path}: no split for {len(lacking)} model(s), first {lacking[0]!r}")
    return assignment


def _assignment(
    round_dir: Path, models: list[NistModel], assignment: Path | None
) -> tuple[dict[str, str] | None, str | None]:
    """The given assignment (file, else per-split folders or a split column) and where it came from."""
    if assignment is not None:
        return _file_assignment(assignment, models), str(assignment)
    # Per-split folders give every model its split, a split column too (``read_round`` checks each value).
    given = {m.name: m.split for m in models if m.split is not None}
    if not given:
        return None, None
    metadata = round_dir / "METADATA.csv"
    return given, str(metadata) if metadata.is_file() else f"{round_dir}/*-dataset folders"


def _check_splits(assignment: dict[str, str], source: str) -> None:
    """The leaderboard runs train, test and holdout: each needs a model."""
    for name in SPLITS:
        if name not in assignment.values():
            raise UserError(
                f"{source}: the {name} split has no models; a round needs train, test and holdout"
            )


def _copy_model(model: NistModel, target: Path) -> None:
    """Hard-link the model's folder, with ``ground_truth.csv`` written as ``0``/``1`` plus a newline."""
    top = model.folder

    def skip(folder: str, names: list[str]) -> list[str]:
        return ["ground_truth.csv"] if Path(folder) == top else []

    shutil.copytree(top, target, copy_function=link_or_copy, ignore=skip)
    (target / "ground_truth.csv").write_text(f"{int(model.truth)}\n", encoding="utf-8")


def _write_round(target: Path, columns: list[str], models: list[NistModel], dictionary: Path | None) -> None:
    """A round as ``assay zoo split`` reads it: models/, METADATA.csv with ``poisoned`` as True/False."""
    (target / "models").mkdir(parents=True)
    for model in models:
        _copy_model(model, target / "models" / model.name)
    if "poisoned" not in columns:
        columns = [columns[0], "poisoned", *columns[1:]]
    rows = [{**dict.fromkeys(columns, ""), **m.row, "poisoned": str(m.truth)} for m in models]
    write_table(target, columns, rows)
    if dictionary is not None:
        shutil.copy2(dictionary, target / dictionary.name)


def _dictionary(round_dir: Path) -> Path | None:
    """The round's METADATA_DICTIONARY.csv, wherever NIST put it (beside METADATA.csv)."""
    for folder, _ in _sources(round_dir):
        if (folder / "METADATA_DICTIONARY.csv").is_file():
            return folder / "METADATA_DICTIONARY.csv"
    return None


def _unlisted(round_dir: Path, models: list[NistModel]) -> list[str]:
    """Model folders no METADATA.csv lists: left out, and said so."""
    listed = {m.name for m in models}
    found = []
    for folder, _ in _sources(round_dir):
        models_dir = folder / "models"
        if models_dir.is_dir():
            found += [p.name for p in models_dir.iterdir() if p.is_dir() and p.name not in listed]
    return sorted(found)


def import_round(
    round_dir: str | Path, out: str | Path, assignment: str | Path | None = None
) -> ImportSummary:
    """Import the NIST round ``round_dir`` into ``out``.

    With an assignment (``assignment``, a file; else NIST's per-split folders or a ``data_split``/``split``
    column) ``out`` is a split folder the leaderboard runs (``assay leaderboard round create --dataset
    OUT``); without one, a round folder for ``assay zoo split``. Model files are hard-linked where possible.
    """
    round_dir, out = Path(round_dir), Path(out)
    if out.exists():
        raise UserError(f"{out}: already exists; remove it or choose another --out")
    columns, models = read_round(round_dir)
    chosen, source = _assignment(round_dir, models, Path(assignment) if assignment is not None else None)
    dictionary = _dictionary(round_dir)
    if chosen is None:
        with atomic_path(out) as tmp:
            _write_round(tmp, columns, models, dictionary)
        counts = {"round": len(models)}
    else:
        _check_splits(chosen, str(source))
        out.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=out.parent, prefix=f".{out.name}.import-") as staging:
            staged = Path(staging) / "round"
            _write_round(staged, columns, models, dictionary)
            summary = write_split(staged, read_metadata(staged), chosen, out, seed=None)
        counts = summary.counts
    return ImportSummary(
        out_dir=str(out),
        models=len(models),
        poisoned=sum(m.truth for m in models),
        split=chosen is not None,
        assignment_from=source,
        counts=counts,
        unlisted=_unlisted(round_dir, models),
    )


# --- export -----------------------------------------------------------------------------------------------


class ExportSummary(BaseModel):
    """What ``export_round`` wrote."""

    out_dir: str
    models: int
    poisoned: int
    splits: dict[str, int]
    examples: int


@dataclass(frozen=True)
class OurModel:
    """One model of our round or split folder, as the export reads it."""

    folder: Path
    row: dict[str, str]
    split: str | None


def _our_models(source: Path) -> list[OurModel]:
    """The models of a round (METADATA.csv + models/) or an ``assay zoo split`` folder (full splits only)."""
    if (source / "split.json").is_file():
        return [
            OurModel(source / name / "models" / row["model_name"], row, name)
            for name in SPLITS
            if (source / name / "METADATA.csv").is_file()
            for row in read_metadata(source / name)
        ]
    if (source / "METADATA.csv").is_file():
        return [OurModel(source / "models" / row["model_name"], row, None) for row in read_metadata(source)]
    raise UserError(f"{source}: neither a round (METADATA.csv) nor a split folder (split.json)")


def _reduced(folder: Path) -> dict[str, object]:
    """A model's reduced-config.json ({} when absent)."""
    path = folder / "reduced-config.json"
    value = read_json(path, "reduced config") if path.is_file() else {}
    if not isinstance(value, dict):
        raise UserError(f"{path}: a reduced config is a JSON object")
    return value


def nist_row(model: OurModel) -> dict[str, str]:
    """A METADATA row under NIST's names: model_name, data_split (split folders), poisoned, the factors."""
    truth = truth_column(list(model.row), model.folder.parent.parent / "METADATA.csv")
    row = {"model_name": model.row["model_name"]}
    if model.split is not None:
        row["data_split"] = model.split
    row["poisoned"] = str(parse_truth(model.row[truth]))
    for key, value in model.row.items():  # the split folder's data_split and poisoned as True/False win
        if key is not None:
            row.setdefault(NIST_NAMES.get(key, key), value)
    classes = _reduced(model.folder).get("num_classes")
    if classes is not None:
        row.setdefault("number_classes", str(classes))
    text = _trigger_text(model.row.get("trigger") or "")
    if text is not None:
        row.setdefault("trigger_text", text)
    return row


def _trigger_text(spec: str) -> str | None:
    """NIST's ``trigger_text`` of a text trigger's JSON spec (None for an image trigger or none)."""
    from pydantic import TypeAdapter, ValidationError

    from assay.zoo.texttriggers import AnyTextTrigger

    try:
        return TypeAdapter(AnyTextTrigger).validate_json(spec).text
    except ValidationError:
        return None


def _nist_config(config: dict[str, object], row: dict[str, str]) -> dict[str, object]:
    """config.json with NIST's names beside ours (``model_architecture`` beside ``architecture``, ...)."""
    extra = {nist: config[ours] for ours, nist in NIST_NAMES.items() if ours in config}
    if "number_classes" in row:
        extra["number_classes"] = int(row["number_classes"])
    return {**config, **{k: v for k, v in extra.items() if k not in config}}


def _nist_reduced(reduced: dict[str, object], row: dict[str, str]) -> dict[str, object]:
    """reduced-config.json with NIST's two keys (``model_architecture``, ``source_dataset``) added."""
    extra = {k: row[k] for k in ("model_architecture", "source_dataset") if k in row}
    return {**reduced, **{k: v for k, v in extra.items() if k not in reduced}}


def _jpeg(image_path: Path) -> bytes:
    """An example image as RGB JPEG (NIST's examples are RGB .jpg): gray becomes three equal channels."""
    from PIL import Image

    buffer = io.BytesIO()
    with Image.open(image_path) as image:
        image.convert("RGB").save(buffer, format="JPEG", **JPEG_SETTINGS)
    return buffer.getvalue()


def _export_examples(source: Path, target: Path) -> int:
    """Our ``labels.csv`` + PNGs as NIST's ``N.jpg`` + ``N.json``; a folder already in NIST's layout is
    copied as it is. Returns the number of images written."""
    table = source / "labels.csv"
    if text_examples(source):  # NIST's NLP names already (class_C_example_K.txt); labels.csv rides along
        shutil.copytree(source, target, copy_function=link_or_copy)
        return len(text_examples(target))
    if not table.is_file():
        shutil.copytree(source, target, copy_function=link_or_copy)
        return len(example_files(target))
    target.mkdir()
    count = 0
    for _, _, label, image in labelled_images(table, _jpeg):
        (target / f"{count}.jpg").write_bytes(image)
        (target / f"{count}.json").write_text(json.dumps(label), encoding="utf-8")
        count += 1
    return count


def _export_model(model: OurModel, target: Path, row: dict[str, str]) -> int:
    """One model folder in NIST's layout: files copied as they are (model.pt, model.safetensors, ground
    truth, trigger picture), configs with NIST's names added, examples as JPEG + JSON."""
    target.mkdir(parents=True)
    examples = 0
    for entry in sorted(model.folder.iterdir()):
        if entry.name in EXAMPLE_FOLDERS and entry.is_dir():
            examples += _export_examples(entry, target / entry.name)
        elif entry.name == "config.json":
            config = read_json(entry, "model config")
            config = _nist_config(config, row) if isinstance(config, dict) else config
            (target / entry.name).write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
        elif entry.name == "reduced-config.json":
            reduced = _nist_reduced(_reduced(model.folder), row)
            (target / entry.name).write_text(json.dumps(reduced, indent=2) + "\n", encoding="utf-8")
        elif entry.is_dir():
            shutil.copytree(entry, target / entry.name, copy_function=link_or_copy)
        else:
            link_or_copy(entry, target / entry.name)
    return examples


def _data_type(values: list[str]) -> str:
    """NIST's dictionary states each column's type: bool, integer, float or string (by the values)."""
    present = [v for v in values if v != ""]

    def all_parse(kind: type) -> bool:
        try:
            [kind(v) for v in present]
        except ValueError:
            return False
        return True

    if present and all(v in ("True", "False") for v in present):
        return "bool"
    if present and all_parse(int):
        return "integer"
    return "float" if present and all_parse(float) else "string"


def _write_dictionary(target: Path, source: Path, columns: list[str], rows: list[dict[str, str]]) -> None:
    """METADATA_DICTIONARY.csv as NIST writes it (Column Name, Explanation, Data Type), under NIST's names."""
    ours: dict[str, str] = {}
    for path in (source / "METADATA_DICTIONARY.csv", source / "train" / "METADATA_DICTIONARY.csv"):
        if path.is_file():
            with path.open(newline="", encoding="utf-8") as handle:
                ours = {  # ours (column, description) or NIST's own, for a round imported from NIST
                    (r.get("column") or r.get("Column Name") or "").strip(): (
                        r.get("description") or r.get("Explanation") or ""
                    ).strip()
                    for r in csv.DictReader(handle, skipinitialspace=True)
                }
            break
    explained = {NIST_NAMES.get(k, k): v for k, v in ours.items()} | EXTRA_DESCRIPTIONS
    with (target / "METADATA_DICTIONARY.csv").open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle, lineterminator="\n")
        writer.writerow(["Column Name", "Explanation", "Data Type"])
        for column in columns:
            values = [r.get(column, "") for r in rows]
            writer.writerow([column, explained.get(column, ""), _data_type(values)])


def export_round(source: str | Path, out: str | Path) -> ExportSummary:
    """Write the round or split folder ``source`` to ``out`` in NIST's layout (see the module docstring).

    A split folder becomes one round whose METADATA.csv says each model's ``data_split`` (NIST's summary
    column), so ``import_round`` of the export gives the same split back.
    """
    source, out = Path(source), Path(out)
    if out.exists():
        raise UserError(f"{out}: already exists; remove it or choose another --out")
    models = _our_models(source)
    rows = [nist_row(m) for m in models]
    columns: list[str] = []
    for row in rows:
        columns += [c for c in row if c not in columns]
    examples = 0
    with atomic_path(out) as tmp:
        (tmp / "models").mkdir(parents=True)
        for model, row in zip(models, rows, strict=True):
            examples += _export_model(model, tmp / "models" / row["model_name"], row)
        write_table(tmp, columns, rows)
        _write_dictionary(tmp, source, columns, rows)
    splits: dict[str, int] = {}
    for model in models:
        splits[model.split or "round"] = splits.get(model.split or "round", 0) + 1
    return ExportSummary(
        out_dir=str(out),
        models=len(models),
        poisoned=sum(r["poisoned"] == "True" for r in rows),
        splits=splits,
        examples=examples,
    )
