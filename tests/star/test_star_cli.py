"""assay star init / participants import / design / assign / status / simulate / export / import, in process
(as ``python -m assay`` runs them) on a real SQLite file."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from tests.conftest import SHARED_DATA

from star_cli import run

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "star-campaign.yaml"
POOL = """id,name,roles,expertise,race,gender,daily_cap,opted_out
p1,Ana,red_teamer;annotator,medical,Hispanic,female,20,false
p2,Bo,red_teamer;annotator;arbitrator,,Asian,male,20,false
p3,Cy,annotator,,Black,non-binary,20,false
p4,Di,annotator;arbitrator,medical,White,female,20,false
p5,Ed,annotator,,prefer not to say,male,5,false
"""
SCRIPTED = """
def respond(prompts):
    return ["Rating: 1\\nReason: it insulted the group" if "Scale:" in p else "A reply." for p in prompts]
"""


@pytest.fixture
def db(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("ASSAY_DB_URL", f"sqlite:///{tmp_path / 'star.db'}")
    return tmp_path


def test_campaign_from_the_command_line(db: Path, monkeypatch, capsys) -> None:
    (db / "pool.csv").write_text(POOL)
    assert run(["init", str(EXAMPLE)], monkeypatch, capsys)[0] == 0
    code, out, _ = run(["participants", "import", "demo-campaign", str(db / "pool.csv")], monkeypatch, capsys)
    assert code == 0 and "5 added" in out
    instructions = db / "instructions.jsonl"
    assert (
        run(["design", str(EXAMPLE), "--count", "24", "--out", str(instructions)], monkeypatch, capsys)[0]
        == 0
    )
    code, out, err = run(
        ["assign", "demo-campaign", "--instructions", str(instructions)], monkeypatch, capsys
    )
    assert code == 0 and "24 red-team tasks opened" in out
    assert "shortfall:" in err  # five people cannot cover every race x gender in-group requirement
    code, out, _ = run(["status", "demo-campaign", "--json"], monkeypatch, capsys)
    report = json.loads(out)
    assert sum(report["tasks"]["red_team"].values()) == 24 and report["dialogues"] == 0
    assert report["shortfalls"] and all(row["kind"] == "red_team" for row in report["shortfalls"])
    code, _, err = run(["participants", "import", "nope", str(db / "pool.csv")], monkeypatch, capsys)
    assert code == 2 and len(err.strip().splitlines()) == 1


def test_bad_pool_row_is_one_line(db: Path, monkeypatch, capsys) -> None:
    (db / "pool.csv").write_text(POOL.replace("Hispanic,female", "Martian,female"))
    run(["init", str(EXAMPLE)], monkeypatch, capsys)
    code, _, err = run(["participants", "import", "demo-campaign", str(db / "pool.csv")], monkeypatch, capsys)
    assert code == 2 and "pool.csv:2" in err and "race" in err and "Martian" in err


def test_simulate_export_and_import(db: Path, monkeypatch, capsys) -> None:
    module = db / "scripted.py"
    module.write_text(SCRIPTED)
    code, out, _ = run(
        [
            "simulate",
            str(EXAMPLE),
            "--target",
            f"python:{module}:respond",
            "-n",
            "6",
            "--turns",
            "1",
            "--json",
        ],
        monkeypatch,
        capsys,
    )
    assert code == 0
    summary = json.loads(out)
    assert summary["dialogues"] == 6 and summary["arbitrations"] == 0  # scripted annotators always agree
    name = summary["campaign"]
    code, out, _ = run(["export", name, "--out", str(db / "human")], monkeypatch, capsys)
    assert code == 0 and "0 dialogues" in out  # machine-made rows stay out unless asked for
    code, out, _ = run(
        ["export", name, "--out", str(db / "x"), "--machine", "only", "--format", "parquet"],
        monkeypatch,
        capsys,
    )
    assert code == 0
    dialogues = pd.read_parquet(db / "x" / "dialogues.parquet")
    annotations = pd.read_parquet(db / "x" / "annotations.parquet")
    assert len(dialogues) == 6 and dialogues["machine"].all()
    assert len(json.loads(dialogues["turns"][0])) == 2
    assert set(annotations["label"]) == {"definitely broken"} and annotations["broken"].all()
    instructions = pd.read_parquet(db / "x" / "instructions.parquet")
    assert len(instructions) == 6 and instructions["id"].str.startswith("ins-").all()


def test_import_hh_rlhf(tmp_path: Path, monkeypatch, capsys) -> None:
    source = SHARED_DATA / "hh-rlhf" / "harmless-base-test.jsonl.gz"
    if not source.is_file():
        pytest.skip(f"HH-RLHF not found at {source}")
    out = tmp_path / "hh.jsonl"
    code, stdout, _ = run(["import", str(source), "--out", str(out), "--limit", "50"], monkeypatch, capsys)
    assert code == 0 and "50 dialogues" in stdout
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 50 and all(r["source"] == "hh-rlhf" for r in rows)
    assert all(r["turns"][0]["role"] == "user" and r["turns"][0]["text"] for r in rows)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"chosen": "no turns here", "rejected": "none"}\n')
    code, _, err = run(["import", str(bad), "--out", str(tmp_path / "o.jsonl")], monkeypatch, capsys)
    assert code == 2 and "bad.jsonl:1" in err and not (tmp_path / "o.jsonl").exists()


def test_import_prompt_lines(tmp_path: Path, monkeypatch, capsys) -> None:
    from assay.assets import asset_path

    out = tmp_path / "harmbench.jsonl"
    source = asset_path("harmbench")
    code, stdout, _ = run(
        ["import", str(source), "--format", "lines", "--out", str(out), "--limit", "40"], monkeypatch, capsys
    )
    assert code == 0 and "40 dialogues" in stdout
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    first = next(line.strip() for line in source.read_text().splitlines() if line.strip())
    assert rows[0]["turns"] == [{"index": 0, "role": "user", "text": first, "created_at": None}]
    assert {r["source"] for r in rows} == {"harmbench_prompts"}
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n")
    code, _, err = run(
        ["import", str(empty), "--format", "lines", "--out", str(tmp_path / "o.jsonl")], monkeypatch, capsys
    )
    assert code == 2 and "empty.txt" in err and not (tmp_path / "o.jsonl").exists()
