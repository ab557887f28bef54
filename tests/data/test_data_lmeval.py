"""lm-evaluation-harness task folders: data file and row style read off the task YAML, written back whole."""

import json
from dataclasses import replace
from pathlib import Path

import pytest

from assay.data import read_benchmark, write_benchmark
from assay.data.items import MultipleChoice
from assay.errors import UserError

TEMPLATE = """\
output_type: multiple_choice
test_split: test
fewshot_split: validation
doc_to_text: "{{question.strip()}}\\nA. {{choices[0]}}\\nB. {{choices[1]}}\\nC. {{choices[2]}}\\nAnswer:"
doc_to_choice: ["A", "B", "C"]
doc_to_target: answer
metric_list:
  - metric: acc
"""

TASK = """\
include: _quiz_template_yaml
task: quiz
dataset_path: json
dataset_kwargs:
  data_files:
    test: data/test.jsonl
    validation: data/validation.jsonl
process_results: !function utils.process_results
"""

ROWS = [
    {
        "question": "Which planet is largest?",
        "choices": ["Mars", "Jupiter", "Venus"],
        "answer": 1,
        "id": "q1",
    },
    {
        "question": "Which gas do plants take in?",
        "choices": ["Oxygen", "Helium", "CO2"],
        "answer": 2,
        "id": "q2",
    },
    {"question": "What is 2 + 2?", "choices": ["4", "5", "22"], "answer": 0, "id": "q3"},
]


def write_task(folder: Path, task: str = TASK, rows: list[dict] = ROWS) -> Path:
    (folder / "data").mkdir(parents=True)
    (folder / "_quiz_template_yaml").write_text(TEMPLATE)
    (folder / "quiz.yaml").write_text(task)
    (folder / "utils.py").write_text("def process_results(doc, results):\n    return {}\n")
    (folder / "data" / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "data" / "validation.jsonl").write_text(json.dumps(ROWS[0]) + "\n")
    return folder


def test_task_folder_reads_the_test_split_with_the_style_its_templates_name(tmp_path: Path) -> None:
    folder = write_task(tmp_path / "quiz")
    bench = read_benchmark(folder)
    assert bench.file_format == "lmeval" and bench.table.split == "test"
    assert bench.style == "columns:question=question,options=choices,answer=answer"
    assert bench.items[1] == MultipleChoice("Which gas do plants take in?", ("Oxygen", "Helium", "CO2"), 2)
    assert bench.table.locations[0] == "data/test.jsonl line 1"
    assert read_benchmark(folder / "quiz.yaml").items == bench.items  # the YAML itself names the task too
    assert read_benchmark(folder, split="validation").items == [bench.items[0]]


def test_release_is_the_whole_folder_with_only_the_data_file_rewritten(tmp_path: Path) -> None:
    folder = write_task(tmp_path / "quiz")
    bench = read_benchmark(folder)
    items = list(bench.items)
    items[2] = replace(items[2], question="Read carefully. " + items[2].question, answer=1)
    out = tmp_path / "release" / "quiz"
    write_benchmark(bench, items, out)
    files = sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()) == files
    for name in files:
        if name != "data/test.jsonl":
            assert (out / name).read_bytes() == (folder / name).read_bytes(), name
    written = [json.loads(line) for line in (out / "data" / "test.jsonl").read_text().splitlines()]
    assert written[:2] == ROWS[:2]
    assert written[2] == {**ROWS[2], "question": "Read carefully. What is 2 + 2?", "answer": 1}
    assert read_benchmark(out).items == items


def test_a_generation_task_without_choices_falls_back_to_the_row_columns(tmp_path: Path) -> None:
    task = (
        "task: bbh_mini\ndataset_path: json\ndataset_kwargs:\n  data_files: data/test.jsonl\n"
        "test_split: train\noutput_type: generate_until\n"
        'doc_to_text: "Q: {{input}}\\nA:"\ndoc_to_target: "{{target}}"\n'
    )
    rows = [
        {"input": f"Is {n} even?\nOptions:\n(A) Yes\n(B) No", "target": "(A)" if n % 2 == 0 else "(B)"}
        for n in range(4)
    ]
    bench = read_benchmark(write_task(tmp_path / "bbh", task, rows))
    assert bench.style == "bbh" and bench.items[1].answer == 1


@pytest.mark.parametrize(
    ("task", "message"),
    [
        (
            "task: t\ndataset_path: cais/mmlu\ntest_split: test\n",
            "'cais/mmlu' is not local data; the Hub is not used",
        ),
        (
            "task: t\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: ../outside.jsonl\n"
            "test_split: test\n",
            "lies outside the task folder",
        ),
        (
            "task: t\ndataset_path: json\ndataset_kwargs:\n  data_files: data/test.jsonl\n",
            "names no test_split",
        ),
    ],
)
def test_task_problems_are_one_line_errors(tmp_path: Path, task: str, message: str) -> None:
    (tmp_path / "outside.jsonl").write_text(json.dumps(ROWS[0]) + "\n")
    folder = write_task(tmp_path / "t", task)
    with pytest.raises(UserError, match=message) as info:
        read_benchmark(folder)
    assert "\n" not in str(info.value)


def test_a_folder_of_several_tasks_asks_for_one(tmp_path: Path) -> None:
    folder = write_task(tmp_path / "quiz")
    (folder / "quiz_copy.yaml").write_text(TASK)
    with pytest.raises(
        UserError, match=r"several lm-eval tasks \(quiz.yaml, quiz_copy.yaml\); give the task YAML"
    ):
        read_benchmark(folder)
    assert len(read_benchmark(folder / "quiz_copy.yaml")) == 3


def test_dataset_path_may_be_a_local_folder_of_split_files(tmp_path: Path) -> None:
    task = "task: quiz\ndataset_path: data\ntest_split: test\ndoc_to_text: question\ndoc_to_choice: choices\n"
    folder = write_task(tmp_path / "quiz", task + "doc_to_target: answer\n")
    bench = read_benchmark(folder)
    assert bench.table.meta["data_file"] == "data/test.jsonl" and len(bench) == 3
    assert bench.style == "columns:question=question,options=choices,answer=answer"
