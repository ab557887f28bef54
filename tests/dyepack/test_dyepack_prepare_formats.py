"""Releases in the input's own layout: MMLU's folder of header-less CSVs, lm-eval task folders, --columns."""

import csv
import io
import json
from collections import defaultdict
from pathlib import Path

from typer.testing import CliRunner

from assay.cli import app as root_app
from assay.data import read_benchmark
from assay.dyepack.key import load_key
from assay.dyepack.prepare import PrepareConfig, prepare_release
from assay.dyepack.verify import check_release


def mmlu_folder(mmlu_sample: Path, folder: Path) -> Path:
    """The 120 sample rows as MMLU's own files: one header-less CSV per subject, QUOTE_MINIMAL."""
    by_subject = defaultdict(list)
    for line in mmlu_sample.read_text().splitlines():
        row = json.loads(line)
        fields = [row["question"], *(row[f"answer_{c}"] for c in "abcd"), row["correct_answer"]]
        by_subject[row["topic"].replace(" ", "_")].append(fields)
    folder.mkdir(parents=True)
    for subject, rows in by_subject.items():
        buffer = io.StringIO(newline="")
        csv.writer(buffer, lineterminator="\n").writerows(rows)
        (folder / f"{subject}_test.csv").write_text(buffer.getvalue(), newline="")
    return folder


def test_mmlu_folder_release_is_a_folder_of_header_less_csvs(tmp_path, mmlu_sample):
    source = mmlu_folder(mmlu_sample, tmp_path / "mmlu" / "test")
    bench = read_benchmark(source, style="mmlu")
    config = PrepareConfig(n_backdoors=4, fraction=0.1, seed=3, cover=0.0)
    result = prepare_release(bench, config, tmp_path / "out")
    assert result.key.file_format == "csv-folder" and result.release_path == tmp_path / "out" / "test"
    released = read_benchmark(result.release_path, style=result.key.style)
    check_release(released, result.key)
    starts, total = {}, 0
    for name, count, _ in bench.table.meta["parts"]:
        starts[name] = range(total, total + count)
        total += count
    touched = {name for name, rows in starts.items() for b in result.key.backdoors if set(b.rows) & set(rows)}
    assert sorted(p.name for p in result.release_path.iterdir()) == sorted(starts)
    for name in starts:
        same = (result.release_path / name).read_bytes() == (source / name).read_bytes()
        assert same == (name not in touched), name
        first = next(csv.reader(io.StringIO((result.release_path / name).read_text())))
        assert len(first) == 6 and first[5] in "ABCD"  # still no header row


def test_lm_eval_task_release_verifies_from_the_copied_folder(tmp_path, mmlu_sample):
    task = tmp_path / "task"
    (task / "data").mkdir(parents=True)
    rows = []
    for line in mmlu_sample.read_text().splitlines():
        row = json.loads(line)
        choices = [row[f"answer_{c}"] for c in "abcd"]
        rows.append(
            {"question": row["question"], "choices": choices, "answer": "ABCD".index(row["correct_answer"])}
        )
    (task / "data" / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (task / "mmlu_mini.yaml").write_text(
        "task: mmlu_mini\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: data/test.jsonl\n"
        'test_split: test\noutput_type: multiple_choice\ndoc_to_text: "{{question.strip()}}\\nAnswer:"\n'
        "doc_to_choice: choices\ndoc_to_target: answer\n"
    )
    result = prepare_release(read_benchmark(task), PrepareConfig(n_backdoors=6, seed=2), tmp_path / "out")
    assert (result.release_path / "mmlu_mini.yaml").read_bytes() == (task / "mmlu_mini.yaml").read_bytes()
    key = result.key
    assert key.file_format == "lmeval" and key.style.startswith("columns:") and key.split == "test"
    check_release(read_benchmark(result.release_path, style=key.style, split=key.split), key)


def test_prepare_command_takes_a_column_mapping_and_the_key_remembers_it(tmp_path, mmlu_sample):
    path = tmp_path / "mc.jsonl"
    rows = [json.loads(line) for line in mmlu_sample.read_text().splitlines()]
    path.write_text(
        "".join(
            json.dumps(
                {"Q": r["question"], "opts": [r[f"answer_{c}"] for c in "abcd"], "label": r["correct_answer"]}
            )
            + "\n"
            for r in rows
        )
    )
    args = ["dyepack", "prepare", str(path), "-b", "6", "-o", str(tmp_path / "out")]  # 4: 1/256 > alpha
    result = CliRunner().invoke(
        root_app, [*args, "--columns", "question=Q,options=opts,answer=label", "--no-audit", "--json"]
    )
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["audit"] is None and summary["cover_rows"] > 90
    assert sum(summary["trigger_positions"].values()) == summary["backdoor_samples"] == 12
    key = load_key(summary["key"])
    assert key.style == "columns:question=Q,options=opts,answer=label"
    check_release(read_benchmark(tmp_path / "out" / "mc.jsonl", style=key.style), key)
