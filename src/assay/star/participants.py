"""The participant pool of a STAR campaign: import from CSV or YAML, and who counts as in- or out-group.

A pool file lists one person per row (CSV) or per mapping (YAML list): ``id``, ``name``, ``roles``
(``red_teamer``, ``annotator``, ``arbitrator``), ``expertise``, one column per demographic attribute of the
campaign spec, ``daily_cap`` (tasks per UTC day, default 20) and ``opted_out`` (default false). Several
values are ``;``-separated in CSV (a YAML list works too). Every problem is one ``UserError`` naming
``file:line``, the field and the value, so a programme lead can fix the file without reading code.

Membership of a target group (a mapping attribute -> value, e.g. ``{race: Asian, gender: male}``):

* **in-group** when, for every attribute of the group, the person's declared values include the group's;
* **out-group** when, for at least one attribute of the group, the person declared values and none of them
  is the group's;
* **neither** when the person answered "prefer not to say" for any attribute of the group, or declared
  nothing for an attribute that would decide it. Such a person is never used for in/out-group matching of
  that group, but is matched for everything else (other groups, rules that target no group).

A pool must have a column (a key, in YAML) for every attribute the campaign's target groups are drawn over:
without it nobody would ever count as in- or out-group for those groups, silently, so the file is refused.
A blank cell is allowed, but it may be an oversight rather than an answer, so ``blank_attributes`` names
each such person (``prefer not to say`` is the explicit answer and is not named).
"""

from __future__ import annotations

import csv
import dataclasses
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from sqlalchemy import select
from sqlalchemy.orm import Session

from assay import textfile
from assay.errors import UserError, input_error
from assay.star.spec import PREFER_NOT_TO_SAY, CampaignSpec
from assay.store.star_models import ROLES, StarCampaign, StarParticipant

FIXED_FIELDS = ("id", "name", "roles", "expertise", "daily_cap", "opted_out")
DEFAULT_DAILY_CAP = 20
_TRUE = {"true", "yes", "y", "1"}
_FALSE = {"false", "no", "n", "0", ""}


@dataclass(frozen=True)
class Person:
    """One validated pool row, before it is written to the store."""

    external_id: str
    name: str
    roles: list[str]
    expertise: list[str]
    demographics: dict[str, list[str]]
    daily_cap: int
    opted_out: bool
    # Where the person is in the pool file (0: read from the store); not part of who they are.
    line: int = dataclasses.field(default=0, compare=False)

    def record(self) -> dict[str, Any]:
        """The person in the pool file's own words (``id``, not ``external_id``), for listings and JSON."""
        return {
            "id": self.external_id,
            "name": self.name,
            "roles": list(self.roles),
            "expertise": list(self.expertise),
            "demographics": {k: list(v) for k, v in self.demographics.items()},
            "daily_cap": self.daily_cap,
            "opted_out": self.opted_out,
        }


@dataclass(frozen=True)
class ImportSummary:
    """What an import changed: new people and people whose row was updated; ``warnings``: the people whose
    blank cells keep them out of some groups' matching (``blank_attributes``)."""

    added: int
    updated: int
    warnings: list[str] = dataclasses.field(default_factory=list)


def membership(demographics: Mapping[str, list[str]], group: Mapping[str, str] | None) -> bool | None:
    """True in-group, False out-group, None neither (see the module docstring for the rules)."""
    if not group:
        return None
    declared = {attr: list(demographics.get(attr) or []) for attr in group}
    if any(PREFER_NOT_TO_SAY in values for values in declared.values()):
        return None
    if all(group[attr] in values for attr, values in declared.items()):
        return True
    if any(values and group[attr] not in values for attr, values in declared.items()):
        return False
    return None


def load_pool(path: str | Path, spec: CampaignSpec) -> list[Person]:
    """Read and validate a pool file (``.csv``, or ``.yaml``/``.yml``) against the campaign spec."""
    path = Path(path)
    text = textfile.read(path, "participant pool")
    is_yaml = path.suffix.lower() in (".yaml", ".yml")
    columns, rows = _yaml_rows(path, text) if is_yaml else _csv_rows(path, text)
    people: list[Person] = []
    seen: dict[str, int] = {}
    for line, row, lines in rows:
        person = _person(path, line, row, lines, spec)
        if person.external_id in seen:
            raise input_error(
                path, line, "id", person.external_id, f"repeats the id on line {seen[person.external_id]}"
            )
        seen[person.external_id] = line
        people.append(person)
    _check_columns(path, columns, spec, "key" if is_yaml else "column")
    return people


def group_attributes(spec: CampaignSpec) -> list[str]:
    """The attributes the campaign's target groups are drawn over, in the spec's order; none when no rule
    targets groups (then no attribute decides any matching)."""
    if not any(rule.targets_groups for rule in spec.rules):
        return []
    used = {attr for group in spec.demographics.groups() for attr in group}
    return [attr for attr in spec.demographics.attributes if attr in used]


def _check_columns(path: Path, columns: list[str], spec: CampaignSpec, kind: str) -> None:
    """Refuse a pool that lacks an attribute the target groups need: nobody in it could ever be in- or
    out-group for those groups, and nothing else would say so."""
    for attr in group_attributes(spec):
        if attr not in columns:
            example = next(f"{k}={v}" for g in spec.demographics.groups() for k, v in g.items() if k == attr)
            raise input_error(
                path,
                1,
                attr,
                ", ".join(columns),
                f"is missing: the campaign's target groups need it (e.g. {example}), and without it nobody "
                f"counts as in- or out-group for them; add the {kind} (blank, or {PREFER_NOT_TO_SAY!r}, for "
                "anyone who does not say)",
            )


def blank_attributes(path: str | Path, people: list[Person], spec: CampaignSpec) -> list[str]:
    """One line per person who left an attribute the target groups need blank: they count as neither in- nor
    out-group for those groups. Named, because a blank may be an oversight (``prefer not to say`` is the
    explicit answer and is not named)."""
    needed = group_attributes(spec)
    found = []
    for person in people:
        blank = [attr for attr in needed if not person.demographics.get(attr)]
        if blank:
            who = f"{path}:{person.line}: {person.external_id} ({person.name})"
            found.append(
                f"{who} declares no {' or '.join(repr(a) for a in blank)}, so counts as neither in-group nor "
                f"out-group for the target groups by {' or '.join(blank)}; fill it in, or write "
                f"{PREFER_NOT_TO_SAY!r} if that is their answer"
            )
    return found


def pool_of(session: Session, campaign: StarCampaign) -> list[Person]:
    """The campaign's pool as stored, in the order people were added."""
    rows = session.scalars(
        select(StarParticipant).where(StarParticipant.campaign_id == campaign.id).order_by(StarParticipant.id)
    )
    return [
        Person(
            external_id=row.external_id,
            name=row.name,
            roles=list(row.roles or []),
            expertise=list(row.expertise or []),
            demographics={k: list(v) for k, v in (row.demographics or {}).items()},
            daily_cap=row.daily_cap,
            opted_out=row.opted_out,
        )
        for row in rows
    ]


def import_pool(session: Session, campaign: StarCampaign, path: str | Path) -> ImportSummary:
    """Add or update (by external id) everyone in the pool file; people not in the file stay as they are."""
    spec = CampaignSpec.model_validate_json(campaign.spec_json)
    people = load_pool(path, spec)
    existing = {
        p.external_id: p
        for p in session.scalars(select(StarParticipant).where(StarParticipant.campaign_id == campaign.id))
    }
    added = updated = 0
    for person in people:
        row = existing.get(person.external_id)
        if row is None:
            row = StarParticipant(campaign_id=campaign.id, external_id=person.external_id)
            session.add(row)
            added += 1
        elif _changed(row, person):
            updated += 1
        _copy(row, person)
    session.flush()
    return ImportSummary(added=added, updated=updated, warnings=blank_attributes(path, people, spec))


Row = tuple[int, dict[str, Any], dict[str, int]]  # line of the row, the row, line of each field (YAML)


def _csv_rows(path: Path, text: str) -> tuple[list[str], Iterator[Row]]:
    """The header's columns, and the CSV rows with the file line each starts on (the header is line 1)."""
    reader = csv.DictReader(text.splitlines(keepends=True))
    if reader.fieldnames is None:
        raise UserError(
            f"{path}: the participant pool is empty (it needs a header row: id, name, roles, ...)"
        )
    return [name.strip() for name in reader.fieldnames], _csv_body(path, reader)


def _csv_body(path: Path, reader: csv.DictReader) -> Iterator[Row]:
    line = reader.line_num + 1
    for row in reader:
        if None in row:
            raise input_error(path, line, "(row)", row[None], "has more cells than the header")
        yield line, {k.strip(): v for k, v in row.items() if k is not None}, {}
        line = reader.line_num + 1


def _yaml_rows(path: Path, text: str) -> tuple[list[str], Iterator[Row]]:
    """Every key any entry has, and the entries (read up front: the file is parsed whole anyway)."""
    entries = list(_yaml_entries(path, text))
    return list(dict.fromkeys(key for _, item, _ in entries for key in item)), iter(entries)


def _yaml_entries(path: Path, text: str) -> Iterator[Row]:
    """YAML list items with the line each mapping (and each of its keys) starts on."""
    try:
        node = yaml.compose(text)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        raise UserError(f"{where}: not valid YAML ({getattr(exc, 'problem', None) or exc})") from exc
    if not isinstance(data, list) or not isinstance(node, yaml.SequenceNode):
        raise UserError(f"{path}: a YAML participant pool must be a list of mappings, one per person")
    for item_node, item in zip(node.value, data, strict=True):
        line = item_node.start_mark.line + 1
        if not isinstance(item, dict) or not isinstance(item_node, yaml.MappingNode):
            raise input_error(path, line, "(entry)", item, "must be a mapping (id, name, roles, ...)")
        lines = {str(key.value): key.start_mark.line + 1 for key, _ in item_node.value}
        yield line, {str(k): v for k, v in item.items()}, lines


def _person(path: Path, line: int, row: dict[str, Any], lines: dict[str, int], spec: CampaignSpec) -> Person:
    """Validate one row; ``lines`` gives a field's own line in YAML, otherwise the row's line is used."""
    attributes = spec.demographics.attributes

    def where(field: str) -> int:
        return lines.get(field, line)

    for field in row:
        if field not in FIXED_FIELDS and field not in attributes:
            known = ", ".join([*FIXED_FIELDS, *attributes])
            raise input_error(path, where(field), field, field, f"is not a known column (known: {known})")
    external_id = _text(row.get("id"))
    if not external_id:
        raise input_error(path, where("id"), "id", row.get("id"), "is required")
    if len(external_id) > 100:
        raise input_error(path, where("id"), "id", external_id, "is longer than 100 characters")
    return Person(
        external_id=external_id,
        name=_text(row.get("name")) or external_id,
        roles=_roles(path, where("roles"), row.get("roles")),
        expertise=_split(row.get("expertise")),
        demographics={
            attr: _values(path, where(attr), attr, row.get(attr), allowed)
            for attr, allowed in attributes.items()
            if _split(row.get(attr))
        },
        daily_cap=_cap(path, where("daily_cap"), row.get("daily_cap")),
        opted_out=_flag(path, where("opted_out"), "opted_out", row.get("opted_out")),
        line=line,
    )


def _text(value: Any) -> str:
    """A cell as stripped text; None (a missing YAML key) is ''."""
    return "" if value is None else str(value).strip()


def _split(value: Any) -> list[str]:
    """A list cell: a YAML list, or ``;``-separated text; blanks dropped."""
    items = value if isinstance(value, list) else _text(value).split(";")
    return [s for s in (_text(v) for v in items) if s]


def _roles(path: Path, line: int, value: Any) -> list[str]:
    """Roles, accepting 'red teamer' / 'red-teamer' for ``red_teamer``; at least one is needed."""
    roles = []
    for raw in _split(value):
        role = raw.lower().replace("-", "_").replace(" ", "_")
        if role not in ROLES:
            raise input_error(path, line, "roles", raw, f"is not a role (roles: {', '.join(ROLES)})")
        if role not in roles:
            roles.append(role)
    if not roles:
        raise input_error(path, line, "roles", value, f"needs at least one of {', '.join(ROLES)}")
    return roles


def _values(path: Path, line: int, attr: str, value: Any, allowed: list[str]) -> list[str]:
    """An attribute's declared values in the spec's spelling (case-insensitive); 'prefer not to say' alone."""
    canonical = {v.lower(): v for v in [*allowed, PREFER_NOT_TO_SAY]}
    values = []
    for raw in _split(value):
        if raw.lower() not in canonical:
            shown = ", ".join([*allowed, PREFER_NOT_TO_SAY])
            raise input_error(path, line, attr, raw, f"is not a value of {attr!r} (values: {shown})")
        if canonical[raw.lower()] not in values:
            values.append(canonical[raw.lower()])
    if PREFER_NOT_TO_SAY in values and len(values) > 1:
        raise input_error(path, line, attr, value, f"combines {PREFER_NOT_TO_SAY!r} with other values")
    return values


def _cap(path: Path, line: int, value: Any) -> int:
    """The daily cap: a whole number >= 1; empty means the default."""
    text = _text(value)
    if not text:
        return DEFAULT_DAILY_CAP
    try:
        cap = int(text)
    except ValueError:
        cap = 0
    if cap < 1 or isinstance(value, (bool, float)):
        raise input_error(
            path, line, "daily_cap", value, "must be a whole number of tasks per day, at least 1"
        )
    return cap


def _flag(path: Path, line: int, field: str, value: Any) -> bool:
    """A yes/no cell: true/false, yes/no, 1/0; empty means false."""
    if isinstance(value, bool):
        return value
    text = _text(value).lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise input_error(path, line, field, value, "must be true or false")


def _changed(row: StarParticipant, person: Person) -> bool:
    """Whether a re-import changes anything stored for this person."""
    return (row.name, row.roles, row.expertise, row.demographics, row.daily_cap, row.opted_out) != (
        person.name,
        person.roles,
        person.expertise,
        person.demographics,
        person.daily_cap,
        person.opted_out,
    )


def _copy(row: StarParticipant, person: Person) -> None:
    """Write a validated person onto its stored row."""
    row.name = person.name
    row.roles = list(person.roles)
    row.expertise = list(person.expertise)
    row.demographics = {k: list(v) for k, v in person.demographics.items()}
    row.daily_cap = person.daily_cap
    row.opted_out = person.opted_out
