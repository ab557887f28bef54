"""What is drawn for one model of a round and what every model's folder holds, image or text alike.

WHY a module of its own: ``round.py`` (the round: drawing, retries, resume, Ray) and ``textround.py`` (a
text model's data and folder) both need these; kept in ``round.py`` they made an import circle.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from assay.zoo.portable import WEIGHTS_FILE, save_model, save_weights
from assay.zoo.texttriggers import AnyTextTrigger, TextTrigger, apply_text_trigger
from assay.zoo.train import PoisonPlan, TrainOutcome
from assay.zoo.triggers import AnyTrigger, apply_trigger


def model_id(index: int) -> str:
    """The TrojAI name of model ``index``: ``id-00000000``."""
    return f"id-{index:08d}"


class ModelFactors(BaseModel):
    """Everything drawn for one model; with the round's split seed it determines the trained weights."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    model_id: str
    index: int
    dataset: str
    architecture: str
    width: int
    poisoned: bool
    trigger: AnyTrigger | AnyTextTrigger | None = None
    target_class: int | None = None
    source_class: int | None = None
    poison_fraction: float | None = None
    clean_subset: float
    training_seed: int
    split_seed: int
    epochs: int


def poison_plan(factors: ModelFactors) -> PoisonPlan | None:
    """How a model's training data is poisoned (None when clean); an image or a text trigger alike."""
    if not factors.poisoned:
        return None
    assert factors.trigger is not None and factors.target_class is not None
    assert factors.poison_fraction is not None
    apply: Any = apply_text_trigger if isinstance(factors.trigger, TextTrigger) else apply_trigger
    return PoisonPlan(
        apply=functools.partial(apply, spec=factors.trigger),
        target_class=factors.target_class,
        fraction=factors.poison_fraction,
        source_class=factors.source_class,
    )


def write_model_files(
    folder: Path, factors: ModelFactors, outcome: TrainOutcome, attempts: int, reduced: dict[str, object]
) -> None:
    """Create ``folder`` with what every model has, image or text: ``model.pt``, its weights,
    ``config.json`` (factors and outcome), ``reduced-config.json`` and ``ground_truth.csv``."""
    folder.mkdir()
    save_model(outcome.model, folder / "model.pt")
    save_weights(outcome.model, folder / WEIGHTS_FILE)
    config = {
        **factors.model_dump(mode="json"),
        "num_poisoned": outcome.num_poisoned,
        "num_cover": outcome.num_cover,
        "attempts": attempts,
        "clean_accuracy": outcome.clean_accuracy,
        "attack_success_rate": outcome.attack_success_rate,
    }
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    (folder / "reduced-config.json").write_text(json.dumps(reduced, indent=2) + "\n", encoding="utf-8")
    (folder / "ground_truth.csv").write_text(f"{int(factors.poisoned)}\n", encoding="utf-8")
