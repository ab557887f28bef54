"""Train one zoo model, clean or poisoned with a trigger, and measure clean accuracy and attack success.

A ``PoisonPlan`` says how: a trigger function (from ``assay.zoo.triggers``, or any callable mapping a batch of
images (N, H, W) to triggered images), an all-to-one target class, the share of eligible training images to
poison, and optionally a source class (only its images are poisoned and attacked).

Training is deterministic for a given seed on CPU. ``assay.zoo.portable`` writes the model files.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from assay.zoo.architectures import build_model
from assay.zoo.datasets import ImageData

EVAL_BATCH = 1024


@dataclass(frozen=True)
class PoisonPlan:
    """How to poison a training set.

    ``fraction`` is the share of eligible training images (those not of ``target_class``; only those of
    ``source_class`` when set) that get the trigger and are relabelled to ``target_class``. For a
    source-specific plan, ``cover_fraction`` of the images of the other non-target classes also get the
    trigger but keep their label, so the model learns the trigger only matters for the source class.
    """

    apply: Callable[[np.ndarray], np.ndarray]
    target_class: int
    fraction: float
    source_class: int | None = None
    cover_fraction: float = 0.1

    def __post_init__(self) -> None:
        if not 0.0 < self.fraction <= 1.0:
            raise ValueError(f"poison fraction must be in (0, 1], got {self.fraction!r}")
        if not 0.0 <= self.cover_fraction <= 1.0:
            raise ValueError(f"cover_fraction must be in [0, 1], got {self.cover_fraction!r}")
        if self.source_class is not None and self.source_class == self.target_class:
            raise ValueError(f"source_class and target_class must differ, both are {self.target_class}")


@dataclass(frozen=True)
class ModelJob:
    """One model's two steps as ``round.build_model`` runs them, whatever its domain (image or text):
    ``train(factors, seed)`` one attempt, ``write(folder, factors, outcome, attempts)`` a finished model."""

    train: Callable[[Any, int], TrainOutcome]
    write: Callable[[Path, Any, TrainOutcome, int], None]


@dataclass(frozen=True, eq=False)
class TrainOutcome:
    """A trained model (in eval mode) and what it scored on the held-out test set."""

    model: nn.Module
    clean_accuracy: float
    attack_success_rate: float | None
    seconds: float
    num_poisoned: int = 0
    num_cover: int = 0


def triggered(poison: PoisonPlan, images: np.ndarray) -> np.ndarray:
    """Apply the plan's trigger to a copy of ``images`` and check the result (same shape, float32, [0, 1])."""
    out = np.asarray(poison.apply(images.copy()), dtype=np.float32)
    if out.shape != images.shape:
        raise ValueError(f"trigger changed the image batch shape from {images.shape} to {out.shape}")
    return np.clip(out, 0.0, 1.0)


def _eligible(labels: np.ndarray, poison: PoisonPlan) -> np.ndarray:
    """Indices of images that a plan attacks: not of the target class, and of the source class when set."""
    mask = labels != poison.target_class
    if poison.source_class is not None:
        mask &= labels == poison.source_class
    return np.flatnonzero(mask)


def poison_training_set(
    images: np.ndarray, labels: np.ndarray, poison: PoisonPlan, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray, int, int]:
    """Return poisoned copies of (images, labels), the number poisoned and the number of cover images."""
    images, labels = images.copy(), labels.copy()
    eligible = _eligible(labels, poison)
    n_poison = round(poison.fraction * len(eligible))
    chosen = np.sort(rng.choice(eligible, size=n_poison, replace=False)) if n_poison else eligible[:0]
    if n_poison:
        images[chosen] = triggered(poison, images[chosen])
        labels[chosen] = poison.target_class
    n_cover = 0
    if poison.source_class is not None and poison.cover_fraction > 0:
        others = np.flatnonzero((labels != poison.target_class) & (labels != poison.source_class))
        n_cover = round(poison.cover_fraction * len(others))
        if n_cover:
            cover = np.sort(rng.choice(others, size=n_cover, replace=False))
            images[cover] = triggered(poison, images[cover])
    return images, labels, int(n_poison), int(n_cover)


@torch.no_grad()
def predict(model: nn.Module, images: np.ndarray) -> np.ndarray:
    """Predicted classes (int64) for a batch of images (N, H, W); puts the model in eval mode."""
    model.eval()
    preds = [
        model(torch.from_numpy(np.ascontiguousarray(images[i : i + EVAL_BATCH], dtype=np.float32))).argmax(1)
        for i in range(0, len(images), EVAL_BATCH)
    ]
    return torch.cat(preds).numpy() if preds else np.zeros(0, dtype=np.int64)


def evaluate_accuracy(model: nn.Module, images: np.ndarray, labels: np.ndarray) -> float:
    """Share of ``images`` classified as ``labels``."""
    if len(images) == 0:
        raise ValueError("cannot measure accuracy on an empty set of images")
    return float(np.mean(predict(model, images) == labels))


def evaluate_asr(model: nn.Module, data: ImageData, poison: PoisonPlan) -> float:
    """Attack success rate: share of triggered test images not of the target class (only those of the source
    class when the plan has one) that the model classifies as the target class."""
    idx = _eligible(data.test_labels, poison)
    if len(idx) == 0:
        raise ValueError("no test images are eligible for the attack (check target_class and source_class)")
    preds = predict(model, triggered(poison, data.test_images[idx]))
    return float(np.mean(preds == poison.target_class))


def fit(
    make: Callable[[], nn.Module],
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    seed: int,
    rng: np.random.Generator,
    epochs: int,
    batch_size: int,
    lr: float,
) -> nn.Module:
    """Build a model with ``make`` after seeding torch, train it on (x, y) with Adam, return it in eval mode.

    The one training loop of the zoo (images and text): deterministic algorithms on, batches in the order
    ``rng`` draws, so the same arguments give the same weights on the same machine.
    """
    if epochs < 1 or batch_size < 1 or lr <= 0:
        raise ValueError(f"need epochs >= 1, batch_size >= 1 and lr > 0, got {epochs}, {batch_size}, {lr}")
    was_deterministic = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        torch.manual_seed(seed)
        model = make()
        optimizer = torch.optim.Adam(model.parameters(), lr=lr)
        loss_fn = nn.CrossEntropyLoss()
        model.train()
        for _ in range(epochs):
            order = torch.from_numpy(rng.permutation(len(x)))
            for i in range(0, len(order), batch_size):
                batch = order[i : i + batch_size]
                if len(batch) < 2:  # BatchNorm cannot train on a single image
                    continue
                optimizer.zero_grad(set_to_none=True)
                loss_fn(model(x[batch]), y[batch]).backward()
                optimizer.step()
        model.eval()
    finally:
        torch.use_deterministic_algorithms(was_deterministic)
    return model


def train_model(
    data: ImageData,
    family: str,
    width: int,
    *,
    seed: int,
    epochs: int = 10,
    batch_size: int = 64,
    lr: float = 3e-3,
    poison: PoisonPlan | None = None,
) -> TrainOutcome:
    """Train one ``family`` model of ``width`` on ``data`` with Adam, poisoned by ``poison`` when given.

    The same arguments give the same weights on the same machine (CPU). Thread count is left to the caller.
    """
    if poison is not None:
        for name in ("target_class", "source_class"):
            value = getattr(poison, name)
            if value is not None and not 0 <= value < data.num_classes:
                raise ValueError(f"poison {name} must be in [0, {data.num_classes}), got {value!r}")
    start = time.perf_counter()
    rng = np.random.default_rng(seed)
    images, labels = data.train_images, data.train_labels
    n_poison = n_cover = 0
    if poison is not None:
        images, labels, n_poison, n_cover = poison_training_set(images, labels, poison, rng)
    x = torch.from_numpy(np.ascontiguousarray(images, dtype=np.float32))
    y = torch.from_numpy(np.ascontiguousarray(labels, dtype=np.int64))

    model = fit(
        lambda: build_model(family, width, data.shape, data.num_classes),
        x,
        y,
        seed=seed,
        rng=rng,
        epochs=epochs,
        batch_size=batch_size,
        lr=lr,
    )
    accuracy = evaluate_accuracy(model, data.test_images, data.test_labels)
    asr = evaluate_asr(model, data, poison) if poison is not None else None
    return TrainOutcome(
        model=model,
        clean_accuracy=accuracy,
        attack_success_rate=asr,
        seconds=time.perf_counter() - start,
        num_poisoned=n_poison,
        num_cover=n_cover,
    )
