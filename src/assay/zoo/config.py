"""How a round of zoo models is drawn: a ``RoundConfig``, read from YAML with ``load_round_config``.

Every field is bounded, and impossible combinations (a range whose min exceeds its max, an unknown data set,
architecture or trigger kind, an empty list) are rejected with one line naming the file, field and value.
The defaults are the settings measured to work on digits: cnn_small of width 16 trained for 20 epochs with a
poison fraction of 0.2-0.3 reaches clean accuracy >= 0.85 and attack success >= 0.8 for every trigger kind.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from assay.errors import validation_error
from assay.yamlfile import load_yaml_model
from assay.zoo.architectures import ARCHITECTURES, WIDTH_RANGE
from assay.zoo.datasets import DATASETS
from assay.zoo.textarch import TEXT_ARCHITECTURES
from assay.zoo.textdata import TEXT_DATASETS
from assay.zoo.texttriggers import TEXT_KINDS
from assay.zoo.triggers import KINDS

MAX_MODELS = 100_000
Share = Annotated[float, Field(ge=0.0, le=1.0)]


class Range(BaseModel):
    """A closed interval ``[min, max]`` inside (0, 1]; YAML may give it as ``[min, max]`` or a mapping."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    min: float = Field(gt=0.0, le=1.0)
    max: float = Field(gt=0.0, le=1.0)

    @model_validator(mode="before")
    @classmethod
    def _from_pair(cls, value: Any) -> Any:
        if isinstance(value, list | tuple):
            if len(value) != 2:
                raise ValueError("must be a pair [min, max]")
            return {"min": value[0], "max": value[1]}
        return value

    @model_validator(mode="after")
    def _ordered(self) -> Range:
        if self.min > self.max:
            raise ValueError(f"min {self.min} is greater than max {self.max}")
        return self


_NAMED: dict[str, tuple[tuple[str, ...] | list[str], str]] = {
    "datasets": ((*DATASETS, *TEXT_DATASETS), "data set"),
    "architectures": ([*ARCHITECTURES, *TEXT_ARCHITECTURES], "architecture"),
    "trigger_kinds": ((*KINDS, *TEXT_KINDS), "trigger kind"),
}
Domain = Literal["image", "text"]
# What each domain may use, and the defaults a text round takes for what its config leaves out. Why other
# floors for text: four subject groups of MMLU questions read by models that see 48 words reach a clean
# accuracy near 0.65-0.7 (measured), where digits reach 0.95.
DOMAIN_NAMES: dict[str, dict[str, tuple[str, ...]]] = {
    "image": {"datasets": DATASETS, "architectures": tuple(ARCHITECTURES), "trigger_kinds": KINDS},
    "text": {
        "datasets": TEXT_DATASETS,
        "architectures": tuple(TEXT_ARCHITECTURES),
        "trigger_kinds": TEXT_KINDS,
    },
}
TEXT_DEFAULTS: dict[str, object] = {
    "datasets": list(TEXT_DATASETS),
    "architectures": list(TEXT_ARCHITECTURES),
    "trigger_kinds": list(TEXT_KINDS),
    "epochs": 6,
    "clean_accuracy_floor": 0.55,
    "poison_fraction": [0.15, 0.3],
}


def domain_of(dataset: str) -> str:
    """``text`` for a text data set, else ``image``: the data set decides a round's domain."""
    return "text" if dataset in TEXT_DATASETS else "image"


def _known(values: list[str], known: tuple[str, ...] | list[str], what: str) -> list[str]:
    unknown = [v for v in values if v not in known]
    if unknown:
        raise ValueError(f"unknown {what} {unknown[0]!r}; known: {', '.join(known)}")
    if len(set(values)) != len(values):
        raise ValueError(f"lists a {what} twice")
    return values


class RoundConfig(BaseModel):
    """The factors of a round and the quality floors every model must reach."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    domain: Domain = Field("image", description="image or text; set from the data sets when left out.")
    models: int = Field(10, ge=1, le=MAX_MODELS, description="Number of models in the round.")
    seed: int = Field(0, ge=0, le=2**32 - 1, description="Seed of every random draw of the round.")
    datasets: list[str] = Field(default_factory=lambda: ["digits"], min_length=1)
    architectures: list[str] = Field(default_factory=lambda: list(ARCHITECTURES), min_length=1)
    widths: list[Annotated[int, Field(ge=WIDTH_RANGE[0], le=WIDTH_RANGE[1])]] = Field(
        default_factory=lambda: [16], min_length=1
    )
    poisoned_share: Share = 0.5
    trigger_kinds: list[str] = Field(default_factory=lambda: list(KINDS), min_length=1)
    source_specific_share: Share = 0.2
    poison_fraction: Range = Range(min=0.2, max=0.3)
    epochs: int = Field(20, ge=1, le=1000)
    clean_subset: Range = Range(min=0.8, max=1.0)
    clean_accuracy_floor: Share = 0.85
    asr_floor: Share = 0.8
    max_attempts: int = Field(4, ge=1, le=100)

    @field_validator("datasets", "architectures", "trigger_kinds")
    @classmethod
    def _names(cls, value: list[str], info: ValidationInfo) -> list[str]:
        known, what = _NAMED[info.field_name]
        return _known(value, known, what)

    @model_validator(mode="before")
    @classmethod
    def _text_defaults(cls, value: Any) -> Any:
        """A text round (``domain: text``, or only text data sets) takes the text defaults it leaves out."""
        if not isinstance(value, dict):
            return value
        datasets = value.get("datasets")
        texty = isinstance(datasets, list) and bool(datasets) and all(d in TEXT_DATASETS for d in datasets)
        if value.get("domain") == "text" or (texty and "domain" not in value):
            return {**TEXT_DEFAULTS, **value, "domain": "text"}
        return value

    @model_validator(mode="after")
    def _one_domain(self) -> RoundConfig:
        """Why: an image trigger cannot go into a text, nor a GRU read a picture; one line says which."""
        allowed = DOMAIN_NAMES[self.domain]
        for field in ("datasets", "architectures", "trigger_kinds"):
            stray = [name for name in getattr(self, field) if name not in allowed[field]]
            if stray:
                raise ValueError(
                    f"{field} lists {stray[0]!r}, which is not for {self.domain} rounds; "
                    f"{self.domain} {field}: {', '.join(allowed[field])}"
                )
        return self

    @field_validator("widths")
    @classmethod
    def _widths(cls, value: list[int]) -> list[int]:
        if len(set(value)) != len(value):
            raise ValueError("lists a width twice")
        return value


def with_overrides(config: RoundConfig, **overrides: object) -> RoundConfig:
    """``config`` with the given fields replaced (None means keep), validated like a file would be."""
    given = {name: value for name, value in overrides.items() if value is not None}
    if not given:
        return config
    try:
        return RoundConfig.model_validate({**config.model_dump(), **given})
    except ValidationError as exc:
        raise validation_error(exc, "options") from None


def load_round_config(path: str | Path) -> RoundConfig:
    """Read and validate a round config from YAML; any problem is a one-line ``UserError`` naming the file."""
    return load_yaml_model(path, RoundConfig, "round config")
