"""Generate a TrojAI-style round: many small image (or text) classifiers, about half of them trojaned.

Each model's factors are drawn deterministically from ``(config.seed, index)`` (``draw_factors``); exactly
``round(models * poisoned_share)`` models are poisoned, chosen by a seeded permutation. ``build_model`` trains
one model, retrying with new training seeds until it reaches the floors, and writes the TrojAI layout::

    models/id-00000000/
        model.pt                 the whole torch module, loadable without assay (``assay.zoo.portable``)
        model.safetensors        its weights alone, for detectors that load no pickle
        config.json              every factor, the attempts, clean_accuracy, attack_success_rate
        reduced-config.json      what a detector may know: architecture, width, input shape, num_classes
        ground_truth.csv         1 if poisoned, else 0
        clean-example-data/      2 test images per class (PNG) and labels.csv
        poisoned-example-data/   triggered test images and labels.csv (poisoned models only)
        trigger.png              a picture of the trigger (poisoned models only)

A model directory appears only when complete (built in a temporary directory, renamed at the end), so
``generate_round`` resumes an interrupted round by skipping existing directories. All models of a round share
one train/test split, fixed by ``config.seed``. A text model (``domain: text``) takes the same path, its
training and folder from ``assay.zoo.textround`` (``ModelJob``: the two steps that differ by domain).
"""

from __future__ import annotations

import concurrent.futures
import csv
import io
import json
import multiprocessing
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from pydantic import BaseModel

from assay.errors import UserError
from assay.fileio import atomic_path, write_text_atomic
from assay.runner.transfer import digest, pack, unpack_to
from assay.zoo.config import RoundConfig, domain_of
from assay.zoo.datasets import ImageData, load_dataset, subset
from assay.zoo.factors import ModelFactors, model_id, poison_plan, write_model_files
from assay.zoo.textround import NUM_TEXT_CLASSES, resample_trigger, text_job
from assay.zoo.texttriggers import sample_text_trigger
from assay.zoo.train import ModelJob, TrainOutcome, train_model
from assay.zoo.triggers import apply_trigger, sample_trigger, trigger_preview

if TYPE_CHECKING:
    from assay.runner.executors import RayExecutor

NUM_CLASSES = 10
IMAGE_SHAPES: dict[str, tuple[int, int]] = {"digits": (8, 8), "mnist": (28, 28)}
EXAMPLES_PER_CLASS = 2
# Tag of the seed sequence of the poisoned-model permutation; larger than any model index.
_PERMUTATION_TAG = 2**32 - 1


class BuildResult(BaseModel):
    """One model of a round: built now, or skipped because its directory already existed."""

    model_id: str
    built: bool
    attempts: int
    clean_accuracy: float
    attack_success_rate: float | None


class RoundSummary(BaseModel):
    """What ``generate_round`` did."""

    out_dir: str
    models: int
    built: int
    skipped: int
    rejected_attempts: int


def _poisoned_indices(config: RoundConfig) -> set[int]:
    n_poisoned = round(config.models * config.poisoned_share)
    rng = np.random.default_rng(np.random.SeedSequence([config.seed, _PERMUTATION_TAG, config.models]))
    return {int(i) for i in rng.permutation(config.models)[:n_poisoned]}


def draw_factors(config: RoundConfig, index: int) -> ModelFactors:
    """Draw model ``index``'s factors, deterministically from ``(config.seed, index)``."""
    if not 0 <= index < config.models:
        raise ValueError(f"index must be in [0, {config.models}), got {index!r}")
    rng = np.random.default_rng(np.random.SeedSequence([config.seed, index]))
    # Every draw happens for every model, in a fixed order, so a factor never depends on another's outcome.
    dataset = config.datasets[int(rng.integers(len(config.datasets)))]
    architecture = config.architectures[int(rng.integers(len(config.architectures)))]
    width = config.widths[int(rng.integers(len(config.widths)))]
    clean_subset = round(float(rng.uniform(config.clean_subset.min, config.clean_subset.max)), 4)
    training_seed = int(rng.integers(0, 2**32))
    if domain_of(dataset) == "text":
        trigger: Any = sample_text_trigger(rng, config.trigger_kinds)
        classes = NUM_TEXT_CLASSES
    else:
        trigger, classes = sample_trigger(rng, IMAGE_SHAPES[dataset], config.trigger_kinds), NUM_CLASSES
    target = int(rng.integers(classes))
    source_specific = bool(rng.random() < config.source_specific_share)
    source = int((target + 1 + rng.integers(classes - 1)) % classes)
    fraction = round(float(rng.uniform(config.poison_fraction.min, config.poison_fraction.max)), 4)
    poisoned = index in _poisoned_indices(config)
    return ModelFactors(
        model_id=model_id(index),
        index=index,
        dataset=dataset,
        architecture=architecture,
        width=width,
        poisoned=poisoned,
        trigger=trigger if poisoned else None,
        target_class=target if poisoned else None,
        source_class=source if poisoned and source_specific else None,
        poison_fraction=max(fraction, 1e-4) if poisoned else None,
        clean_subset=max(clean_subset, 1e-4),
        training_seed=training_seed,
        split_seed=config.seed,
        epochs=config.epochs,
    )


def attempt_seed(training_seed: int, attempt: int) -> int:
    """The training seed of attempt ``attempt`` (0-based) of a model."""
    return int(np.random.SeedSequence([training_seed, attempt]).generate_state(1)[0])


def attempt_factors(config: RoundConfig, factors: ModelFactors, attempt: int) -> ModelFactors:
    """The factors training attempt ``attempt`` (0-based) uses: the drawn ones, except that every second
    failure of a poisoned model draws a new trigger of the same kind.

    Why: some draws cannot take (a grey patch on a digit's strokes looks like the digit), and no training
    seed fixes that; NIST likewise discards such a model and draws again. Keeping the kind keeps the round's
    mix of trigger kinds as configured.
    """
    redraw = attempt // 2
    if not factors.poisoned or redraw == 0:
        return factors
    assert factors.trigger is not None
    rng = np.random.default_rng(np.random.SeedSequence([factors.split_seed, factors.index, redraw]))
    if domain_of(factors.dataset) == "text":
        trigger: Any = resample_trigger(rng, factors.trigger.kind)
    else:
        trigger = sample_trigger(rng, IMAGE_SHAPES[factors.dataset], [factors.trigger.kind])
    return factors.model_copy(update={"trigger": trigger})


def _margin(outcome: TrainOutcome, config: RoundConfig) -> float:
    margin = outcome.clean_accuracy - config.clean_accuracy_floor
    if outcome.attack_success_rate is not None:
        margin = min(margin, outcome.attack_success_rate - config.asr_floor)
    return margin


def png_bytes(image: np.ndarray) -> bytes:
    """Encode an (H, W) float image in [0, 1] as an 8-bit grayscale PNG (what TrojAI example data uses)."""
    from PIL import Image

    pixels = np.round(np.clip(np.asarray(image, dtype=np.float64), 0.0, 1.0) * 255).astype(np.uint8)
    if pixels.ndim != 2:
        raise ValueError(f"expected an (H, W) image, got shape {pixels.shape}")
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")  # 2-D uint8 is 8-bit grayscale ("L")
    return buffer.getvalue()


def _write_examples(folder: Path, images: np.ndarray, labels: list[dict[str, int]]) -> None:
    folder.mkdir()
    rows = io.StringIO()
    writer = csv.DictWriter(rows, fieldnames=["file", *labels[0]] if labels else ["file", "label"])
    writer.writeheader()
    for i, (image, label) in enumerate(zip(images, labels, strict=True)):
        name = f"example_{i:03d}_class_{label['label']}.png"
        (folder / name).write_bytes(png_bytes(image))
        writer.writerow({"file": name, **label})
    (folder / "labels.csv").write_text(rows.getvalue(), encoding="utf-8")


def _example_indices(labels: np.ndarray, classes: list[int], rng: np.random.Generator) -> np.ndarray:
    picks = []
    for cls in classes:
        idx = np.flatnonzero(labels == cls)
        picks.append(np.sort(rng.choice(idx, size=min(EXAMPLES_PER_CLASS, len(idx)), replace=False)))
    return np.concatenate(picks) if picks else np.zeros(0, dtype=np.int64)


def _write_model_dir(
    folder: Path, factors: ModelFactors, data: ImageData, outcome: TrainOutcome, attempts: int
) -> None:
    reduced = {
        "architecture": factors.architecture,
        "width": factors.width,
        "input_shape": list(data.shape),
        "num_classes": data.num_classes,
    }
    write_model_files(folder, factors, outcome, attempts, reduced)

    rng = np.random.default_rng(factors.training_seed)
    clean = _example_indices(data.test_labels, list(range(data.num_classes)), rng)
    _write_examples(
        folder / "clean-example-data",
        data.test_images[clean],
        [{"label": int(data.test_labels[i])} for i in clean],
    )
    if factors.poisoned:
        assert factors.trigger is not None and factors.target_class is not None
        sources = (
            [factors.source_class]
            if factors.source_class is not None
            else [c for c in range(data.num_classes) if c != factors.target_class]
        )
        chosen = _example_indices(data.test_labels, sources, rng)
        _write_examples(
            folder / "poisoned-example-data",
            apply_trigger(data.test_images[chosen], factors.trigger),
            [{"label": factors.target_class, "source_label": int(data.test_labels[i])} for i in chosen],
        )
        preview = trigger_preview(factors.trigger, data.shape)
        (folder / "trigger.png").write_bytes(png_bytes(preview))


def image_job(factors: ModelFactors) -> ModelJob:
    """The train and write steps of an image model ."""
    data = load_dataset(factors.dataset, seed=factors.split_seed)  # type: ignore[arg-type]
    data = subset(data, factors.clean_subset, np.random.default_rng(factors.training_seed))

    def train(tried: ModelFactors, seed: int) -> TrainOutcome:
        return train_model(
            data, tried.architecture, tried.width, seed=seed, epochs=tried.epochs, poison=poison_plan(tried)
        )

    def write(folder: Path, tried: ModelFactors, outcome: TrainOutcome, attempts: int) -> None:
        _write_model_dir(folder, tried, data, outcome, attempts)

    return ModelJob(train, write)


def build_model(config: RoundConfig, factors: ModelFactors, model_dir: str | Path) -> BuildResult:
    """Train ``factors``' model until it reaches the floors, then write its TrojAI folder ``model_dir``.

    Attempt ``k`` trains with ``attempt_seed(factors.training_seed, k)`` and ``attempt_factors(..., k)``.
    After ``config.max_attempts`` failures a ``UserError`` names the model, the floors and the best numbers
    reached, and nothing is written.
    """
    job = text_job(factors) if domain_of(factors.dataset) == "text" else image_job(factors)
    best: TrainOutcome | None = None
    for attempt in range(config.max_attempts):
        tried = attempt_factors(config, factors, attempt)
        outcome = job.train(tried, attempt_seed(tried.training_seed, attempt))
        if best is None or _margin(outcome, config) > _margin(best, config):
            best = outcome
        if _margin(outcome, config) >= 0:
            with atomic_path(model_dir) as tmp:
                job.write(tmp, tried, outcome, attempt + 1)
            return BuildResult(
                model_id=factors.model_id,
                built=True,
                attempts=attempt + 1,
                clean_accuracy=outcome.clean_accuracy,
                attack_success_rate=outcome.attack_success_rate,
            )
    assert best is not None
    floors = f"clean_accuracy_floor {config.clean_accuracy_floor}"
    reached = f"clean accuracy {best.clean_accuracy:.3f}"
    if factors.poisoned:
        floors += f", asr_floor {config.asr_floor}"
        reached += f", attack success {best.attack_success_rate:.3f}"
    raise UserError(
        f"{factors.model_id}: no attempt of {config.max_attempts} reached {floors} (best: {reached}); "
        "lower the floors or raise epochs, widths or poison_fraction"
    )


def _read_result(model_dir: Path, built: bool) -> BuildResult:
    info = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    return BuildResult(
        model_id=model_dir.name,
        built=built,
        attempts=info["attempts"],
        clean_accuracy=info["clean_accuracy"],
        attack_success_rate=info["attack_success_rate"],
    )


def _build_index(config_json: str, index: int, models_dir: str) -> BuildResult:
    config = RoundConfig.model_validate_json(config_json)
    factors = draw_factors(config, index)
    return build_model(config, factors, Path(models_dir) / factors.model_id)


def _init_worker() -> None:
    torch.set_num_threads(1)


def build_packed(config_json: str, index: int) -> tuple[BuildResult, str, bytes]:
    """Build model ``index`` on a cluster node, in a scratch folder of that node, and hand it back as one
    blob with its SHA-256 (``assay.runner.transfer``): no node needs to see the round folder, and a build
    run again after its node died writes nothing twice."""
    _init_worker()
    with tempfile.TemporaryDirectory(prefix="assay-zoo-") as scratch:
        result = _build_index(config_json, index, scratch)
        blob = pack(Path(scratch) / result.model_id)
    return result, digest(blob), blob


METADATA_COLUMNS: dict[str, str] = {
    "model_name": "Model folder name under models/ (id-NNNNNNNN).",
    "index": "Model index in the round; with the round seed it determines every factor.",
    "dataset": "Data set the model was trained on (digits 8x8, mnist 28x28, mmlu_subjects text).",
    "architecture": "Architecture family (a key of assay.zoo.architectures.ARCHITECTURES).",
    "width": "Width of the architecture (first-layer channels, or MLP hidden units / 8).",
    "poisoned": "True if the model was trained with a trigger (the ground truth).",
    "trigger_kind": "Trigger kind (solid_patch, random_patch, blend, warp, filter; text: rare_word, phrase, "
    "char_edit); empty if clean.",
    "trigger": "Full trigger spec as JSON (assay.zoo.triggers.TriggerSpec); empty if clean.",
    "target_class": "Class the trigger maps inputs to; empty if clean.",
    "source_class": "Only class whose triggered inputs are attacked; empty if all-to-one or clean.",
    "poison_fraction": "Share of eligible training images poisoned; empty if clean.",
    "clean_subset": "Share of the training split the model was trained on.",
    "training_seed": "Base training seed; attempt k used a seed derived from it and k.",
    "split_seed": "Seed of the train/test split (the round seed).",
    "epochs": "Training epochs.",
    "clean_accuracy": "Accuracy on the clean test split.",
    "attack_success_rate": "Share of triggered eligible test images classed as the target; empty if clean.",
    "attempts": "Training attempts needed to reach the floors (1 = first try).",
}


def _metadata_row(model_dir: Path) -> dict[str, object]:
    info = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    trigger = info.get("trigger")
    row: dict[str, object] = {key: info.get(key) for key in METADATA_COLUMNS}
    row["model_name"] = model_dir.name
    row["trigger_kind"] = trigger["kind"] if trigger else None
    row["trigger"] = json.dumps(trigger, separators=(",", ":")) if trigger else None
    return {key: "" if value is None else value for key, value in row.items()}


def write_metadata(out_dir: str | Path, model_names: list[str]) -> None:
    """Write ``METADATA.csv`` (one row per model) and ``METADATA_DICTIONARY.csv`` into ``out_dir``."""
    out_dir = Path(out_dir)
    table = io.StringIO()
    writer = csv.DictWriter(table, fieldnames=list(METADATA_COLUMNS), lineterminator="\n")
    writer.writeheader()
    for name in model_names:
        writer.writerow(_metadata_row(out_dir / "models" / name))
    write_text_atomic(out_dir / "METADATA.csv", table.getvalue())
    dictionary = io.StringIO()
    dict_writer = csv.writer(dictionary, lineterminator="\n")
    dict_writer.writerow(["column", "description"])
    dict_writer.writerows(METADATA_COLUMNS.items())
    write_text_atomic(out_dir / "METADATA_DICTIONARY.csv", dictionary.getvalue())


def generate_round(
    config: RoundConfig,
    out_dir: str | Path,
    workers: int = 1,
    on_done: Callable[[BuildResult], None] | None = None,
    cluster: RayExecutor | None = None,
) -> RoundSummary:
    """Build every model of the round under ``out_dir/models/`` (skipping finished ones) and the metadata.

    ``workers > 1`` trains in that many processes (one torch thread each); a ``cluster`` trains each model
    as a task on its nodes (``build_packed``; ``workers`` is then unused), the models coming back by value.
    ``on_done`` is called once per model, built or skipped, in the parent process. A model that cannot
    reach the floors raises ``UserError`` (after the models already running finish, with processes); the
    finished ones stay, so a rerun resumes.
    """
    if workers < 1:
        raise UserError(f"workers must be at least 1, got {workers}")
    out_dir = Path(out_dir)
    models_dir = out_dir / "models"
    models_dir.mkdir(parents=True, exist_ok=True)
    names = [model_id(i) for i in range(config.models)]
    results: list[BuildResult] = []

    def done(result: BuildResult) -> None:
        results.append(result)
        if on_done is not None:
            on_done(result)

    todo = []
    for index, name in enumerate(names):
        if (models_dir / name).is_dir():
            done(_read_result(models_dir / name, built=False))
        else:
            todo.append(index)

    config_json = config.model_dump_json()
    if cluster is not None:

        def landed(packed: tuple[BuildResult, str, bytes]) -> None:
            result, expected, blob = packed
            unpack_to(blob, expected, models_dir / result.model_id)  # checked against its hash first
            done(result)

        cluster.call_map(build_packed, [(config_json, index) for index in todo], landed)
    elif workers == 1 or len(todo) <= 1:
        for index in todo:
            done(_build_index(config_json, index, str(models_dir)))
    else:
        context = multiprocessing.get_context("spawn")  # fork after torch has run can hang OpenMP
        with concurrent.futures.ProcessPoolExecutor(
            max_workers=min(workers, len(todo)), mp_context=context, initializer=_init_worker
        ) as pool:
            futures = [pool.submit(_build_index, config_json, i, str(models_dir)) for i in todo]
            try:
                for future in concurrent.futures.as_completed(futures):
                    done(future.result())
            except BaseException:
                for future in futures:
                    future.cancel()
                raise

    write_metadata(out_dir, names)
    built = sum(r.built for r in results)
    return RoundSummary(
        out_dir=str(out_dir),
        models=config.models,
        built=built,
        skipped=len(results) - built,
        rejected_attempts=sum(r.attempts - 1 for r in results if r.built),
    )
