"""The meta-classifier detector, run through its TrojAI command line on the small session round."""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from assay.trojai import check_metaparameters, check_schema

DETECTOR = Path(__file__).resolve().parents[2] / "detectors" / "meta_classifier"
ENTRYPOINT = DETECTOR / "entrypoint.py"
META = DETECTOR / "metaparameters.json"
SCHEMA = DETECTOR / "metaparameters_schema.json"
SHIPPED = DETECTOR / "learned_parameters"
pytestmark = pytest.mark.slow  # trains the detector on the session's 20-model round


def _run(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, str(ENTRYPOINT), *map(str, args)],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=300,
    )


def _infer(model_dir: Path, result: Path, learned: Path, tmp: Path, meta: Path = META):
    return _run(
        "infer",
        "--model_filepath", model_dir / "model.pt",
        "--result_filepath", result,
        "--scratch_dirpath", tmp / "scratch",
        "--examples_dirpath", model_dir / "clean-example-data",
        "--metaparameters_filepath", meta,
        "--schema_filepath", SCHEMA,
        "--learned_parameters_dirpath", learned,
        cwd=tmp,
    )  # fmt: skip


@pytest.fixture(scope="module")
def configured(small_round, tmp_path_factory) -> Path:
    """Learned parameters from configure on the small round's train split."""
    tmp = tmp_path_factory.mktemp("meta-classifier")
    learned = tmp / "learned"
    done = _run(
        "configure",
        "--scratch_dirpath", tmp / "scratch",
        "--metaparameters_filepath", META,
        "--schema_filepath", SCHEMA,
        "--learned_parameters_dirpath", learned,
        "--configure_models_dirpath", small_round / "splits" / "train",
        cwd=tmp,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return learned


def test_shipped_metaparameters_validate():
    schema = json.loads(SCHEMA.read_text(encoding="utf-8"))
    check_schema(schema, SCHEMA)
    values = json.loads(META.read_text(encoding="utf-8"))
    assert check_metaparameters(values, schema, META) == values


def test_configure_then_infer_every_test_model(small_round, configured, tmp_path):
    learned = json.loads((configured / "meta_classifier.json").read_text(encoding="utf-8"))
    assert learned["training_models"] == len(list((small_round / "splits" / "train" / "models").iterdir()))
    assert len(learned["coef"]) == len(learned["features"]) > 0
    models = sorted((small_round / "splits" / "test-sequestered" / "models").iterdir())
    assert models
    scores = []
    for model_dir in models:
        result = tmp_path / f"{model_dir.name}.txt"
        done = _infer(model_dir, result, configured, tmp_path)
        assert done.returncode == 0, done.stderr
        value = float(result.read_text(encoding="utf-8"))
        assert 0.0 <= value <= 1.0
        scores.append(value)

    # The learned parameters are what infer uses: a huge intercept either way moves the answer to the clip
    # bounds, and no learned parameters at all is a clean failure with no result.
    clip = json.loads(META.read_text(encoding="utf-8"))["clip"]
    for intercept, expected in ((1000.0, 1.0 - clip), (-1000.0, clip)):
        changed = tmp_path / f"changed{intercept:+.0f}"
        changed.mkdir()
        (changed / "meta_classifier.json").write_text(
            json.dumps({**learned, "intercept": intercept}), encoding="utf-8"
        )
        result = changed / "result.txt"
        done = _infer(models[0], result, changed, tmp_path)
        assert done.returncode == 0, done.stderr
        assert float(result.read_text(encoding="utf-8")) == pytest.approx(expected)
    assert all(clip <= s <= 1.0 - clip for s in scores)

    result = tmp_path / "absent.txt"
    done = _infer(models[0], result, tmp_path / "nothing-here", tmp_path)
    assert done.returncode == 2
    assert "meta_classifier.json" in done.stderr
    assert not result.exists()


def test_corrupted_model_is_exit_2(small_round, configured, tmp_path):
    source = sorted((small_round / "splits" / "test-sequestered" / "models").iterdir())[0]
    model_dir = tmp_path / "broken" / source.name
    shutil.copytree(source, model_dir)
    # fixed garbage: fresh random bytes each run could now and then decode as something else (a warning, an
    # odd pickle opcode) and make the test flaky
    (model_dir / "model.pt").write_bytes(random.Random(0).randbytes(512))
    result = tmp_path / "result.txt"
    done = _infer(model_dir, result, configured, tmp_path)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and str(model_dir / "model.pt") in lines[0]
    assert not result.exists()


def test_shipped_learned_parameters_give_a_probability(small_round, tmp_path):
    assert (SHIPPED / "meta_classifier.json").is_file()
    model_dir = sorted((small_round / "splits" / "test-sequestered" / "models").iterdir())[0]
    result = tmp_path / "result.txt"
    done = _infer(model_dir, result, SHIPPED, tmp_path)
    assert done.returncode == 0, done.stderr
    assert 0.0 < float(result.read_text(encoding="utf-8")) < 1.0
