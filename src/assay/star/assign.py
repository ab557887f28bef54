"""The STAR assignment engine: campaigns, red-team/annotate/arbitrate tasks, atomic claims, shortfalls.

Flow: ``create_campaign`` stores the spec; ``add_instructions`` makes one red-team task per instruction
(group-targeted ones in-group or out-group by ``in_group_share``, within one task in every group and over
the campaign: ``balance.in_group_counts``); ``claim_next`` hands a person the oldest task they may take;
``submit_dialogue`` finishes a red-team task and opens its annotate tasks by the dialogue's annotation arm
(group-targeted dialogues: in-group only, out-group only, or both, in the spec's shares within one dialogue:
``balance.arm_of``; other dialogues: ``annotators_per_dialogue`` annotators anyone may be);
``submit_annotation`` stores a rating and, once the primary ratings of a dialogue are all in and two differ
by ``arbitration_gap`` or more, opens exactly one arbitrate task (the "both" arm's out-group ratings are
extra, flagged ``ablation``: they never call for arbitration).
``shortfalls`` reports the tasks nobody in the pool may take, by group, and marks them ``waiting``.
``release_expired_claims`` puts claims nobody finished in time back in the queue, ``release_claim`` one claim
its holder gives back.

A claim is one conditional ``UPDATE ... WHERE id = (first eligible) AND (still eligible) RETURNING id``, so
two claimers never get the same task and the checks (role, opt-out, daily cap, group membership, expertise,
never a dialogue the person has seen in any role) hold at the moment of the claim, not a moment before.
The unique constraints on ``star_tasks`` (one task per person per dialogue, one arbitration per dialogue)
back this up. Claiming covers ``waiting`` tasks too: waiting is a report, not a lock.

Machine-made dialogues and annotations carry ``machine=True``; the listing functions take a ``machine``
filter that defaults to human-only, so the two are never mixed without asking.
"""

from __future__ import annotations

import random
import threading
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from typing import Any, NamedTuple

from sqlalchemy import ColumnElement, and_, bindparam, exists, func, or_, select, update
from sqlalchemy.exc import IntegrityError, OperationalError
from sqlalchemy.orm import Session, aliased, sessionmaker

from assay.errors import UserError
from assay.retry import retry
from assay.star.balance import arm_of, in_group_counts
from assay.star.participants import membership
from assay.star.spec import ARMS, CampaignSpec, PolicyRule, group_label
from assay.store.enums import TASK_ROLE, TaskKind, TaskStatus
from assay.store.models import utcnow
from assay.store.star_models import (
    TURN_ROLES,
    StarAnnotation,
    StarCampaign,
    StarDialogue,
    StarInstruction,
    StarParticipant,
    StarTask,
    StarTurn,
)

CLAIMABLE = (TaskStatus.OPEN, TaskStatus.WAITING)
RETRIES = 20
REQUIREMENT = {True: "in-group", False: "out-group", None: "anyone"}
# A dialogue's annotation arm as the export names it, from the requirements of its annotate tasks;
# "none": the dialogue targets no group.
ARM_OF_FLAGS = {
    frozenset({True}): "in-group",
    frozenset({False}): "out-group",
    frozenset({True, False}): "both",
}
NO_ARM = "none"


class Shortfall(NamedTuple):
    """Open tasks of one kind, group and requirement that nobody in the pool may take."""

    kind: str
    group_label: str
    requirement: str  # "in-group", "out-group" or "anyone", plus "; expertise: ..." where the rule needs it
    tasks: int


@dataclass(frozen=True)
class Rating:
    """One earlier rating an arbitrator sees."""

    annotator_id: int | None
    rating: int
    label: str
    reason: str
    machine: bool


@dataclass(frozen=True)
class ArbitrationView:
    """What an arbitrator sees: the instruction, the dialogue, and the primary ratings with their reasons."""

    task_id: int
    dialogue_id: int
    rule_id: str
    group_label: str
    instruction: str
    topic: str
    target_model: str
    turns: list[tuple[str, str]]
    ratings: list[Rating]


# --- campaigns and instructions -------------------------------------------------------------------------


@lru_cache(maxsize=64)
def _parse_spec(spec_json: str) -> CampaignSpec:
    """Parse a stored spec once per process: claims read it on every call."""
    return CampaignSpec.model_validate_json(spec_json)


def campaign_spec(campaign: StarCampaign) -> CampaignSpec:
    """The validated spec a campaign was created with."""
    return _parse_spec(campaign.spec_json)


def create_campaign(session: Session, spec: CampaignSpec, seed: int = 0) -> StarCampaign:
    """Store a campaign; the same spec again returns it, a different spec under the same name is an error.

    Specs are compared as parsed, so a campaign stored in an older form of the same spec (before the
    annotation arms, say) still counts as the same."""
    spec_json = spec.model_dump_json()
    existing = session.scalar(select(StarCampaign).where(StarCampaign.name == spec.name))
    if existing is not None:
        if campaign_spec(existing) == spec:
            return existing
        raise UserError(f"campaign {spec.name!r} already exists with a different spec; choose another name")
    campaign = StarCampaign(name=spec.name, spec_json=spec_json, seed=seed)
    session.add(campaign)
    session.flush()
    return campaign


def get_campaign(session: Session, campaign: str | int) -> StarCampaign:
    """A campaign by name or id; ``UserError`` naming the known campaigns otherwise."""
    column = StarCampaign.id if isinstance(campaign, int) else StarCampaign.name
    found = session.scalar(select(StarCampaign).where(column == campaign))
    if found is None:
        names = ", ".join(session.scalars(select(StarCampaign.name).order_by(StarCampaign.name))) or "none"
        raise UserError(f"no campaign {campaign!r} (campaigns: {names})")
    return found


def _field(obj: Any, name: str, default: Any = None) -> Any:
    """An instruction field from a pydantic object, any object with attributes, or a dict."""
    if isinstance(obj, Mapping):
        return obj.get(name, default)
    return getattr(obj, name, default)


def _instruction_row(campaign: StarCampaign, spec: CampaignSpec, obj: Any) -> StarInstruction:
    """Validate one design instruction against the spec and make its row."""
    instruction_id = str(_field(obj, "id") or "")
    rule = spec.rule(str(_field(obj, "rule_id")))
    group = _field(obj, "group") or None
    label = group_label(group)
    if group and label not in {group_label(g) for g in spec.demographics.groups()}:
        raise UserError(f"instruction {instruction_id}: group {label!r} is not a target group of the spec")
    if not instruction_id:
        raise UserError(f"instruction number {_field(obj, 'number')!r} has no id")
    return StarInstruction(
        campaign_id=campaign.id,
        number=int(_field(obj, "number", 0)),
        instruction_id=instruction_id,
        rule_id=rule.id,
        rule_area=str(_field(obj, "rule_area") or rule.area),
        group_json=dict(group) if group else None,
        group_label=label,
        parameters_json=dict(_field(obj, "parameters") or {}),
        template=str(_field(obj, "template") or ""),
        text=str(_field(obj, "text") or ""),
    )


def add_instructions(session: Session, campaign: StarCampaign, instructions: Iterable[Any]) -> int:
    """Store instructions and one red-team task each; ids already stored are skipped. Returns tasks made."""
    spec = campaign_spec(campaign)
    known = set(
        session.scalars(
            select(StarInstruction.instruction_id).where(StarInstruction.campaign_id == campaign.id)
        )
    )
    rows: list[StarInstruction] = []
    for obj in instructions:
        row = _instruction_row(campaign, spec, obj)
        if row.instruction_id not in known:
            known.add(row.instruction_id)
            rows.append(row)
    session.add_all(rows)
    session.flush()
    session.add_all(_new_task(row, TaskKind.RED_TEAM, row.id) for row in rows)
    session.flush()
    _balance(session, campaign, spec)
    return len(rows)


def _targets_group(spec: CampaignSpec, rule_id: str, label: str) -> bool:
    """Whether tasks of this rule and group are matched by group membership at all."""
    return bool(label) and spec.rule(rule_id).targets_groups


def _balance(session: Session, campaign: StarCampaign, spec: CampaignSpec) -> None:
    """Decide in-group or out-group for every group-targeted red-team task nobody holds or has done.

    Tasks already claimed or done keep their requirement; the rest (new ones, and open or waiting ones no
    person holds, whose requirement nobody has acted on) are decided again together, so a campaign whose
    instructions arrive in several batches before anyone starts is split as exactly as one added at once.
    The update is conditional: a task claimed meanwhile keeps the requirement it was claimed under.
    """
    rows = session.execute(
        select(StarTask.id, StarTask.rule_id, StarTask.group_label)
        .where(
            StarTask.campaign_id == campaign.id,
            StarTask.kind == TaskKind.RED_TEAM,
            StarTask.status.in_(CLAIMABLE),
            StarTask.participant_id.is_(None),
        )
        .order_by(StarTask.id)
    )
    by_group: dict[str, list[int]] = {}
    for task_id, rule_id, label in rows:
        if _targets_group(spec, rule_id, label):
            by_group.setdefault(label, []).append(task_id)
    before = _held_counts(session, campaign.id)
    rng = random.Random(f"{campaign.seed}:balance:{sum(n for n, _ in before.values())}")
    wanted = in_group_counts(
        before, {g: len(ts) for g, ts in by_group.items()}, spec.in_group_fraction(), rng
    )
    for label, tasks in sorted(by_group.items()):
        chosen = set(rng.sample(range(len(tasks)), wanted[label]))
        for flag in (True, False):
            ids = [task_id for i, task_id in enumerate(tasks) if (i in chosen) == flag]
            for start in range(0, len(ids), 500):  # bounded IN lists: SQLite caps bound parameters
                session.execute(
                    update(StarTask)
                    .where(StarTask.id.in_(ids[start : start + 500]), StarTask.participant_id.is_(None))
                    .values(in_group=flag)
                )
    session.flush()


def _held_counts(session: Session, campaign_id: int) -> dict[str, tuple[int, int]]:
    """Group-matched red-team tasks that keep their requirement (someone holds or has done them): per group,
    how many and how many in-group."""
    rows = session.execute(
        select(StarTask.group_label, StarTask.in_group, func.count())
        .where(
            StarTask.campaign_id == campaign_id,
            StarTask.kind == TaskKind.RED_TEAM,
            StarTask.in_group.is_not(None),
            or_(StarTask.status.not_in(CLAIMABLE), StarTask.participant_id.is_not(None)),
        )
        .group_by(StarTask.group_label, StarTask.in_group)
    ).all()
    counts: dict[str, tuple[int, int]] = {}
    for label, flag, n in rows:
        total, ins = counts.get(label, (0, 0))
        counts[label] = (total + n, ins + (n if flag else 0))
    return counts


# --- who may take what ----------------------------------------------------------------------------------


def group_memberships(person: StarParticipant, spec: CampaignSpec) -> tuple[set[str], set[str]]:
    """Labels of the spec's target groups the person is in-group for, and out-group for."""
    ins: set[str] = set()
    outs: set[str] = set()
    for group in spec.demographics.groups():
        member = membership(person.demographics or {}, group)
        if member is True:
            ins.add(group_label(group))
        elif member is False:
            outs.add(group_label(group))
    return ins, outs


def qualified_rules(spec: CampaignSpec, expertise: Iterable[str]) -> set[str]:
    """Rules whose needed expertise the person has all of (rules needing none: everyone)."""
    have = set(expertise)
    return {rule.id for rule in spec.rules if set(rule.expertise) <= have}


@dataclass(frozen=True)
class _Claimant:
    """Everything about a person a claim checks, read once before the atomic update."""

    participant_id: int
    campaign_id: int
    kind: str
    ins: frozenset[str]
    outs: frozenset[str]
    rules: frozenset[str]


_CANDIDATE = aliased(StarTask, name="candidate")  # the task the claim looks at
_OTHER = aliased(StarTask, name="other")  # any task of the same dialogue
_MINE = aliased(StarTask, name="mine")  # the claimer's tasks, for the daily cap


def _task_conditions(task: Any, kind: str, reopened: bool = False) -> list[ColumnElement[bool]]:
    """SQL conditions under which ``task`` (the table or an alias) may go to the claimer right now; with
    ``reopened``, the claims in the bound ``reopened`` list count as open (past their time: a claim
    releases them before it looks)."""
    status = task.status.in_(CLAIMABLE)
    if reopened:
        status = or_(status, task.id.in_(bindparam("reopened", expanding=True)))
    seen = (
        select(_OTHER.id)
        .where(_OTHER.dialogue_id == task.dialogue_id, _OTHER.participant_id == bindparam("who"))
        .correlate(task)
    )
    conditions = [
        task.campaign_id == bindparam("campaign"),
        task.kind == kind,
        status,
        task.id.not_in(bindparam("avoid", expanding=True)),  # a task just skipped (empty: none)
        ~exists(seen),
        or_(
            task.in_group.is_(None),
            and_(task.in_group.is_(True), task.group_label.in_(bindparam("ins", expanding=True))),
            and_(task.in_group.is_(False), task.group_label.in_(bindparam("outs", expanding=True))),
        ),
    ]
    if kind != TaskKind.RED_TEAM:
        conditions.append(task.rule_id.in_(bindparam("rules", expanding=True)))
    return conditions


def _person_condition() -> ColumnElement[bool]:
    """Still not opted out and under the daily cap (tasks claimed since the start of ``now``'s UTC day)."""
    claimed_today = (
        select(func.count(_MINE.id))
        .where(
            _MINE.participant_id == bindparam("who"),
            _MINE.claimed_at >= bindparam("day_start"),
            _MINE.claimed_at < bindparam("day_end"),
        )
        .scalar_subquery()
    )
    return exists(
        select(StarParticipant.id).where(
            StarParticipant.id == bindparam("who"),
            StarParticipant.opted_out.is_(False),
            claimed_today < StarParticipant.daily_cap,
        )
    )


_BUILDING = threading.Lock()


def _claim_statement(kind: str) -> Any:
    """:func:`_built_claim_statement`, built by one thread at a time: the web's request threads all ask
    for it at a worker's start, and the statements share the module's aliases (``_OTHER``, ``_MINE``).
    A loaded run once logged an unadapted ``_OTHER.participant_id`` and 151 empty claims while tasks
    were open; not reproduced since, and building under a lock costs nothing after the first claim."""
    with _BUILDING:
        return _built_claim_statement(kind)


@lru_cache(maxsize=len(TASK_ROLE))
def _built_claim_statement(kind: str) -> Any:
    """``UPDATE star_tasks SET claimed WHERE id = (oldest eligible) AND still eligible RETURNING id``.

    On PostgreSQL the candidate is picked ``FOR UPDATE SKIP LOCKED``: claimers running at once take
    different tasks instead of all waiting on the same row and then finding it gone (which read as "no task
    left" while the queue was full). SQLite has one writer at a time and ignores the clause.

    Built once per kind, with the claimer's values as bound parameters (``_claim_params``): building it is
    far slower than running it.
    """
    first = (
        select(_CANDIDATE.id)
        .where(*_task_conditions(_CANDIDATE, kind))
        .order_by(_CANDIDATE.id)
        .limit(1)
        .with_for_update(skip_locked=True)  # PostgreSQL: concurrent claimers pick different rows
        .scalar_subquery()
    )
    return (
        update(StarTask)
        .where(StarTask.id == first, *_claim_conditions(StarTask, kind))
        .values(status=TaskStatus.CLAIMED, participant_id=bindparam("who"), claimed_at=bindparam("now"))
        .returning(StarTask.id)
    )


def _claim_conditions(task: Any, kind: str, reopened: bool = False) -> list[ColumnElement[bool]]:
    """The whole rule a claim hands ``task`` to the claimer by: the task may go to them, and they are still
    in and under their daily cap. The claim and ``open_for`` (the progress line's count) both use it, so
    the count never promises a task the claim will not give."""
    return [*_task_conditions(task, kind, reopened), _person_condition()]


@lru_cache(maxsize=len(TASK_ROLE))
def _built_count_statement(kind: str) -> Any:
    """``SELECT count(*)`` of the tasks ``_claim_conditions`` would let the claimer take now."""
    return select(func.count(StarTask.id)).where(*_claim_conditions(StarTask, kind, reopened=True))


def open_for(
    session: Session, who: _Claimant | None, now: datetime | None = None, reopened: Iterable[int] = ()
) -> int:
    """How many tasks of ``who``'s kind a claim could hand them now, by the claim's own rule (matching,
    one task per dialogue, the daily cap); ``reopened``: claims past their time, which a claim releases
    first. None (role or opt-out rules them out): 0. Reads only."""
    if who is None:
        return 0
    with _BUILDING:
        statement = _built_count_statement(who.kind)
    params = _claim_params(who, _utc(now)) | {"reopened": sorted(reopened)}
    return int(session.scalar(statement, params) or 0)


def utc_day(now: datetime) -> tuple[datetime, datetime]:
    """The UTC day ``now`` falls in, [start, end): the day of the daily cap, and of "done today"."""
    day = _utc(now).replace(hour=0, minute=0, second=0, microsecond=0)
    return day, day + timedelta(days=1)


def _claim_params(who: _Claimant, now: datetime, avoid: Iterable[int] = ()) -> dict[str, Any]:
    """The bound values of ``_claim_statement`` for this claimer at ``now``, passing over ``avoid``."""
    day_start, day_end = utc_day(now)
    return {
        "campaign": who.campaign_id,
        "who": who.participant_id,
        "ins": sorted(who.ins),
        "outs": sorted(who.outs),
        "rules": sorted(who.rules),
        "avoid": sorted(avoid),
        "day_start": day_start,
        "day_end": day_end,
        "now": now,
    }


def _utc(now: datetime | None) -> datetime:
    """``now`` as aware UTC (naive is taken as UTC); the store compares UTC times."""
    if now is None:
        return utcnow()
    return now.replace(tzinfo=UTC) if now.tzinfo is None else now.astimezone(UTC)


def _claimant(session: Session, participant_id: int, kind: str) -> _Claimant | None:
    """Read the person; None when their role or opt-out rules them out before any query."""
    person = session.get(StarParticipant, participant_id)
    if person is None:
        raise UserError(f"no participant with id {participant_id}")
    if person.opted_out or TASK_ROLE[kind] not in (person.roles or []):
        return None
    spec = campaign_spec(session.get_one(StarCampaign, person.campaign_id))
    ins, outs = group_memberships(person, spec)
    return _Claimant(
        participant_id=person.id,
        campaign_id=person.campaign_id,
        kind=kind,
        ins=frozenset(ins),
        outs=frozenset(outs),
        rules=frozenset(qualified_rules(spec, person.expertise or [])),
    )


def _backoff(attempt: int) -> float:
    """Seconds to wait after a lock conflict, with jitter so competing claimers do not retry in step."""
    return random.uniform(0.005, 0.02) * (attempt + 1)


def claim_next(
    sessions: sessionmaker[Session], participant_id: int, kind: str, now: datetime | None = None
) -> int | None:
    """Atomically claim the oldest task of ``kind`` this person may take; None when there is none."""
    with sessions() as session:
        who = claimant(session, participant_id, kind)
    return claim_as(sessions, who, now)


def claimant(session: Session, participant_id: int, kind: str) -> _Claimant | None:
    """Who claims, as ``claim_as`` needs it (their groups and qualified rules); None when their role or
    opt-out rules them out. Read in a caller's transaction, it costs no round trip for rows already there."""
    if kind not in TASK_ROLE:
        raise UserError(f"unknown task kind {kind!r} (kinds: {', '.join(TASK_ROLE)})")
    return _claimant(session, participant_id, kind)


def claim_as(
    sessions: sessionmaker[Session],
    who: _Claimant | None,
    now: datetime | None = None,
    avoid: Iterable[int] = (),
) -> int | None:
    """The claim itself: one conditional UPDATE in its own transaction, retried on a lock past the busy
    timeout or a lost race (PostgreSQL). Tasks in ``avoid`` (one just skipped) are passed over."""
    if who is None:
        return None
    statement, params = _claim_statement(who.kind), _claim_params(who, _utc(now), avoid)

    def claim() -> int | None:
        with sessions.begin() as session:
            return session.scalar(statement, params)

    return retry(claim, on=(OperationalError, IntegrityError), attempts=RETRIES, wait=_backoff)


def release_expired_claims(
    session: Session,
    campaign: StarCampaign,
    timeout: timedelta,
    now: datetime | None = None,
    keep: Iterable[int] = (),
) -> list[int]:
    """Put claimed tasks older than ``timeout`` back in the queue (open, nobody's); their ids.

    People close tabs and go home: without this a claimed task would wait for them forever. ``keep`` names
    claimed tasks still in active use (a red-team chat with a recent turn) that stay claimed however old.
    The claimer no longer appears among the dialogue's tasks, so they may be matched to it again later,
    but never twice at once (the unique constraint still holds). One conditional UPDATE, so a task
    submitted at the same moment is either done or released, never both.
    """
    cutoff = _utc(now) - timeout
    released = session.scalars(
        update(StarTask)
        .where(
            StarTask.campaign_id == campaign.id,
            StarTask.status == TaskStatus.CLAIMED,
            StarTask.claimed_at < cutoff,
            StarTask.id.not_in(list(keep)),
        )
        .values(status=TaskStatus.OPEN, participant_id=None, claimed_at=None)
        .returning(StarTask.id)
        .execution_options(synchronize_session="fetch")  # loaded tasks see the release
    ).all()
    session.flush()
    return sorted(released)


def release_claim(session: Session, task_id: int, participant_id: int) -> bool:
    """Put one claimed task back in the queue (open, nobody's, as if never claimed) if this person still
    holds it; whether it was released. One conditional UPDATE, so a task submitted at the same moment is
    either done or released, never both. Like an expired claim it leaves no trace on the person: not in
    their claims of the day (the daily cap), not in their finished work, not among the dialogue's people."""
    released = session.scalar(
        update(StarTask)
        .where(
            StarTask.id == task_id,
            StarTask.status == TaskStatus.CLAIMED,
            StarTask.participant_id == participant_id,
        )
        .values(status=TaskStatus.OPEN, participant_id=None, claimed_at=None)
        .returning(StarTask.id)
        .execution_options(synchronize_session="fetch")  # a loaded task sees the release
    )
    session.flush()
    return released is not None


# --- dialogues ------------------------------------------------------------------------------------------


def _claimed_task(session: Session, task_id: int, kinds: tuple[str, ...]) -> StarTask:
    """The task, which must be of one of ``kinds`` and claimed (not open, not done)."""
    task = session.get(StarTask, task_id)
    if task is None:
        raise UserError(f"no task with id {task_id}")
    if task.kind not in kinds:
        raise UserError(f"task {task_id} is a {task.kind} task, not {' or '.join(kinds)}")
    if task.status != TaskStatus.CLAIMED:
        raise UserError(f"task {task_id} is {task.status}, not claimed; claim it before submitting")
    return task


def _turns(task_id: int, turns: Sequence[Sequence[Any]], now: datetime) -> list[StarTurn]:
    """Validated turns: (role, text) or (role, text, created_at); at least one."""
    if not turns:
        raise UserError(f"task {task_id}: a dialogue needs at least one turn")
    rows = []
    for index, turn in enumerate(turns):
        role, text, *rest = turn
        if role not in TURN_ROLES:
            raise UserError(
                f"task {task_id}: turn {index} role {role!r} is not one of {', '.join(TURN_ROLES)}"
            )
        created = _utc(rest[0]) if rest and rest[0] is not None else now
        rows.append(StarTurn(index=index, role=role, text=str(text), created_at=created))
    return rows


def submit_dialogue(
    session: Session,
    task_id: int,
    topic: str,
    turns: Sequence[Sequence[Any]],
    target_model: str,
    pre_annotation: dict[str, Any] | None = None,
    machine: bool = False,
    now: datetime | None = None,
) -> int:
    """Finish a red-team task: store the dialogue and its turns, open its annotate tasks; the dialogue id."""
    now = _utc(now)
    task = _claimed_task(session, task_id, (TaskKind.RED_TEAM,))
    campaign = session.get_one(StarCampaign, task.campaign_id)
    dialogue = StarDialogue(
        campaign_id=task.campaign_id,
        instruction_id=task.instruction_id,
        red_teamer_id=task.participant_id,
        topic=topic,
        target_model=target_model,
        machine=machine,
        started_at=task.claimed_at,
        finished_at=now,
        pre_annotation=dict(pre_annotation or {}),
        turns=_turns(task_id, turns, now),
    )
    session.add(dialogue)
    session.flush()
    task.dialogue_id, task.status, task.done_at, task.machine = dialogue.id, TaskStatus.DONE, now, machine
    session.add_all(_annotate_tasks(session, campaign, task, dialogue.id))
    session.flush()
    return dialogue.id


def _new_task(source: StarInstruction | StarTask, kind: str, instruction_id: int, **columns: Any) -> StarTask:
    """A task of ``kind`` on instruction ``instruction_id``, with the campaign, rule and group of ``source``
    (the instruction itself, or the task it follows from)."""
    return StarTask(
        campaign_id=source.campaign_id,
        kind=kind,
        instruction_id=instruction_id,
        rule_id=source.rule_id,
        group_label=source.group_label,
        **columns,
    )


def _annotate_tasks(session: Session, campaign: StarCampaign, red_team: StarTask, dialogue_id: int) -> list:
    """The annotate tasks of a dialogue, by its annotation arm: (in_group, extra) per task."""
    spec = campaign_spec(campaign)
    k = spec.annotators_per_dialogue
    targeted = _targets_group(spec, red_team.rule_id, red_team.group_label)
    arm = _arm(session, campaign, spec, dialogue_id) if targeted else None
    wanted: list[tuple[bool | None, bool]] = {
        None: [(None, False)] * k,
        "in_group": [(True, False)] * k,
        "out_group": [(False, False)] * k,
        "both": [(True, False)] * k + [(False, True)] * k,
    }[arm]
    return [
        _new_task(
            red_team,
            TaskKind.ANNOTATE,
            red_team.instruction_id,
            dialogue_id=dialogue_id,
            in_group=in_group,
            ablation=extra,
        )
        for in_group, extra in wanted
    ]


def _arm(session: Session, campaign: StarCampaign, spec: CampaignSpec, dialogue_id: int) -> str:
    """The annotation arm of a group-targeted dialogue: its place among the campaign's group-targeted
    dialogues in order picks it from one fixed sequence (``balance.arm_of``), so after any number of them
    each arm's count is within one of its share."""
    earlier = session.scalar(
        select(func.count(StarTask.id)).where(
            StarTask.campaign_id == campaign.id,
            StarTask.kind == TaskKind.RED_TEAM,
            StarTask.dialogue_id < dialogue_id,
            StarTask.in_group.is_not(None),
        )
    )
    return ARMS[arm_of(int(earlier or 0), spec.annotation_arms.shares(), campaign.seed)]


def dialogue_arms(session: Session, campaign: StarCampaign) -> dict[int, str]:
    """Each dialogue's annotation arm (``in-group``, ``out-group``, ``both`` or ``none``), read off the
    requirements of its annotate tasks, which is where the arm was put into effect."""
    rows = session.execute(
        select(StarTask.dialogue_id, StarTask.in_group).where(
            StarTask.campaign_id == campaign.id,
            StarTask.kind == TaskKind.ANNOTATE,
        )
    )
    seen: dict[int, set[bool | None]] = {}
    for dialogue_id, in_group in rows:
        seen.setdefault(dialogue_id, set()).add(in_group)
    return {d: ARM_OF_FLAGS.get(frozenset(flags), NO_ARM) for d, flags in seen.items()}


# --- annotations and arbitration ------------------------------------------------------------------------


def _check_annotation(session: Session, task_id: int, rating: int, reason: str) -> None:
    """Reject a rating off the scale, an empty reason, or a task that is not a claimed annotate/arbitrate."""
    task = _claimed_task(session, task_id, (TaskKind.ANNOTATE, TaskKind.ARBITRATE))
    likert = campaign_spec(session.get_one(StarCampaign, task.campaign_id)).likert
    if isinstance(rating, bool) or not isinstance(rating, int) or not 0 <= rating < len(likert):
        raise UserError(
            f"task {task_id}: rating {rating!r} is not on the {len(likert)}-point scale 0..{len(likert) - 1}"
        )
    if not isinstance(reason, str) or not reason.strip():
        raise UserError(f"task {task_id}: a rating needs a reason (value: {reason!r})")


def _write_annotation(
    session: Session, task_id: int, rating: int, reason: str, machine: bool, now: datetime
) -> int:
    """Close the task (the conditional update goes first: it takes the write lock), store, arbitrate?"""
    closed = session.scalar(
        update(StarTask)
        .where(StarTask.id == task_id, StarTask.status == TaskStatus.CLAIMED)
        .values(status=TaskStatus.DONE, done_at=now, machine=machine)
        .returning(StarTask.id)
    )
    if closed is None:
        raise UserError(f"task {task_id} was submitted already")
    task = session.get_one(StarTask, task_id)
    session.refresh(task)
    dialogue_id = task.dialogue_id
    session.execute(select(StarDialogue.id).where(StarDialogue.id == dialogue_id).with_for_update())
    annotation = StarAnnotation(
        dialogue_id=dialogue_id,
        task_id=task_id,
        annotator_id=task.participant_id,
        rating=rating,
        reason=reason.strip(),
        kind=task.kind,
        ablation=task.ablation,
        machine=machine,
        created_at=now,
    )
    session.add(annotation)
    session.flush()
    if task.kind == TaskKind.ANNOTATE and not task.ablation:
        _maybe_arbitrate(session, task)
    return annotation.id


def submit_annotation(
    target: sessionmaker[Session] | Session,
    task_id: int,
    rating: int,
    reason: str,
    machine: bool = False,
    now: datetime | None = None,
) -> int:
    """Store a rating (0-based Likert point) with its reason; returns the annotation id.

    With a session factory the write runs in its own transaction, retried on lock conflicts (use this from
    concurrent workers); with a session it joins the caller's transaction.
    """
    now = _utc(now)
    if isinstance(target, Session):
        _check_annotation(target, task_id, rating, reason)
        return _write_annotation(target, task_id, rating, reason, machine, now)
    with target() as session:
        _check_annotation(session, task_id, rating, reason)

    def write() -> int:
        with target.begin() as session:
            return _write_annotation(session, task_id, rating, reason, machine, now)

    return retry(write, on=OperationalError, attempts=RETRIES, wait=_backoff)


def _maybe_arbitrate(session: Session, task: StarTask) -> None:
    """Open the dialogue's one arbitration task once all primary ratings are in and two differ by the gap."""
    spec = campaign_spec(session.get_one(StarCampaign, task.campaign_id))
    rows = session.execute(
        select(StarTask.in_group, StarAnnotation.rating)
        .outerjoin(StarAnnotation, StarAnnotation.task_id == StarTask.id)
        .where(
            StarTask.dialogue_id == task.dialogue_id,
            StarTask.kind == TaskKind.ANNOTATE,
            StarTask.ablation.is_(False),
        )
    ).all()
    ratings = [rating for _, rating in rows]
    if None in ratings or not spec.needs_arbitration(ratings):
        return
    if session.scalar(select(StarTask.id).where(StarTask.arbitration_of == task.dialogue_id)) is not None:
        return
    try:
        with session.begin_nested():
            session.add(
                _new_task(
                    task,
                    TaskKind.ARBITRATE,
                    task.instruction_id,
                    dialogue_id=task.dialogue_id,
                    arbitration_of=task.dialogue_id,
                    in_group=task.in_group,
                )
            )
    except IntegrityError:  # another submitter opened it first: the unique constraint keeps it to one
        pass


def arbitration_view(session: Session, task_id: int) -> ArbitrationView:
    """The dialogue and the primary ratings with reasons, for the arbitrator of an arbitrate task."""
    task = session.get(StarTask, task_id)
    if task is None or task.kind != TaskKind.ARBITRATE:
        raise UserError(f"task {task_id} is not an arbitration task")
    dialogue = session.get_one(StarDialogue, task.arbitration_of)
    likert = campaign_spec(session.get_one(StarCampaign, task.campaign_id)).likert
    annotations = session.scalars(
        select(StarAnnotation)
        .where(
            StarAnnotation.dialogue_id == dialogue.id,
            StarAnnotation.kind == TaskKind.ANNOTATE,
            StarAnnotation.ablation.is_(False),
        )
        .order_by(StarAnnotation.id)
    ).all()
    return ArbitrationView(
        task_id=task.id,
        dialogue_id=dialogue.id,
        rule_id=task.rule_id,
        group_label=task.group_label,
        instruction=dialogue.instruction.text,
        topic=dialogue.topic,
        target_model=dialogue.target_model,
        turns=[(turn.role, turn.text) for turn in dialogue.turns],
        ratings=[
            Rating(a.annotator_id, a.rating, likert[a.rating], a.reason, a.machine) for a in annotations
        ],
    )


# --- reporting ------------------------------------------------------------------------------------------


def _may_take(
    person: StarParticipant, task: StarTask, spec: CampaignSpec, ins: set[str], outs: set[str]
) -> bool:
    """Whether the person could ever take the task, ignoring today's cap and who has seen the dialogue."""
    if person.opted_out or TASK_ROLE[task.kind] not in (person.roles or []):
        return False
    if task.in_group is True and task.group_label not in ins:
        return False
    if task.in_group is False and task.group_label not in outs:
        return False
    return task.kind == TaskKind.RED_TEAM or task.rule_id in qualified_rules(spec, person.expertise or [])


def _requirement(spec: CampaignSpec, task: StarTask) -> str:
    """How a shortfall row describes what the task needs."""
    text = REQUIREMENT[task.in_group]
    rule: PolicyRule = spec.rule(task.rule_id)
    if task.kind != TaskKind.RED_TEAM and rule.expertise:
        text += f"; expertise: {', '.join(rule.expertise)}"
    return text


def shortfalls(session: Session, campaign: StarCampaign) -> list[Shortfall]:
    """Open tasks nobody eligible exists for, by kind, group and requirement; marks them waiting.

    Re-checked on every call: a waiting task someone may now take goes back to open.
    """
    spec = campaign_spec(campaign)
    people = session.scalars(select(StarParticipant).where(StarParticipant.campaign_id == campaign.id)).all()
    groups = {p.id: group_memberships(p, spec) for p in people}
    tasks = session.scalars(
        select(StarTask).where(StarTask.campaign_id == campaign.id, StarTask.status.in_(CLAIMABLE))
    ).all()
    seen = _seen_by(session, campaign.id)
    candidates: dict[tuple[Any, ...], list[int]] = {}
    missing: Counter[tuple[str, str, str]] = Counter()
    for task in tasks:
        key = (task.kind, task.group_label, task.in_group, task.rule_id)
        if key not in candidates:
            candidates[key] = [p.id for p in people if _may_take(p, task, spec, *groups[p.id])]
        excluded = seen.get(task.dialogue_id, set()) if task.dialogue_id is not None else set()
        ok = any(pid not in excluded for pid in candidates[key])
        task.status = TaskStatus.OPEN if ok else TaskStatus.WAITING
        if not ok:
            missing[(task.kind, task.group_label, _requirement(spec, task))] += 1
    session.flush()
    return [Shortfall(kind, label, req, n) for (kind, label, req), n in sorted(missing.items())]


def _seen_by(session: Session, campaign_id: int) -> dict[int, set[int]]:
    """For each dialogue, the people who have had any task on it."""
    seen: dict[int, set[int]] = {}
    rows = session.execute(
        select(StarTask.dialogue_id, StarTask.participant_id).where(
            StarTask.campaign_id == campaign_id,
            StarTask.dialogue_id.is_not(None),
            StarTask.participant_id.is_not(None),
        )
    )
    for dialogue_id, participant_id in rows:
        seen.setdefault(dialogue_id, set()).add(participant_id)
    return seen


def list_dialogues(
    session: Session, campaign: StarCampaign, machine: bool | None = False
) -> list[StarDialogue]:
    """The campaign's dialogues: human-made by default, machine-made with True, both only with None."""
    query = select(StarDialogue).where(StarDialogue.campaign_id == campaign.id)
    if machine is not None:
        query = query.where(StarDialogue.machine.is_(machine))
    return list(session.scalars(query.order_by(StarDialogue.id)))


def list_annotations(
    session: Session, campaign: StarCampaign, machine: bool | None = False, ablation: bool | None = False
) -> list[StarAnnotation]:
    """The campaign's annotations (all kept, arbitrations too): human primary ones unless asked otherwise."""
    query = (
        select(StarAnnotation)
        .join(StarDialogue, StarDialogue.id == StarAnnotation.dialogue_id)
        .where(StarDialogue.campaign_id == campaign.id)
    )
    if machine is not None:
        query = query.where(StarAnnotation.machine.is_(machine))
    if ablation is not None:
        query = query.where(StarAnnotation.ablation.is_(ablation))
    return list(session.scalars(query.order_by(StarAnnotation.id)))
