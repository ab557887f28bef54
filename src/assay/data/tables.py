"""Raw benchmark tables: rows as plain dicts, read from and written back to the user's own file format.

Formats, chosen by suffix: ``.jsonl``, ``.json`` (a list of rows, or an object holding one list of rows,
such as BIG-Bench Hard's ``{"canary": ..., "examples": [...]}``), ``.csv`` (with a header, or MMLU's own
header-less ``question,A,B,C,D,answer`` files), ``.parquet``; and folders: one written by HF ``datasets``
``save_to_disk`` (a ``Dataset`` or a ``DatasetDict``), a folder of CSV files (MMLU's ``data/test/``: the rows
of every file in name order, each with its ``subject`` from the file name), or an lm-evaluation-harness
task folder or task YAML (``assay.data.lmeval``).

``write_table`` writes rows back in the table's format, atomically, keeping what a reader would notice:
JSON container keys, CSV column order and line endings, Parquet and HF column types, the other splits of a
``DatasetDict``, JSON spacing and ASCII escaping. Unchanged rows come back byte-identical for files written
the usual way (``json.dumps``, the ``csv`` module or pandas).
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import re
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from assay.errors import UserError, shown
from assay.fileio import atomic_path

FileFormat = Literal["jsonl", "json", "csv", "parquet", "hf", "csv-folder", "lmeval"]

SUFFIXES: dict[str, FileFormat] = {
    ".jsonl": "jsonl",
    ".json": "json",
    ".csv": "csv",
    ".parquet": "parquet",
    ".yaml": "lmeval",
    ".yml": "lmeval",
}
FOLDER_FORMATS: frozenset[str] = frozenset({"hf", "csv-folder", "lmeval"})  # written as a directory

MMLU_COLUMNS = ["question", "A", "B", "C", "D", "answer"]  # the original header-less CSVs, in this order
_SPLIT_SUFFIX = re.compile(r"_(test|dev|val|validation|train|auxiliary_train)$")


@dataclass
class RawTable:
    """The rows of one benchmark file, with what is needed to name them in errors and to write them back.

    ``locations[i]`` names ``rows[i]`` in messages: ``"line 7"`` (JSONL: physical line; CSV: the line the
    record starts on, the header being line 1), ``"row 3"`` (Parquet, HF; 1-based) or ``"examples[4]"``
    (JSON: the path of the row inside the document, 0-based like any JSON path; ``"[4]"`` for a top-level
    list). ``container`` is set for a JSON object: ``{"rows_key": "examples", "object": {...}}``, where
    ``object`` holds every top-level key in file order with the rows' key mapped to ``None``. ``split`` is
    the chosen split of an HF ``DatasetDict`` (``None`` for a single ``Dataset`` and the other formats).
    ``meta`` holds format details found on reading (JSON spacing, CSV line ending, Arrow schema, HF features
    and the other splits); a table built by hand may leave it empty and gets the usual defaults.
    ``style`` is the row style the file itself declares (an lm-eval task's ``doc_to_*`` fields), if any.
    """

    path: Path
    file_format: FileFormat
    rows: list[dict[str, Any]]
    locations: list[str]
    container: dict[str, Any] | None = None
    split: str | None = None
    meta: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)
    style: str | None = None

    def __len__(self) -> int:
        return len(self.rows)


def format_of(path: str | Path) -> FileFormat | None:
    """The format a path's suffix names (``None`` for no known suffix: an HF directory when writing)."""
    return SUFFIXES.get(Path(path).suffix.lower())


def read_table(path: str | Path, split: str | None = None) -> RawTable:
    """Read a benchmark file or folder into a ``RawTable``; ``UserError`` on bad input."""
    path = Path(path)
    if not path.exists():
        raise UserError(f"{path}: no such file or directory")
    fmt = folder_format(path) if path.is_dir() else format_of(path)
    if fmt is None:
        known = ", ".join(SUFFIXES)
        raise UserError(
            f"{path}: unknown benchmark format '{path.suffix}': use one of {known}, "
            "or a directory saved by HF datasets (save_to_disk)"
        )
    if split is not None and fmt not in ("json", "hf", "lmeval"):
        raise UserError(f"{path}: a {fmt} file has no splits; leave out split ({split!r})")
    if fmt == "lmeval":
        table = _read_lmeval(path, split)
    elif fmt in ("json", "hf"):
        table = (_read_json if fmt == "json" else _read_hf)(path, split)
    else:
        reader = {
            "jsonl": _read_jsonl,
            "csv": _read_csv,
            "parquet": _read_parquet,
            "csv-folder": _read_csv_folder,
        }
        table = reader[fmt](path)
    if not table.rows:
        raise UserError(f"{path}: the benchmark is empty (no rows)")
    return table


def folder_format(path: Path) -> FileFormat:
    """What a folder holds: an HF ``save_to_disk`` dataset, an lm-eval task, or CSV files (MMLU's layout)."""
    if any((path / marker).exists() for marker in ("dataset_dict.json", "state.json", "dataset_info.json")):
        return "hf"
    if any(p.suffix.lower() in (".yaml", ".yml") for p in path.iterdir()):
        return "lmeval"
    if any(p.suffix.lower() == ".csv" and p.is_file() for p in path.iterdir()):
        return "csv-folder"
    raise UserError(
        f"{path}: a directory, but not one saved by HF datasets (save_to_disk: no dataset_dict.json or "
        "state.json inside), an lm-eval task folder (no .yaml) or a folder of CSV files"
    )


def write_table(table: RawTable, rows: list[dict[str, Any]], target: str | Path) -> None:
    """Write ``rows`` to ``target`` in ``table``'s format, atomically; nothing is left behind on failure."""
    target = Path(target)
    writer = {
        "jsonl": _write_jsonl,
        "json": _write_json,
        "csv": _write_csv,
        "parquet": _write_parquet,
        "hf": _write_hf,
        "csv-folder": _write_csv_folder,
        "lmeval": _write_lmeval,
    }[table.file_format]
    with atomic_path(target) as tmp:
        writer(table, rows, tmp)


# ---------------------------------------------------------------- lm-eval task folders


def _read_lmeval(path: Path, split: str | None) -> RawTable:
    """The evaluation split of an lm-eval task (folder or YAML), read in its data file's own format."""
    from assay.data.lmeval import locate_task, style_from_config

    task = locate_task(path, split)
    inner = read_table(task.data_file)
    return RawTable(
        path=task.folder,
        file_format="lmeval",
        rows=inner.rows,
        locations=[f"{task.relative} {where}" for where in inner.locations],
        split=task.split,
        meta={"inner": inner, "data_file": str(task.relative), "yaml": task.yaml_name},
        style=style_from_config(task.config, set(inner.rows[0]) if inner.rows else set()),
    )


def _write_lmeval(table: RawTable, rows: list[dict[str, Any]], target: Path) -> None:
    """A copy of the task folder with the data file rewritten in its own format (other files as they were)."""
    from assay.data.lmeval import copy_task

    copy_task(table.path, target)
    write_table(table.meta["inner"], rows, target / table.meta["data_file"])


# ---------------------------------------------------------------- helpers


def _fail(path: Path, where: str, problem: str, value: Any = None) -> UserError:
    """One-line error for a problem that is about a row or line rather than a field."""
    if value is None:
        return UserError(f"{path}:{where}: {problem}")
    return UserError(f"{path}:{where}: {problem} (value: {shown(value)})")


def _read_text(path: Path) -> tuple[str, bool]:
    """The file's text and whether it started with a UTF-8 byte-order mark."""
    data = path.read_bytes()
    bom = data.startswith(b"\xef\xbb\xbf")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise UserError(f"{path}: not UTF-8 text (byte {exc.start}: {exc.reason})") from None
    return text, bom


def _write_text(target: Path, text: str, bom: bool) -> None:
    target.write_text(text, encoding="utf-8-sig" if bom else "utf-8", newline="")


def _dumps_style(obj: Any, original: str, ascii_only: bool, indented: bool) -> dict[str, Any]:
    """The ``json.dumps`` arguments that reproduce ``original`` (or a close default when none does)."""
    ensure_ascii = ascii_only
    if indented:
        tried: list[dict[str, Any]] = [{"indent": i} for i in (2, 4, "\t", 1, 3, 8)]
    else:
        tried = [{"separators": (", ", ": ")}, {"separators": (",", ":")}]
    for kwargs in tried:
        if json.dumps(obj, ensure_ascii=ensure_ascii, **kwargs) == original:
            return {"ensure_ascii": ensure_ascii, **kwargs}
    return {"ensure_ascii": ensure_ascii, **tried[0]}


# ---------------------------------------------------------------- JSON Lines


def _read_jsonl(path: Path) -> RawTable:
    text, bom = _read_text(path)
    rows: list[dict[str, Any]] = []
    locations: list[str] = []
    first_line = None
    for number, raw in enumerate(text.split("\n"), start=1):  # not splitlines: U+2028 may sit in a string
        line = raw.removesuffix("\r")
        if not line.strip():
            continue
        where = f"line {number}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise _fail(path, where, f"invalid JSON: {exc.msg} at column {exc.colno}", line) from None
        if not isinstance(row, dict):
            raise _fail(path, where, f"a row must be a JSON object, not {_json_type(row)}", row)
        if first_line is None:
            first_line = (row, line)
        rows.append(row)
        locations.append(where)
    meta: dict[str, Any] = {"bom": bom}
    if first_line is not None:
        meta["dumps"] = _dumps_style(first_line[0], first_line[1], text.isascii(), indented=False)
    return RawTable(path, "jsonl", rows, locations, meta=meta)


def _write_jsonl(table: RawTable, rows: list[dict[str, Any]], target: Path) -> None:
    kwargs = table.meta.get("dumps", {"ensure_ascii": False})
    text = "".join(json.dumps(row, **kwargs) + "\n" for row in rows)
    _write_text(target, text, table.meta.get("bom", False))


# ---------------------------------------------------------------- JSON


def _json_type(value: Any) -> str:
    names = {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}
    return names.get(type(value), "a number")


def _read_json(path: Path, split: str | None) -> RawTable:
    text, bom = _read_text(path)
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        hint = ""
        if exc.msg == "Extra data" and exc.lineno > 1:
            hint = "; this looks like JSON Lines (one object a line): rename the file to .jsonl"
        line = text.split("\n")[exc.lineno - 1]
        raise _fail(
            path, f"line {exc.lineno}", f"invalid JSON: {exc.msg} at column {exc.colno}{hint}", line
        ) from None
    container: dict[str, Any] | None = None
    if isinstance(doc, list):
        if split is not None:
            raise UserError(
                f"{path}: the file is one list of rows, it has no splits; leave out split ({split!r})"
            )
        items, prefix = doc, ""
    elif isinstance(doc, dict):
        key = _rows_key(path, doc, split)
        items, prefix = doc[key], key
        container = {"rows_key": key, "object": {k: (None if k == key else v) for k, v in doc.items()}}
    else:
        raise UserError(
            f"{path}: expected a list of rows or an object holding one, "
            f"found {_json_type(doc)} at the top level"
        )
    locations = [f"{prefix}[{i}]" for i in range(len(items))]
    for row, where in zip(items, locations, strict=True):
        if not isinstance(row, dict):
            raise _fail(path, where, f"a row must be a JSON object, not {_json_type(row)}", row)
    stripped = text.rstrip("\n")
    meta = {
        "bom": bom,
        "newline": text[len(stripped) :],
        "dumps": _dumps_style(doc, stripped, text.isascii(), indented=stripped[1:2] == "\n"),
    }
    return RawTable(path, "json", items, locations, container=container, split=split, meta=meta)


def _rows_key(path: Path, doc: dict[str, Any], split: str | None) -> str:
    """The key of the object's list of rows; ``split`` picks one when there are several."""
    lists = [k for k, v in doc.items() if isinstance(v, list)]
    if split is not None:
        if split not in lists:
            raise UserError(f"{path}: no list of rows under key {split!r}; lists: {lists or 'none'}")
        return split
    of_rows = [k for k in lists if all(isinstance(r, dict) for r in doc[k])]
    for candidates in (lists, of_rows, [k for k in of_rows if doc[k]]):
        if len(candidates) == 1:
            return candidates[0]
    if not lists:
        raise UserError(
            f"{path}: the JSON object has no list of row objects; keys: {list(doc)} "
            '(expected e.g. {"examples": [{...}, ...]})'
        )
    raise UserError(
        f"{path}: the JSON object holds several lists of rows {of_rows or lists}; pick one with split"
    )


def _write_json(table: RawTable, rows: list[dict[str, Any]], target: Path) -> None:
    doc: Any = rows
    if table.container is not None:
        key = table.container["rows_key"]
        doc = {k: (rows if k == key else v) for k, v in table.container["object"].items()}
        doc.setdefault(key, rows)
    kwargs = table.meta.get("dumps", {"ensure_ascii": False, "indent": 2})
    text = json.dumps(doc, **kwargs) + table.meta.get("newline", "\n")
    _write_text(target, text, table.meta.get("bom", False))


# ---------------------------------------------------------------- CSV


def subject_of(path: Path) -> str:
    """MMLU's subject from a file name: ``abstract_algebra_test.csv`` -> ``abstract_algebra``."""
    return _SPLIT_SUFFIX.sub("", path.stem)


def _headerless_mmlu(first: list[str]) -> bool:
    """MMLU's own CSVs have no header row: six values, the last an answer letter."""
    return len(first) == len(MMLU_COLUMNS) and first[-1].strip() in ("A", "B", "C", "D")


def _read_csv(path: Path) -> RawTable:
    text, bom = _read_text(path)
    first_break = text.find("\n")
    lineterminator = "\r\n" if first_break > 0 and text[first_break - 1] == "\r" else "\n"
    meta: dict[str, Any] = {
        "bom": bom,
        "lineterminator": lineterminator,
        "final_newline": text.endswith("\n"),
    }
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        first = next(reader, None)
        if first is None:
            return RawTable(path, "csv", [], [], meta=meta)
        headerless = _headerless_mmlu(first)
        header = MMLU_COLUMNS if headerless else first
        seen: set[str] = set()
        for name in header:
            if name in seen:
                raise _fail(path, "line 1", f"the header names column {name!r} twice", header)
            seen.add(name)
        rows: list[dict[str, Any]] = []
        locations: list[str] = []
        last_line = reader.line_num
        records = [(1, first)] if headerless else []
        for where, record in [*records, *_numbered(reader, last_line)]:
            if not record:  # a blank line
                continue
            if len(record) != len(header):
                raise _fail(
                    path,
                    f"line {where}",
                    f"has {len(record)} values but the header has {len(header)} columns",
                    record,
                )
            rows.append(dict(zip(header, record, strict=True)))
            locations.append(f"line {where}")
    except csv.Error as exc:
        raise _fail(path, f"line {reader.line_num}", f"invalid CSV: {exc}") from None
    if headerless:  # the subject is in the file name only; it is not written back
        for row in rows:
            row["subject"] = subject_of(path)
    meta.update(columns=header, header=not headerless)
    return RawTable(path, "csv", rows, locations, meta=meta)


def _numbered(reader: Any, last_line: int) -> Iterator[tuple[int, list[str]]]:
    """The records left in ``reader``, each with the line it starts on."""
    for record in reader:
        yield last_line + 1, record
        last_line = reader.line_num


def _columns(rows: list[dict[str, Any]], known: list[str]) -> list[str]:
    """``known`` columns first, in order, then any new keys in first-seen order."""
    columns = list(known)
    seen = set(columns)
    for row in rows:
        for key in row:
            if key not in seen:
                seen.add(key)
                columns.append(key)
    return columns


def _write_csv(table: RawTable, rows: list[dict[str, Any]], target: Path) -> None:
    header = table.meta.get("header", True)
    # A header-less file has a fixed layout: only its own columns go back (not the added subject).
    columns = _columns(rows, table.meta.get("columns", [])) if header else table.meta["columns"]
    lineterminator = table.meta.get("lineterminator", "\n")
    buffer = io.StringIO(newline="")
    writer = csv.writer(buffer, lineterminator=lineterminator)
    if header:
        writer.writerow(columns)
    for row in rows:
        writer.writerow(["" if row.get(c) is None else row.get(c) for c in columns])
    text = buffer.getvalue()
    if not table.meta.get("final_newline", True):
        text = text.removesuffix(lineterminator)
    _write_text(target, text, table.meta.get("bom", False))


def _read_csv_folder(path: Path) -> RawTable:
    """Every CSV file of a folder, in name order (MMLU's ``data/test/``: one header-less file a subject)."""
    rows: list[dict[str, Any]] = []
    locations: list[str] = []
    parts: list[tuple[str, int, dict[str, Any]]] = []
    for file in sorted(p for p in path.iterdir() if p.suffix.lower() == ".csv" and p.is_file()):
        part = _read_csv(file)
        rows += part.rows
        locations += [f"{file.name} {where}" for where in part.locations]
        parts.append((file.name, len(part.rows), part.meta))
    return RawTable(path, "csv-folder", rows, locations, meta={"parts": parts})


def _write_csv_folder(table: RawTable, rows: list[dict[str, Any]], target: Path) -> None:
    """The same files in a new folder, each with its own rows, header (or none), quoting and line ends."""
    target.mkdir()
    start = 0
    for name, count, meta in table.meta["parts"]:
        if count == 0:
            shutil.copyfile(table.path / name, target / name)
            continue
        _write_csv(
            RawTable(table.path / name, "csv", [], [], meta=meta), rows[start : start + count], target / name
        )
        start += count


# ---------------------------------------------------------------- Parquet


def _read_parquet(path: Path) -> RawTable:
    import pyarrow.parquet as pq

    try:
        arrow = pq.read_table(path)
    except Exception as exc:  # pyarrow raises several types for a damaged file
        raise UserError(f"{path}: not a readable Parquet file ({exc})") from None
    rows = arrow.to_pylist()
    locations = [f"row {i}" for i in range(1, len(rows) + 1)]
    return RawTable(path, "parquet", rows, locations, meta={"schema": arrow.schema})


def _arrow_table(rows: list[dict[str, Any]], schema: Any) -> Any:
    import pyarrow as pa

    if schema is None:
        return pa.Table.from_pylist(rows)
    extra = [c for c in _columns(rows, schema.names) if c not in set(schema.names)]
    table = pa.Table.from_pylist([{c: row.get(c) for c in schema.names} for row in rows], schema=schema)
    for column in extra:
        table = table.append_column(column, pa.array([row.get(column) for row in rows]))
    return table


def _write_parquet(table: RawTable, rows: list[dict[str, Any]], target: Path) -> None:
    import pyarrow.parquet as pq

    pq.write_table(_arrow_table(rows, table.meta.get("schema")), target)


# ---------------------------------------------------------------- HF datasets


@contextlib.contextmanager
def _quiet_datasets() -> Iterator[Any]:
    """Import ``datasets`` with its progress bars off for the block (they would clutter our own output)."""
    import datasets

    was_disabled = datasets.are_progress_bars_disabled()
    datasets.disable_progress_bars()
    try:
        yield datasets
    finally:
        if not was_disabled:
            datasets.enable_progress_bars()


def _read_hf(path: Path, split: str | None) -> RawTable:
    if not any(
        (path / marker).exists() for marker in ("dataset_dict.json", "state.json", "dataset_info.json")
    ):
        raise UserError(
            f"{path}: a directory, but not one saved by HF datasets (save_to_disk): "
            "no dataset_dict.json or state.json inside"
        )
    with _quiet_datasets() as datasets:
        try:
            loaded = datasets.load_from_disk(str(path))
        except Exception as exc:  # datasets raises several types for a damaged directory
            raise UserError(f"{path}: could not load the HF dataset ({type(exc).__name__}: {exc})") from None
    meta: dict[str, Any] = {}
    if isinstance(loaded, datasets.DatasetDict):
        splits = list(loaded)
        if split is None and len(splits) == 1:
            split = splits[0]
        if split is None:
            raise UserError(f"{path}: a DatasetDict with splits {splits}: pick one with split")
        if split not in loaded:
            raise UserError(f"{path}: no split {split!r}; splits: {splits}")
        meta["splits"] = dict(loaded)
        dataset = loaded[split]
    else:
        if split is not None:
            raise UserError(f"{path}: a single Dataset, not a DatasetDict; leave out split ({split!r})")
        dataset = loaded
    meta["features"] = dataset.features
    rows = dataset.to_list()
    locations = [f"row {i}" for i in range(1, len(rows) + 1)]
    return RawTable(path, "hf", rows, locations, split=split, meta=meta)


def _write_hf(table: RawTable, rows: list[dict[str, Any]], target: Path) -> None:
    with _quiet_datasets() as datasets:
        features = table.meta.get("features")
        if features is not None:
            extra = [c for c in _columns(rows, list(features)) if c not in features]
            if extra:
                inferred = datasets.Dataset.from_list(
                    [{c: row.get(c) for c in extra} for row in rows]
                ).features
                features = datasets.Features({**features, **inferred})
            rows = [{c: row.get(c) for c in features} for row in rows]
        dataset = datasets.Dataset.from_list(rows, features=features)
        if table.split is None:
            dataset.save_to_disk(str(target))
            return
        splits = dict(table.meta.get("splits") or {table.split: dataset})
        splits[table.split] = dataset
        datasets.DatasetDict(splits).save_to_disk(str(target))
