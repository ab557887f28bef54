"""assay.trojai, the detector contract: schema rules, metaparameters, example data, results, and the
constant baseline detector run through the TrojAI command line."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from assay.errors import UserError
from assay.trojai import (
    check_metaparameters,
    check_schema,
    load_metaparameters,
    read_examples,
    training_models,
    write_result,
)

PROJECT = Path(__file__).resolve().parents[1]
CONSTANT = PROJECT / "detectors" / "constant"
DETECTORS = sorted(p for p in (PROJECT / "detectors").iterdir() if (p / "entrypoint.py").is_file())


def _schema() -> dict:
    return json.loads((CONSTANT / "metaparameters_schema.json").read_text())


@pytest.mark.parametrize("detector", DETECTORS, ids=lambda p: p.name)
def test_every_shipped_detector_has_valid_bounded_metaparameters(detector: Path) -> None:
    values = load_metaparameters(detector / "metaparameters.json", detector / "metaparameters_schema.json")
    assert values["technique"] and values["technique_description"]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            lambda s: s["properties"]["probability"].pop("maximum"),
            "'probability' needs a minimum and a maximum",
        ),
        (lambda s: s["properties"]["technique_description"].pop("maxLength"), "needs maxLength or enum"),
        (lambda s: s["properties"].update(sizes={"type": "array"}), "'sizes' needs maxItems"),
        (lambda s: s["properties"].update(nested={"type": "object"}), "must be flat"),
        (lambda s: s["properties"].update(untyped={}), "'untyped' has no type"),
        (lambda s: s.pop("additionalProperties"), "'additionalProperties' is not false"),
    ],
)
def test_check_schema_warns_where_nist_accepts(change, message: str) -> None:
    schema = copy.deepcopy(_schema())
    assert check_schema(schema, "s.json") == []  # the shipped one passes without a warning
    change(schema)
    warnings = check_schema(schema, "s.json")
    assert len(warnings) == 1 and message in warnings[0] and warnings[0].startswith("s.json: ")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda s: s["required"].remove("technique"), "no technique"),
        (lambda s: s.update(type=12), "not a valid JSON schema"),
    ],
)
def test_check_schema_rejects_what_nist_rejects(change, message: str) -> None:
    schema = copy.deepcopy(_schema())
    change(schema)
    with pytest.raises(UserError) as info:
        check_schema(schema, "s.json")
    assert message in str(info.value) and str(info.value).startswith("s.json: ")


def nist_schema(**header: object) -> dict:
    """A schema in NIST's trojai-example layout: technique fields at the root, nothing required."""
    return {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "title": "Spectral signature detector",
        "technique": "Spectral signatures",
        "technique_description": "Top singular vector of the penultimate activations.",
        "technique_changes": "First submission",
        "technique_type": ["Weight Analysis"],
        "commit_id": "0123abc",
        "repo_name": "https://example.org/performer/detector",
        "required": [],
        "additionalProperties": False,
        "type": "object",
        "properties": {
            "threshold": {
                "type": "number",
                "minimum": 0,
                "maximum": 1,
                "suggested_minimum": 0.2,
                "suggested_maximum": 0.8,
            },
            "criterion": {"enum": ["gini", "entropy"]},
        },
        **header,
    }


def test_nist_layout_is_accepted_and_names_its_technique() -> None:
    from assay.trojai import technique_of

    schema = nist_schema()
    assert check_schema(schema, "s.json") == []
    assert check_metaparameters({"threshold": 0.5}, schema, "m.json") == {"threshold": 0.5}
    assert technique_of(schema, {"threshold": 0.5}) == "Spectral signatures"


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("technique_description", "Extracts model weights and trains a random forest regressor."),
        ("repo_name", "https://github.com/usnistgov/trojai-example"),
        ("commit_id", ""),
        ("technique_type", []),
        ("technique_type", ["Magic"]),
    ],
)
def test_the_templates_header_is_refused_as_nist_does(field: str, value: object) -> None:
    with pytest.raises(UserError, match=f":Schema Header: field '{field}'"):
        check_schema(nist_schema(**{field: value}), "s.json")


def test_the_published_templates_header_names_every_field_left_in_one_line() -> None:
    """trojai-example's schema as published leaves five template fields: one refusal names all five."""
    published = Path(__file__).parents[1] / "examples" / "trojai-baseline" / "metaparameters_schema.json"
    with pytest.raises(UserError) as refused:
        check_schema(json.loads(published.read_text()), "s.json")
    line = str(refused.value)
    assert "\n" not in line
    for field in ("title", "technique_description", "technique_changes", "commit_id", "repo_name"):
        assert f"'{field}'" in line


@pytest.mark.parametrize(
    ("values", "field"),
    [
        ({"probability": 1.5}, "probability"),
        ({"probability": "high"}, "probability"),
        ({"learn_prior": 1}, "learn_prior"),
        ({"extra": 3}, "(top level)"),
    ],
)
def test_check_metaparameters_names_the_field(values: dict, field: str) -> None:
    good = json.loads((CONSTANT / "metaparameters.json").read_text())
    assert check_metaparameters(good, _schema(), "m.json") == good
    with pytest.raises(UserError) as info:
        check_metaparameters({**good, **values}, _schema(), "m.json")
    assert f"m.json: field '{field}'" in str(info.value) and "\n" not in str(info.value)


def test_read_examples_from_a_round_and_broken_folders(small_round: Path, tmp_path: Path) -> None:
    folder = next((small_round / "models").iterdir()) / "clean-example-data"
    images, labels = read_examples(folder)
    assert images.shape == (20, 8, 8) and images.dtype == np.float32
    assert images.min() >= 0.0 and images.max() <= 1.0 and images.max() > 0.5
    assert sorted(labels.tolist()) == sorted(list(range(10)) * 2)
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "labels.csv").write_text("file,label\na.png,3\nb.png,x\n")
    (broken / "a.png").write_bytes((folder / "labels.csv").read_bytes())  # not an image
    with pytest.raises(
        UserError, match=r"labels\.csv:2: field 'file' names no readable image \(value: 'a\.png'\)"
    ):
        read_examples(broken)
    (broken / "labels.csv").write_text("file,label\nb.png,x\n")
    with pytest.raises(UserError, match=r"labels\.csv:2: field 'label' is not an integer \(value: 'x'\)"):
        read_examples(broken)
    with pytest.raises(UserError, match=r"labels\.csv: not found"):
        read_examples(tmp_path)


def test_training_models_reads_ground_truth(small_round: Path, tmp_path: Path) -> None:
    models = training_models(small_round / "splits" / "train")
    assert len(models) == 10 and sum(m.poisoned for m in models) == 5
    assert all(m.model_filepath.is_file() and m.examples_dirpath.is_dir() for m in models)
    bad = tmp_path / "models" / "id-00000000"
    bad.mkdir(parents=True)
    (bad / "ground_truth.csv").write_text("yes\n")
    with pytest.raises(UserError, match=r"ground_truth\.csv:1: field 'ground_truth' must be 0 or 1"):
        training_models(tmp_path)
    with pytest.raises(UserError, match="holds no model folders"):
        training_models(tmp_path / "models" / "id-00000000")


@pytest.mark.parametrize("value", [float("nan"), 1.5, -0.1, float("inf")])
def test_write_result_rejects_non_probabilities(tmp_path: Path, value: float) -> None:
    with pytest.raises(ValueError, match=r"probability in \[0, 1\]"):
        write_result(tmp_path / "r.txt", value)
    assert not (tmp_path / "r.txt").exists()


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, str(CONSTANT / "entrypoint.py"), *args], capture_output=True, text=True, env=env
    )


def _infer(
    model: Path, result: Path, scratch: Path, meta: Path, learned: Path
) -> subprocess.CompletedProcess[str]:
    return _run(
        "infer",
        *("--model_filepath", str(model / "model.pt"), "--result_filepath", str(result)),
        *("--scratch_dirpath", str(scratch), "--examples_dirpath", str(model / "clean-example-data")),
        *(
            "--metaparameters_filepath",
            str(meta),
            "--schema_filepath",
            str(CONSTANT / "metaparameters_schema.json"),
        ),
        *("--learned_parameters_dirpath", str(learned)),
    )


def test_constant_detector_cli_infer_configure_and_bad_metaparameters(
    small_round: Path, tmp_path: Path
) -> None:
    model = next((small_round / "splits" / "test-sequestered" / "models").iterdir())
    learned = tmp_path / "learned"
    done = _infer(model, tmp_path / "r.txt", tmp_path, CONSTANT / "metaparameters.json", learned)
    assert done.returncode == 0, done.stderr
    assert float((tmp_path / "r.txt").read_text()) == 0.5

    meta = tmp_path / "meta.json"
    meta.write_text(
        json.dumps({**json.loads((CONSTANT / "metaparameters.json").read_text()), "learn_prior": True})
    )
    configured = _run(
        "configure",
        "--automatic_configuration",
        *("--scratch_dirpath", str(tmp_path), "--metaparameters_filepath", str(meta)),
        *("--schema_filepath", str(CONSTANT / "metaparameters_schema.json")),
        *("--learned_parameters_dirpath", str(learned)),
        *("--configure_models_dirpath", str(small_round / "splits" / "train")),
    )
    assert configured.returncode == 0, configured.stderr
    prior = json.loads((learned / "prior.json").read_text())
    assert prior == {"probability": 0.5, "training_models": 10}  # 5 of the 10 training models are poisoned
    (learned / "prior.json").write_text(json.dumps({"probability": 0.3, "training_models": 10}))
    done = _infer(model, tmp_path / "r2.txt", tmp_path, meta, learned)
    assert done.returncode == 0 and float((tmp_path / "r2.txt").read_text()) == 0.3
    # NIST's harness calls containers without the mode word, and may add --source_dataset_dirpath
    infer = _infer(model, tmp_path / "r4.txt", tmp_path, meta, learned).args[2:]
    legacy = _run(*infer[1:], "--source_dataset_dirpath", str(tmp_path))
    assert legacy.returncode == 0, legacy.stderr
    assert float((tmp_path / "r4.txt").read_text()) == 0.3

    meta.write_text(json.dumps({**json.loads(meta.read_text()), "probability": 2}))
    bad = _infer(model, tmp_path / "r3.txt", tmp_path, meta, learned)
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines() == [
        f"error: {meta}: field 'probability' 2 is greater than the maximum of 1.0"
    ]
    assert not (tmp_path / "r3.txt").exists()
