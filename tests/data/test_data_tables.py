"""Raw tables: reading each format, naming rows in errors, writing back byte for byte and atomically."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from assay.data import RawTable, read_table, write_table
from assay.errors import UserError


def _siblings(path: Path) -> list[str]:
    return sorted(p.name for p in path.parent.iterdir())


# ---------------------------------------------------------------- JSON Lines


def test_jsonl_locations_are_physical_lines_and_rewrite_is_byte_identical(tmp_path: Path) -> None:
    path = tmp_path / "b.jsonl"
    path.write_text('{"a": 1, "b": "x"}\n\n{"a": 2, "b": "\\u00e9"}\n', encoding="utf-8")
    table = read_table(path)
    assert table.file_format == "jsonl"
    assert table.rows == [{"a": 1, "b": "x"}, {"a": 2, "b": "é"}]
    assert table.locations == ["line 1", "line 3"]
    out = tmp_path / "out.jsonl"
    write_table(table, table.rows, out)
    assert out.read_text(encoding="utf-8") == '{"a": 1, "b": "x"}\n{"a": 2, "b": "\\u00e9"}\n'


def test_jsonl_keeps_compact_separators_and_unicode(tmp_path: Path) -> None:
    path = tmp_path / "b.jsonl"
    text = '{"q":"café","n":[1,2]}\n'
    path.write_text(text, encoding="utf-8")
    table = read_table(path)
    write_table(table, table.rows, tmp_path / "out.jsonl")
    assert (tmp_path / "out.jsonl").read_text(encoding="utf-8") == text


def test_jsonl_lines_are_split_on_newlines_only(tmp_path: Path) -> None:
    path = tmp_path / "b.jsonl"
    text = '{"q": "one\u2028two\x85three"}\r\n{"q": "x"}\r\n'
    path.write_text(text, encoding="utf-8", newline="")
    table = read_table(path)
    assert table.rows == [{"q": "one\u2028two\x85three"}, {"q": "x"}]
    assert table.locations == ["line 1", "line 2"]


def test_jsonl_invalid_json_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"a": 1}\n{"a": 2}\n{"a": \n', encoding="utf-8")
    with pytest.raises(UserError, match=r"bad\.jsonl:line 3: invalid JSON") as info:
        read_table(path)
    assert "\n" not in str(info.value)


def test_jsonl_row_that_is_not_an_object(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"a": 1}\n[1, 2]\n', encoding="utf-8")
    with pytest.raises(
        UserError, match=r"bad\.jsonl:line 2: a row must be a JSON object, not a list \(value: \[1, 2\]\)"
    ):
        read_table(path)


@pytest.mark.parametrize("content", ["", "\n\n", "[]", '{"canary": "x", "examples": []}'])
def test_empty_benchmark(tmp_path: Path, content: str) -> None:
    path = tmp_path / ("empty.jsonl" if not content.strip() else "empty.json")
    path.write_text(content, encoding="utf-8")
    with pytest.raises(UserError, match=r"empty\.jsonl?: the benchmark is empty \(no rows\)"):
        read_table(path)


def test_empty_csv_with_only_a_header(tmp_path: Path) -> None:
    path = tmp_path / "empty.csv"
    path.write_text("question,A,B,answer\n", encoding="utf-8")
    with pytest.raises(UserError, match="the benchmark is empty"):
        read_table(path)


def test_missing_file_and_unknown_suffix(tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"nope\.jsonl: no such file"):
        read_table(tmp_path / "nope.jsonl")
    odd = tmp_path / "bench.xlsx"
    odd.write_text("x", encoding="utf-8")
    with pytest.raises(UserError, match=r"bench\.xlsx: unknown benchmark format '\.xlsx'.*\.jsonl"):
        read_table(odd)
    folder = tmp_path / "folder"
    folder.mkdir()
    with pytest.raises(UserError, match="not one saved by HF datasets"):
        read_table(folder)


def test_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "latin.jsonl"
    path.write_bytes('{"q": "café"}\n'.encode("latin-1"))
    with pytest.raises(UserError, match="not UTF-8"):
        read_table(path)


# ---------------------------------------------------------------- JSON


def test_json_container_keys_are_kept(tmp_path: Path) -> None:
    path = tmp_path / "task.json"
    doc = {
        "canary": "GUID 123",
        "examples": [{"input": "q1", "target": "(A)"}, {"input": "q2", "target": "(B)"}],
    }
    path.write_text(json.dumps(doc), encoding="utf-8")
    table = read_table(path)
    assert table.container == {"rows_key": "examples", "object": {"canary": "GUID 123", "examples": None}}
    assert table.locations == ["examples[0]", "examples[1]"]
    out = tmp_path / "out.json"
    write_table(table, table.rows, out)
    assert out.read_text(encoding="utf-8") == path.read_text(encoding="utf-8")
    rows = [dict(table.rows[0], target="(C)"), table.rows[1]]
    write_table(table, rows, out)
    assert json.loads(out.read_text(encoding="utf-8")) == {"canary": "GUID 123", "examples": rows}


def test_json_list_with_indent_round_trips(tmp_path: Path) -> None:
    path = tmp_path / "list.json"
    text = json.dumps([{"instruction": "Say hi", "output": "hi"}], indent=4, ensure_ascii=False) + "\n"
    path.write_text(text, encoding="utf-8")
    table = read_table(path)
    assert table.container is None
    assert table.locations == ["[0]"]
    write_table(table, table.rows, tmp_path / "out.json")
    assert (tmp_path / "out.json").read_text(encoding="utf-8") == text


def test_json_errors(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text('{"examples": [\n  {"a": 1},\n  {"a": 2,}\n]}', encoding="utf-8")
    with pytest.raises(UserError, match=r"bad\.json:line 3: invalid JSON"):
        read_table(path)
    path.write_text('{"a": 1}\n{"a": 2}\n', encoding="utf-8")
    with pytest.raises(UserError, match=r"line 2: invalid JSON: Extra data.*rename the file to \.jsonl"):
        read_table(path)
    path.write_text('{"examples": [{"a": 1}, "oops"]}', encoding="utf-8")
    with pytest.raises(
        UserError, match=r"bad\.json:examples\[1\]: a row must be a JSON object, not a string"
    ):
        read_table(path)
    path.write_text('{"name": "x", "count": 3}', encoding="utf-8")
    with pytest.raises(UserError, match="no list of row objects"):
        read_table(path)
    path.write_text("42", encoding="utf-8")
    with pytest.raises(UserError, match="found a number at the top level"):
        read_table(path)


def test_json_object_with_several_lists_needs_split(tmp_path: Path) -> None:
    path = tmp_path / "splits.json"
    path.write_text(json.dumps({"train": [{"a": 1}], "test": [{"a": 2}, {"a": 3}]}), encoding="utf-8")
    with pytest.raises(UserError, match=r"several lists of rows \['train', 'test'\]"):
        read_table(path)
    table = read_table(path, split="test")
    assert table.rows == [{"a": 2}, {"a": 3}]
    assert table.locations == ["test[0]", "test[1]"]
    write_table(table, [{"a": 5}, {"a": 6}], tmp_path / "out.json")
    assert json.loads((tmp_path / "out.json").read_text()) == {
        "train": [{"a": 1}],
        "test": [{"a": 5}, {"a": 6}],
    }


# ---------------------------------------------------------------- CSV


def test_csv_locations_count_the_header_and_multiline_records(tmp_path: Path) -> None:
    path = tmp_path / "mmlu.csv"
    text = 'question,A,B,answer\n"two\nlines",x,y,A\nq2,x,y,B\n'
    path.write_text(text, encoding="utf-8")
    table = read_table(path)
    assert table.locations == ["line 2", "line 4"]
    assert table.rows[0] == {"question": "two\nlines", "A": "x", "B": "y", "answer": "A"}
    write_table(table, table.rows, tmp_path / "out.csv")
    assert (tmp_path / "out.csv").read_text(encoding="utf-8") == text


def test_csv_keeps_crlf_bom_and_column_order(tmp_path: Path) -> None:
    path = tmp_path / "b.csv"
    raw = '\ufeffz,question,a\r\n1,"q, with comma",x\r\n'
    path.write_bytes(raw.encode("utf-8"))
    table = read_table(path)
    assert list(table.rows[0]) == ["z", "question", "a"]
    write_table(table, [dict(table.rows[0], a="y")], tmp_path / "out.csv")
    assert (tmp_path / "out.csv").read_bytes() == raw.replace(",x\r", ",y\r").encode("utf-8")


def test_csv_errors(tmp_path: Path) -> None:
    path = tmp_path / "bad.csv"
    path.write_text("question,A,B,answer\nq,x,y,A\nq,x,y\n", encoding="utf-8")
    with pytest.raises(UserError, match=r"bad\.csv:line 3: has 3 values but the header has 4 columns"):
        read_table(path)
    path.write_text("question,A,A,answer\nq,x,y,A\n", encoding="utf-8")
    with pytest.raises(UserError, match=r"bad\.csv:line 1: the header names column 'A' twice"):
        read_table(path)


# ---------------------------------------------------------------- Parquet


def test_parquet_keeps_types_and_schema(tmp_path: Path) -> None:
    path = tmp_path / "b.parquet"
    schema = pa.schema(
        [
            ("question", pa.string()),
            ("choices", pa.list_(pa.string())),
            ("answer", pa.int8()),
            ("id", pa.int64()),
        ]
    )
    rows = [
        {"question": "q1", "choices": ["a", "b"], "answer": 1, "id": 10},
        {"question": "q2", "choices": ["c", "d", "e"], "answer": 0, "id": 11},
    ]
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)
    table = read_table(path)
    assert table.rows == rows
    assert table.locations == ["row 1", "row 2"]
    out = tmp_path / "out.parquet"
    write_table(table, [dict(rows[0], answer=0), rows[1]], out)
    written = pq.read_table(out)
    assert written.schema == schema
    assert written.to_pylist()[0]["answer"] == 0


def test_parquet_written_by_pandas_round_trips(tmp_path: Path) -> None:
    pd = pytest.importorskip("pandas")
    path = tmp_path / "b.parquet"
    frame = pd.DataFrame({"question": ["q1", "q2"], "answer": [1, 0], "subject": ["math", "law"]})
    frame.to_parquet(path)
    table = read_table(path)
    write_table(table, table.rows, tmp_path / "out.parquet")
    back = pd.read_parquet(tmp_path / "out.parquet")
    pd.testing.assert_frame_equal(back, frame)


def test_atomic_write_leaves_nothing_behind(tmp_path: Path) -> None:
    path = tmp_path / "b.parquet"
    pq.write_table(pa.Table.from_pylist([{"answer": 1}]), path)
    table = read_table(path)
    target = tmp_path / "out" / "release.parquet"
    with pytest.raises((pa.ArrowInvalid, pa.ArrowTypeError)):
        write_table(table, [{"answer": "not an int"}], target)
    assert not target.exists()
    assert not target.parent.exists()  # the folder made for it is removed too (assay.fileio)
    # An existing target is left as it was.
    write_table(table, table.rows, target)
    before = target.read_bytes()
    with pytest.raises((pa.ArrowInvalid, pa.ArrowTypeError)):
        write_table(table, [{"answer": "not an int"}], target)
    assert target.read_bytes() == before
    assert _siblings(target) == ["release.parquet"]


def test_table_built_by_hand_writes_with_defaults(tmp_path: Path) -> None:
    table = RawTable(Path("x.jsonl"), "jsonl", [{"a": "é"}], ["line 1"])
    write_table(table, table.rows, tmp_path / "x.jsonl")
    assert (tmp_path / "x.jsonl").read_text(encoding="utf-8") == '{"a": "é"}\n'


# ---------------------------------------------------------------- HF datasets


def test_hf_dataset_and_dataset_dict(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    features = datasets.Features(
        {
            "question": datasets.Value("string"),
            "choices": datasets.Sequence(datasets.Value("string")),
            "answer": datasets.ClassLabel(names=["A", "B", "C"]),
        }
    )
    test_rows = [{"question": "q1", "choices": ["a", "b", "c"], "answer": 2}]
    dev_rows = [{"question": "d1", "choices": ["x", "y", "z"], "answer": 0}]
    single = tmp_path / "single"
    datasets.Dataset.from_list(test_rows, features=features).save_to_disk(str(single))
    table = read_table(single)
    assert (table.file_format, table.split, table.rows, table.locations) == ("hf", None, test_rows, ["row 1"])
    with pytest.raises(UserError, match="a single Dataset, not a DatasetDict"):
        read_table(single, split="test")

    both = tmp_path / "both"
    datasets.DatasetDict(
        {
            "dev": datasets.Dataset.from_list(dev_rows, features=features),
            "test": datasets.Dataset.from_list(test_rows, features=features),
        }
    ).save_to_disk(str(both))
    with pytest.raises(
        UserError, match=r"both: a DatasetDict with splits \['dev', 'test'\]: pick one with split"
    ):
        read_table(both)
    with pytest.raises(UserError, match=r"no split 'train'; splits: \['dev', 'test'\]"):
        read_table(both, split="train")
    table = read_table(both, split="test")
    assert table.split == "test"
    out = tmp_path / "out"
    write_table(table, [dict(test_rows[0], answer=1)], out)
    back = datasets.load_from_disk(str(out))
    assert list(back) == ["dev", "test"]
    assert back["test"].features == features
    assert back["test"].to_list() == [dict(test_rows[0], answer=1)]
    assert back["dev"].to_list() == dev_rows
