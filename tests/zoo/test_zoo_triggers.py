"""Trigger library of the model zoo: every kind keeps shape, dtype and range, is deterministic, and does
exactly what its spec says."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from assay.zoo.triggers import (
    KINDS,
    Blend,
    Filter,
    RandomPatch,
    SolidPatch,
    TriggerSpec,
    Warp,
    apply_trigger,
    check_fits,
    sample_trigger,
    trigger_preview,
)

SPECS = {
    "solid_patch": SolidPatch(size=3, location="bottom_right", margin=1, value=0.9),
    "random_patch": RandomPatch(size=3, location=(1, 2), pattern_seed=7, levels=4),
    "blend": Blend(pattern_seed=3, alpha=0.2),
    "warp": Warp(pattern_seed=5, grid=4, strength=1.5),
    "filter": Filter(gamma=1.4, contrast=1.3, sharpen=0.8, vignette=0.4),
}


def smooth_images(shape: tuple[int, int], n: int = 4, seed: int = 0) -> np.ndarray:
    """Blurry random images in [0, 1]: a stand-in for digits that a warp moves without wrecking."""
    from scipy import ndimage

    raw = np.random.default_rng(seed).random((n, *shape))
    smooth = ndimage.gaussian_filter(raw, sigma=(0, 1.5, 1.5))
    smooth = (smooth - smooth.min()) / (smooth.max() - smooth.min())
    return smooth.astype(np.float32)


@pytest.fixture(params=[(8, 8), (28, 28)], ids=["digits", "mnist"])
def images(request) -> np.ndarray:
    return smooth_images(request.param)


@pytest.mark.parametrize("kind", KINDS)
def test_output_shape_dtype_range_and_input_untouched(kind, images):
    before = images.copy()
    out = apply_trigger(images, SPECS[kind])
    assert out.shape == images.shape and out.dtype == np.float32
    assert out.min() >= 0.0 and out.max() <= 1.0
    assert out is not images
    np.testing.assert_array_equal(images, before)


@pytest.mark.parametrize("kind", KINDS)
def test_deterministic(kind, images):
    spec = SPECS[kind]
    np.testing.assert_array_equal(apply_trigger(images, spec), apply_trigger(images, spec))
    rebuilt = type(spec)(**spec.model_dump())
    np.testing.assert_array_equal(apply_trigger(images, spec), apply_trigger(images, rebuilt))


@pytest.mark.parametrize("kind", KINDS)
def test_json_round_trip_gives_equal_spec_and_output(kind, images):
    spec = SPECS[kind]
    back = TriggerSpec.model_validate_json(spec.model_dump_json())
    assert back == spec and type(back) is type(spec)
    assert TriggerSpec.model_validate(spec.model_dump()) == spec
    np.testing.assert_array_equal(apply_trigger(images, back), apply_trigger(images, spec))


@pytest.mark.parametrize("kind", KINDS)
def test_preview_is_an_image(kind):
    for shape in [(8, 8), (28, 28)]:
        preview = trigger_preview(SPECS[kind], shape)
        assert preview.shape == shape and preview.dtype == np.float32
        assert preview.min() >= 0.0 and preview.max() <= 1.0 and preview.std() > 0


def _patch_mask(shape, row, col, size):
    mask = np.zeros(shape, bool)
    mask[row : row + size, col : col + size] = True
    return mask


@pytest.mark.parametrize(
    ("location", "margin", "origin"),
    [("top_left", 0, (0, 0)), ("bottom_right", 1, (4, 4)), ("top_right", 0, (0, 5)), ((2, 1), 0, (2, 1))],
)
def test_solid_patch_changes_exactly_its_pixels(location, margin, origin):
    images = np.full((3, 8, 8), 0.25, np.float32)
    out = apply_trigger(images, SolidPatch(size=3, location=location, margin=margin, value=0.75))
    mask = _patch_mask((8, 8), *origin, 3)
    assert np.all(out[:, mask] == np.float32(0.75))
    np.testing.assert_array_equal(out[:, ~mask], images[:, ~mask])


def test_random_patch_sets_its_pattern_and_nothing_else():
    spec = RandomPatch(size=4, location=(10, 20), pattern_seed=11, levels=2)
    images = smooth_images((28, 28))
    out = apply_trigger(images, spec)
    mask = _patch_mask((28, 28), 10, 20, 4)
    for image in out:
        np.testing.assert_array_equal(image[mask].reshape(4, 4), spec.pattern())
    np.testing.assert_array_equal(out[:, ~mask], images[:, ~mask])
    assert set(np.unique(spec.pattern())) <= {0.0, 1.0}
    assert not np.array_equal(
        spec.pattern(), RandomPatch(**{**spec.model_dump(), "pattern_seed": 12}).pattern()
    )


def test_blend_equals_closed_form(images):
    spec = SPECS["blend"]
    p = spec.pattern(images.shape[1:])
    expected = (1 - spec.alpha) * images.astype(np.float64) + spec.alpha * p
    np.testing.assert_allclose(apply_trigger(images, spec), expected, atol=1e-7, rtol=0)


def test_warp_strength_zero_is_identity(images):
    out = apply_trigger(images, Warp(pattern_seed=5, grid=4, strength=0.0))
    np.testing.assert_allclose(out, images, atol=1e-6, rtol=0)


def test_warp_moves_pixels_but_keeps_the_mean(images):
    out = apply_trigger(images, SPECS["warp"])
    assert np.abs(out - images).max() > 0.05
    np.testing.assert_allclose(out.mean(axis=(1, 2)), images.mean(axis=(1, 2)), atol=0.05)
    flow = SPECS["warp"].flow(images.shape[1:])
    assert np.abs(flow).max() == pytest.approx(1.5)


def test_filter_is_not_identity(images):
    assert np.abs(apply_trigger(images, SPECS["filter"]) - images).max() > 0.05
    with pytest.raises(ValidationError, match="identity"):
        Filter()


@pytest.mark.parametrize(
    ("spec", "field_value"),
    [
        (SolidPatch(size=9), "size=9"),
        (SolidPatch(size=3, location=(6, 2)), "location=(6, 2)"),
        (RandomPatch(size=2, location=(0, 8), pattern_seed=1), "location=(0, 8)"),
        (SolidPatch(size=3, location="bottom_left", margin=6), "margin=6"),
        (Warp(pattern_seed=1, grid=9, strength=1.0), "grid=9"),
    ],
)
def test_check_fits_names_field_and_value(spec, field_value):
    with pytest.raises(ValueError, match=r"8x8") as caught:
        check_fits(spec, (8, 8))
    message = str(caught.value)
    assert field_value in message and "\n" not in message
    with pytest.raises(ValueError, match="8x8"):
        apply_trigger(np.zeros((1, 8, 8), np.float32), spec)


def test_check_fits_accepts_what_fits():
    check_fits(SolidPatch(size=8, location="top_left"), (8, 8))
    check_fits(SolidPatch(size=3, location=(5, 5)), (8, 8))
    check_fits(SPECS["warp"], (8, 8))


@pytest.mark.parametrize(
    ("cls", "fields"),
    [
        (SolidPatch, {"size": 0}),
        (SolidPatch, {"size": 3, "value": 1.5}),
        (SolidPatch, {"size": 3, "location": (-1, 0)}),
        (SolidPatch, {"size": 3, "location": "middle"}),
        (SolidPatch, {"size": 3, "colour": 1}),
        (RandomPatch, {"size": 3, "pattern_seed": -1}),
        (RandomPatch, {"size": 3, "pattern_seed": 1, "levels": 1}),
        (Blend, {"pattern_seed": 1, "alpha": 0.0}),
        (Blend, {"pattern_seed": 1, "alpha": 0.6}),
        (Warp, {"pattern_seed": 1, "strength": 5.0}),
        (Warp, {"pattern_seed": 1, "strength": 1.0, "grid": 1}),
        (Filter, {"gamma": 3.0}),
        (Filter, {"vignette": float("nan")}),
    ],
)
def test_pydantic_rejects_out_of_bounds(cls, fields):
    with pytest.raises(ValidationError):
        cls(**fields)


def test_unknown_kind_is_rejected():
    with pytest.raises(ValidationError):
        TriggerSpec.model_validate({"kind": "sticker", "size": 3})


def test_apply_rejects_wrong_array():
    with pytest.raises(ValueError, match="float32"):
        apply_trigger(np.zeros((8, 8), np.float32), SPECS["blend"])
    with pytest.raises(ValueError, match="float32"):
        apply_trigger(np.zeros((1, 8, 8), np.float64), SPECS["blend"])


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), shape=st.sampled_from([(8, 8), (28, 28)]))
def test_sample_trigger_always_fits(seed, shape):
    spec = sample_trigger(np.random.default_rng(seed), shape)
    check_fits(spec, shape)
    out = apply_trigger(np.zeros((1, *shape), np.float32), spec)
    assert out.shape == (1, *shape)
    if isinstance(spec, SolidPatch | RandomPatch):
        assert (2 <= spec.size <= 3) if shape == (8, 8) else (3 <= spec.size <= 6)


def test_sample_trigger_respects_kinds_and_covers_all():
    rng = np.random.default_rng(0)
    assert {sample_trigger(rng, (8, 8), kinds=["warp"]).kind for _ in range(10)} == {"warp"}
    assert {sample_trigger(rng, (28, 28)).kind for _ in range(100)} == set(KINDS)
    assert sample_trigger(np.random.default_rng(4), (8, 8)) == sample_trigger(
        np.random.default_rng(4), (8, 8)
    )
    with pytest.raises(ValueError, match="kinds"):
        sample_trigger(rng, (8, 8), kinds=["sticker"])
