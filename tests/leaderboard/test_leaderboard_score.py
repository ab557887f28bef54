"""assay leaderboard score: file reading, NIST's missing-result rule, grouped scores, and the CLI's errors."""

from __future__ import annotations

import csv
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from assay.cli import main
from assay.errors import UserError
from assay.leaderboard.scoring import default_factors, read_metadata, read_scores, score, score_files
from assay.stats import detection_metrics, grouped_metrics
from assay.zoo.round import METADATA_COLUMNS

NAMES = [f"id-{i:08d}" for i in range(12)]
TRUTH = [0, 1, 1, 0, 1, 0, 0, 1, 1, 0, 1, 0]
PREDICTIONS = [0.1, 0.9, 1.0, 0.0, 0.35, 0.6, 0.2, 0.8, 0.7, 0.3, 0.55, 0.45]
ARCHITECTURES = ["cnn", "mlp", "cnn", "mlp", "cnn", "mlp", "cnn", "mlp", "cnn", "mlp", "cnn", "mlp"]


def _write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def _csv(path: Path, header: str | None, names: list[str], values: list) -> Path:
    lines = ([header] if header else []) + [f"{n},{v}" for n, v in zip(names, values, strict=True)]
    return _write(path, "\n".join(lines) + "\n")


def _metadata(path: Path, names: list[str] = NAMES) -> Path:
    """A METADATA.csv with the zoo's columns: two factors that vary, the rest unique or constant."""
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(METADATA_COLUMNS))
        writer.writeheader()
        for i, name in enumerate(names):
            row = dict.fromkeys(METADATA_COLUMNS, "")
            row.update(model_name=name, index=str(i), dataset="digits" if i < 6 else "mnist")
            row.update(architecture=ARCHITECTURES[i], poisoned=str(bool(TRUTH[i])), epochs="3")
            row.update(training_seed=str(100 + i), clean_accuracy=f"0.9{i:02d}")
            writer.writerow(row)
    return path


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    return {
        "predictions": _csv(tmp_path / "predictions.csv", "model_name,prediction", NAMES, PREDICTIONS),
        "truth": _csv(tmp_path / "truth.csv", "model_name,ground_truth", NAMES, TRUTH),
        "metadata": _metadata(tmp_path / "METADATA.csv"),
    }


def _run(
    args: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> tuple[int, str, str]:
    """``assay.cli.main`` in process (as ``python -m assay`` runs it): exit code, stdout, stderr."""
    monkeypatch.setattr(sys, "argv", ["assay", "leaderboard", "score", *args])
    with pytest.raises(SystemExit) as exit_:
        main()
    out, err = capsys.readouterr()
    return int(exit_.value.code or 0), out, err


def _same(report: dict, expected: dict) -> None:
    assert report.keys() == expected.keys()
    for key, value in expected.items():
        if isinstance(value, float) and math.isnan(value):
            assert report[key] is None  # JSON has no NaN
        else:
            assert report[key] == pytest.approx(value, abs=1e-12)


@pytest.mark.slow
def test_happy_path_json_equals_the_stats_functions(files: dict[str, Path]) -> None:
    args = ["--predictions", str(files["predictions"]), "--truth", str(files["truth"])]
    args += [
        "--metadata",
        str(files["metadata"]),
        "--group-by",
        "architecture",
        "--group-by",
        "dataset",
        "--json",
    ]
    done = subprocess.run(
        [sys.executable, "-m", "assay", "leaderboard", "score", *args], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert (report["models"], report["predicted"], report["missing"], report["flags"]) == (12, 12, [], "")
    y, p = np.array(TRUTH), np.array(PREDICTIONS)
    _same(report["overall"], detection_metrics(y, p))
    assert report["group_by"] == ["architecture", "dataset"]
    for value, expected in grouped_metrics(y, p, ARCHITECTURES).items():
        _same(report["groups"]["architecture"][value], expected)
    assert report["groups"]["dataset"]["digits"]["n"] == 6


def test_missing_predictions_score_half_and_are_flagged(files: dict[str, Path], tmp_path: Path) -> None:
    partial = _csv(tmp_path / "partial.csv", None, NAMES[:9], PREDICTIONS[:9])
    report = score_files(partial, files["truth"])
    assert report.missing == NAMES[9:] and report.predicted == 9 and report.flags == ":Missing Results:"
    filled = [*PREDICTIONS[:9], 0.5, 0.5, 0.5]
    assert report.overall == detection_metrics(np.array(TRUTH), np.array(filled))
    nothing = score({}, dict(zip(NAMES, TRUTH, strict=True)))
    assert nothing.flags == ":No Results::Missing Results:"
    assert nothing.overall["cross_entropy"] == pytest.approx(math.log(2), abs=1e-15)


def test_missing_is_shown_in_the_table(files: dict[str, Path], tmp_path: Path, monkeypatch, capsys) -> None:
    partial = _csv(tmp_path / "partial.csv", None, NAMES[1:], PREDICTIONS[1:])
    code, out, _ = _run(
        ["-p", str(partial), "-t", str(files["truth"]), "-m", str(files["metadata"])], monkeypatch, capsys
    )
    assert code == 0
    assert ":Missing Results: 1 model(s) scored as 0.5, first id-00000000" in out
    assert "by architecture" in out and "by dataset" in out and "by poisoned" not in out


def test_headers_accepted(tmp_path: Path) -> None:
    expected = dict(zip(NAMES[:3], PREDICTIONS[:3], strict=True))
    for header in (None, "model_name,prediction", "model_name,probability", "model,score"):
        path = _csv(tmp_path / "p.csv", header, NAMES[:3], PREDICTIONS[:3])
        assert read_scores(path, "prediction") == expected
    _write(
        tmp_path / "bom.csv", "\ufeffmodel_name,ground_truth\r\nid-00000001 , 1\r\n\r\nid-00000002,0.0\r\n"
    )
    assert read_scores(tmp_path / "bom.csv", "ground_truth") == {"id-00000001": 1.0, "id-00000002": 0.0}


BAD_PREDICTIONS = [
    ("model_name,prediction\nid-00000000,0.5\nid-00000001,high\n", 3, "prediction", "is not a number"),
    ("id-00000000,1.5\n", 1, "prediction", "must be a probability in [0, 1]"),
    ("model_name,prediction\nid-00000000,-0.1\n", 2, "prediction", "must be a probability"),
    ("model_name,prediction\nid-00000000,nan\n", 2, "prediction", "must be a probability"),
    (
        "model_name,prediction\nid-00000000,0.2\nid-00000000,0.3\n",
        3,
        "model_name",
        "repeats the model of line 2",
    ),
    ("model_name,prediction\nid-00000000,0.2,0.3\n", 2, "prediction", "expected 2 fields"),
]


@pytest.mark.parametrize(("text", "line", "field", "problem"), BAD_PREDICTIONS)
def test_bad_predictions_name_file_line_and_field(
    files: dict[str, Path],
    tmp_path: Path,
    monkeypatch,
    capsys,
    text: str,
    line: int,
    field: str,
    problem: str,
) -> None:
    bad = _write(tmp_path / "bad.csv", text)
    code, out, err = _run(["-p", str(bad), "-t", str(files["truth"])], monkeypatch, capsys)
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1
    assert f"{bad}:{line}: field '{field}' {problem}" in err


@pytest.mark.parametrize(
    ("text", "line", "field", "problem"),
    [
        ("id-00000000,2\n", 1, "ground_truth", "must be 0 (clean) or 1"),
        ("model_name,truth\nid-00000000,yes\n", 2, "truth", "is not a number"),
    ],
)
def test_bad_truth_names_file_line_and_field(
    files: dict[str, Path],
    tmp_path: Path,
    monkeypatch,
    capsys,
    text: str,
    line: int,
    field: str,
    problem: str,
) -> None:
    bad = _write(tmp_path / "truth-bad.csv", text)
    code, _, err = _run(["-p", str(files["predictions"]), "-t", str(bad)], monkeypatch, capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert f"{bad}:{line}: field '{field}' {problem}" in err


@pytest.mark.slow
def test_bad_input_exits_2_with_one_line_from_a_subprocess(files: dict[str, Path], tmp_path: Path) -> None:
    bad = _write(tmp_path / "bad.csv", "model_name,prediction\nid-00000000,0.5\nid-00000000,0.7\n")
    args = ["leaderboard", "score", "--predictions", str(bad), "--truth", str(files["truth"])]
    done = subprocess.run([sys.executable, "-m", "assay", *args], capture_output=True, text=True)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.strip().splitlines() == [
        f"error: {bad}:3: field 'model_name' repeats the model of line 2 (value: 'id-00000000')"
    ]


def test_unknown_models_and_unknown_columns_are_errors(files: dict[str, Path], tmp_path: Path) -> None:
    extra = _csv(tmp_path / "extra.csv", None, [*NAMES, "id-99999999"], [*PREDICTIONS, 0.5])
    with pytest.raises(UserError, match="1 model\\(s\\) not in the ground truth, first 'id-99999999'"):
        score_files(extra, files["truth"])
    with pytest.raises(UserError, match="no column 'colour'"):
        score_files(files["predictions"], files["truth"], files["metadata"], ["colour"])
    with pytest.raises(UserError, match="needs metadata"):
        score_files(files["predictions"], files["truth"], None, ["dataset"])
    short = _metadata(tmp_path / "short.csv", NAMES[:5])
    with pytest.raises(UserError, match=r"short\.csv: no row for 7 scored model\(s\), first 'id-00000005'"):
        score_files(files["predictions"], files["truth"], short)
    with pytest.raises(UserError, match="not found"):
        score_files(tmp_path / "absent.csv", files["truth"])


def test_grouped_scores_each_group_on_its_own_models(files: dict[str, Path]) -> None:
    report = score_files(files["predictions"], files["truth"], files["metadata"])
    assert report.group_by == ["dataset", "architecture"]  # index, seeds, accuracy unique; poisoned excluded
    y, p = np.array(TRUTH), np.array(PREDICTIONS)
    assert report.groups["dataset"]["digits"] == detection_metrics(y[:6], p[:6])
    assert report.groups["dataset"]["digits"]["roc_auc"] != report.overall["roc_auc"]


def test_round_folder_as_truth_reads_its_metadata(tmp_path: Path, files: dict[str, Path]) -> None:
    round_dir = tmp_path / "splits" / "test"
    for name, truth in zip(NAMES, TRUTH, strict=True):
        (round_dir / "models" / name).mkdir(parents=True)
        _write(round_dir / "models" / name / "ground_truth.csv", f"{truth}\n")
    _metadata(round_dir / "METADATA.csv")
    report = score_files(files["predictions"], round_dir, group_by=["architecture"])
    assert report.models == 12 and report.group_by == ["architecture"]
    assert report.overall == detection_metrics(np.array(TRUTH), np.array(PREDICTIONS))


def test_read_metadata_and_default_factors(files: dict[str, Path], tmp_path: Path) -> None:
    table = read_metadata(files["metadata"])
    assert list(table) == NAMES and table[NAMES[7]]["dataset"] == "mnist"
    assert default_factors(table, NAMES[:6]) == ["architecture"]  # dataset is constant on these
    _write(tmp_path / "nohead.csv", "name,dataset\nid-00000000,digits\n")
    with pytest.raises(UserError, match=r"nohead\.csv:1: field 'model_name' is missing"):
        read_metadata(tmp_path / "nohead.csv")


def test_a_class_absent_gives_null_in_json() -> None:
    report = score({"id-1": 0.9, "id-2": 0.4}, {"id-1": 1, "id-2": 1})
    dumped = json.loads(report.model_dump_json())["overall"]
    assert dumped["roc_auc"] is None and dumped["tpr_at_5_fpr"] is None and dumped["positives"] == 2
