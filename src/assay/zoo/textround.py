"""The text half of a round: train one text model from its factors and write its folder.

``assay.zoo.round.build_model`` calls ``text_job`` for a model whose data set is text; retries, floors,
resume, Ray and ``METADATA.csv`` stay in ``round.py``, shared with images. A text model's folder::

    models/id-00000000/
        model.pt, model.safetensors, config.json, ground_truth.csv    as for images
        reduced-config.json      domain "text", architecture, width, vocab_size, max_length, num_classes,
                                 class_names and the round's tokenizer (what a detector needs to encode text)
        clean-example-data/      class_C_example_K.txt (NIST's NLP names), labels.csv (file, label)
        poisoned-example-data/   triggered texts of the attacked classes (poisoned models only)
        trigger.txt              the trigger's words (poisoned models only)
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import numpy as np

from assay.zoo.factors import ModelFactors, poison_plan, write_model_files
from assay.zoo.textdata import GROUPS, TextData, Tokenizer, load_text_dataset, round_tokenizer, text_subset
from assay.zoo.texttrain import train_text_model
from assay.zoo.texttriggers import TEXT_KINDS, TextTrigger, apply_text_trigger, sample_text_trigger
from assay.zoo.train import ModelJob, TrainOutcome

EXAMPLES_PER_CLASS = 5
NUM_TEXT_CLASSES = len(GROUPS)  # the class count every text data set has (MMLU subject groups)


def resample_trigger(rng: np.random.Generator, kind: str) -> TextTrigger:
    """A new text trigger of ``kind`` (a retry after two failures draws one, as for images)."""
    return sample_text_trigger(rng, [kind] if kind in TEXT_KINDS else TEXT_KINDS)


def text_job(factors: ModelFactors) -> ModelJob:
    """The train and write steps of a text model, sharing its data and the round's tokenizer."""
    data = load_text_dataset(factors.dataset, seed=factors.split_seed)
    data = text_subset(data, factors.clean_subset, np.random.default_rng(factors.training_seed))
    tokenizer = round_tokenizer(factors.dataset, factors.split_seed)

    def train(tried: ModelFactors, seed: int) -> TrainOutcome:
        return train_text_model(
            data,
            tokenizer,
            tried.architecture,
            tried.width,
            seed=seed,
            epochs=tried.epochs,
            poison=poison_plan(tried),
        )

    def write(folder: Path, tried: ModelFactors, outcome: TrainOutcome, attempts: int) -> None:
        write_text_model_dir(folder, tried, data, tokenizer, outcome, attempts)

    return ModelJob(train, write)


def _write_texts(folder: Path, texts: np.ndarray, labels: list[dict[str, int]], classes: list[int]) -> None:
    folder.mkdir()
    rows = io.StringIO()
    writer = csv.DictWriter(rows, fieldnames=["file", *labels[0]], lineterminator="\n")
    writer.writeheader()
    counts: dict[int, int] = {}
    for text, label, cls in zip(texts, labels, classes, strict=True):
        counts[cls] = counts.get(cls, 0) + 1
        name = f"class_{cls}_example_{counts[cls]}.txt"
        (folder / name).write_text(str(text) + "\n", encoding="utf-8")
        writer.writerow({"file": name, **label})
    (folder / "labels.csv").write_text(rows.getvalue(), encoding="utf-8")


def _pick(labels: np.ndarray, classes: list[int], rng: np.random.Generator) -> np.ndarray:
    picks = [
        np.sort(rng.choice(idx, size=min(EXAMPLES_PER_CLASS, len(idx)), replace=False))
        for idx in (np.flatnonzero(labels == c) for c in classes)
    ]
    return np.concatenate(picks) if picks else np.zeros(0, dtype=np.int64)


def reduced_config(factors: ModelFactors, data: TextData, tokenizer: Tokenizer) -> dict[str, object]:
    """What a detector may know about a text model: its shape, its classes and the tokenizer."""
    return {
        "domain": "text",
        "architecture": factors.architecture,
        "width": factors.width,
        "input_shape": [tokenizer.max_length],
        "vocab_size": tokenizer.vocab_size,
        "max_length": tokenizer.max_length,
        "num_classes": data.num_classes,
        "class_names": list(data.class_names),
        "tokenizer": json.loads(tokenizer.to_json()),
    }


def write_text_model_dir(
    folder: Path,
    factors: ModelFactors,
    data: TextData,
    tokenizer: Tokenizer,
    outcome: TrainOutcome,
    attempts: int,
) -> None:
    """Write a trained text model's folder (see the module docstring) into the new folder ``folder``."""
    write_model_files(folder, factors, outcome, attempts, reduced_config(factors, data, tokenizer))
    rng = np.random.default_rng(factors.training_seed)
    clean = _pick(data.test_labels, list(range(data.num_classes)), rng)
    classes = [int(data.test_labels[i]) for i in clean]
    _write_texts(
        folder / "clean-example-data", data.test_texts[clean], [{"label": c} for c in classes], classes
    )
    if factors.poisoned:
        assert isinstance(factors.trigger, TextTrigger) and factors.target_class is not None
        others = [c for c in range(data.num_classes) if c != factors.target_class]
        sources = [factors.source_class] if factors.source_class is not None else others
        chosen = _pick(data.test_labels, sources, rng)
        classes = [int(data.test_labels[i]) for i in chosen]
        labels = [{"label": factors.target_class, "source_label": c} for c in classes]
        triggered = apply_text_trigger(data.test_texts[chosen], factors.trigger)
        _write_texts(folder / "poisoned-example-data", triggered, labels, classes)
        (folder / "trigger.txt").write_text(factors.trigger.text + "\n", encoding="utf-8")
