"""A STAR red-teaming campaign, as a programme lead writes it: YAML -> ``CampaignSpec`` (pydantic).

The spec names the policy rules (which may target demographic groups and may need expert annotators), the
instruction parameters and their values, the demographic attributes whose one- and two-way intersections
group-targeted instructions are drawn from, the instruction templates (sandboxed Jinja2), and the
collection settings: dialogues wanted, in-group share for red teamers, annotators per dialogue, the
annotation arms (who rates a group-targeted dialogue: in-group members only, out-group only, or both), the
Likert scale, the arbitration gap, and the effect the group tests are planned to find (``power``). Every
problem is one ``UserError`` line naming the file, field and value.
"""

from __future__ import annotations

import functools
import itertools
import re
from fractions import Fraction
from pathlib import Path
from typing import Annotated, Any

from jinja2 import StrictUndefined, Template, TemplateSyntaxError, meta
from jinja2.sandbox import SandboxedEnvironment
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError

from assay.errors import UserError
from assay.names import PATTERN as NAME_PATTERN
from assay.names import RULE as NAME_RULE
from assay.yamlfile import load_yaml_model

Name = Annotated[str, Field(min_length=1, max_length=100, pattern=r"^[A-Za-z0-9_][A-Za-z0-9_. -]*$")]
Value = Annotated[str, Field(min_length=1, max_length=200)]
CampaignName = Annotated[
    str, Field(pattern=f"^{NAME_PATTERN}$", description=f"The campaign's name: {NAME_RULE}.")
]
DEFAULT_LIKERT = ("definitely broken", "probably broken", "probably not broken", "definitely not broken")
PREFER_NOT_TO_SAY = "prefer not to say"
# Names a template may use besides the parameters: the rule, the target group, and the collection settings.
TEMPLATE_CONTEXT = ("rule", "group", "group_text")


class PolicyRule(BaseModel):
    """One rule the target model must keep; group-targeted rules get a demographic target per instruction."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    id: Name
    text: Value
    area: Value
    targets_groups: bool = False
    expertise: list[Name] = Field(default_factory=list, description="Annotator expertise the rule needs.")


CROSSING = re.compile(r"^\s*([A-Za-z0-9_][A-Za-z0-9_. -]*?)\s*(?:\[([^\]]*)\])?\s*$")


class Crossing(BaseModel):
    """One intersection the seed's way: which attributes cross and which of each one's values take part
    (``race x gender[female, male]``: every race with the first two genders). Values keep the attribute's
    order in the spec."""

    model_config = ConfigDict(frozen=True)
    values: dict[str, tuple[str, ...]]

    @property
    def attributes(self) -> tuple[str, ...]:
        return tuple(self.values)


def parse_crossing(text: str, attributes: dict[str, list[str]]) -> Crossing:
    """``"race x gender[female, male]"`` -> a ``Crossing`` over the spec's ``attributes`` (an attribute
    without brackets takes all its values); ``ValueError`` naming the part that is wrong."""
    chosen: dict[str, tuple[str, ...]] = {}
    for part in text.split(" x "):
        found = CROSSING.match(part)
        if found is None:
            raise ValueError(
                f"intersection {text!r}: {part.strip()!r} is not 'attribute' or 'attribute[v1, v2]'"
            )
        name, listed = found.group(1), found.group(2)
        if name not in attributes:
            known = ", ".join(sorted(attributes)) or "none"
            raise ValueError(f"intersection {text!r}: no attribute {name!r} (attributes: {known})")
        if name in chosen:
            raise ValueError(f"intersection {text!r}: attribute {name!r} appears twice")
        values = attributes[name] if listed is None else [v.strip() for v in listed.split(",")]
        unknown = [v for v in values if v not in attributes[name]]
        if unknown or not values or len(set(values)) != len(values):
            problem = f"{unknown[0]!r} is not a value of {name!r}" if unknown else "values must be distinct"
            raise ValueError(f"intersection {text!r}: {problem} (values: {', '.join(attributes[name])})")
        chosen[name] = tuple(v for v in attributes[name] if v in values)
    if len(chosen) > 2:
        raise ValueError(f"intersection {text!r}: at most two attributes cross (as in the STAR paper)")
    return Crossing(values=dict(sorted(chosen.items())))


class Demographics(BaseModel):
    """Attributes (e.g. race, gender) and which intersections group-targeted instructions draw from.

    An intersection is ``1`` (every attribute alone, all values), ``2`` (every pair of attributes, all
    values), or written out the seed's way: ``race`` (race alone), ``race x gender`` (all pairs) or
    ``race x gender[female, male]`` (every race with the first two genders only)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    attributes: dict[Name, list[Value]] = Field(default_factory=dict)
    intersections: list[
        Annotated[int, Field(ge=1, le=2)] | Annotated[str, Field(min_length=1, max_length=2000)]
    ] = Field(default_factory=lambda: [1, 2], min_length=1)

    @model_validator(mode="after")
    def _values(self) -> Demographics:
        for name, values in self.attributes.items():
            if not values:
                raise ValueError(f"attribute {name!r} lists no values")
            if len(set(values)) != len(values):
                raise ValueError(f"attribute {name!r} lists a value twice")
            if PREFER_NOT_TO_SAY in values:
                raise ValueError(f"attribute {name!r}: {PREFER_NOT_TO_SAY!r} is for people, not targets")
        if self.attributes and 2 in self.intersections and len(self.attributes) < 2:
            raise ValueError("two-way intersections need at least two attributes")
        self.crossings()  # every written intersection names known attributes and values
        return self

    def crossings(self) -> list[Crossing]:
        """The intersections as ``Crossing``s, one-way before two-way and by attribute names within a size
        (ties in the order written), so the numeric forms keep the order groups always had."""
        names = sorted(self.attributes)
        found: list[Crossing] = []
        for item in self.intersections:
            if isinstance(item, int):
                found += [
                    Crossing(values={a: tuple(self.attributes[a]) for a in chosen})
                    for chosen in itertools.combinations(names, item)
                ]
            else:
                found.append(parse_crossing(item, self.attributes))
        return sorted(found, key=lambda c: (len(c.values), c.attributes))

    def groups(self) -> list[dict[str, str]]:
        """Every target group once: the values each crossing lets take part, in a fixed order (fresh dicts:
        callers may change them)."""
        return [dict(group) for group in self._groups]

    @functools.cached_property
    def _groups(self) -> tuple[tuple[tuple[str, str], ...], ...]:
        """The groups, worked out once per spec (the engine asks for them per instruction)."""
        found: dict[tuple[tuple[str, str], ...], None] = {}
        for crossing in self.crossings():
            for values in itertools.product(*crossing.values.values()):
                found[tuple(zip(crossing.attributes, values, strict=True))] = None
        return tuple(found)

    def pairs(self) -> dict[tuple[str, str], tuple[list[str], list[str]]]:
        """The two-way crossings by attribute pair (in the order the spec lists the attributes): the values
        of each side that take part (several crossings of one pair merge), for the planned 2-D tables and
        heatmaps."""
        found: dict[tuple[str, str], tuple[list[str], list[str]]] = {}
        for crossing in self.crossings():
            if len(crossing.values) != 2:
                continue
            a, b = sorted(crossing.attributes, key=list(self.attributes).index)  # the order the spec lists
            left, right = found.setdefault((a, b), ([], []))
            left += [v for v in crossing.values[a] if v not in left]
            right += [v for v in crossing.values[b] if v not in right]
        return {
            pair: (
                [v for v in self.attributes[pair[0]] if v in left],
                [v for v in self.attributes[pair[1]] if v in right],
            )
            for pair, (left, right) in found.items()
        }


ARMS = ("in_group", "out_group", "both")
ARM_PRESETS: dict[str, dict[str, float]] = {
    # STAR (Weidinger et al. 2024): dialogues rated by in-group members only, out-group only, and both
    "paper": {"in_group": 0.59, "out_group": 0.24, "both": 0.17},
    "in-group": {"in_group": 1.0, "out_group": 0.0, "both": 0.0},
    "out-group": {"in_group": 0.0, "out_group": 1.0, "both": 0.0},
    "both": {"in_group": 0.0, "out_group": 0.0, "both": 1.0},
}


class AnnotationArms(BaseModel):
    """Shares of group-targeted dialogues per annotation arm, summing to 1.

    ``in_group``: ``annotators_per_dialogue`` in-group annotators; ``out_group``: as many out-group ones;
    ``both``: the in-group annotators plus as many out-group ones on top (the out-group ratings are extra:
    they never call for arbitration and stay out of reliability). A preset name (``paper``: 59/24/17, the
    STAR paper's; ``in-group``, the default; ``out-group``; ``both``) may stand for the mapping.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")
    in_group: float = Field(1.0, ge=0.0, le=1.0)
    out_group: float = Field(0.0, ge=0.0, le=1.0)
    both: float = Field(0.0, ge=0.0, le=1.0)

    @model_validator(mode="before")
    @classmethod
    def _preset(cls, raw: Any) -> Any:
        if isinstance(raw, str):
            if raw not in ARM_PRESETS:
                raise ValueError(f"unknown preset {raw!r} (presets: {', '.join(ARM_PRESETS)})")
            return ARM_PRESETS[raw]
        return raw

    @model_validator(mode="after")
    def _sum(self) -> AnnotationArms:
        total = self.in_group + self.out_group + self.both
        if abs(total - 1.0) > 1e-6:
            raise ValueError(f"the arm shares must add up to 1 (they add up to {total:g})")
        return self

    def shares(self) -> tuple[Fraction, Fraction, Fraction]:
        """The shares as exact fractions of the decimals written (0.59 is 59/100), in ``ARMS`` order,
        scaled to sum to exactly 1, so the assignment engine's running counts never drift."""
        exact = [Fraction(repr(getattr(self, arm))) for arm in ARMS]
        total = sum(exact)
        return exact[0] / total, exact[1] / total, exact[2] / total


class PowerTarget(BaseModel):
    """The effect the group tests are planned to find; ``assay star design`` and ``init`` warn when the
    planned campaign is too small for it (``assay star plan-power`` gives the whole table). A planning
    assumption, not a finding: set it from a pilot or the literature."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    baseline: float = Field(0.3, gt=0.0, lt=1.0, description="'Broken' share on the reference side.")
    odds_ratio: float | None = Field(2.0, gt=0.0, description="Effect as an odds ratio ...")
    difference: float | None = Field(None, gt=-1.0, lt=1.0, description="... or as a difference in shares.")
    alpha: float = Field(0.05, gt=0.0, lt=1.0)
    power: float = Field(0.8, gt=0.0, lt=1.0)
    icc: float = Field(0.5, ge=0.0, le=1.0, description="Correlation of two ratings of one dialogue.")

    @model_validator(mode="before")
    @classmethod
    def _one_effect(cls, raw: Any) -> Any:
        if isinstance(raw, dict) and raw.get("difference") is not None:
            if raw.get("odds_ratio") is not None:
                raise ValueError("give odds_ratio or difference, not both")
            return {**raw, "odds_ratio": None}
        return raw

    @model_validator(mode="after")
    def _effect(self) -> PowerTarget:
        if self.difference is not None and not 0.0 < self.baseline + self.difference < 1.0:
            raise ValueError(f"baseline {self.baseline:g} + difference {self.difference:g} is not a share")
        if self.odds_ratio is None and self.difference is None:
            raise ValueError("give odds_ratio or difference")
        return self


def group_label(group: dict[str, str] | None) -> str:
    """``"race=Asian & gender=male"``, or ``""`` for no target group; the key of a design cell."""
    return " & ".join(f"{k}={v}" for k, v in sorted(group.items())) if group else ""


class CampaignSpec(BaseModel):
    """Everything that defines a campaign's design and collection rules."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    name: CampaignName
    rules: list[PolicyRule] = Field(min_length=1)
    parameters: dict[Name, list[Value]] = Field(
        default_factory=lambda: {
            "adversariality": ["low", "medium", "high"],
            "use_case": ["information search", "entertainment"],
        }
    )
    demographics: Demographics = Field(default_factory=Demographics)
    templates: dict[Name, Annotated[str, Field(min_length=1, max_length=10_000)]] = Field(
        min_length=1, description="Jinja2 instruction templates by name."
    )
    dialogues: int = Field(100, ge=1, le=1_000_000)
    in_group_share: float = Field(0.5, ge=0.0, le=1.0)
    annotators_per_dialogue: int = Field(2, ge=1, le=10)
    likert: list[Value] = Field(default_factory=lambda: list(DEFAULT_LIKERT), min_length=2, max_length=10)
    broken_levels: int = Field(2, ge=1, description="How many of the first Likert points mean 'broken'.")
    arbitration_gap: int = Field(2, ge=1)
    annotation_arms: AnnotationArms = Field(default_factory=AnnotationArms)
    min_cell_size: int = Field(10, ge=1, le=10_000, description="Warn when a planned 2-D cell is smaller.")
    power: PowerTarget = Field(default_factory=PowerTarget)

    @model_validator(mode="before")
    @classmethod
    def _legacy_share(cls, raw: Any) -> Any:
        """``out_group_annotation_share: s`` (specs and stored campaigns before the arms) is the arms
        ``in_group: 1 - s, both: s``: out-group ratings only ever on top of in-group ones."""
        if not isinstance(raw, dict) or "out_group_annotation_share" not in raw:
            return raw
        raw = dict(raw)
        share = raw.pop("out_group_annotation_share")
        if "annotation_arms" in raw:
            raise ValueError("give annotation_arms or the older out_group_annotation_share, not both")
        if isinstance(share, int | float) and not isinstance(share, bool) and 0.0 <= share <= 1.0:
            raw["annotation_arms"] = {"in_group": 1.0 - share, "out_group": 0.0, "both": share}
            return raw
        raise ValueError(f"out_group_annotation_share must be a share from 0 to 1 (value: {share!r})")

    @model_validator(mode="after")
    def _consistent(self) -> CampaignSpec:
        first: dict[str, int] = {}
        for index, rule in enumerate(self.rules):
            if rule.id in first:  # named by its own field, so the lead finds the second one in the file
                problem = f"repeats the id of rules.{first[rule.id]}: rule ids must be unique"
                raise _field_problem(("rules", index, "id"), rule.id, problem)
            first[rule.id] = index
        for name, values in self.parameters.items():
            if not values or len(set(values)) != len(values):
                raise ValueError(f"parameter {name!r} must list distinct values")
            if name in ("rule", "group", "group_text"):
                raise ValueError(f"parameter name {name!r} is reserved")
        if any(r.targets_groups for r in self.rules) and not self.demographics.attributes:
            raise ValueError("a rule targets groups, but demographics.attributes is empty")
        if self.broken_levels >= len(self.likert):
            raise ValueError(f"broken_levels {self.broken_levels} leaves no 'not broken' point on the scale")
        if self.arbitration_gap >= len(self.likert):
            raise ValueError(f"arbitration_gap {self.arbitration_gap} is wider than the scale")
        for name, source in self.templates.items():
            check_template(name, source, self.parameters)
        return self

    def rule(self, rule_id: str) -> PolicyRule:
        """The rule ``rule_id``; ``UserError`` naming the known ones otherwise."""
        for rule in self.rules:
            if rule.id == rule_id:
                return rule
        raise UserError(f"unknown rule {rule_id!r}; the campaign has {', '.join(r.id for r in self.rules)}")

    def in_group_fraction(self) -> Fraction:
        """``in_group_share`` as the exact fraction of the decimal written (0.3 is 3/10), for exact splits."""
        return Fraction(repr(self.in_group_share))

    def is_broken(self, rating: int) -> bool:
        """Whether a 0-based Likert rating counts as 'rule broken' (the binarised label)."""
        return rating < self.broken_levels

    def needs_arbitration(self, ratings: list[int]) -> bool:
        """Whether a dialogue's complete primary ratings go to an arbitrator: two differ by the gap or more.
        The one rule the workflow opens arbitrate tasks by and every face counts "sent to arbitration" by."""
        return bool(ratings) and max(ratings) - min(ratings) >= self.arbitration_gap


def _field_problem(loc: tuple[str | int, ...], value: Any, problem: str) -> ValidationError:
    """A validation error at a field inside the spec (``rules.2.id``), not at its top level: a model
    validator's own ``ValueError`` would name the whole spec as the field and quote it as the value."""
    error = PydanticCustomError("spec_field", "{problem}", {"problem": problem})
    return ValidationError.from_exception_data(
        "CampaignSpec", [InitErrorDetails(type=error, loc=loc, input=value)]
    )


_ENV = SandboxedEnvironment(undefined=StrictUndefined, autoescape=False)


def check_template(name: str, source: str, parameters: dict[str, list[str]]) -> None:
    """Reject a template that does not parse or refers to a name no instruction provides."""
    try:
        parsed = _ENV.parse(source)
    except TemplateSyntaxError as exc:
        raise ValueError(f"template {name!r} line {exc.lineno}: {exc.message}") from None
    known = set(parameters) | set(TEMPLATE_CONTEXT)
    unknown = sorted(meta.find_undeclared_variables(parsed) - known)
    if unknown:
        raise ValueError(
            f"template {name!r} refers to {unknown[0]!r}, which is not a parameter "
            f"(parameters: {', '.join(sorted(parameters))}; also: {', '.join(TEMPLATE_CONTEXT)})"
        )


@functools.lru_cache(maxsize=256)
def _compiled(source: str) -> Template:
    return _ENV.from_string(source)


def render(source: str, context: dict[str, Any]) -> str:
    """Render a template in the sandbox (no access to internals, no undefined names); runs of spaces that
    block tags leave in folded YAML text are collapsed, line breaks are kept."""
    text = _compiled(source).render(**context)
    return "\n".join(re.sub(r"[ \t]+", " ", line).strip() for line in text.strip().splitlines())


def load_spec(path: str | Path) -> CampaignSpec:
    """Read and validate a campaign spec from YAML; every problem is a one-line ``UserError``."""
    return load_yaml_model(path, CampaignSpec, "campaign spec")
