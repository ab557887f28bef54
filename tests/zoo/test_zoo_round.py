"""assay.zoo rounds: factor draws, the TrojAI layout, resume, floors, config errors and the CLI (digits)."""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from assay.errors import UserError
from assay.trojai import load_model
from assay.zoo.config import RoundConfig, load_round_config
from assay.zoo.round import IMAGE_SHAPES, attempt_factors, draw_factors, generate_round
from assay.zoo.triggers import KINDS, check_fits

ZOO = [sys.executable, "-m", "assay", "zoo"]

# Small, quick and reliable: MLPs on digits, patch triggers, all-to-one.
FAST = {
    "models": 6,
    "seed": 11,
    "architectures": ["mlp"],
    "widths": [8],
    "epochs": 8,
    "trigger_kinds": ["solid_patch", "random_patch"],
    "source_specific_share": 0.0,
    "poison_fraction": [0.3, 0.3],
    "clean_accuracy_floor": 0.75,
    "asr_floor": 0.7,
}


@pytest.mark.parametrize(("models", "share"), [(10, 0.5), (7, 0.5), (9, 0.3), (5, 0.0), (4, 1.0)])
def test_draw_factors_deterministic_exact_share(models: int, share: float) -> None:
    config = RoundConfig(models=models, seed=5, poisoned_share=share, datasets=["digits", "mnist"])
    first = [draw_factors(config, i) for i in range(models)]
    assert first == [draw_factors(config, i) for i in range(models)]
    assert sum(f.poisoned for f in first) == round(models * share)
    assert [f.model_id for f in first] == [f"id-{i:08d}" for i in range(models)]
    for f in first:
        if f.poisoned:
            assert f.trigger is not None and f.target_class is not None and f.poison_fraction is not None
            check_fits(f.trigger, IMAGE_SHAPES[f.dataset])
            assert f.source_class != f.target_class
        else:
            assert f.trigger is None and f.target_class is None and f.source_class is None
    other = [draw_factors(config.model_copy(update={"seed": 6}), i) for i in range(models)]
    assert other != first


def test_triggers_fit_for_many_draws() -> None:
    config = RoundConfig(models=200, seed=1, datasets=["digits", "mnist"], source_specific_share=0.5)
    factors = [draw_factors(config, i) for i in range(200)]
    kinds = {f.trigger.kind for f in factors if f.trigger is not None}
    assert kinds == set(KINDS)
    assert any(f.source_class is not None for f in factors)
    for f in factors:
        if f.trigger is not None:
            check_fits(f.trigger, IMAGE_SHAPES[f.dataset])


@pytest.fixture(scope="module")
def built_round(tmp_path_factory: pytest.TempPathFactory) -> tuple[RoundConfig, Path, object]:
    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("round")
    config = RoundConfig.model_validate(FAST)
    summary = generate_round(config, out)
    return config, out, summary


def _read_csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def test_round_layout_and_metadata(built_round) -> None:
    config, out, summary = built_round
    assert (summary.built, summary.skipped, summary.models) == (6, 0, 6)
    rows = _read_csv(out / "METADATA.csv")
    assert [r["model_name"] for r in rows] == [f"id-{i:08d}" for i in range(6)]
    columns = {r["column"] for r in _read_csv(out / "METADATA_DICTIONARY.csv")}
    assert columns == set(rows[0])
    assert sum(r["poisoned"] == "True" for r in rows) == 3
    assert sorted(p.name for p in (out / "models").iterdir()) == [r["model_name"] for r in rows]
    for row in rows:
        folder = out / "models" / row["model_name"]
        info = json.loads((folder / "config.json").read_text())
        poisoned = info["poisoned"]
        assert (folder / "ground_truth.csv").read_text().strip() == str(int(poisoned))
        assert row["poisoned"] == str(poisoned)
        assert float(row["clean_accuracy"]) == info["clean_accuracy"] >= config.clean_accuracy_floor
        assert int(row["attempts"]) == info["attempts"] >= 1
        assert row["architecture"] == info["architecture"] and int(row["width"]) == info["width"]
        used = attempt_factors(config, draw_factors(config, info["index"]), info["attempts"] - 1)
        assert info == {**info, **used.model_dump(mode="json")}
        reduced = json.loads((folder / "reduced-config.json").read_text())
        assert reduced == {"architecture": "mlp", "width": 8, "input_shape": [8, 8], "num_classes": 10}
        model = load_model(folder / "model.pt")
        assert model(torch.zeros(1, 8, 8)).shape == (1, 10)
        labels = _read_csv(folder / "clean-example-data" / "labels.csv")
        assert len(labels) == 20 and {int(r["label"]) for r in labels} == set(range(10))
        for r in labels:
            assert (folder / "clean-example-data" / r["file"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        if poisoned:
            assert float(row["attack_success_rate"]) == info["attack_success_rate"] >= config.asr_floor
            assert row["trigger_kind"] == info["trigger"]["kind"]
            assert (folder / "trigger.png").read_bytes()[:4] == b"\x89PNG"
            poisoned_labels = _read_csv(folder / "poisoned-example-data" / "labels.csv")
            assert poisoned_labels and {int(r["label"]) for r in poisoned_labels} == {info["target_class"]}
        else:
            assert row["attack_success_rate"] == "" and info["attack_success_rate"] is None
            assert not (folder / "trigger.png").exists()
            assert not (folder / "poisoned-example-data").exists()
    assert not [p for p in (out / "models").iterdir() if p.name.startswith(".")]


def test_resume_rebuilds_only_missing(built_round) -> None:
    config, out, _ = built_round
    models = out / "models"
    victim = models / "id-00000003"
    before_config = (victim / "config.json").read_text()
    before_weights = load_model(victim / "model.pt").state_dict()
    mtimes = {p.name: (p / "model.pt").stat().st_mtime_ns for p in models.iterdir() if p != victim}
    metadata = (out / "METADATA.csv").read_text()
    shutil.rmtree(victim)
    seen: list[str] = []
    summary = generate_round(config, out, on_done=lambda r: seen.append(r.model_id))
    assert (summary.built, summary.skipped) == (1, 5)
    assert sorted(seen) == [f"id-{i:08d}" for i in range(6)]
    assert {n: (models / n / "model.pt").stat().st_mtime_ns for n in mtimes} == mtimes
    assert (victim / "config.json").read_text() == before_config
    after_weights = load_model(victim / "model.pt").state_dict()
    assert all(torch.equal(before_weights[k], after_weights[k]) for k in before_weights)
    assert (out / "METADATA.csv").read_text() == metadata


def test_impossible_floor_raises_and_leaves_nothing(tmp_path: Path) -> None:
    config = RoundConfig.model_validate(
        {**FAST, "models": 1, "epochs": 1, "clean_accuracy_floor": 0.999, "max_attempts": 2}
    )
    with pytest.raises(UserError) as info:
        generate_round(config, tmp_path)
    message = str(info.value)
    assert "\n" not in message
    assert "id-00000000" in message and "0.999" in message and "2" in message and "best" in message
    assert list((tmp_path / "models").iterdir()) == []
    assert not (tmp_path / "METADATA.csv").exists()


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("models: 0\n", "models"),
        ("poison_fraction: [0.4, 0.2]\n", "poison_fraction"),
        ("architectures: [vgg]\n", "architectures"),
        ("datasets: [cifar]\n", "datasets"),
        ("trigger_kinds: []\n", "trigger_kinds"),
        ("widths: [2]\n", "widths.0"),
        ("epoch: 3\n", "epoch"),
        ("asr_floor: 1.5\n", "asr_floor"),
    ],
)
def test_bad_config_is_one_line(tmp_path: Path, text: str, field: str) -> None:
    path = tmp_path / "round.yaml"
    path.write_text(text)
    with pytest.raises(UserError) as info:
        load_round_config(path)
    message = str(info.value)
    assert "\n" not in message and str(path) in message and f"field '{field}'" in message


def test_bad_yaml_and_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "round.yaml"
    path.write_text("models: [1\n")
    with pytest.raises(UserError, match=r"round\.yaml"):
        load_round_config(path)
    with pytest.raises(UserError, match=r"missing\.yaml"):
        load_round_config(tmp_path / "missing.yaml")


def test_example_config_loads() -> None:
    config = load_round_config(Path(__file__).parents[2] / "examples" / "zoo-round.yaml")
    assert config.models >= 1


@pytest.mark.slow
def test_cli_generate(tmp_path: Path) -> None:
    path = tmp_path / "round.yaml"
    path.write_text(json.dumps({**FAST, "models": 4}))  # JSON is YAML
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = str(tmp_path / "out")
    result = subprocess.run(
        [*ZOO, "generate", "--config", str(path), "--models", "2", "--seed", "3", "--out", out, "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["built"] == 2
    assert sorted(p.name for p in (tmp_path / "out" / "models").iterdir()) == ["id-00000000", "id-00000001"]
    bad = subprocess.run(
        [*ZOO, "generate", "--models", "0", "--out", str(tmp_path / "x")],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert bad.returncode == 2 and "models" in bad.stderr
    helped = subprocess.run([*ZOO, "generate", "--help"], capture_output=True, text=True, env=env)
    assert helped.returncode == 0 and "Example:" in helped.stdout


@pytest.mark.slow
def test_workers_build_the_same_models(built_round, tmp_path: Path) -> None:
    config, out, _ = built_round
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    for name in ("id-00000000", "id-00000005"):
        shutil.rmtree(copy / "models" / name)
    summary = generate_round(config, copy, workers=2)
    assert (summary.built, summary.skipped) == (2, 4)
    for name in ("id-00000000", "id-00000005"):
        first = json.loads((out / "models" / name / "config.json").read_text())
        again = json.loads((copy / "models" / name / "config.json").read_text())
        assert again == first


def test_png_examples_decode_back_to_the_image():
    """Example images survive PNG encoding to within one grey level (what detectors will read)."""
    import io

    import numpy as np
    from PIL import Image

    from assay.zoo.round import png_bytes

    image = np.random.default_rng(0).random((8, 8)).astype(np.float32)
    decoded = np.asarray(Image.open(io.BytesIO(png_bytes(image))), dtype=np.float32) / 255
    assert decoded.shape == (8, 8) and np.abs(decoded - image).max() <= 0.5 / 255 + 1e-6


def test_attempt_factors_redraw_the_trigger_every_second_attempt() -> None:
    config = RoundConfig(models=10, seed=4, poisoned_share=0.5)
    factors = [draw_factors(config, i) for i in range(10)]
    poisoned = next(f for f in factors if f.poisoned)
    clean = next(f for f in factors if not f.poisoned)
    tries = [attempt_factors(config, poisoned, k) for k in range(6)]
    assert tries[0] == tries[1] == poisoned
    assert tries[2] == tries[3] != poisoned and tries[4] == tries[5] != tries[2]
    for tried in tries:
        assert tried.trigger is not None and tried.trigger.kind == poisoned.trigger.kind
        check_fits(tried.trigger, IMAGE_SHAPES[tried.dataset])
        assert tried.model_dump(exclude={"trigger"}) == poisoned.model_dump(exclude={"trigger"})
    assert attempt_factors(config, poisoned, 4) == tries[4]  # deterministic
    assert all(attempt_factors(config, clean, k) == clean for k in range(6))
