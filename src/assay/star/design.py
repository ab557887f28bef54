"""The design step of a STAR campaign: a randomised, balanced factorial design of red-teaming instructions.

STAR steers red teamers with parametric instructions so that the risk surface is covered evenly: every
rule, parameter value, template and (for group-targeted rules) target group gets an even share of the
dialogues, within one. Each factor is a list that cycles through its values in a seeded random order,
shuffled independently of the other factors, so margins are exact while the factors are crossed at random.
Parameters, templates and groups cycle across rules in consecutive chunks, so they are balanced within each
rule as well as overall. Everything is reproducible from the seed.

>>> spec = load_spec("examples/star-campaign.yaml")
>>> instructions = draw_design(spec, count=120, seed=1)
>>> design_table(spec, instructions).warnings          # planned 2-D cells below spec.min_cell_size
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from jinja2.exceptions import SecurityError, UndefinedError
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from assay.errors import UserError, first_problem, input_error
from assay.fileio import write_text_atomic
from assay.star.spec import CampaignSpec, PolicyRule, group_label, render

MAX_WARNINGS = 10  # warning lines shown before the rest are summarised in one line


class Instruction(BaseModel):
    """One red-teaming instruction: the design cell it belongs to, and the text a red teamer reads."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    number: int = Field(ge=1, description="1-based position in the design.")
    id: str = Field(pattern=r"^ins-\d{5,}$")
    rule_id: str
    rule_area: str
    group: dict[str, str] | None = Field(None, description="Target group; only for group-targeted rules.")
    group_label: str = ""
    parameters: dict[str, str] = Field(default_factory=dict)
    template: str
    text: str


class DesignTable(BaseModel):
    """How many dialogues each cell of the design (and of the planned 2-D analyses) will get."""

    model_config = ConfigDict(frozen=True)
    count: int
    min_cell_size: int
    rules: dict[str, int] = Field(description="rule id -> dialogues")
    parameters: dict[str, dict[str, int]] = Field(description="parameter -> value -> dialogues")
    templates: dict[str, int] = Field(description="template name -> dialogues")
    rule_groups: dict[str, dict[str, int]] = Field(description="group-targeted rule -> group label -> n")
    rule_parameters: dict[str, dict[str, dict[str, int]]] = Field(
        description="rule -> parameter -> value -> dialogues (planned 2-D analysis)"
    )
    attribute_pairs: dict[str, dict[str, dict[str, int]]] = Field(
        description="group-targeted rule -> 'race x gender' -> 'race=Asian x gender=male' -> dialogues "
        "(planned 2-D analysis; counts instructions whose group sets both attributes)"
    )
    warnings: list[str] = Field(default_factory=list)


# --- drawing -------------------------------------------------------------------------------------------


def _cycled(n_values: int, length: int, rng: np.random.Generator) -> np.ndarray:
    """Indices cycling through ``n_values`` in one seeded random order; any run of it is balanced."""
    order = rng.permutation(n_values)
    return np.resize(order, length) if length else np.zeros(0, dtype=int)


def _balanced(n_values: int, length: int, rng: np.random.Generator) -> np.ndarray:
    """A shuffled list of value indices in which every value appears within one of ``length / n_values``."""
    return rng.permutation(_cycled(n_values, length, rng))


def _chunked(n_values: int, slots: Sequence[np.ndarray], rng: np.random.Generator) -> dict[int, np.ndarray]:
    """Value indices for several groups of slots (one per rule), balanced within each group and overall.

    One cycle runs through all the groups' slots; each group takes the next consecutive chunk of it (so
    that chunk is balanced within one) and shuffles it. Overall the cycle is balanced within one too.
    """
    total = sum(len(s) for s in slots)
    cycle = _cycled(n_values, total, rng)
    out: dict[int, np.ndarray] = {}
    start = 0
    for index, positions in enumerate(slots):
        chunk = cycle[start : start + len(positions)]
        out[index] = rng.permutation(chunk)
        start += len(positions)
    return out


def _assign(n_values: int, count: int, slots: Sequence[np.ndarray], rng: np.random.Generator) -> np.ndarray:
    """A value index for every instruction: ``slots[i]`` holds the positions of the instructions of rule i."""
    values = np.zeros(count, dtype=int)
    for index, chunk in _chunked(n_values, slots, rng).items():
        values[slots[index]] = chunk
    return values


def group_text(group: dict[str, str] | None, attribute_order: Sequence[str] = ()) -> str:
    """The target group in plain words for a template: ``"people who are Asian and female"``, or ``""``.

    Values follow ``attribute_order`` (the spec's order, as a programme lead wrote it), then the rest.
    """
    if not group:
        return ""
    rank = {name: i for i, name in enumerate(attribute_order)}
    names = sorted(group, key=lambda name: (rank.get(name, len(rank)), name))
    values = [group[name] for name in names]
    words = values[0] if len(values) == 1 else ", ".join(values[:-1]) + " and " + values[-1]
    return f"people who are {words}"


class _Renderer:
    """Renders instruction texts, caching by design cell so a large design compiles each cell only once."""

    def __init__(self, spec: CampaignSpec) -> None:
        self.spec = spec
        self.attribute_order = list(spec.demographics.attributes)
        self.cache: dict[tuple[str, str, str, tuple[str, ...]], str] = {}

    def __call__(
        self, template: str, rule: PolicyRule, group: dict[str, str] | None, parameters: dict[str, str]
    ) -> str:
        key = (template, rule.id, group_label(group), tuple(parameters.values()))
        if key not in self.cache:
            context: dict[str, Any] = {
                **parameters,
                "rule": rule,
                "group": dict(group or {}),
                "group_text": group_text(group, self.attribute_order),
            }
            try:
                self.cache[key] = render(self.spec.templates[template], context)
            except (UndefinedError, SecurityError) as exc:
                raise UserError(
                    f"template {template!r} cannot be rendered for rule {rule.id!r}: {exc}"
                ) from exc
        return self.cache[key]


def draw_design(spec: CampaignSpec, count: int, seed: int) -> list[Instruction]:
    """``count`` instructions in a randomised, balanced factorial design, reproducible from ``seed``.

    Rules, each parameter's values and the templates get even shares overall (within one); parameters and
    templates also within each rule; each group-targeted rule spreads its share evenly over
    ``spec.demographics.groups()``. Each factor draws from its own child of ``np.random.SeedSequence(seed)``.
    """
    if count < 1:
        raise UserError(f"count must be at least 1 (value: {count})")
    if seed < 0:
        raise UserError(f"seed must be zero or positive (value: {seed})")
    rules, templates = spec.rules, sorted(spec.templates)
    names = list(spec.parameters)
    streams = [np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(3 + len(names))]
    rule_of = _balanced(len(rules), count, streams[0])
    slots = [np.flatnonzero(rule_of == i) for i in range(len(rules))]
    template_of = _assign(len(templates), count, slots, streams[1])
    groups = spec.demographics.groups()
    targeted = [i for i, rule in enumerate(rules) if rule.targets_groups]
    group_of = np.full(count, -1, dtype=int)
    if targeted and groups:
        for index, chunk in _chunked(len(groups), [slots[i] for i in targeted], streams[2]).items():
            group_of[slots[targeted[index]]] = chunk
    value_of = {
        name: _assign(len(spec.parameters[name]), count, slots, streams[3 + k])
        for k, name in enumerate(names)
    }
    renderer = _Renderer(spec)
    instructions = []
    for position in range(count):
        rule = rules[rule_of[position]]
        group = groups[group_of[position]] if group_of[position] >= 0 else None
        parameters = {name: spec.parameters[name][value_of[name][position]] for name in names}
        template = templates[template_of[position]]
        instructions.append(
            Instruction(
                number=position + 1,
                id=f"ins-{position + 1:05d}",
                rule_id=rule.id,
                rule_area=rule.area,
                group=dict(group) if group is not None else None,
                group_label=group_label(group),
                parameters=parameters,
                template=template,
                text=renderer(template, rule, group, parameters),
            )
        )
    return instructions


# --- counting ------------------------------------------------------------------------------------------


def _dialogues(n: int) -> str:
    return f"{n} dialogue" if n == 1 else f"{n} dialogues"


def _pair_counts(
    spec: CampaignSpec, instructions: Sequence[Instruction], rule_id: str
) -> dict[str, dict[str, int]]:
    """For one rule: ``'race x gender' -> 'race=Asian x gender=male' -> n``, one entry per two-way target
    group the spec draws (zeros too; ``race x gender[female, male]`` lists no non-binary cell)."""
    found: dict[str, dict[str, int]] = {}
    for a, b in spec.demographics.pairs():
        cells = {
            f"{a}={g[a]} x {b}={g[b]}": 0
            for g in spec.demographics.groups()
            if len(g) == 2 and a in g and b in g
        }
        for ins in instructions:
            if ins.rule_id == rule_id and ins.group and a in ins.group and b in ins.group:
                cells[f"{a}={ins.group[a]} x {b}={ins.group[b]}"] += 1
        found[f"{a} x {b}"] = cells
    return found


def _warnings(
    min_size: int,
    rule_parameters: dict[str, dict[str, dict[str, int]]],
    attribute_pairs: dict[str, dict[str, dict[str, int]]],
) -> list[str]:
    """One line per planned 2-D cell below ``min_size``; past ``MAX_WARNINGS`` the rest become one line."""
    cells = [
        (rule_id, f"{name}={value}", n)
        for rule_id, by_parameter in rule_parameters.items()
        for name, counts in by_parameter.items()
        for value, n in counts.items()
    ]
    cells += [
        (rule_id, cell, n)
        for rule_id, by_pair in attribute_pairs.items()
        for counts in by_pair.values()
        for cell, n in counts.items()
    ]
    small = [
        f"rule {rule_id}: {cell} gets {_dialogues(n)}, fewer than min_cell_size {min_size}"
        for rule_id, cell, n in cells
        if n < min_size
    ]
    if len(small) <= MAX_WARNINGS:
        return small
    rest = len(small) - MAX_WARNINGS
    return [*small[:MAX_WARNINGS], f"... and {rest} more planned cells below min_cell_size {min_size}"]


def design_table(spec: CampaignSpec, instructions: Sequence[Instruction]) -> DesignTable:
    """Count the design's cells, and warn about planned 2-D cells too small to analyse."""
    rules = Counter(ins.rule_id for ins in instructions)
    parameters = {
        name: {v: sum(ins.parameters.get(name) == v for ins in instructions) for v in values}
        for name, values in spec.parameters.items()
    }
    templates = Counter(ins.template for ins in instructions)
    labels = [group_label(g) for g in spec.demographics.groups()]
    rule_groups: dict[str, dict[str, int]] = {}
    rule_parameters: dict[str, dict[str, dict[str, int]]] = {}
    attribute_pairs: dict[str, dict[str, dict[str, int]]] = {}
    for rule in spec.rules:
        mine = [ins for ins in instructions if ins.rule_id == rule.id]
        rule_parameters[rule.id] = {
            name: {v: sum(ins.parameters.get(name) == v for ins in mine) for v in values}
            for name, values in spec.parameters.items()
        }
        if rule.targets_groups:
            seen = Counter(ins.group_label for ins in mine)
            rule_groups[rule.id] = {label: seen[label] for label in labels}
            attribute_pairs[rule.id] = _pair_counts(spec, mine, rule.id)
    return DesignTable(
        count=len(instructions),
        min_cell_size=spec.min_cell_size,
        rules={rule.id: rules[rule.id] for rule in spec.rules},
        parameters=parameters,
        templates={name: templates[name] for name in sorted(spec.templates)},
        rule_groups=rule_groups,
        rule_parameters=rule_parameters,
        attribute_pairs=attribute_pairs,
        warnings=_warnings(spec.min_cell_size, rule_parameters, attribute_pairs),
    )


# --- files ---------------------------------------------------------------------------------------------


def write_instructions(path: str | Path, instructions: Sequence[Instruction]) -> None:
    """Write the instructions as JSONL, atomically: a reader never sees half a design."""
    write_text_atomic(path, "".join(ins.model_dump_json() + "\n" for ins in instructions))


def read_instructions(path: str | Path) -> list[Instruction]:
    """Read instructions written by ``write_instructions``; every problem is one line naming file:line."""
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise UserError(f"{path}: cannot read the instructions ({exc.strerror or exc})") from exc
    except UnicodeDecodeError as exc:
        raise UserError(f"{path}: not UTF-8 text ({exc.reason})") from exc
    return [_parse_line(path, number, line) for number, line in enumerate(lines, 1) if line.strip()]


def _parse_line(path: Path, number: int, line: str) -> Instruction:
    """One JSONL line as an ``Instruction``, or a ``UserError`` naming the line, field and value."""
    try:
        raw = json.loads(line)
    except json.JSONDecodeError as exc:
        raise UserError(f"{path}:{number}: not valid JSON ({exc.msg} at column {exc.colno})") from exc
    if not isinstance(raw, dict):
        raise UserError(f"{path}:{number}: an instruction must be a JSON object, not {type(raw).__name__}")
    try:
        return Instruction.model_validate(raw)
    except ValidationError as exc:
        field, problem, value = first_problem(exc)
        raise input_error(path, number, field, value, problem.lower()) from exc
