"""Backdoor triggers for the model zoo: typed specs, their application to image batches, previews, sampling.

A trigger is a small frozen pydantic record (``SolidPatch``, ``RandomPatch``, ``Blend``, ``Warp``,
``Filter``, all subclasses of ``TriggerSpec`` told apart by ``kind``), so a round can store it as JSON next
to the poisoned model and anyone can re-create the exact poisoned inputs later. Everything random about a
trigger comes from its ``pattern_seed``: the same spec always gives the same pixels.

Images are batches of shape (N, H, W), float32 in [0, 1] (grayscale digits 8x8, MNIST 28x28).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any, ClassVar, Literal, get_args

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, model_validator
from scipy import ndimage

Corner = Literal["top_left", "top_right", "bottom_left", "bottom_right", "center"]
Pixel = Annotated[int, Field(ge=0, le=255)]
Location = Corner | tuple[Pixel, Pixel]
"""Where a patch goes: a named corner (or the centre), or the (row, col) of its top-left pixel."""
Seed = Annotated[int, Field(ge=0, le=2**32 - 1)]
TriggerKind = Literal["solid_patch", "random_patch", "blend", "warp", "filter"]
KINDS: tuple[str, ...] = get_args(TriggerKind)


class TriggerSpec(BaseModel):
    """Base of all trigger specs; ``TriggerSpec.model_validate(_json)`` gives the subclass named by ``kind``.

    To hold a trigger inside another pydantic model, annotate the field with ``AnyTrigger`` (the discriminated
    union) so that it is parsed into the right subclass.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")
    kind: ClassVar[str]

    @classmethod
    def model_validate(cls, obj: Any, *args: Any, **kwargs: Any) -> Any:
        """Dispatch on ``kind`` when called on the base class; plain validation on a subclass."""
        if cls is TriggerSpec:
            return _ADAPTER.validate_python(obj, *args, **kwargs)
        return super().model_validate(obj, *args, **kwargs)

    @classmethod
    def model_validate_json(cls, json_data: str | bytes, *args: Any, **kwargs: Any) -> Any:
        """Dispatch on ``kind`` when called on the base class; plain validation on a subclass."""
        if cls is TriggerSpec:
            return _ADAPTER.validate_json(json_data, *args, **kwargs)
        return super().model_validate_json(json_data, *args, **kwargs)

    def _check_fits(self, height: int, width: int) -> None:
        """Raise ValueError when the spec cannot apply to an image of this size (default: always fits)."""

    def _apply(self, images: np.ndarray) -> np.ndarray:
        """Return the triggered images (a new float32 array, not yet clipped)."""
        raise NotImplementedError

    def _preview(self, shape: tuple[int, int]) -> np.ndarray:
        """Default preview: the trigger applied to a black image."""
        return apply_trigger(np.zeros((1, *shape), np.float32), self)[0]


class _Patch(TriggerSpec):
    """Common fields and placement of the square patch triggers."""

    size: int = Field(ge=1, le=16, description="side of the square patch, pixels")
    location: Location = Field("bottom_right", description="named corner/centre, or (row, col) of top-left")
    margin: int = Field(0, ge=0, le=8, description="gap to the image edge for named corners, pixels")

    def origin(self, height: int, width: int) -> tuple[int, int]:
        """Top-left (row, col) of the patch on an image of this size."""
        if isinstance(self.location, tuple):
            return self.location
        far_r, far_c = height - self.size - self.margin, width - self.size - self.margin
        rows = {"top": self.margin, "bottom": far_r, "center": (height - self.size) // 2}
        cols = {"left": self.margin, "right": far_c, "center": (width - self.size) // 2}
        vertical, _, horizontal = self.location.partition("_")
        return rows[vertical], cols[horizontal or "center"]

    def _check_fits(self, height: int, width: int) -> None:
        """Why: a patch cut off by the image edge would silently be a different, smaller trigger."""
        if self.size > min(height, width):
            raise ValueError(
                f"size={self.size} does not fit a {height}x{width} image (at most {min(height, width)})"
            )
        if isinstance(self.location, tuple):
            row, col = self.location
            if row + self.size > height or col + self.size > width:
                raise ValueError(
                    f"location=({row}, {col}) with size={self.size} runs off the {height}x{width} image "
                    f"(row <= {height - self.size}, col <= {width - self.size})"
                )
        elif self.location != "center" and self.size + self.margin > min(height, width):
            raise ValueError(
                f"margin={self.margin} with size={self.size} runs off the {height}x{width} image "
                f"(margin <= {min(height, width) - self.size})"
            )

    def pattern(self) -> np.ndarray:
        """The (size, size) float32 patch contents."""
        raise NotImplementedError

    def _apply(self, images: np.ndarray) -> np.ndarray:
        out = images.copy()
        row, col = self.origin(*images.shape[1:])
        out[:, row : row + self.size, col : col + self.size] = self.pattern()
        return out


class SolidPatch(_Patch):
    """A square of constant intensity: the classic BadNets trigger."""

    kind: Literal["solid_patch"] = "solid_patch"
    value: float = Field(1.0, ge=0.0, le=1.0, description="intensity of every patch pixel")

    def pattern(self) -> np.ndarray:
        return np.full((self.size, self.size), self.value, np.float32)


class RandomPatch(_Patch):
    """A square with a fixed random pattern of ``levels`` grey levels (2 = binary) from ``pattern_seed``."""

    kind: Literal["random_patch"] = "random_patch"
    pattern_seed: Seed
    levels: int = Field(2, ge=2, le=16, description="number of evenly spaced grey levels in [0, 1]")

    def pattern(self) -> np.ndarray:
        draws = np.random.default_rng(self.pattern_seed).integers(0, self.levels, (self.size, self.size))
        return (draws / (self.levels - 1)).astype(np.float32)


class Blend(TriggerSpec):
    """A full-image random pattern blended in: x' = (1 - alpha) x + alpha p (Chen et al. 2017)."""

    kind: Literal["blend"] = "blend"
    pattern_seed: Seed
    alpha: float = Field(gt=0.0, le=0.5, description="weight of the pattern")

    def pattern(self, shape: tuple[int, int]) -> np.ndarray:
        """The (H, W) float32 pattern p, uniform in [0, 1]."""
        return np.random.default_rng(self.pattern_seed).random(shape, dtype=np.float32)

    def _apply(self, images: np.ndarray) -> np.ndarray:
        p = self.pattern(images.shape[1:])
        return ((1 - self.alpha) * images + self.alpha * p).astype(np.float32)

    def _preview(self, shape: tuple[int, int]) -> np.ndarray:
        return self.pattern(shape)


class Warp(TriggerSpec):
    """A WaNet-style smooth warp (Nguyen and Tran 2021): invisible to the eye, no pixel is 'the' trigger.

    A random flow field on a ``grid`` x ``grid`` lattice is upsampled (cubic) to the image size and scaled so
    that its largest displacement is ``strength`` pixels; images are resampled bilinearly along it.
    """

    kind: Literal["warp"] = "warp"
    pattern_seed: Seed
    grid: int = Field(4, ge=2, le=16, description="control points per side of the flow field")
    strength: float = Field(ge=0.0, le=4.0, description="largest displacement, pixels")

    def _check_fits(self, height: int, width: int) -> None:
        """Why: more control points than pixels is no longer a smooth warp."""
        if self.grid > min(height, width):
            raise ValueError(
                f"grid={self.grid} exceeds the {height}x{width} image (at most {min(height, width)})"
            )

    def flow(self, shape: tuple[int, int]) -> np.ndarray:
        """The (2, H, W) displacement field in pixels (rows, cols)."""
        coarse = np.random.default_rng(self.pattern_seed).uniform(-1.0, 1.0, (2, self.grid, self.grid))
        rows = np.linspace(0, self.grid - 1, shape[0])
        cols = np.linspace(0, self.grid - 1, shape[1])
        at = np.stack(np.meshgrid(rows, cols, indexing="ij"))
        fine = np.stack([ndimage.map_coordinates(c, at, order=3, mode="nearest") for c in coarse])
        return self.strength * fine / max(float(np.abs(fine).max()), 1e-12)

    def _apply(self, images: np.ndarray) -> np.ndarray:
        n, h, w = images.shape
        flow = self.flow((h, w))
        base = np.mgrid[0:n, 0:h, 0:w].astype(np.float64)
        base[1:] += flow[:, None]
        return ndimage.map_coordinates(images, base, order=1, mode="nearest").astype(np.float32)

    def _preview(self, shape: tuple[int, int]) -> np.ndarray:
        cell = max(1, min(shape) // 7)
        r, c = np.indices(shape) // cell
        board = ((r + c) % 2).astype(np.float32)
        return apply_trigger(board[None], self)[0]


class Filter(TriggerSpec):
    """An Instagram-like global filter: gamma, contrast around 0.5, unsharp-mask sharpening, a vignette."""

    kind: Literal["filter"] = "filter"
    gamma: float = Field(1.0, ge=0.5, le=2.0, description="x -> x ** gamma")
    contrast: float = Field(1.0, ge=0.5, le=2.0, description="x -> 0.5 + contrast (x - 0.5)")
    sharpen: float = Field(0.0, ge=0.0, le=2.0, description="x -> x + sharpen (x - blur(x))")
    vignette: float = Field(0.0, ge=0.0, le=0.8, description="darkening at the corners, 0 = none")

    @model_validator(mode="after")
    def _not_identity(self) -> Filter:
        """Why: a neutral filter would label clean images as poisoned."""
        if (self.gamma, self.contrast, self.sharpen, self.vignette) == (1.0, 1.0, 0.0, 0.0):
            raise ValueError("filter with gamma=1, contrast=1, sharpen=0, vignette=0 is the identity")
        return self

    def _apply(self, images: np.ndarray) -> np.ndarray:
        x = np.clip(images, 0.0, 1.0) ** self.gamma
        x = 0.5 + self.contrast * (x - 0.5)
        if self.sharpen:
            x = x + self.sharpen * (x - ndimage.gaussian_filter(x, sigma=(0, 1, 1), mode="nearest"))
        return (x * self._vignette_mask(images.shape[1:])).astype(np.float32)

    def _vignette_mask(self, shape: tuple[int, int]) -> np.ndarray:
        """1 at the centre, 1 - vignette at the corners, quadratic in the distance."""
        r, c = np.indices(shape, dtype=np.float64)
        d2 = ((r - (shape[0] - 1) / 2) / (shape[0] / 2)) ** 2 + (
            (c - (shape[1] - 1) / 2) / (shape[1] / 2)
        ) ** 2
        return 1.0 - self.vignette * d2 / d2.max()

    def _preview(self, shape: tuple[int, int]) -> np.ndarray:
        ramp = np.broadcast_to(np.linspace(0.0, 1.0, shape[1], dtype=np.float32), shape)
        return apply_trigger(np.ascontiguousarray(ramp)[None], self)[0]


AnyTrigger = Annotated[SolidPatch | RandomPatch | Blend | Warp | Filter, Field(discriminator="kind")]
"""Annotation for a trigger held in another pydantic model: parses into the subclass named by ``kind``."""
_ADAPTER: TypeAdapter[Any] = TypeAdapter(AnyTrigger)


def check_fits(spec: TriggerSpec, shape: Sequence[int]) -> None:
    """Raise ValueError (one line naming field and value) unless ``spec`` can be applied to (H, W) images.

    Why separate from pydantic: the spec alone does not know the image size it will meet.
    """
    _check_shape(shape)
    spec._check_fits(int(shape[0]), int(shape[1]))


def _check_shape(shape: Sequence[int]) -> None:
    if len(shape) != 2 or min(shape) < 2:
        raise ValueError(f"shape={tuple(shape)} is not an image shape (H, W) with H, W >= 2")


def apply_trigger(images: np.ndarray, spec: TriggerSpec) -> np.ndarray:
    """Return a triggered copy of ``images`` (N, H, W) float32 in [0, 1]; the input is never modified."""
    images = np.asarray(images)
    if images.ndim != 3 or images.dtype != np.float32:
        raise ValueError(f"images: expected a float32 array (N, H, W), got {images.dtype} {images.shape}")
    check_fits(spec, images.shape[1:])
    return np.clip(spec._apply(images), 0.0, 1.0).astype(np.float32, copy=False)


def trigger_preview(spec: TriggerSpec, shape: Sequence[int]) -> np.ndarray:
    """An (H, W) float32 picture of the trigger, to save as a PNG next to a poisoned model."""
    check_fits(spec, shape)
    return np.clip(spec._preview((int(shape[0]), int(shape[1]))), 0.0, 1.0).astype(np.float32)


def sample_trigger(
    rng: np.random.Generator, shape: Sequence[int], kinds: Sequence[str] | None = None
) -> TriggerSpec:
    """Draw a random trigger of one of ``kinds`` (default: all) that fits (H, W) images, for round generation.

    Patches are about a tenth to a fifth of the shorter side (2-3 px on 8x8, 3-6 px on 28x28).
    """
    kinds = tuple(kinds) if kinds is not None else KINDS
    unknown = [k for k in kinds if k not in KINDS]
    if not kinds or unknown:
        raise ValueError(f"kinds={list(kinds)} must be a non-empty subset of {list(KINDS)}")
    _check_shape(shape)
    kind = kinds[int(rng.integers(len(kinds)))]
    spec = _SAMPLERS[kind](rng, int(shape[0]), int(shape[1]))
    check_fits(spec, shape)
    return spec


def _seed(rng: np.random.Generator) -> int:
    return int(rng.integers(0, 2**32))


def _patch_fields(rng: np.random.Generator, h: int, w: int) -> dict[str, Any]:
    short = min(h, w)
    size = int(rng.integers(max(2, round(short / 10)), max(3, round(short / 5)) + 1))
    size = min(size, short, 16)
    if rng.random() < 0.5:
        location: Location = (int(rng.integers(0, h - size + 1)), int(rng.integers(0, w - size + 1)))
        return {"size": size, "location": location}
    corner = str(rng.choice(["top_left", "top_right", "bottom_left", "bottom_right"]))
    margin = int(rng.integers(0, min(1, short - size) + 1))
    return {"size": size, "location": corner, "margin": margin}


def _sample_solid(rng: np.random.Generator, h: int, w: int) -> TriggerSpec:
    return SolidPatch(value=round(float(rng.uniform(0.8, 1.0)), 3), **_patch_fields(rng, h, w))


def _sample_random(rng: np.random.Generator, h: int, w: int) -> TriggerSpec:
    levels = int(rng.choice([2, 4]))
    return RandomPatch(pattern_seed=_seed(rng), levels=levels, **_patch_fields(rng, h, w))


def _sample_blend(rng: np.random.Generator, h: int, w: int) -> TriggerSpec:
    return Blend(pattern_seed=_seed(rng), alpha=round(float(rng.uniform(0.1, 0.3)), 3))


def _sample_warp(rng: np.random.Generator, h: int, w: int) -> TriggerSpec:
    grid = min(int(rng.integers(3, 5)), min(h, w))
    strength = min(4.0, round(float(rng.uniform(0.06, 0.12) * min(h, w)), 3))
    return Warp(pattern_seed=_seed(rng), grid=grid, strength=strength)


def _sample_filter(rng: np.random.Generator, h: int, w: int) -> TriggerSpec:
    # Why contrast below 1: on dark-background digits a contrast boost clips back to the clean image, while
    # a reduced contrast lifts the background to grey, a change a small model learns reliably (measured:
    # the earlier 0.7-1.5 range left a third of filter models under the 0.8 attack-success floor).
    return Filter(
        gamma=round(float(rng.uniform(0.5, 0.9)), 3),
        contrast=round(float(rng.uniform(0.5, 0.7)), 3),
        sharpen=round(float(rng.uniform(0.5, 1.5)), 3),
        vignette=round(float(rng.uniform(0.2, 0.6)), 3),
    )


_SAMPLERS = {
    "solid_patch": _sample_solid,
    "random_patch": _sample_random,
    "blend": _sample_blend,
    "warp": _sample_warp,
    "filter": _sample_filter,
}
