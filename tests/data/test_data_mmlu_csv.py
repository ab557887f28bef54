"""MMLU's own CSV files: no header row, one file per subject, a folder of them; written back as they were."""

import csv
import io
from dataclasses import replace
from pathlib import Path

import pytest

from assay.data import read_benchmark, write_benchmark
from assay.data.items import MultipleChoice
from assay.errors import UserError

# Rows as the original files have them (question, A, B, C, D, answer): commas, quotes and a line break
# inside fields, as pandas' to_csv wrote them (csv.QUOTE_MINIMAL, "\n" line ends).
SUBJECTS = {
    "abstract_algebra_test.csv": [
        ["Find all c in Z_3 such that Z_3[x]/(x^2 + c) is a field.", "0", "1", "2", "3", "B"],
        [
            "Statement 1 | If aH is an element of a factor group, then |aH| divides |a|. Statement 2 | If H "
            "and K are subgroups of G then HK is a subgroup of G.",
            "True, True",
            "False, False",
            "True, False",
            "False, True",
            "B",
        ],
    ],
    "high_school_us_history_test.csv": [
        [
            'This question refers to the following information.\n"Society in every state is a blessing, but '
            'government even in its best state is but a necessary evil."\nThe author most likely wrote to',
            "argue for independence",
            "praise the king",
            'defend "the crown"',
            "oppose taxation",
            "A",
        ],
        ["Which amendment ended slavery?", "13th", "14th", "15th", "19th", "A"],
    ],
}


def mmlu_csv(rows: list[list[str]]) -> str:
    buffer = io.StringIO(newline="")
    csv.writer(buffer, quoting=csv.QUOTE_MINIMAL, lineterminator="\n").writerows(rows)
    return buffer.getvalue()


@pytest.fixture
def mmlu_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "data" / "test"
    folder.mkdir(parents=True)
    for name, rows in SUBJECTS.items():
        (folder / name).write_text(mmlu_csv(rows), encoding="utf-8", newline="")
    return folder


def test_a_header_less_file_reads_as_mmlu_with_its_subject(mmlu_folder: Path) -> None:
    path = mmlu_folder / "abstract_algebra_test.csv"
    bench = read_benchmark(path, style="mmlu")
    assert bench.style == "mmlu" and read_benchmark(path).style == "mmlu"  # auto detects it too
    assert bench.items[1] == MultipleChoice(
        SUBJECTS["abstract_algebra_test.csv"][1][0],
        ("True, True", "False, False", "True, False", "False, True"),
        1,
    )
    assert [row["subject"] for row in bench.table.rows] == ["abstract_algebra"] * 2
    assert bench.table.locations == ["line 1", "line 2"]
    out = path.parent.parent / "copy.csv"
    write_benchmark(bench, bench.items, out)
    assert out.read_bytes() == path.read_bytes()


def test_a_folder_reads_every_subject_and_writes_back_the_same_files(
    mmlu_folder: Path, tmp_path: Path
) -> None:
    bench = read_benchmark(mmlu_folder)
    assert bench.file_format == "csv-folder" and bench.style == "mmlu" and len(bench) == 4
    assert [row["subject"] for row in bench.table.rows] == ["abstract_algebra"] * 2 + [
        "high_school_us_history"
    ] * 2
    assert bench.table.locations[2:] == [
        "high_school_us_history_test.csv line 1",
        "high_school_us_history_test.csv line 4",
    ]
    assert bench.items[2].options[2] == 'defend "the crown"' and "\n" in bench.items[2].question
    items = list(bench.items)
    items[3] = replace(items[3], question="Note the date. " + items[3].question, answer=2)
    out = tmp_path / "release" / "test"
    write_benchmark(bench, items, out)
    assert sorted(p.name for p in out.iterdir()) == sorted(SUBJECTS)
    name = "abstract_algebra_test.csv"
    assert (out / name).read_bytes() == (mmlu_folder / name).read_bytes()
    history = (out / "high_school_us_history_test.csv").read_text(encoding="utf-8")
    rows = SUBJECTS["high_school_us_history_test.csv"]
    assert history == mmlu_csv([rows[0], ["Note the date. " + rows[1][0], *rows[1][1:5], "C"]])
    assert read_benchmark(out).items == items


def test_a_bad_row_names_the_file_in_the_folder_and_its_line(mmlu_folder: Path) -> None:
    (mmlu_folder / "zoology_test.csv").write_text(
        mmlu_csv([["Q?", "a", "b", "c", "d", "A"], ["Q2?", "a", "b", "c", "d", "E"]])
    )
    with pytest.raises(
        UserError,
        match=r"test:zoology_test\.csv line 2: field 'answer' letter 'E' is outside the options A-D",
    ):
        read_benchmark(mmlu_folder)


def test_a_csv_with_a_header_is_still_read_by_its_header(tmp_path: Path) -> None:
    path = tmp_path / "mmlu.csv"
    path.write_text(
        mmlu_csv([["question", "A", "B", "C", "D", "answer"], *SUBJECTS["abstract_algebra_test.csv"]])
    )
    bench = read_benchmark(path)
    assert len(bench) == 2 and "subject" not in bench.table.rows[0]
    write_benchmark(bench, bench.items, tmp_path / "copy.csv")
    assert (tmp_path / "copy.csv").read_bytes() == path.read_bytes()
