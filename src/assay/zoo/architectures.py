"""Small image classifier families for the model zoo.

Each family trains in seconds on two CPU cores, takes a ``width`` (channels of the first conv layer, or
hidden units / 8 for the MLP; bounded to ``WIDTH_RANGE``) and works on any input size from 8x8 up
(adaptive pooling).
Inputs are (N, H, W), (N, 1, H, W) or RGB (N, 3, H, W) float tensors (channels averaged); outputs are
(N, num_classes) logits.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

WIDTH_RANGE = (4, 64)


def gray(x: torch.Tensor) -> torch.Tensor:
    """(N, H, W), (N, 1, H, W) or RGB (N, 3, H, W) input as (N, 1, H, W): channels averaged.

    NIST-style detectors feed RGB examples (``N.jpg``, what ``assay zoo export-nist`` writes); the mean of an
    RGB copy of a gray image is that image, and a one-channel input passes unchanged. A reshape and a mean
    rather than a branch on ``x.dim()``, so torch.fx can trace it (``assay.zoo.portable``).
    """
    return x.reshape(x.shape[0], -1, x.shape[-2], x.shape[-1]).mean(dim=1, keepdim=True)


class _Channels(nn.Module):
    """``gray`` as a layer: the first of the convolutional families."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return gray(x)


class CnnSmall(nn.Module):
    """Two 3x3 conv layers, adaptive average pooling to 4x4, one linear layer."""

    def __init__(self, width: int, shape: tuple[int, int], num_classes: int) -> None:
        super().__init__()
        self.features = nn.Sequential(
            _Channels(),
            nn.Conv2d(1, width, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(width, 2 * width, 3, padding=1),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(4),
        )
        self.classifier = nn.Linear(2 * width * 16, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x).flatten(1))


class _ResidualBlock(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(x + self.bn2(self.conv2(out)))


class ResNetTiny(nn.Module):
    """A stem conv, one residual block, max pooling for large inputs, global pooling, one linear layer."""

    def __init__(self, width: int, shape: tuple[int, int], num_classes: int) -> None:
        super().__init__()
        # 28x28 inputs are pooled to 14x14 before the block to keep a model to seconds on CPU.
        pool: nn.Module = nn.MaxPool2d(2) if min(shape) >= 16 else nn.Identity()
        self.stem = nn.Sequential(
            _Channels(),
            nn.Conv2d(1, width, 3, padding=1, bias=False),
            nn.BatchNorm2d(width),
            nn.ReLU(),
            pool,
        )
        self.block = _ResidualBlock(width)
        self.pool = nn.AdaptiveAvgPool2d(2)
        self.classifier = nn.Linear(width * 4, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.pool(self.block(self.stem(x))).flatten(1))


class Mlp(nn.Module):
    """Flatten, two hidden layers of ``8 * width`` units, one linear output layer."""

    def __init__(self, width: int, shape: tuple[int, int], num_classes: int) -> None:
        super().__init__()
        hidden = 8 * width
        self.net = nn.Sequential(
            nn.Flatten(),
            nn.Linear(shape[0] * shape[1], hidden),
            nn.ReLU(),
            nn.Linear(hidden, hidden),
            nn.ReLU(),
            nn.Linear(hidden, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(gray(x))


ARCHITECTURES: dict[str, Callable[[int, tuple[int, int], int], nn.Module]] = {
    "cnn_small": CnnSmall,
    "resnet_tiny": ResNetTiny,
    "mlp": Mlp,
}


def check_width(width: object) -> None:
    """Raise ValueError unless ``width`` is an int in ``WIDTH_RANGE`` (image and text families alike)."""
    low, high = WIDTH_RANGE
    if isinstance(width, bool) or not isinstance(width, int) or not low <= width <= high:
        raise ValueError(f"width must be an integer in [{low}, {high}], got {width!r}")


def build_model(family: str, width: int, shape: tuple[int, int], num_classes: int) -> nn.Module:
    """Build an untrained model of ``family`` (a key of ``ARCHITECTURES``); seed torch first to reproduce it.

    >>> build_model("cnn_small", 8, (8, 8), 10)(torch.zeros(2, 8, 8)).shape
    torch.Size([2, 10])
    """
    if family not in ARCHITECTURES:
        raise ValueError(f"unknown architecture family {family!r}; known: {', '.join(ARCHITECTURES)}")
    check_width(width)
    height, wide = (int(shape[0]), int(shape[1]))
    if min(height, wide) < 4:
        raise ValueError(f"shape must be at least 4x4, got {tuple(shape)!r}")
    if num_classes < 2:
        raise ValueError(f"num_classes must be at least 2, got {num_classes!r}")
    return ARCHITECTURES[family](width, (height, wide), int(num_classes))
