"""assay.star.design: balanced margins on random specs, reproducibility, the design table and its warnings,
the JSONL round trip, and ``assay star design`` end to end (one-line errors, no file on failure)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError
from typer.testing import CliRunner

from assay.errors import UserError
from assay.star.cli import app as star_app
from assay.star.design import (
    Instruction,
    design_table,
    draw_design,
    group_text,
    read_instructions,
    write_instructions,
)
from assay.star.spec import CampaignSpec, group_label, load_spec

PROJECT = Path(__file__).resolve().parents[2]
EXAMPLE = PROJECT / "examples" / "star-campaign.yaml"


# --- random small specs --------------------------------------------------------------------------------


@st.composite
def specs(draw: st.DrawFn) -> CampaignSpec:
    """A random small campaign: 1-4 rules, 1-3 parameters of 1-4 values, 1-2 attributes, 1-2 templates."""
    n_rules = draw(st.integers(1, 4))
    targets = draw(st.lists(st.booleans(), min_size=n_rules, max_size=n_rules))
    rules = [
        {"id": f"r{i}", "text": f"Rule {i} must hold.", "area": f"area {i % 2}", "targets_groups": t}
        for i, t in enumerate(targets)
    ]
    sizes = draw(st.lists(st.integers(1, 4), min_size=1, max_size=3))
    parameters = {f"p{k}": [f"v{k}{j}" for j in range(n)] for k, n in enumerate(sizes)}
    attribute_sizes = draw(st.lists(st.integers(1, 3), min_size=1, max_size=2))
    attributes = {f"a{k}": [f"x{k}{j}" for j in range(n)] for k, n in enumerate(attribute_sizes)}
    intersections = [1] if len(attributes) == 1 else draw(st.sampled_from([[1], [2], [1, 2]]))
    uses = " ".join(f"{{{{ {name} }}}}" for name in parameters)
    templates = {
        f"t{i}": f"T{i}: {{{{ rule.text }}}} {{{{ group_text }}}} {uses}"
        for i in range(draw(st.integers(1, 2)))
    }
    return CampaignSpec.model_validate(
        {
            "name": "random",
            "rules": rules,
            "parameters": parameters,
            "demographics": {"attributes": attributes, "intersections": intersections},
            "templates": templates,
        }
    )


def _within_one(counts: dict[Any, int], keys: list[Any], total: int) -> bool:
    """Every key's count is the floor or the ceiling of an even share of ``total``."""
    share = total / len(keys)
    return all(abs(counts.get(key, 0) - share) < 1 for key in keys) and sum(counts.values()) == total


FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FAST
@given(spec=specs(), count=st.integers(1, 300), seed=st.integers(0, 2**32))
def test_every_margin_is_within_one_of_an_even_share(spec: CampaignSpec, count: int, seed: int) -> None:
    instructions = draw_design(spec, count, seed)
    assert [ins.number for ins in instructions] == list(range(1, count + 1))
    assert len({ins.id for ins in instructions}) == count
    rule_ids = [rule.id for rule in spec.rules]
    assert _within_one(Counter(ins.rule_id for ins in instructions), rule_ids, count)
    assert _within_one(Counter(ins.template for ins in instructions), sorted(spec.templates), count)
    for name, values in spec.parameters.items():
        assert _within_one(Counter(ins.parameters[name] for ins in instructions), values, count)
    labels = [group_label(g) for g in spec.demographics.groups()]
    for rule in spec.rules:
        mine = [ins for ins in instructions if ins.rule_id == rule.id]
        for name, values in spec.parameters.items():
            assert _within_one(Counter(ins.parameters[name] for ins in mine), values, len(mine))
        if rule.targets_groups:
            assert _within_one(Counter(ins.group_label for ins in mine), labels, len(mine))


@FAST
@given(spec=specs(), count=st.integers(1, 120), seed=st.integers(0, 2**32))
def test_groups_texts_and_seeds(spec: CampaignSpec, count: int, seed: int) -> None:
    instructions = draw_design(spec, count, seed)
    assert draw_design(spec, count, seed) == instructions
    groups = spec.demographics.groups()
    for ins in instructions:
        rule = spec.rule(ins.rule_id)
        assert rule.text in ins.text and ins.rule_area == rule.area
        if rule.targets_groups:
            assert ins.group in groups and ins.group_label == group_label(ins.group)
            assert group_text(ins.group, list(spec.demographics.attributes)) in ins.text
        else:
            assert ins.group is None and ins.group_label == ""
        assert all(value in ins.text for value in ins.parameters.values())
    table = design_table(spec, instructions)
    assert table.count == count and sum(table.rules.values()) == count


def test_another_seed_gives_another_design() -> None:
    spec = load_spec(EXAMPLE)
    designs = [draw_design(spec, 120, seed) for seed in range(4)]
    assert all(a != b for i, a in enumerate(designs) for b in designs[i + 1 :])
    assert draw_design(spec, 120, 3) == designs[3]


def test_group_text_in_plain_words() -> None:
    order = ["race", "gender"]
    assert group_text({"gender": "female", "race": "Asian"}, order) == "people who are Asian and female"
    assert group_text({"gender": "non-binary"}, order) == "people who are non-binary"
    assert group_text(None) == group_text({}) == ""


# --- the example spec and the design table -------------------------------------------------------------


def test_example_designs_120_with_warnings_only_when_cells_are_small() -> None:
    spec = load_spec(EXAMPLE)
    instructions = draw_design(spec, 120, seed=1)
    table = design_table(spec, instructions)
    assert table.rules == {"hate": 40, "stereotypes": 40, "medical": 40}
    assert table.parameters["adversariality"] == {"low": 40, "medium": 40, "high": 40}
    assert set(table.rule_groups) == {"hate", "stereotypes"} and len(table.rule_groups["hate"]) == 19
    pairs = table.attribute_pairs["hate"]["race x gender"]
    hate = [ins for ins in instructions if ins.rule_id == "hate"]
    assert len(pairs) == 12 and sum(pairs.values()) == sum(len(ins.group or {}) == 2 for ins in hate)
    assert pairs["race=Asian x gender=male"] == sum(
        ins.group == {"gender": "male", "race": "Asian"} for ins in hate
    )
    # 120 dialogues over 3 rules and 19 groups leave about 2 per race x gender cell: min_cell_size 5 warns.
    assert len(table.warnings) == 11 and table.warnings[-1].startswith("... and ")
    assert table.warnings[0].startswith("rule hate: race=")
    assert table.warnings[0].endswith("fewer than min_cell_size 5")
    large = design_table(spec.model_copy(update={"min_cell_size": 14}), instructions)
    assert any("adversariality=" in line for line in large.warnings)
    assert design_table(spec.model_copy(update={"min_cell_size": 1}), instructions).warnings == []


def test_few_warnings_are_listed_whole() -> None:
    raw = yaml.safe_load(EXAMPLE.read_text())
    raw["demographics"]["intersections"] = [2]  # 12 race x gender groups per group-targeted rule
    spec = CampaignSpec.model_validate({**raw, "min_cell_size": 4})
    table = design_table(spec, draw_design(spec, 138, seed=1))  # 46 per rule: 10 cells of 4, 2 of 3
    assert len(table.warnings) == 4 and not any(line.startswith("...") for line in table.warnings)
    assert all(" gets 3 dialogues, fewer than min_cell_size 4" in line for line in table.warnings)


# --- files ---------------------------------------------------------------------------------------------


def test_jsonl_round_trip_and_one_line_errors(tmp_path: Path) -> None:
    spec = load_spec(EXAMPLE)
    instructions = draw_design(spec, 30, seed=2)
    path = tmp_path / "out" / "instructions.jsonl"
    write_instructions(path, instructions)
    assert read_instructions(path) == instructions
    assert len(path.read_text().splitlines()) == 30
    lines = path.read_text().splitlines()
    broken = json.loads(lines[1])
    broken["number"] = 0
    path.write_text("\n".join([lines[0], json.dumps(broken), *lines[2:]]) + "\n")
    with pytest.raises(UserError) as info:
        read_instructions(path)
    message = str(info.value)
    assert "\n" not in message and message.startswith(f"{path}:2: field 'number'") and "(value: 0)" in message
    path.write_text(lines[0] + "\n{not json\n")
    with pytest.raises(UserError, match=r":2: not valid JSON"):
        read_instructions(path)
    with pytest.raises(UserError, match="cannot read"):
        read_instructions(tmp_path / "missing.jsonl")


def test_bad_count_is_a_user_error() -> None:
    with pytest.raises(UserError, match="count"):
        draw_design(load_spec(EXAMPLE), 0, seed=0)


# --- the command ---------------------------------------------------------------------------------------


def test_command_prints_tables_and_warnings(tmp_path: Path) -> None:
    out = tmp_path / "ins.jsonl"
    args = ["design", str(EXAMPLE), "--count", "60", "--seed", "4", "--out", str(out)]
    result = CliRunner().invoke(star_app, args)
    assert result.exit_code == 0, result.output
    assert "Rule x target group" in result.stdout and "Parameter use_case" in result.stdout
    assert "warning:" in result.stderr and "fewer than min_cell_size 5" in result.stderr
    assert read_instructions(out) == draw_design(load_spec(EXAMPLE), 60, 4)
    help_text = CliRunner().invoke(star_app, ["design", "--help"]).stdout
    assert "Example: assay star design" in help_text


def _bad_spec(tmp_path: Path, name: str, change) -> Path:
    raw = yaml.safe_load(EXAMPLE.read_text())
    change(raw)
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


BAD_SPECS = {
    "missing-parameter": (lambda r: r["templates"].update(x="{{ mood }}"), "(top level)", "'mood'"),
    "unknown-field": (lambda r: r.update(colour="red"), "colour", "Extra inputs"),
    "duplicate-rule": (
        lambda r: r["rules"].append(dict(r["rules"][0])),
        "rules.3.id",
        "repeats the id of rules.0",
    ),
}


SUBPROCESS_BAD = (
    "missing-parameter"  # each ``python -m assay`` start imports torch: only one bad spec runs so
)


@pytest.fixture(scope="module")
def cli_runs(
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[str, tuple[subprocess.CompletedProcess, Path, Path]]:
    """The ``python -m assay star design`` runs these tests need, started at once (each start is slow)."""
    tmp = tmp_path_factory.mktemp("star-cli")
    jobs = {
        "good": (EXAMPLE, ["--count", "120", "--seed", "1", "--json"]),
        SUBPROCESS_BAD: (_bad_spec(tmp, SUBPROCESS_BAD, BAD_SPECS[SUBPROCESS_BAD][0]), []),
    }
    started = {}
    for name, (spec_path, extra) in jobs.items():
        out = tmp / f"{name}.jsonl"
        command = [sys.executable, "-m", "assay", "star", "design", str(spec_path), "--out", str(out), *extra]
        process = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp
        )
        started[name] = (process, command, spec_path, out)
    runs = {}
    for name, (process, command, spec_path, out) in started.items():
        stdout, stderr = process.communicate(timeout=120)
        runs[name] = (
            subprocess.CompletedProcess(command, process.returncode, stdout, stderr),
            spec_path,
            out,
        )
    return runs


@pytest.mark.slow
def test_cli_writes_jsonl_and_json_summary(cli_runs) -> None:
    result, _, out = cli_runs["good"]
    assert result.returncode == 0, result.stderr
    assert read_instructions(out) == draw_design(load_spec(EXAMPLE), 120, 1)
    summary = json.loads(result.stdout)
    assert summary["count"] == 120 and summary["seed"] == 1 and summary["rules"]["hate"] == 40
    assert summary["warnings"][0].startswith("rule hate: race=")


def _assert_one_line_error(code: int, stdout: str, stderr: str, spec_path: Path, name: str) -> None:
    _, field, words = BAD_SPECS[name]
    assert code == 2 and stdout == ""
    lines = stderr.strip().splitlines()
    assert (
        len(lines) == 1
        and str(spec_path) in lines[0]
        and f"field '{field}'" in lines[0]
        and words in lines[0]
    )


@pytest.mark.slow
def test_cli_bad_spec_in_a_subprocess(cli_runs) -> None:
    result, spec_path, out = cli_runs[SUBPROCESS_BAD]
    _assert_one_line_error(result.returncode, result.stdout, result.stderr, spec_path, SUBPROCESS_BAD)
    assert not out.exists()


@pytest.mark.parametrize("name", list(BAD_SPECS))
def test_cli_bad_spec_is_one_line_and_writes_nothing(tmp_path: Path, monkeypatch, capsys, name: str) -> None:
    """The same entry point (``assay.cli.main``) in this process: each subprocess start costs seconds."""
    from assay.cli import main

    spec_path, out = _bad_spec(tmp_path, name, BAD_SPECS[name][0]), tmp_path / "ins.jsonl"
    monkeypatch.setattr(sys, "argv", ["assay", "star", "design", str(spec_path), "--out", str(out)])
    with pytest.raises(SystemExit) as info:
        main()
    captured = capsys.readouterr()
    _assert_one_line_error(info.value.code, captured.out, captured.err, spec_path, name)
    assert not out.exists() and list(tmp_path.iterdir()) == [spec_path]


def test_instruction_is_frozen() -> None:
    ins = draw_design(load_spec(EXAMPLE), 1, seed=0)[0]
    assert isinstance(ins, Instruction) and ins.id == "ins-00001"
    with pytest.raises(ValueError):
        ins.number = 2  # type: ignore[misc]


def test_template_naming_a_setting_that_is_not_a_parameter_is_rejected_by_the_spec() -> None:
    """``use_case`` is only a name a template may use when it is one of the campaign's parameters."""
    with pytest.raises(ValidationError, match="refers to 'use_case'"):
        CampaignSpec.model_validate(
            {
                "name": "x",
                "rules": [{"id": "a", "text": "Keep it.", "area": "b"}],
                "parameters": {"p": ["1"]},
                "demographics": {"attributes": {"g": ["y"]}, "intersections": [1]},
                "templates": {"t": "{{ use_case }}"},
            }
        )
