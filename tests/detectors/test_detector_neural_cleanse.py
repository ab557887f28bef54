"""The Neural Cleanse detector: its command line on a small round, bad input, and its reverse-engineering."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from assay.trojai import check_metaparameters, check_schema
from assay.zoo.datasets import load_dataset
from assay.zoo.train import PoisonPlan, train_model
from assay.zoo.triggers import SolidPatch, apply_trigger

PROJECT = Path(__file__).resolve().parents[2]
DETECTOR = PROJECT / "detectors" / "neural_cleanse"
ENTRYPOINT = DETECTOR / "entrypoint.py"
# Fewer steps than the shipped metaparameters keep the command-line tests quick; the unit test uses defaults.
QUICK_STEPS = 60
pytestmark = pytest.mark.slow  # reverse-engineers triggers on trained models


def _load_detector():
    spec = importlib.util.spec_from_file_location("neural_cleanse_entrypoint", ENTRYPOINT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


nc = _load_detector()


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1"}


def _quick_metaparameters(tmp_path: Path) -> Path:
    meta = json.loads((DETECTOR / "metaparameters.json").read_text(encoding="utf-8"))
    meta["steps"] = QUICK_STEPS
    path = tmp_path / "metaparameters.json"
    path.write_text(json.dumps(meta), encoding="utf-8")
    return path


def _run(*args: str | Path, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ENTRYPOINT), *map(str, args)],
        capture_output=True,
        text=True,
        env=_env(),
        cwd=cwd,
        timeout=300,
    )


def _infer(model_dir: Path, result: Path, meta: Path, learned: Path, scratch: Path):
    return _run(
        "infer",
        "--model_filepath",
        model_dir / "model.pt",
        "--result_filepath",
        result,
        "--scratch_dirpath",
        scratch,
        "--examples_dirpath",
        model_dir / "clean-example-data",
        "--metaparameters_filepath",
        meta,
        "--schema_filepath",
        DETECTOR / "metaparameters_schema.json",
        "--learned_parameters_dirpath",
        learned,
        cwd=scratch,
    )


def test_shipped_metaparameters_validate():
    schema = json.loads((DETECTOR / "metaparameters_schema.json").read_text(encoding="utf-8"))
    check_schema(schema, "metaparameters_schema.json")
    meta = json.loads((DETECTOR / "metaparameters.json").read_text(encoding="utf-8"))
    check_metaparameters(meta, schema, "metaparameters.json")
    assert meta["technique"] == "neural_cleanse"
    learned = json.loads((DETECTOR / "learned_parameters" / nc.LEARNED).read_text(encoding="utf-8"))
    assert len(learned["weights"]) == len(learned["features"])


def test_configure_then_infer_on_a_small_round(small_round, tmp_path):
    meta = _quick_metaparameters(tmp_path)
    learned, scratch = tmp_path / "learned", tmp_path / "scratch"
    scratch.mkdir()
    done = _run(
        "configure",
        "--scratch_dirpath",
        scratch,
        "--metaparameters_filepath",
        meta,
        "--schema_filepath",
        DETECTOR / "metaparameters_schema.json",
        "--learned_parameters_dirpath",
        learned,
        "--configure_models_dirpath",
        small_round / "splits" / "train",
        cwd=scratch,
    )
    assert done.returncode == 0, done.stderr
    record = json.loads((learned / nc.LEARNED).read_text(encoding="utf-8"))
    assert all(np.isfinite(record["weights"])) and np.isfinite(record["intercept"])

    models = sorted((small_round / "splits" / "test-sequestered" / "models").iterdir())
    assert models
    for model_dir in models:
        assert not (model_dir / "ground_truth.csv").exists()
        result = tmp_path / f"{model_dir.name}.txt"
        done = _infer(model_dir, result, meta, learned, scratch)
        assert done.returncode == 0, done.stderr
        value = float(result.read_text(encoding="utf-8"))
        assert 0.0 <= value <= 1.0


def test_corrupted_model_gives_exit_2_and_no_result(small_round, tmp_path):
    source = sorted((small_round / "splits" / "test-sequestered" / "models").iterdir())[0]
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "model.pt").write_bytes(np.random.default_rng(0).bytes(4096))
    (broken / "clean-example-data").symlink_to(source / "clean-example-data")
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    result = tmp_path / "result.txt"
    done = _infer(broken, result, DETECTOR / "metaparameters.json", tmp_path / "no-learned", scratch)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and str(broken / "model.pt") in lines[0]
    assert not result.exists()


def test_anomaly_index_matches_a_hand_computation():
    values = np.array([1.0, 4.0, 5.0, 6.0, 7.0])
    # median 5; absolute deviations 4, 1, 0, 1, 2 -> MAD 1; (5 - 1) / (1.4826 * 1)
    assert nc.anomaly_index(values) == pytest.approx(4.0 / 1.4826)
    assert nc.anomaly_index(np.array([3.0, 3.0, 3.0, 3.0])) == pytest.approx(0.0)


@pytest.fixture(scope="module")
def digits():
    return load_dataset("digits", seed=0)


def _reverse(model, digits) -> object:
    # Two clean examples per class, as in a round's clean-example-data.
    picks = np.concatenate([np.flatnonzero(digits.test_labels == c)[:2] for c in range(10)])
    torch.manual_seed(0)
    return nc.reverse_engineer(model, digits.test_images[picks], digits.test_labels[picks], 10)


def test_reverse_engineering_finds_a_solid_patch_target(digits):
    torch.set_num_threads(1)
    trigger = SolidPatch(size=2, location="bottom_right", value=1.0)
    target = 7
    plan = PoisonPlan(apply=lambda images: apply_trigger(images, trigger), target_class=target, fraction=0.2)
    # Width 12, as in the reference rounds. (At width 8 this clean model's anomaly index happens to be high:
    # with ten classes the MAD is noisy, which is why the shipped logistic also uses log(min / median norm).)
    poisoned = train_model(digits, "cnn_small", 12, seed=0, epochs=10, poison=plan)
    assert poisoned.attack_success_rate >= 0.9
    clean = train_model(digits, "cnn_small", 12, seed=0, epochs=10)

    found = _reverse(poisoned.model, digits)
    baseline = _reverse(clean.model, digits)
    assert int(np.argmin(found.norms)) == target
    assert found.reached[target]
    assert nc.anomaly_index(found.norms) > nc.anomaly_index(baseline.norms)
    assert nc.anomaly_index(found.norms) > 2.0
    assert nc.features(found)["log_min_over_median"] < nc.features(baseline)["log_min_over_median"]
    # The reverse-engineered mask sits on the trigger's corner.
    mask = found.masks[target]
    assert mask[-3:, -3:].sum() > 0.5 * mask.sum()
