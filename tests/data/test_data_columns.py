"""Any layout by naming its columns (``--columns``): HF datasets, one CSV column per option, open ended."""

from dataclasses import replace
from pathlib import Path

import pytest

from assay.data import read_benchmark, write_benchmark
from assay.data.items import MultipleChoice, OpenEnded
from assay.data.styles import get_style, parse_columns
from assay.errors import UserError


def test_hf_dataset_with_a_column_mapping_round_trips(tmp_path: Path) -> None:
    import datasets

    rows = [
        {"Question": "Capital of France?", "choices": ["Rome", "Paris", "Oslo"], "label": 1, "src": "geo"},
        {"Question": "Largest ocean?", "choices": ["Pacific", "Arctic", "Indian"], "label": 0, "src": "geo"},
    ]
    path = tmp_path / "hf"
    datasets.DatasetDict({"test": datasets.Dataset.from_list(rows)}).save_to_disk(str(path))
    style = "columns:question=Question,options=choices,answer=label"
    bench = read_benchmark(path, style=style)
    assert bench.style == style and bench.kind == "multiple_choice"
    assert bench.items[0] == MultipleChoice("Capital of France?", ("Rome", "Paris", "Oslo"), 1)
    items = [replace(bench.items[0], question="Think. Capital of France?", answer=2), bench.items[1]]
    write_benchmark(bench, items, tmp_path / "out")
    again = read_benchmark(tmp_path / "out", style=bench.style, split="test")
    assert again.items == items
    assert again.table.rows[0] == {**rows[0], "Question": "Think. Capital of France?", "label": 2}
    assert again.table.rows[1] == rows[1]


def test_one_column_per_option_and_a_dict_column(tmp_path: Path) -> None:
    csv_path = tmp_path / "med.csv"
    csv_path.write_text("id,q,opa,opb,opc,cop\n1,Which organ filters blood?,Kidney,Heart,Lung,A\n")
    bench = read_benchmark(csv_path, style="columns:question=q,options=opa|opb|opc,answer=cop")
    assert bench.items == [MultipleChoice("Which organ filters blood?", ("Kidney", "Heart", "Lung"), 0)]
    write_benchmark(bench, [replace(bench.items[0], answer=2)], tmp_path / "out.csv")
    assert (
        tmp_path / "out.csv"
    ).read_text() == "id,q,opa,opb,opc,cop\n1,Which organ filters blood?,Kidney,Heart,Lung,C\n"
    arc = tmp_path / "arc.jsonl"
    arc.write_text(
        '{"question": "Q?", "choices": {"text": ["x", "y"], "label": ["A", "B"]}, "answerKey": "B"}\n'
    )
    item = read_benchmark(arc, style="columns:question=question,options=choices.text,answer=answerKey").items[
        0
    ]
    assert item == MultipleChoice("Q?", ("x", "y"), 1)


def test_open_ended_mapping(tmp_path: Path) -> None:
    path = tmp_path / "chat.jsonl"
    path.write_text('{"prompt": "Say hi.", "response": "Hi!"}\n')
    bench = read_benchmark(path, style="columns:instruction=prompt,output=response")
    assert bench.kind == "open_ended" and bench.items == [OpenEnded("Say hi.", "", "Hi!")]


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("question=q,answer=a", "role 'options' is missing for multiple_choice"),
        ("question=q,options=o,answer=a,output=x", "unknown role mix"),
        ("question", "expected ROLE=COLUMN pairs"),
        ("question=q,question=r,options=o,answer=a", "role 'question' given twice"),
    ],
)
def test_mapping_errors_are_one_line(spec: str, message: str) -> None:
    with pytest.raises(UserError, match=message):
        parse_columns(spec)


def test_a_missing_column_names_file_line_and_field(tmp_path: Path) -> None:
    path = tmp_path / "b.jsonl"
    path.write_text('{"q": "Q?", "opts": ["a", "b"], "ans": 0}\n{"q": "Q2?", "ans": 1}\n')
    with pytest.raises(UserError, match=r"b\.jsonl:line 2: field 'opts' is missing"):
        read_benchmark(path, style="columns:question=q,options=opts,answer=ans")
    with pytest.raises(UserError, match="unknown row style 'colums:q=1'"):
        get_style("colums:q=1")
