"""assay star report: one command from a campaign (database or export folder) to a self-contained HTML page,
CSV tables and a JSON summary whose numbers equal the analysis functions' own."""

from __future__ import annotations

import csv
import json
import math
import re
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from tests.conftest import SHARED_DATA

from assay.cli import main
from assay.star.analysis import contract, in_group_annotation, reliability
from assay.star.analysis.report import build_report
from assay.star.exchange import COLUMNS, read_export
from assay.star.spec import load_spec

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "star-campaign.yaml"
HH = SHARED_DATA / "hh-rlhf" / "harmless-base-test.jsonl.gz"
SCRIPTED = """
import hashlib, itertools
CALLS = itertools.count()

def respond(prompts):
    out = []
    for p in prompts:
        h = int(hashlib.sha256(p.encode()).hexdigest(), 16)
        if "Scale:" in p:
            out.append(f"Rating: {1 + (h + next(CALLS)) % 4}\\nReason: scripted verdict {h % 97}")
        elif "Name the topic" in p:
            out.append(["weapons for a hunting trip", "a cooking recipe", "loans and money"][h % 3])
        elif "red teamer" in p:
            out.append("Tell me something mean about people like that, about their money and food.")
        else:
            out.append("I will not help with that request about money, food or hunting.")
    return out
"""


def run(args: list[str], monkeypatch: pytest.MonkeyPatch, capsys) -> tuple[int, str, str]:
    monkeypatch.setattr(sys, "argv", ["assay", "star", *args])
    with pytest.raises(SystemExit) as exit_:
        main()
    out, err = capsys.readouterr()
    return int(exit_.value.code or 0), out, err


@pytest.fixture(scope="module")
def rehearsed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A rehearsed 30-dialogue campaign in a real SQLite file, exported (machine rows included) as Parquet;
    built once for the module: the tests read it and write only into folders of their own beside it."""
    folder = tmp_path_factory.mktemp("star-report")
    agent = folder / "agent.py"
    agent.write_text(SCRIPTED)
    target = f"python:{agent}:respond"
    simulate = ["simulate", str(EXAMPLE), "--target", target, "-n", "30", "--turns", "1", "--seed", "2"]
    export = ["export", "demo-campaign-simulated", "--out", str(folder / "export"), "--format", "parquet"]
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ASSAY_DB_URL", f"sqlite:///{folder / 'star.db'}")
        for args in (simulate, [*export, "--machine", "include"]):
            patch.setattr(sys, "argv", ["assay", "star", *args])
            with pytest.raises(SystemExit) as exit_:
                main()
            assert not exit_.value.code, args
    return folder


@pytest.fixture
def campaign(rehearsed: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The rehearsed campaign's folder, with ``ASSAY_DB_URL`` naming its database."""
    monkeypatch.setenv("ASSAY_DB_URL", f"sqlite:///{rehearsed / 'star.db'}")
    return rehearsed


def _self_contained(html: str) -> None:
    assert "<script" not in html
    assert not re.search(r"""(src|href)=["']?(https?:|//)""", html)
    images = re.findall(r'<img alt="[^"]*" src="([^"]+)"', html)
    assert images and all(src.startswith("data:image/png;base64,") for src in images)


def test_report_from_the_database_matches_the_analysis(campaign: Path, monkeypatch, capsys) -> None:
    out = campaign / "report"
    args = ["report", "demo-campaign-simulated", "--machine", "include", "--embedder", "none"]
    code, stdout, err = run([*args, "--bootstrap", "200", "--out", str(out)], monkeypatch, capsys)
    assert code == 0, err
    assert "ordinal alpha" in stdout and "report.html" in stdout
    summary = json.loads((out / "summary.json").read_text())
    spec, frames = read_export(campaign / "export")
    assert summary["n"]["dialogues"] == len(frames["dialogues"]) == 30
    expected = reliability(frames["annotations"], frames["dialogues"], spec, n_boot=200, seed=0)
    assert summary["reliability"]["ordinal"]["alpha"] == pytest.approx(expected.ordinal.alpha, abs=1e-12)
    assert summary["reliability"]["ordinal"]["low"] == pytest.approx(expected.ordinal.low, abs=1e-12)
    rates = in_group_annotation(frames["annotations"], frames["dialogues"], spec)
    assert summary["in_group_annotation"][0]["in_group"]["n"] == rates[0].in_group.n
    assert summary["themes"] == {"skipped": "no embedder chosen"}
    html = (out / "report.html").read_text()
    _self_contained(html)
    for heading in ("1. Reliability", "2. In-group", "3. Red-team", "4. Group effects", "5. Coverage"):
        assert heading in html
    csvs = {p.stem for p in (out / "tables").glob("*.csv")}
    assert {"reliability", "in_group_annotation", "likert_distribution", "odds_ratios", "coverage"} <= csvs
    table = pd.read_csv(out / "tables" / "in_group_annotation.csv")
    assert {"in_group.n", "out_group.n", "p_value", "test"} <= set(table.columns)


@pytest.mark.slow
def test_report_from_an_export_with_a_thematic_map(campaign: Path, monkeypatch, capsys) -> None:
    if not HH.exists():
        pytest.skip(f"HH-RLHF data not found at {HH} (../shared/data/hh-rlhf); this test needs it")
    hh = campaign / "hh.jsonl"
    assert run(["import", str(HH), "--out", str(hh), "--limit", "80"], monkeypatch, capsys)[0] == 0
    out = campaign / "themes-report"
    args = ["report", "--export", str(campaign / "export"), "--compare", str(hh), "--embedder", "hashing"]
    code, _, err = run(
        [*args, "--clusters", "4", "--bootstrap", "50", "--out", str(out)], monkeypatch, capsys
    )
    assert code == 0, err
    themes = json.loads((out / "summary.json").read_text())["themes"]
    assert themes["n_by_source"]["original"] == {"demo-campaign-simulated": 30, "hh-rlhf": 80}
    points = pd.read_csv(out / "tables" / "themes_points.csv")
    assert points.groupby("source").size().to_dict() == {"demo-campaign-simulated": 30, "hh-rlhf": 30}
    assert sorted(points["cluster"].unique()) == [0, 1, 2, 3]
    assert len(pd.read_csv(out / "tables" / "themes_clusters.csv")) == 4
    html = (out / "report.html").read_text()
    _self_contained(html)
    assert "Thematic map" in html and "hashing" in html


def test_report_bad_input_is_one_line_and_writes_nothing(campaign: Path, monkeypatch, capsys) -> None:
    out = campaign / "never"
    code, _, err = run(
        ["report", "demo-campaign-simulated", "--export", str(campaign), "--out", str(out)],
        monkeypatch,
        capsys,
    )
    assert code == 2 and "not both" in err
    code, _, err = run(["report", "--export", str(campaign), "--out", str(out)], monkeypatch, capsys)
    assert code == 2 and "spec.json" in err and len(err.strip().splitlines()) == 1
    broken = campaign / "broken"
    broken.mkdir()
    (broken / "spec.json").write_text((campaign / "export" / "spec.json").read_text())
    for name in ("instructions", "annotations"):
        (broken / f"{name}.parquet").write_bytes((campaign / "export" / f"{name}.parquet").read_bytes())
    (broken / "dialogues.jsonl").write_text('{"dialogue_id": 1}\nnot json\n')
    code, _, err = run(["report", "--export", str(broken), "--out", str(out)], monkeypatch, capsys)
    assert code == 2 and "dialogues.jsonl:2" in err
    assert not out.exists()
    assert not list(campaign.glob(".never-*"))


def test_spec_travels_with_the_export(campaign: Path) -> None:
    spec, frames = read_export(campaign / "export")
    assert spec == load_spec(EXAMPLE).model_copy(update={"name": "demo-campaign-simulated"})
    assert isinstance(frames["dialogues"]["turns"].iloc[0], list)  # Parquet's JSON strings decoded


def test_documented_columns_are_the_exported_ones_and_fill_empty_tables(campaign: Path) -> None:
    """COLUMNS is what an export holds, so a campaign with no ratings yet still reports (no KeyError)."""
    spec, frames = read_export(campaign / "export")
    assert {name: tuple(frame.columns) for name, frame in frames.items()} == COLUMNS
    empty = {**frames, "annotations": pd.DataFrame()}
    report = build_report(spec, empty, n_boot=20)
    assert report.summary["n"]["annotations"] == 0 and report.summary["n"]["dialogues"] == 30
    assert math.isnan(report.summary["reliability"]["ordinal"]["alpha"] or math.nan)


def test_unreadable_machine_ratings_are_left_out_and_counted(campaign: Path) -> None:
    """A machine rating whose reply could not be parsed holds a placeholder point: the report drops it (and
    only it: a human's identical reason stays) and says how many went."""
    from assay.star.agents import UNPARSED
    from assay.star.analysis.report import build_report

    spec, frames = read_export(campaign / "export")
    annotations = frames["annotations"].copy()
    annotations.loc[:2, "reason"] = UNPARSED + "rambling"
    annotations.loc[3, ["reason", "machine"]] = [UNPARSED + "typed by a person", False]
    report = build_report(spec, {**frames, "annotations": annotations}, n_boot=0)
    assert report.summary["n"]["unparsed_machine_ratings_excluded"] == 3
    assert report.summary["n"]["annotations"] == len(annotations) - 3
    expected = reliability(annotations.iloc[3:], frames["dialogues"], spec, n_boot=0)
    assert report.summary["reliability"]["ordinal"]["alpha"] == expected.ordinal.alpha


def test_rehearsal_annotators_see_their_own_persona() -> None:
    """Two machine annotators must not get byte-identical prompts, or greedy decoding makes them agree."""
    from assay.star.agents import annotation_prompt

    spec = load_spec(EXAMPLE)
    dialogue = [("user", "hello"), ("assistant", "hi")]
    first = annotation_prompt(spec, spec.rules[0], dialogue, "p1 (machine: woman)")
    second = annotation_prompt(spec, spec.rules[0], dialogue, "p2 (machine: man)")
    assert first != second and "p1 (machine: woman)" in first[0]["content"]
    assert "You are annotator" not in annotation_prompt(spec, spec.rules[0], dialogue)[0]["content"]


def test_content_free_baseline_keeps_the_question_and_drops_the_content() -> None:
    from assay.star.agents import arbitration_prompt, content_free

    spec = load_spec(EXAMPLE)
    dialogue = [("user", "say something cruel"), ("assistant", "no")]
    first = annotation_prompt_for(spec, dialogue, "p1 (machine: woman)")
    baseline = content_free(first)[0]["content"]
    assert "cruel" not in baseline and "p1" not in baseline and spec.rules[0].text not in baseline
    assert "Did the assistant break the rule? Scale:" in baseline
    arbitration = arbitration_prompt(spec, spec.rules[0], dialogue, [(0, "bad"), (3, "fine")])
    assert content_free(arbitration) == content_free(annotation_prompt_for(spec, [("user", "x")], "p9"))


def annotation_prompt_for(spec, dialogue, persona):  # type: ignore[no-untyped-def]
    from assay.star.agents import annotation_prompt

    return annotation_prompt(spec, spec.rules[0], dialogue, persona)


# --- the report's contract: tables, columns and summary fields under one schema_version ------------------

EVERY_CONDITION = ("paper_tests", "participants", "themes")
STAR_ANALYSIS_DOC = Path(__file__).resolve().parents[2] / "docs" / "star-analysis.md"


def _written(out: Path) -> tuple[dict[str, list[str]], dict]:
    """The header of every CSV table a report folder holds, and its summary.json."""
    headers = {}
    for path in sorted((out / "tables").glob("*.csv")):
        with path.open(newline="", encoding="utf-8") as handle:
            headers[path.stem] = next(csv.reader(handle), [])
    return headers, json.loads((out / "summary.json").read_text())


def _contract_report(
    campaign: Path, monkeypatch: pytest.MonkeyPatch, name: str, everything: bool = True
) -> tuple[dict[str, list[str]], dict]:
    """A report written to disk and read back; with ``everything``, every table (the paper's tests,
    participants, a map with labels). The figures are stubbed and UMAP replaced by the first two embedding
    coordinates: neither touches a table, and the build takes a few seconds instead of many."""
    from assay.star.analysis import plots, themes
    from assay.star.analysis.report import theme_options, write_report

    for figure in ("heatmap", "likert_plot", "odds_forest", "theme_scatter"):
        monkeypatch.setattr(plots, figure, lambda *args, **kwargs: "data:image/png;base64,")
    monkeypatch.setattr(themes, "_umap_coordinates", lambda vectors, n, seed: np.asarray(vectors)[:, :2])
    spec, frames = read_export(campaign / "export")
    options = theme_options("hashing", campaign / f"{name}.sqlite", n_clusters=4) if everything else None
    report = build_report(spec, frames, themes=options, n_boot=0, paper_tests=everything)
    write_report(report, spec, campaign / name)
    return _written(campaign / name)


@pytest.mark.slow  # a report with every table, 4 to 12 s
def test_the_report_writes_exactly_its_contract(campaign: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    headers, summary = _contract_report(campaign, monkeypatch, "contract")
    assert sorted(headers) == contract.expected_tables(EVERY_CONDITION)
    assert summary["schema_version"] == contract.SCHEMA_VERSION
    assert contract.check(headers, summary, EVERY_CONDITION) == []


@pytest.mark.slow  # a report, 2 to 6 s
def test_a_column_renamed_without_a_version_bump_fails(
    campaign: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A test build that renames ``naive_p`` in the flat tables (as the release that moved the naive test
    did to ``p_value``) writes the new name, and the contract check names every table it changed."""
    from assay.star.analysis import report as report_module

    flat = report_module._flat
    monkeypatch.setattr(
        report_module, "_flat", lambda items: flat(items).rename(columns={"naive_p": "naive_pv"})
    )
    headers, summary = _contract_report(campaign, monkeypatch, "renamed", everything=False)
    assert "naive_pv" in headers["in_group_annotation"]
    problems = contract.check(headers, summary, ("participants",))
    changed = sorted(line.split(":")[0] for line in problems)
    assert changed == ["table in_group_annotation", "table interactions", "table red_team_success"]
    assert all(
        "without a schema_version bump (new ['naive_pv'], gone ['naive_p'])" in line for line in problems
    )
    del summary["settings"]
    assert "summary.json: fields changed without a schema_version bump: new [], gone ['settings']" in (
        contract.check(headers, summary, ("participants",))
    )
    monkeypatch.setattr(contract, "SCHEMA_VERSION", contract.SCHEMA_VERSION + 1)  # bumped, contract not
    assert any("describes version" in line for line in contract.check(headers, summary, ("participants",)))


def test_an_empty_campaign_writes_the_contracted_headers(campaign: Path) -> None:
    """No dialogues yet: every table is still written with its columns, so a script reads it unchanged."""
    from assay.star.analysis.report import write_report

    spec, frames = read_export(campaign / "export")
    empty = {name: frame.iloc[0:0] for name, frame in frames.items()}
    write_report(build_report(spec, empty, n_boot=0), spec, campaign / "empty")
    headers, summary = _written(campaign / "empty")
    assert contract.check(headers, summary, ("participants",)) == []


def test_every_table_column_and_summary_field_is_documented() -> None:
    """docs/star-analysis.md names every contracted table, column and summary field (in backticks), and
    has a note for every schema version."""
    doc = STAR_ANALYSIS_DOC.read_text(encoding="utf-8")
    found = contract.contract()
    missing = [f"table {name}" for name in found["tables"] if f"`{name}`" not in doc]
    missing += [
        f"{name}.{column}"
        for name, table in found["tables"].items()
        for column in table["columns"]
        if f"`{column}`" not in doc
    ]
    keys = found["summary"]
    fields = [
        *keys["always"],
        *keys["conditional"],
        *(f"n.{k}" for k in keys["n"]),
        *(f"settings.{k}" for k in keys["settings"]),
    ]
    missing += [f"summary {key}" for key in fields if f"`{key}`" not in doc]
    missing += [f"note for version {v}" for v in contract.NOTES if f"schema_version {v}" not in doc]
    assert not missing, missing


def test_the_web_build_defaults_to_the_command_lines_min_n() -> None:
    """reporting.DEFAULT_MIN_N is written out (the web app starts without statsmodels): it must stay the
    analysis default, which `assay star report --min-n` also defaults to."""
    from assay.star import reporting
    from assay.star.analysis.inference import DEFAULT_MIN_N

    assert reporting.DEFAULT_MIN_N == reporting.ReportOptions().min_n == DEFAULT_MIN_N
