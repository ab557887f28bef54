"""The TrojAI detector contract: its command line, its metaparameter rules, and the files a detector reads.

A detector is a program run as::

    entrypoint.py infer --model_filepath M --result_filepath R --scratch_dirpath S --examples_dirpath E
        --round_training_dataset_dirpath T --metaparameters_filepath P --schema_filepath J
        --learned_parameters_dirpath L
    entrypoint.py configure [--automatic_configuration] --scratch_dirpath S --metaparameters_filepath P
        --schema_filepath J --learned_parameters_dirpath L --configure_models_dirpath D

``infer`` writes one probability that the model is trojaned to ``R``; ``configure`` learns parameters from a
training round ``D`` into ``L``. As in NIST's example entrypoint, a command line without a mode word is
``infer`` (NIST's harness calls containers that way), and ``--source_dataset_dirpath`` may follow.
``detector_main`` does the parsing, checks the metaparameters against their JSON schema, writes the result
atomically and turns bad input (a corrupted model file, a broken example folder) into one line on stderr and
exit code 2, with no result file. The leaderboard uses ``check_schema`` and ``check_metaparameters`` to
validate submissions; the programs in ``detectors/`` use all of it.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from assay.errors import UserError, input_error, shown
from assay.fileio import write_text_atomic

REQUIRED_METAPARAMETERS = ("technique", "technique_description")
MODES = ("infer", "configure")
Metaparameters = dict[str, Any]
T = TypeVar("T")
# NIST's schema header (trojai-example, trojai-test-harness): technique fields at the schema's root.
NIST_TECHNIQUE_TYPES = (
    "Weight Analysis",
    "Trigger Inversion",
    "Attribution Analysis",
    "Jacobian Inspection",
    "Other",
)
# The template's own header text: NIST refuses a submission that still carries it (":Schema Header:").
NIST_TEMPLATE_HEADER = {
    "title": "Trojan Detection Container (trojai-example) - The template detector to be used within the "
    "TrojAI competition.",
    "technique_description": "Extracts model weights and trains a random forest regressor.",
    "technique_changes": "Output metaparameter.json file after reconfiguration",
    "commit_id": "",
    "repo_name": "https://github.com/usnistgov/trojai-example",
}


@dataclass(frozen=True)
class InferArgs:
    """The paths ``infer`` is given."""

    model_filepath: Path
    result_filepath: Path
    scratch_dirpath: Path
    examples_dirpath: Path
    round_training_dataset_dirpath: Path | None
    metaparameters_filepath: Path
    schema_filepath: Path
    learned_parameters_dirpath: Path
    source_dataset_dirpath: Path | None = None


@dataclass(frozen=True)
class ConfigureArgs:
    """The paths ``configure`` is given."""

    scratch_dirpath: Path
    metaparameters_filepath: Path
    schema_filepath: Path
    learned_parameters_dirpath: Path
    configure_models_dirpath: Path
    automatic_configuration: bool


@dataclass(frozen=True)
class TrainingModel:
    """One model of a training round, as ``configure`` sees it."""

    name: str
    model_filepath: Path
    examples_dirpath: Path
    poisoned: bool


# --- metaparameters -------------------------------------------------------------------------------------


def _bounded(name: str, spec: dict[str, Any]) -> str | None:
    """Why a schema property is unbounded, or None when it is bounded."""
    kinds = spec.get("type")
    kinds = [kinds] if isinstance(kinds, str) else list(kinds or [])
    if "enum" in spec or "const" in spec:
        return None
    if not kinds:
        return f"property '{name}' has no type"
    for kind in kinds:
        if kind in ("number", "integer"):
            low = "minimum" in spec or "exclusiveMinimum" in spec
            high = "maximum" in spec or "exclusiveMaximum" in spec
            if not (low and high):
                return f"numeric property '{name}' needs a minimum and a maximum"
        elif kind == "string" and "maxLength" not in spec:
            return f"string property '{name}' needs maxLength or enum"
        elif kind == "array" and "maxItems" not in spec:
            return f"array property '{name}' needs maxItems"
        elif kind == "object":
            return f"property '{name}' is an object; metaparameters must be flat"
    return None


def _check_header(schema: dict[str, Any], source: str | Path) -> None:
    """NIST's ``:Schema Header:`` check: the template's text left in place, or a bad ``technique_type``.
    Every field still holding the template's text is named in the one line, so a performer fixes them all
    at once rather than one submission each (trojai-example as published leaves five)."""
    left = [field for field, template in NIST_TEMPLATE_HEADER.items() if schema.get(field) == template]
    if len(left) == 1:
        raise UserError(
            f"{source}: :Schema Header: field '{left[0]}' still holds the trojai-example template's value "
            f"{shown(NIST_TEMPLATE_HEADER[left[0]])}; describe your own technique"
        )
    if left:
        names = ", ".join(f"'{field}'" for field in left)
        raise UserError(
            f"{source}: :Schema Header: fields {names} still hold the trojai-example template's values "
            f"(field '{left[0]}': {shown(NIST_TEMPLATE_HEADER[left[0]])}); describe your own technique"
        )
    if "technique_type" not in schema:
        return
    kinds = schema["technique_type"]
    valid = {kind.upper() for kind in NIST_TECHNIQUE_TYPES}
    if not isinstance(kinds, list) or not kinds:
        raise UserError(f"{source}: :Schema Header: field 'technique_type' must be a non-empty list")
    for kind in kinds:
        if not isinstance(kind, str) or kind.upper() not in valid:
            raise UserError(
                f"{source}: :Schema Header: field 'technique_type' value {kind!r} is not one of "
                f"{', '.join(NIST_TECHNIQUE_TYPES)}"
            )


def technique_of(schema: dict[str, Any], values: Metaparameters) -> str:
    """The technique's name: a metaparameter (assay's layout) or the schema's root field (NIST's)."""
    return str(values.get("technique") or schema.get("technique") or "")[:200]


def check_schema(schema: Any, source: str | Path) -> list[str]:
    """Raise ``UserError`` for what NIST's harness refuses too; return warnings for assay's stricter rules.

    Two layouts are accepted: NIST's (``technique``, ``technique_description``, ``technique_type``, ... at
    the schema's root, ``required`` possibly empty) and assay's (``technique`` and ``technique_description``
    as required metaparameters). Unbounded parameters or open ``additionalProperties`` only warn: NIST runs
    them, but an organiser cannot perturb such parameters within bounds.
    """
    from jsonschema import Draft7Validator
    from jsonschema.exceptions import SchemaError

    if not isinstance(schema, dict):
        raise UserError(f"{source}: a metaparameter schema must be a JSON object")
    try:
        Draft7Validator.check_schema(schema)
    except SchemaError as exc:
        raise UserError(f"{source}: not a valid JSON schema ({exc.message})") from None
    _check_header(schema, source)
    properties = schema.get("properties", {})  # an object: the meta-schema check saw to that
    required = schema.get("required") or []
    if "technique" not in schema and not all(f in required for f in REQUIRED_METAPARAMETERS):
        raise UserError(
            f"{source}: no technique: put 'technique' and 'technique_description' at the schema's root "
            "(NIST's layout) or require them as metaparameters"
        )
    warnings = []
    if schema.get("additionalProperties", True) is not False:
        warnings.append(f"{source}: field 'additionalProperties' is not false: undeclared parameters pass")
    for name, spec in properties.items():
        problem = _bounded(name, spec if isinstance(spec, dict) else {})
        if problem:
            warnings.append(f"{source}: {problem}")
    return warnings


def check_metaparameters(values: Any, schema: dict[str, Any], source: str | Path) -> Metaparameters:
    """Validate ``values`` against ``schema``; the first problem is a one-line ``UserError`` naming it."""
    from jsonschema import Draft7Validator

    if not isinstance(values, dict):
        raise UserError(f"{source}: metaparameters must be a JSON object")
    errors = sorted(Draft7Validator(schema).iter_errors(values), key=lambda e: list(e.absolute_path))
    if errors:
        error = errors[0]
        field = ".".join(str(p) for p in error.absolute_path) or "(top level)"
        raise UserError(f"{source}: field '{field}' {error.message}")
    return values


def read_json(path: Path, what: str) -> Any:
    """Read a JSON file; a missing or malformed file is a one-line ``UserError``."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise UserError(f"{path}: cannot read the {what} ({exc.strerror or exc})") from None
    except json.JSONDecodeError as exc:
        raise UserError(f"{path}:{exc.lineno}: the {what} is not valid JSON ({exc.msg})") from None


def load_metaparameters(metaparameters_filepath: Path, schema_filepath: Path) -> Metaparameters:
    """Read both files, check the schema's rules, and validate the metaparameters against it."""
    schema = read_json(schema_filepath, "metaparameter schema")
    check_schema(schema, schema_filepath)
    values = read_json(metaparameters_filepath, "metaparameters")
    return check_metaparameters(values, schema, metaparameters_filepath)


# --- models and examples --------------------------------------------------------------------------------


def load_model(path: str | Path) -> Any:
    """Load a TrojAI ``model.pt`` (a whole pickled torch module) in eval mode on CPU.

    Raises ``FileNotFoundError`` for a missing file and ``ValueError`` naming the file when it is not a model.
    Only load files you trust, or load inside the harness sandbox: a pickled module can run code.
    """
    import torch

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such model file")
    try:
        # weights_only=False on purpose: TrojAI model.pt files are whole pickled modules, not state dicts.
        model = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as exc:
        raise ValueError(f"{path}: not a readable torch model file ({type(exc).__name__}: {exc})") from exc
    if not isinstance(model, torch.nn.Module):
        raise ValueError(f"{path}: holds a {type(model).__name__}, not a torch.nn.Module")
    return model.eval()


EXAMPLE_SUFFIXES = (".jpg", ".jpeg", ".png")  # NIST's image rounds: N.jpg (or N.png) beside N.json


def _grayscale(path: Path) -> np.ndarray:
    """An image file as (H, W) float32 in [0, 1]: PIL's ITU-R 601-2 luma, so RGB examples (NIST's) and
    grayscale ones (ours) reach detectors alike, and an RGB copy of a gray image reads back as that image.
    Raises OSError (PIL's UnidentifiedImageError is one) for a file that is no readable image."""
    from PIL import Image

    with Image.open(path) as image:
        return np.asarray(image.convert("L"), dtype=np.float32) / 255.0


def _example_order(path: Path) -> tuple[bool, int, str]:
    """Numeric stems in number order (2.jpg before 10.jpg), then any others by name."""
    stem = path.stem
    return (not stem.isdigit(), int(stem) if stem.isdigit() else 0, path.name)


def json_label(path: Path) -> int:
    """The class in an example's JSON label file: NIST writes a bare integer (``71``); an object with an
    integer ``label`` is taken too. A missing or bad file is a one-line ``UserError`` naming file and
    value."""
    if not path.is_file():
        raise UserError(f"{path}: not found; in NIST's layout each image N.jpg has its label in N.json")
    value = read_json(path, "example label")
    if isinstance(value, dict):
        value = value.get("label")
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise input_error(path, 1, "label", value, "is not a class number (a non-negative integer)")
    return value


def example_files(examples_dirpath: str | Path) -> list[tuple[Path, int]]:
    """NIST's layout of an examples folder: each image (jpg or png) with its class in a same-stem .json.

    Returns (image path, label) pairs in number order; [] when the folder holds no such image.
    """
    folder = Path(examples_dirpath)
    if not folder.is_dir():
        return []
    found = [p for p in folder.iterdir() if p.suffix.lower() in EXAMPLE_SUFFIXES and p.is_file()]
    return [(p, json_label(p.with_suffix(".json"))) for p in sorted(found, key=_example_order)]


def _same_shape(images: list[np.ndarray], pixels: np.ndarray) -> str | None:
    """Why ``pixels`` cannot join ``images`` (a different shape), or None."""
    if images and pixels.shape != images[0].shape:
        return f"is {pixels.shape}, unlike the first image {images[0].shape}"
    return None


def _read_nist_examples(pairs: list[tuple[Path, int]]) -> tuple[np.ndarray, np.ndarray]:
    """NIST's image + JSON pairs as grayscale arrays; errors name the image file."""
    images = []
    for path, _ in pairs:
        try:
            pixels = _grayscale(path)
        except OSError:
            raise UserError(f"{path}: not a readable image") from None
        problem = _same_shape(images, pixels)
        if problem:
            raise UserError(f"{path}: the image {problem}")
        images.append(pixels)
    return np.stack(images), np.asarray([label for _, label in pairs], dtype=np.int64)


def read_examples(examples_dirpath: str | Path) -> tuple[np.ndarray, np.ndarray]:
    """Read an examples folder: ours (``labels.csv`` with columns ``file``, ``label``, grayscale PNGs) or
    NIST's (``N.jpg`` or ``N.png`` with its class in ``N.json``, usually RGB).

    Returns float32 grayscale images (N, H, W) in [0, 1] (RGB converted to luma, see ``_grayscale``) and
    int64 labels, so detectors read both layouts alike; a missing or broken file is a ``UserError`` naming the
    file and line. ``labels.csv`` wins when a folder has both.
    """
    folder = Path(examples_dirpath)
    table = folder / "labels.csv"
    if not table.is_file():
        pairs = example_files(folder)
        if pairs:
            return _read_nist_examples(pairs)
        raise UserError(
            f"{table}: not found; an examples folder holds labels.csv and its images, or NIST's N.jpg "
            "(or N.png) with its label in N.json"
        )
    images, labels = [], []
    for line, name, label, pixels in labelled_images(table, _grayscale):
        problem = _same_shape(images, pixels)
        if problem:
            raise input_error(table, line, "file", name, problem)
        images.append(pixels)
        labels.append(label)
    if not images:
        raise UserError(f"{table}: lists no examples")
    return np.stack(images), np.asarray(labels, dtype=np.int64)


TEXT_EXAMPLE_NAME = re.compile(r"class_(\d+)_example_(\d+)\.txt")


def read_text_examples(examples_dirpath: str | Path) -> tuple[list[str], np.ndarray]:
    """Read a text examples folder: NIST's NLP names (``class_C_example_K.txt``, the class in the name) in
    class then example order, or ours (``labels.csv`` naming each ``.txt`` file), which wins when present.

    Returns the texts (stripped of the final newline) and int64 labels; a missing or unreadable file is a
    ``UserError`` naming the file (and the line of ``labels.csv``)."""
    folder = Path(examples_dirpath)
    table = folder / "labels.csv"
    if table.is_file():
        found = [(label, content) for _, _, label, content in labelled_images(table, _read_text)]
    else:
        named = (
            [(TEXT_EXAMPLE_NAME.fullmatch(p.name), p) for p in folder.iterdir()] if folder.is_dir() else []
        )
        ordered = sorted((int(m[1]), int(m[2]), p) for m, p in named if m)
        found = [(label, _read_text(path)) for label, _, path in ordered]
    if not found:
        raise UserError(f"{folder}: holds no example texts (class_C_example_K.txt, or labels.csv)")
    return [text for _, text in found], np.asarray([label for label, _ in found], dtype=np.int64)


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8").rstrip("\n")
    except UnicodeDecodeError as exc:
        raise UserError(f"{path}: not UTF-8 text (byte {exc.start})") from None


def labelled_images(table: Path, read: Callable[[Path], T]) -> Iterator[tuple[int, str, int, T]]:
    """Each row of our ``labels.csv`` as (line, file name, label, ``read(image path)``); a label that is no
    integer or a file ``read`` cannot open (OSError) is a one-line error naming the line. Shared by the
    example reader and NIST export, which read the same table into different things."""
    with table.open(newline="", encoding="utf-8") as handle:
        for line, row in enumerate(csv.DictReader(handle), start=2):
            name = row.get("file") or ""
            try:
                label = int(row.get("label") or "")
            except ValueError:
                raise input_error(table, line, "label", row.get("label"), "is not an integer") from None
            try:
                content = read(table.parent / name)
            except OSError:
                raise input_error(table, line, "file", name, "names no readable image") from None
            yield line, name, label, content


def training_models(models_dirpath: str | Path) -> list[TrainingModel]:
    """The models of a training round (``DIR/models`` or ``DIR``), each with its ground truth."""
    root = Path(models_dirpath)
    folder = root / "models" if (root / "models").is_dir() else root
    found = []
    for model_dir in sorted(p for p in folder.iterdir() if p.is_dir()) if folder.is_dir() else []:
        truth = model_dir / "ground_truth.csv"
        if not truth.is_file():
            continue
        value = truth.read_text(encoding="utf-8").strip()
        if value not in ("0", "1"):
            raise input_error(truth, 1, "ground_truth", value, "must be 0 or 1")
        examples = model_dir / "clean-example-data"
        found.append(TrainingModel(model_dir.name, model_dir / "model.pt", examples, value == "1"))
    if not found:
        raise UserError(f"{folder}: holds no model folders with ground_truth.csv")
    return found


def write_result(path: str | Path, probability: float) -> None:
    """Write the probability that the model is trojaned, after checking it is a number in [0, 1]."""
    value = float(probability)
    if not math.isfinite(value) or not 0.0 <= value <= 1.0:
        raise ValueError(f"a detector must output a probability in [0, 1], got {probability!r}")
    write_text_atomic(Path(path), f"{value!r}\n")


# --- the command line -----------------------------------------------------------------------------------

InferFn = Callable[[InferArgs, Metaparameters], float]
ConfigureFn = Callable[[ConfigureArgs, Metaparameters], None]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description="A trojan detector (TrojAI detector command line).")
    modes = parser.add_subparsers(dest="mode", required=True)
    shared = ("metaparameters_filepath", "schema_filepath", "learned_parameters_dirpath")
    infer = modes.add_parser("infer", help="Write P(trojaned) for one model.")
    _paths(infer, "model_filepath", "result_filepath", "scratch_dirpath", "examples_dirpath", *shared)
    infer.add_argument("--round_training_dataset_dirpath", type=Path, default=None)
    infer.add_argument("--source_dataset_dirpath", type=Path, default=None)
    configure = modes.add_parser("configure", help="Learn parameters from a training round.")
    _paths(configure, "scratch_dirpath", *shared, "configure_models_dirpath")
    configure.add_argument("--automatic_configuration", action="store_true")
    return parser


def _paths(parser: argparse.ArgumentParser, *names: str) -> None:
    """Required path options, one per name (``--model_filepath PATH``)."""
    for name in names:
        parser.add_argument(f"--{name}", type=Path, required=True)


def detector_main(infer: InferFn, configure: ConfigureFn, argv: Sequence[str] | None = None) -> int:
    """Run a detector's command line; returns the exit code (0 done, 2 bad input)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] not in MODES and argv[0] not in ("-h", "--help"):
        argv.insert(0, "infer")  # NIST's legacy form: no mode word means infer
    args = vars(_parser().parse_args(argv))
    mode = args.pop("mode")
    try:
        metaparameters = load_metaparameters(args["metaparameters_filepath"], args["schema_filepath"])
        if mode == "infer":
            infer_args = InferArgs(**args)
            probability = infer(infer_args, metaparameters)
            write_result(infer_args.result_filepath, probability)
        else:
            configure_args = ConfigureArgs(**args)
            configure_args.learned_parameters_dirpath.mkdir(parents=True, exist_ok=True)
            configure(configure_args, metaparameters)
    except (UserError, ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0
