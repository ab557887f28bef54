"""lm-evaluation-harness task folders: read the split a task evaluates on, write it back in the same folder.

A task YAML names its data (``dataset_path: json`` / ``csv`` / ``parquet`` with
``dataset_kwargs.data_files``, or ``dataset_path`` a local folder of split files), the split
(``test_split``, else ``validation_split``) and how a row becomes a prompt (``doc_to_text``,
``doc_to_choice``, ``doc_to_target``: a column name or a Jinja template). ``include`` pulls in a template
YAML as lm-eval does. Data on the Hugging Face Hub is never downloaded: save the split as a file inside
the task folder and name it in ``data_files``.

The rows are read by ``tables.read_table`` (which calls ``locate_task``) in the data file's own format;
the row style comes from the ``doc_to_*`` fields where they name columns plainly ("{{question}}",
``answer``, ``choices``), and from the columns otherwise (BIG-Bench Hard's ``input``/``target``), or from
``--columns``. The release is a copy of the whole task folder with only the data file rewritten, so
``lm_eval --include_path RELEASE`` runs it.
"""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from assay.errors import UserError

_LOCAL_BUILDERS = ("json", "csv", "parquet")
_DATA_SUFFIXES = (".jsonl", ".json", ".csv", ".parquet")
_PLAIN = re.compile(
    r"\{\{\s*([A-Za-z_]\w*)\s*(?:\.strip\(\)\s*)?\}\}"
)  # "{{question}}", "{{question.strip()}}"
_INDEXED = re.compile(r"\{\{\s*([A-Za-z_]\w*)\[0\]\s*\}\}")  # "{{choices[0]}}": options written into the text
_VARIABLE = re.compile(r"\{\{\s*([A-Za-z_]\w*)")


class _TaskLoader(yaml.SafeLoader):
    """Safe YAML that keeps lm-eval's ``!function module.name`` tags as plain strings."""


_TaskLoader.add_constructor("!function", lambda loader, node: f"!function {loader.construct_scalar(node)}")


def task_yaml(path: Path) -> Path:
    """The task YAML: ``path`` itself, or the one task file in the folder ``path``."""
    if path.is_file():
        return path
    tasks = [p for p in sorted(path.iterdir()) if p.suffix.lower() in (".yaml", ".yml") and _is_task(p)]
    if len(tasks) == 1:
        return tasks[0]
    if not tasks:
        raise UserError(f"{path}: no lm-eval task YAML with a dataset_path in this folder")
    names = ", ".join(p.name for p in tasks)
    raise UserError(f"{path}: several lm-eval tasks ({names}); give the task YAML itself, e.g. {tasks[0]}")


def _is_task(path: Path) -> bool:
    try:
        return "dataset_path" in load_config(path)
    except UserError:
        return False


def load_config(path: Path, depth: int = 0) -> dict[str, Any]:
    """The task's settings with its ``include`` chain merged in (the including file wins)."""
    try:
        config = yaml.load(path.read_text(encoding="utf-8"), Loader=_TaskLoader)  # a SafeLoader
    except (OSError, yaml.YAMLError) as exc:
        raise UserError(f"{path}: not a readable YAML file ({exc})") from None
    if not isinstance(config, dict):
        raise UserError(f"{path}: an lm-eval task YAML must be a mapping of settings")
    include = config.pop("include", None)
    if include is None:
        return config
    if depth > 8:
        raise UserError(f"{path}: 'include' nests too deeply (a loop?)")
    base = load_config(path.parent / str(include), depth + 1)
    return {**base, **config}


def data_file(config: dict[str, Any], yaml_path: Path, split: str | None) -> tuple[Path, str]:
    """The file holding the task's evaluation split, and the split's name."""
    split = split or config.get("test_split") or config.get("validation_split")
    if not split:
        raise UserError(f"{yaml_path}: the task names no test_split or validation_split; give --split")
    source = config.get("dataset_path")
    kwargs = config.get("dataset_kwargs") or {}
    files = kwargs.get("data_files")
    if source in _LOCAL_BUILDERS and files is not None:
        entry = files.get(split) if isinstance(files, dict) else files  # a bare file is lm-eval's one split
        if isinstance(entry, list) and len(entry) == 1:
            entry = entry[0]
        if not isinstance(entry, str):
            raise UserError(
                f"{yaml_path}: field 'dataset_kwargs.data_files' has no single file for split {split!r} "
                f"(value: {files!r})"
            )
        return _resolve(yaml_path, entry), split
    folder = _local_folder(yaml_path, source, kwargs.get("data_dir"))
    if folder is None:
        raise UserError(
            f"{yaml_path}: field 'dataset_path' {source!r} is not local data; the Hub is not used here: save "
            "the split as a file in the task folder and set dataset_path: json (or csv, parquet) with "
            "dataset_kwargs.data_files"
        )
    found = [p for p in sorted(folder.iterdir()) if p.suffix in _DATA_SUFFIXES and p.stem.startswith(split)]
    if len(found) != 1:
        raise UserError(
            f"{folder}: expected one data file for split {split!r} (like {split}.jsonl), found {len(found)}"
        )
    return found[0], split


def _resolve(yaml_path: Path, name: str) -> Path:
    """A data path as lm-eval users write it: relative to the task folder, else to the working directory."""
    candidate = Path(name)
    for path in (yaml_path.parent / candidate, candidate):
        if path.is_file():
            return path
    raise UserError(f"{yaml_path}: data file {name!r} not found (relative to {yaml_path.parent} or here)")


def _local_folder(yaml_path: Path, source: Any, data_dir: Any) -> Path | None:
    for name in (data_dir, source):
        if isinstance(name, str) and name not in _LOCAL_BUILDERS:
            for path in (yaml_path.parent / name, Path(name)):
                if path.is_dir():
                    return path
    return None


def style_from_config(config: dict[str, Any], columns: set[str]) -> str | None:
    """A ``columns:`` row style read off ``doc_to_*``, or None where they are not plain column references."""
    choice, target, text = config.get("doc_to_choice"), config.get("doc_to_target"), config.get("doc_to_text")
    options = _column(choice, columns)
    if options is None and isinstance(choice, list) and isinstance(text, str):
        indexed = _INDEXED.search(text)  # MMLU: choices written into the text, doc_to_choice ["A", ...]
        options = indexed.group(1) if indexed and indexed.group(1) in columns else None
    answer = _column(target, columns)
    if options is None or answer is None or not isinstance(text, str):
        return None
    question = _column(text, columns)
    if question is None:
        used = {name for name in _VARIABLE.findall(text) if name in columns} - {options, answer}
        if len(used) != 1:
            return None
        question = used.pop()
    return f"columns:question={question},options={options},answer={answer}"


def _column(value: Any, columns: set[str]) -> str | None:
    if not isinstance(value, str):
        return None
    if value in columns:
        return value
    match = _PLAIN.fullmatch(value.strip())
    return match.group(1) if match and match.group(1) in columns else None


@dataclass(frozen=True)
class TaskData:
    """Where an lm-eval task keeps the split it evaluates on: what ``tables.read_table`` needs to read it.

    This module only reads task YAMLs; reading and writing the data file is ``tables``' job, so the two
    modules do not import each other (``tables`` calls ``locate_task``).
    """

    folder: Path
    data_file: Path  # absolute
    split: str | None
    yaml_name: str
    config: dict[str, Any]

    @property
    def relative(self) -> Path:
        """The data file's path inside the task folder."""
        return self.data_file.resolve().relative_to(self.folder.resolve())


def locate_task(path: Path, split: str | None) -> TaskData:
    """The task YAML of ``path`` (folder or YAML) and the data file of its evaluation split."""
    yaml_path = task_yaml(path)
    folder = yaml_path.parent
    config = load_config(yaml_path)
    file, split = data_file(config, yaml_path, split)
    if not file.resolve().is_relative_to(folder.resolve()):
        raise UserError(
            f"{yaml_path}: the data file {file} lies outside the task folder; copy it into {folder} so the "
            "release can be written in the same layout"
        )
    return TaskData(folder, file, split, yaml_path.name, config)


def copy_task(folder: Path, target: Path) -> None:
    """The task folder copied as it is; ``tables`` then rewrites the data file inside it."""
    shutil.copytree(folder, target, symlinks=True)
