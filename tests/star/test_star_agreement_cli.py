"""assay star agreement: alpha for a rating table from any tool (Krippendorff 2011's worked example)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from assay.cli import main

# Krippendorff (2011), "Computing Krippendorff's Alpha-Reliability": 4 coders x 12 units, missing values.
CODERS = {
    "A": "1 2 3 3 2 1 4 1 2 . . .",
    "B": "1 2 3 3 2 2 4 1 2 5 . 3",
    "C": ". 3 3 3 2 3 4 2 2 5 1 .",
    "D": "1 2 3 3 2 4 4 1 2 5 1 .",
}
PUBLISHED = {"nominal": 0.743, "ordinal": 0.815, "interval": 0.849, "ratio": 0.797}


def _table(path: Path) -> Path:
    columns = {c: v.split() for c, v in CODERS.items()}
    lines = ["unit," + ",".join(columns)]
    for unit in range(12):
        lines.append(
            f"u{unit + 1}," + ",".join("" if columns[c][unit] == "." else columns[c][unit] for c in columns)
        )
    path.write_text("\n".join(lines) + "\n")
    return path


def run(args: list[str], monkeypatch, capsys) -> tuple[int, str, str]:
    monkeypatch.setattr(sys, "argv", ["assay", "star", "agreement", *args])
    with pytest.raises(SystemExit) as exit_:
        main()
    out, err = capsys.readouterr()
    return int(exit_.value.code or 0), out, err


@pytest.mark.parametrize("level", list(PUBLISHED))
def test_worked_example_through_the_cli(tmp_path: Path, monkeypatch, capsys, level: str) -> None:
    code, out, _ = run(
        [str(_table(tmp_path / "r.csv")), "--level", level, "--bootstrap", "300", "--json"],
        monkeypatch,
        capsys,
    )
    assert code == 0
    record = json.loads(out)
    assert round(record["alpha"], 3) == PUBLISHED[level]
    assert record["units"] == 12 and record["pairable_units"] == 11 and record["coders"] == 4
    low, high = record["ci95"]
    assert low <= record["alpha"] <= high and record["bootstrap"] > 250
    assert record["percent_agreement"] == pytest.approx(43 / 55, abs=1e-12)


def test_bad_cells_are_one_line(tmp_path: Path, monkeypatch, capsys) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("unit,A,B\nu1,1,2\nu2,3,high\n")
    code, _, err = run([str(bad), "--level", "ordinal"], monkeypatch, capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert "bad.csv:3" in err and "'B'" in err and "high" in err
    code, _, err = run([str(_table(tmp_path / "r.csv")), "--level", "fuzzy"], monkeypatch, capsys)
    assert code == 2 and "--level" in err
