"""assay.zoo data sets, architectures and training of one clean or poisoned model (digits, a few seconds)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from assay.trojai import load_model
from assay.zoo.architectures import ARCHITECTURES, build_model
from assay.zoo.datasets import load_dataset, subset
from assay.zoo.portable import save_model
from assay.zoo.train import (
    PoisonPlan,
    evaluate_accuracy,
    evaluate_asr,
    predict,
    train_model,
)

EPOCHS = 10


def patch_trigger(images: np.ndarray) -> np.ndarray:
    """A simple test trigger: the bottom-right 2x2 patch set to white."""
    out = images.copy()
    out[:, -2:, -2:] = 1.0
    return out


@pytest.fixture(scope="module")
def digits():
    return load_dataset("digits", seed=0)


@pytest.fixture(scope="module")
def clean(digits):
    return train_model(digits, "cnn_small", 8, seed=0, epochs=EPOCHS)


# --- data sets ----------------------------------------------------------------------------------------------


def test_digits_shapes_ranges_and_stratification(digits):
    assert digits.shape == (8, 8) and digits.num_classes == 10
    assert digits.train_images.shape == (1347, 8, 8) and digits.test_images.shape == (450, 8, 8)
    assert digits.train_images.dtype == np.float32 and digits.train_labels.dtype == np.int64
    for images in (digits.train_images, digits.test_images):
        assert images.min() >= 0.0 and images.max() <= 1.0 and images.max() == 1.0
    train_share = np.bincount(digits.train_labels, minlength=10) / len(digits.train_labels)
    test_share = np.bincount(digits.test_labels, minlength=10) / len(digits.test_labels)
    np.testing.assert_allclose(train_share, test_share, atol=0.01)


def test_split_is_deterministic_by_seed(digits):
    again, other = load_dataset("digits", seed=0), load_dataset("digits", seed=1)
    np.testing.assert_array_equal(again.train_images, digits.train_images)
    np.testing.assert_array_equal(again.test_labels, digits.test_labels)
    assert not np.array_equal(other.train_labels, digits.train_labels)


def test_mnist_subset_has_5000_images_of_28x28():
    data = load_dataset("mnist", seed=0)
    assert data.shape == (28, 28)
    assert len(data.train_images) + len(data.test_images) == 5000
    assert len(data.test_images) == 1250
    assert data.train_images.min() >= 0.0 and data.train_images.max() == 1.0
    assert set(np.unique(data.train_labels)) == set(range(10))


def test_unknown_dataset_is_named():
    with pytest.raises(ValueError, match=r"'cifar'.*digits, mnist"):
        load_dataset("cifar", seed=0)  # type: ignore[arg-type]


def test_subset_keeps_a_stratified_share(digits):
    part = subset(digits, 0.5, np.random.default_rng(0))
    assert abs(len(part.train_labels) - len(digits.train_labels) / 2) <= 10
    assert set(np.unique(part.train_labels)) == set(range(10))
    assert part.test_images is digits.test_images
    again = subset(digits, 0.5, np.random.default_rng(0))
    np.testing.assert_array_equal(part.train_labels, again.train_labels)
    with pytest.raises(ValueError, match="fraction"):
        subset(digits, 0.0, np.random.default_rng(0))


# --- architectures ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("family", sorted(ARCHITECTURES))
@pytest.mark.parametrize("shape", [(8, 8), (28, 28)])
def test_every_architecture_gives_logits(family, shape):
    model = build_model(family, 8, shape, 10).eval()
    with torch.no_grad():
        assert model(torch.rand(5, *shape)).shape == (5, 10)
        assert model(torch.rand(5, 1, *shape)).shape == (5, 10)


def test_at_least_three_families():
    assert {"cnn_small", "resnet_tiny", "mlp"} <= set(ARCHITECTURES)


def test_unknown_family_and_bad_width():
    with pytest.raises(ValueError, match=r"'vit'.*cnn_small"):
        build_model("vit", 8, (8, 8), 10)
    with pytest.raises(ValueError, match="width"):
        build_model("mlp", 1000, (8, 8), 10)


# --- training -----------------------------------------------------------------------------------------------


def test_clean_model_is_accurate_and_has_no_backdoor(digits, clean):
    assert clean.clean_accuracy >= 0.9
    assert clean.attack_success_rate is None
    assert not clean.model.training
    plan = PoisonPlan(apply=patch_trigger, target_class=0, fraction=0.1)
    assert evaluate_asr(clean.model, digits, plan) < 0.3
    assert evaluate_accuracy(clean.model, digits.test_images, digits.test_labels) == clean.clean_accuracy


def test_same_seed_gives_identical_weights(digits, clean):
    again = train_model(digits, "cnn_small", 8, seed=0, epochs=EPOCHS)
    for a, b in zip(clean.model.state_dict().values(), again.model.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    other = train_model(digits, "cnn_small", 8, seed=1, epochs=1)
    assert not torch.equal(next(iter(other.model.parameters())), next(iter(clean.model.parameters())))


def test_poisoned_model_learns_the_trigger(digits):
    plan = PoisonPlan(apply=patch_trigger, target_class=0, fraction=0.1)
    outcome = train_model(digits, "cnn_small", 8, seed=0, epochs=EPOCHS, poison=plan)
    assert outcome.num_poisoned == round(0.1 * np.sum(digits.train_labels != 0))
    assert outcome.attack_success_rate is not None and outcome.attack_success_rate >= 0.9
    assert outcome.clean_accuracy >= 0.85


def test_source_specific_trigger(digits):
    plan = PoisonPlan(apply=patch_trigger, target_class=0, fraction=0.5, source_class=3, cover_fraction=0.1)
    outcome = train_model(digits, "cnn_small", 8, seed=0, epochs=EPOCHS, poison=plan)
    assert outcome.num_poisoned == round(0.5 * np.sum(digits.train_labels == 3))
    assert outcome.num_cover > 0
    source = digits.test_labels == 3
    on_source = np.mean(predict(outcome.model, patch_trigger(digits.test_images[source])) == 0)
    assert outcome.attack_success_rate == pytest.approx(on_source)
    assert outcome.attack_success_rate >= 0.8
    others = (digits.test_labels != 0) & (digits.test_labels != 3)
    kept = predict(outcome.model, patch_trigger(digits.test_images[others])) == digits.test_labels[others]
    assert kept.mean() >= 0.7


def test_bad_plans_are_refused(digits):
    with pytest.raises(ValueError, match="fraction"):
        PoisonPlan(apply=patch_trigger, target_class=0, fraction=0.0)
    with pytest.raises(ValueError, match="differ"):
        PoisonPlan(apply=patch_trigger, target_class=2, fraction=0.1, source_class=2)
    with pytest.raises(ValueError, match="target_class"):
        train_model(digits, "mlp", 4, seed=0, epochs=1, poison=PoisonPlan(patch_trigger, 10, 0.1))


# --- saving -------------------------------------------------------------------------------------------------


def test_save_load_round_trip(tmp_path, digits, clean):
    path = save_model(clean.model, tmp_path / "id-00000000" / "model.pt")
    loaded = load_model(path)
    assert not loaded.training
    x = torch.from_numpy(digits.test_images[:32])
    with torch.no_grad():
        assert torch.equal(loaded(x), clean.model(x))
    assert [p.name for p in path.parent.iterdir()] == ["model.pt"]


def test_corrupted_model_file_is_named(tmp_path):
    bad = tmp_path / "model.pt"
    bad.write_bytes(b"not a torch file at all")
    with pytest.raises(ValueError, match=r"model\.pt"):
        load_model(bad)
    not_module = tmp_path / "dict.pt"
    torch.save({"a": torch.zeros(2)}, not_module)
    with pytest.raises(ValueError, match=r"dict\.pt.*not a torch\.nn\.Module"):
        load_model(not_module)
    with pytest.raises(FileNotFoundError):
        load_model(tmp_path / "missing.pt")
