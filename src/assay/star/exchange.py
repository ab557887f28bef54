"""Campaign data out and external dialogues in, in one documented schema (JSONL or Parquet).

Export writes four tables (see ``docs/star.md`` for every field):

* ``instructions``: campaign, id, number, rule_id, rule_area, group, group_label, parameters, template, text;
* ``dialogues``: campaign, dialogue_id, source, instruction_id, rule_id, group_label, red_teamer,
  red_teamer_relation (in-group, out-group or none), annotation_arm (in-group, out-group, both or none),
  topic, target_model, machine, started_at, finished_at, pre_annotation, turns [{index, role, text,
  created_at}];
* ``annotations``: campaign, annotation_id, dialogue_id, annotator, annotator_relation, kind, ablation,
  rating (0-based), label, broken, reason, machine, created_at. Arbitrations are rows of kind arbitrate; every
  annotation is kept;
* ``participants``: one row per pool member with no id and no name (rows in an order that says nothing of
  who is who): roles, expertise, demographics, opted_out, and the tasks done (red_team_tasks,
  annotate_tasks, arbitrate_tasks, of the machine rows chosen) and hours spent on them (claim to
  submission), for the report's participants section, which shows counts only.

Machine-made rows are exported only when asked (``machine="include"`` or ``"only"``) and always carry
``machine: true``. ``import_hh_rlhf`` turns Anthropic HH-RLHF red-team conversations into dialogue rows
(``source: "hh-rlhf"``) for comparison in the analysis.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from sqlalchemy import select
from sqlalchemy.orm import Session

from assay import textfile
from assay.errors import UserError, input_error, validation_error
from assay.fileio import atomic_path, write_text_atomic
from assay.star.assign import NO_ARM, campaign_spec, dialogue_arms, list_annotations, list_dialogues
from assay.store.enums import TaskKind, TaskStatus
from assay.store.star_models import StarCampaign, StarInstruction, StarParticipant, StarTask

if TYPE_CHECKING:
    import pandas as pd

    from assay.star.spec import CampaignSpec

MachineRows = Literal["exclude", "include", "only"]
FORMATS = ("jsonl", "parquet")
_MACHINE_FILTER: dict[str, bool | None] = {"exclude": False, "include": None, "only": True}
SPEC_FILE = "spec.json"
TABLES = ("instructions", "dialogues", "annotations")
OPTIONAL_TABLES = ("participants",)  # exports before it existed lack it; the report then skips its section
COLUMNS = {  # every table's documented columns (docs/star.md), in order
    "instructions": (
        *("campaign", "id", "number", "rule_id", "rule_area", "group", "group_label", "parameters"),
        *("template", "text"),
    ),
    "dialogues": (
        *("campaign", "dialogue_id", "source", "instruction_id", "rule_id", "group_label", "red_teamer"),
        *("red_teamer_relation", "annotation_arm", "topic", "target_model", "machine", "started_at"),
        *("finished_at", "pre_annotation", "turns"),
    ),
    "annotations": (
        *("campaign", "annotation_id", "dialogue_id", "annotator", "annotator_relation", "kind"),
        *("ablation", "rating", "label", "broken", "reason", "machine", "created_at"),
    ),
    "participants": (
        *("roles", "expertise", "demographics", "opted_out", "red_team_tasks", "annotate_tasks"),
        *("arbitrate_tasks", "hours"),
    ),
}
# Fields that hold JSON objects or lists; Parquet stores them as JSON strings.
NESTED = ("group", "parameters", "pre_annotation", "turns", "roles", "expertise", "demographics")


def _time(value: Any) -> str | None:
    return value.isoformat() if value is not None else None


def _people(session: Session, campaign: StarCampaign) -> dict[int, str]:
    rows = session.execute(
        select(StarParticipant.id, StarParticipant.external_id).where(
            StarParticipant.campaign_id == campaign.id
        )
    )
    return dict(rows.tuples().all())


_RELATION = {True: "in-group", False: "out-group", None: "none"}


def _relations(session: Session, campaign: StarCampaign) -> dict[tuple[str, int], str]:
    """How each red teamer and annotator stood to the dialogue's target group, from their task's requirement:
    ("red_team", dialogue id) and ("task", task id) -> in-group, out-group or none."""
    rows = session.execute(
        select(StarTask.id, StarTask.kind, StarTask.dialogue_id, StarTask.in_group).where(
            StarTask.campaign_id == campaign.id
        )
    )
    found: dict[tuple[str, int], str] = {}
    for task_id, kind, dialogue_id, in_group in rows:
        found["task", task_id] = _RELATION[in_group]
        if kind == TaskKind.RED_TEAM and dialogue_id is not None:
            found[TaskKind.RED_TEAM, dialogue_id] = _RELATION[in_group]
    return found


def _participants(session: Session, campaign: StarCampaign, machine: bool | None) -> list[dict[str, Any]]:
    """The pool without names or ids, with each person's finished tasks (of the chosen machine rows) and the
    hours from claim to submission; sorted by content, so the order links no row to a pool id."""
    work: dict[int, dict[str, float]] = {}
    query = select(StarTask.participant_id, StarTask.kind, StarTask.claimed_at, StarTask.done_at).where(
        StarTask.campaign_id == campaign.id,
        StarTask.status == TaskStatus.DONE,
        StarTask.participant_id.is_not(None),
    )
    if machine is not None:
        query = query.where(StarTask.machine.is_(machine))
    for person, kind, claimed, done in session.execute(query):
        mine = work.setdefault(person, {"hours": 0.0})
        mine[kind] = mine.get(kind, 0) + 1
        if claimed is not None and done is not None:
            mine["hours"] += max((done - claimed).total_seconds(), 0.0) / 3600
    rows = [
        {
            "roles": list(p.roles or []),
            "expertise": list(p.expertise or []),
            "demographics": {k: list(v) for k, v in (p.demographics or {}).items()},
            "opted_out": p.opted_out,
            **{f"{kind}_tasks": int(work.get(p.id, {}).get(kind, 0)) for kind in TaskKind},
            "hours": round(work.get(p.id, {}).get("hours", 0.0), 4),
        }
        for p in session.scalars(select(StarParticipant).where(StarParticipant.campaign_id == campaign.id))
    ]
    return sorted(rows, key=lambda row: json.dumps(row, sort_keys=True))


def campaign_tables(
    session: Session, campaign: StarCampaign, machine: MachineRows = "exclude"
) -> dict[str, list]:
    """The four export tables as lists of plain dicts."""
    spec = campaign_spec(campaign)
    people = _people(session, campaign)
    instructions = session.scalars(
        select(StarInstruction)
        .where(StarInstruction.campaign_id == campaign.id)
        .order_by(StarInstruction.number)
    ).all()
    by_row = {i.id: i for i in instructions}
    keep = _MACHINE_FILTER[machine]
    dialogues = list_dialogues(session, campaign, machine=keep)
    annotations = list_annotations(session, campaign, machine=keep, ablation=None)
    relation = _relations(session, campaign)
    arms = dialogue_arms(session, campaign)
    return {
        "instructions": [
            {
                "campaign": campaign.name,
                "id": i.instruction_id,
                "number": i.number,
                "rule_id": i.rule_id,
                "rule_area": i.rule_area,
                "group": i.group_json,
                "group_label": i.group_label,
                "parameters": i.parameters_json,
                "template": i.template,
                "text": i.text,
            }
            for i in instructions
        ],
        "dialogues": [
            {
                "campaign": campaign.name,
                "dialogue_id": d.id,
                "source": "assay",
                "instruction_id": by_row[d.instruction_id].instruction_id,
                "rule_id": by_row[d.instruction_id].rule_id,
                "group_label": by_row[d.instruction_id].group_label,
                "red_teamer": people.get(d.red_teamer_id),
                "red_teamer_relation": relation.get((TaskKind.RED_TEAM, d.id), "none"),
                "annotation_arm": arms.get(d.id, NO_ARM),
                "topic": d.topic,
                "target_model": d.target_model,
                "machine": d.machine,
                "started_at": _time(d.started_at),
                "finished_at": _time(d.finished_at),
                "pre_annotation": d.pre_annotation,
                "turns": [
                    {"index": t.index, "role": t.role, "text": t.text, "created_at": _time(t.created_at)}
                    for t in d.turns
                ],
            }
            for d in dialogues
        ],
        "annotations": [
            {
                "campaign": campaign.name,
                "annotation_id": a.id,
                "dialogue_id": a.dialogue_id,
                "annotator": people.get(a.annotator_id),
                "annotator_relation": relation.get(("task", a.task_id), "none"),
                "kind": a.kind,
                "ablation": a.ablation,
                "rating": a.rating,
                "label": spec.likert[a.rating],
                "broken": spec.is_broken(a.rating),
                "reason": a.reason,
                "machine": a.machine,
                "created_at": _time(a.created_at),
            }
            for a in annotations
        ],
        "participants": _participants(session, campaign, keep),
    }


def with_all_columns(frames: dict[str, pd.DataFrame]) -> dict[str, pd.DataFrame]:
    """The tables with every documented column, so an empty one (a campaign with no ratings yet, an
    export's empty file) or an imported set without some fields reads as missing values, not a KeyError."""
    return {
        name: frame.reindex(columns=[*frame.columns, *(c for c in COLUMNS.get(name, ()) if c not in frame)])
        for name, frame in frames.items()
    }


def write_table(rows: list[dict], path: Path, fmt: str) -> None:
    """One table as JSONL (nested fields as JSON) or Parquet (nested fields as JSON strings), atomically."""
    if fmt == "jsonl":
        write_text_atomic(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
        return
    import pandas as pd

    flat = [{k: json.dumps(v) if isinstance(v, dict | list) else v for k, v in r.items()} for r in rows]
    with atomic_path(path) as tmp:
        pd.DataFrame(flat).to_parquet(tmp, index=False)


def export_campaign(
    session: Session, campaign: StarCampaign, out: Path, fmt: str = "jsonl", machine: MachineRows = "exclude"
) -> dict[str, int]:
    """Write ``OUT/{instructions,dialogues,annotations}.{jsonl,parquet}``; returns the row counts."""
    if fmt not in FORMATS:
        raise UserError(f"unknown export format {fmt!r}; use one of {', '.join(FORMATS)}")
    tables = campaign_tables(session, campaign, machine)
    out.mkdir(parents=True, exist_ok=True)
    for name, rows in tables.items():
        write_table(rows, out / f"{name}.{fmt}", fmt)
    # The spec travels with the tables: the analysis needs the scale, the rules and the groups.
    write_text_atomic(out / SPEC_FILE, campaign_spec(campaign).model_dump_json(indent=2) + "\n")
    return {name: len(rows) for name, rows in tables.items()}


def _hh_turns(text: str, path: Path, line: int) -> list[dict[str, Any]]:
    turns = []
    for chunk in text.split("\n\nHuman:")[1:]:
        human, _, assistant = chunk.partition("\n\nAssistant:")
        turns.append({"index": len(turns), "role": "user", "text": human.strip(), "created_at": None})
        if assistant.strip():
            turns.append(
                {"index": len(turns), "role": "assistant", "text": assistant.strip(), "created_at": None}
            )
    if not turns:
        raise input_error(path, line, "chosen", text[:60], "holds no '\\n\\nHuman:' turn")
    return turns


def _external_row(source: str, number: int, turns: list[dict[str, Any]], target: str) -> dict[str, Any]:
    """A dialogue row for data from elsewhere: no instruction, red teamer or rule of ours."""
    return {
        "campaign": None,
        "dialogue_id": f"{source}-{number}",
        "source": source,
        "instruction_id": None,
        "rule_id": None,
        "group_label": "",
        "red_teamer": None,
        "annotation_arm": "none",
        "topic": "",
        "target_model": target,
        "machine": False,
        "started_at": None,
        "finished_at": None,
        "pre_annotation": {},
        "turns": turns,
    }


def import_lines(
    path: str | Path, source: str | None = None, limit: int | None = None
) -> list[dict[str, Any]]:
    """A text file of prompts, one per line (e.g. HarmBench behaviours), as one-turn dialogue rows."""
    path = Path(path)
    name = source or path.stem
    lines = textfile.read(path, "prompt file").splitlines()
    rows = []
    for number, line in enumerate(lines, start=1):
        if line.strip() and (limit is None or len(rows) < limit):
            turn = {"index": 0, "role": "user", "text": line.strip(), "created_at": None}
            rows.append(_external_row(name, number, [turn], ""))
    if not rows:
        raise UserError(f"{path}: holds no non-empty line")
    return rows


def import_hh_rlhf(
    path: str | Path, side: str = "rejected", limit: int | None = None
) -> list[dict[str, Any]]:
    """HH-RLHF rows ({"chosen", "rejected"} transcripts, .jsonl or .jsonl.gz) as dialogue rows."""
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    rows: list[dict[str, Any]] = []
    try:
        with opener(path, "rb") as handle:  # bytes, decoded line by line: a bad byte names its line
            for line_number, raw in enumerate(handle, start=1):
                if limit is not None and len(rows) >= limit:
                    break
                line = textfile.decode_line(raw, path, line_number, "HH-RLHF file")
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise input_error(
                        path, line_number, "(line)", line[:60], f"is not JSON ({exc.msg})"
                    ) from None
                if not isinstance(record, dict) or not isinstance(record.get(side), str):
                    raise input_error(path, line_number, side, record, "must be a transcript string")
                turns = _hh_turns(record[side], path, line_number)
                rows.append(_external_row("hh-rlhf", line_number, turns, f"hh-rlhf:{side}"))
    except OSError as exc:
        raise UserError(f"{path}: cannot read ({exc.strerror or exc})") from None
    return rows


def _decode_nested(frame: pd.DataFrame) -> pd.DataFrame:
    """Parquet exports carry nested fields as JSON strings; give every reader the same Python objects."""
    for column in NESTED:
        if column in frame.columns:
            frame[column] = [json.loads(v) if isinstance(v, str) else v for v in frame[column]]
    return frame


def read_table(path: str | Path) -> pd.DataFrame:
    """One export table (.jsonl or .parquet) as a DataFrame; unreadable rows are a one-line error."""
    import pandas as pd

    path = Path(path)
    if path.suffix == ".parquet":
        try:
            return _decode_nested(pd.read_parquet(path))
        except (OSError, ValueError) as exc:
            raise UserError(f"{path}: cannot read as Parquet ({exc})") from None
    rows = []
    try:
        with path.open("rb") as handle:
            for number, raw in enumerate(handle, start=1):
                line = textfile.decode_line(raw, path, number, "dialogue table")
                if not line.strip():
                    continue
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise input_error(path, number, "(line)", line[:60], f"is not JSON ({exc.msg})") from None
                if not isinstance(rows[-1], dict):
                    raise input_error(path, number, "(line)", line[:60], "must be a JSON object")
    except OSError as exc:
        raise UserError(f"{path}: cannot read ({exc.strerror or exc})") from None
    return _decode_nested(pd.DataFrame(rows))


def _table_path(folder: Path, name: str) -> Path:
    for fmt in FORMATS:
        if (folder / f"{name}.{fmt}").exists():
            return folder / f"{name}.{fmt}"
    raise UserError(f"{folder}: no {name}.jsonl or {name}.parquet (write one with `assay star export`)")


def read_export(
    folder: str | Path, spec: CampaignSpec | None = None
) -> tuple[CampaignSpec, dict[str, pd.DataFrame]]:
    """An ``assay star export`` folder: its spec (``spec.json`` unless one is given) and the tables (the
    participants table only where the export has one)."""
    from assay.star.spec import CampaignSpec

    folder = Path(folder)
    if spec is None:
        spec_path = folder / SPEC_FILE
        if not spec_path.exists():
            raise UserError(
                f"{folder}: no {SPEC_FILE}; export with a current `assay star export` or pass --spec"
            )
        spec_text = textfile.read(spec_path, "export's spec")
        try:
            spec = CampaignSpec.model_validate_json(spec_text)
        except ValueError as exc:
            raise validation_error(exc, spec_path) from None
    frames = {name: read_table(_table_path(folder, name)) for name in TABLES}
    for name in OPTIONAL_TABLES:
        if any((folder / f"{name}.{fmt}").exists() for fmt in FORMATS):
            frames[name] = read_table(_table_path(folder, name))
    return spec, frames
