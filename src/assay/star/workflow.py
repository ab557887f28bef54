"""STAR's live workflow: people claiming tasks, chatting, rating and handing work back, through any face.

Every state change is one function here, and each decides in full whether it is allowed: ``claim``,
``give_back`` (the holder hands a task back: open for anyone at once, no trace on the holder's day or done
count, one event in the audit trail) and ``skip`` (give back, then claim another task of the kind on
another dialogue), ``commit_topic``, ``add_message`` and ``save_reply`` (the red-team chat, stored turn by
turn the moment each turn exists), ``finish`` (the dialogue with its pre-annotation goes to the engine,
which opens the annotation tasks), ``submit_rating`` (annotation or arbitration; the engine opens the one
arbitration task when two primary ratings differ by the campaign's gap), ``expire`` (claims past the
campaign's timeout go back to the queue) and ``sweep`` (expiry, the claims of a stopped ``assay star
simulate``, and shortfall re-checks for every campaign: what a server runs periodically and ``assay star
sweep`` runs once).

Who sees what is decided here too, by reads that never write (a page view takes no write lock):
``open_task``, ``queue``, ``my_tasks``, ``claimable``, ``task_view`` and ``progress`` (the line every task
page and the queue show: done today, the daily cap, the tasks a claim could hand them now). A claim past
its time is hidden from its holder at once, before any sweep has released it, so the rule does not depend
on when the sweeper last ran. A red-team chat with a turn inside the timeout keeps its claim (someone is
typing).

Who asks is a ``Worker``: the pool entries an account acts as and the STAR roles it holds; the face builds
it from its own accounts. ``NotYours`` (no such task or pool entry of this worker: a face answers 404 so
ids reveal nothing) and ``NotAllowed`` (the roles do not allow it: 403) are the refusals besides
``UserError``.

Functions take a ``Session`` and flush, never commit (the caller owns the transaction), except those that
must not hold the caller's transaction open: ``claim`` and ``skip`` (the engine's atomic claim runs in its
own), ``save_reply`` and ``generate_reply`` (a model thread, after the request), and ``sweep``.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import delete, func, or_, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from assay.errors import UserError
from assay.models import Conversation, stream_chat
from assay.star import live, rehearsal
from assay.star.access import NotAllowed, NotYours  # re-exported: the faces catch them from here
from assay.star.agents import target_prompt
from assay.star.assign import (
    Rating,
    arbitration_view,
    campaign_spec,
    claim_as,
    claimant,
    open_for,
    release_claim,
    release_expired_claims,
    shortfalls,
    submit_annotation,
    submit_dialogue,
    utc_day,
)
from assay.star.dialogue import check_pre_annotation, mention_labels
from assay.star.spec import PolicyRule
from assay.store.enums import TASK_ROLE, TaskKind, TaskStatus
from assay.store.models import as_utc, utcnow
from assay.store.star_models import StarAnnotation, StarCampaign, StarDialogue, StarParticipant, StarTask
from assay.store.star_web_models import StarDraft, StarDraftTurn
from assay.store.web_models import WebAuditEvent

KIND_LABEL = {
    TaskKind.RED_TEAM: "red-team",
    TaskKind.ANNOTATE: "annotation",
    TaskKind.ARBITRATE: "arbitration",
}
IDLE_RESET = timedelta(minutes=10)  # a pause this long counts as a break for the reminder
RECENT_DONE = 10  # finished tasks a queue shows per campaign
GIVE_BACK = "star.give_back"  # the audit trail's action for a task given back (assay.web.audit.ACTIONS)
TASK_TARGET = "star task "  # ... and its target, before the task's id


@dataclass(frozen=True)
class Worker:
    """Who asks: the pool entries (participant ids) an account acts as, the STAR roles it holds, and the
    account (``user_id``, for the audit trail; None from the shell)."""

    participant_ids: frozenset[int]
    roles: frozenset[str]
    user_id: int | None = None

    def may(self, kind: str) -> bool:
        """Whether the account's roles allow tasks of this kind."""
        return TASK_ROLE[kind] in self.roles


@dataclass(frozen=True)
class Claim:
    """The outcome of ``claim``: the task (None when none is open for the person) and whether it is new."""

    task_id: int | None
    new: bool


@dataclass(frozen=True)
class GivenBack:
    """A task its holder gave back (open for anyone again) and, after a skip, the task claimed instead
    (None: no other task of the kind is open for them)."""

    task_id: int
    kind: str
    next_task_id: int | None = None


@dataclass(frozen=True)
class Progress:
    """The progress line of one pool entry: tasks finished today and claimed today (the UTC day of the daily
    cap, which counts claims: a task given back or expired is in neither), the cap, and per kind the entry
    may take how many tasks a claim could hand them now (``assign.open_for``: the claim's own rule, so a
    dialogue they rated already, or a reached cap, promises nothing)."""

    done_today: int
    claimed_today: int
    daily_cap: int
    left: dict[str, int]


@dataclass(frozen=True)
class QueueSection:
    """One campaign the worker acts in: what they hold, what they may claim, what they finished lately."""

    person: StarParticipant
    campaign: StarCampaign
    kinds: list[str]
    tasks: list[tuple[StarTask, datetime | None]]  # claimed tasks and when each goes back to the queue
    done: list[StarTask]
    timeout: int
    break_minutes: int
    progress: Progress

    def held(self, kind: str) -> StarTask | None:
        """The task of ``kind`` the person holds (at most one per kind), or None."""
        return next((task for task, _ in self.tasks if task.kind == kind), None)


@dataclass(frozen=True)
class BreakStatus:
    """The break reminder: due now, or in how many seconds (a face can show it then without a reload)."""

    minutes: int
    due: bool = False
    due_in: int = 0
    worked: int = 0  # minutes of continuous work so far


@dataclass(frozen=True)
class ReplyRequest:
    """What generating one model reply needs, read inside the request so the model thread reads nothing."""

    task_id: int
    draft_id: int
    index: int  # the index the reply takes in the draft
    conversation: Conversation
    settings: live.CampaignSettings


@dataclass(frozen=True)
class TaskView:
    """What the task's holder may see of it: never another annotator's rating; for arbitration the primary
    ratings with their reasons; for a red-team task the instruction and the chat so far."""

    task: StarTask
    campaign: StarCampaign
    rule: PolicyRule
    rules: list[PolicyRule]
    instruction: str | None  # red-team tasks only
    topic: str
    turns: list[tuple[str, str]]
    likert: list[str]
    earlier: list[Rating]  # arbitration only
    mine: StarAnnotation | None
    draft: StarDraft | None  # a red-team task being worked on
    awaiting: bool  # the draft's last message has no reply yet
    model_ready: bool
    mention_labels: list[str]
    deadline: datetime | None
    timeout: int
    break_minutes: int


# --- who sees what (reads only) -------------------------------------------------------------------------


def claimable_kinds(worker: Worker, person: StarParticipant) -> list[str]:
    """Kinds both the pool entry and the account allow (the engine checks the rest at the claim)."""
    roles = set(person.roles or [])
    return [kind for kind, role in TASK_ROLE.items() if role in roles and worker.may(kind)]


def _timeout(session: Session, campaign: StarCampaign) -> timedelta:
    """How long an untouched claim lasts in this campaign (an organiser's setting)."""
    return timedelta(minutes=live.settings_of(session, campaign).claim_timeout_minutes)


def _stale_and_active(
    session: Session, campaign: StarCampaign, now: datetime, among: Collection[int] | None = None
) -> tuple[list[int], set[int]]:
    """Claims older than the timeout, and those of them whose red-team chat had a turn within it."""
    cutoff = now - _timeout(session, campaign)
    query = select(StarTask.id).where(
        StarTask.campaign_id == campaign.id,
        StarTask.status == TaskStatus.CLAIMED,
        StarTask.claimed_at < cutoff,
    )
    if among is not None:
        query = query.where(StarTask.id.in_(list(among)))
    stale = list(session.scalars(query))
    if not stale:  # the usual case
        return [], set()
    drafts = select(StarDraft.task_id).where(StarDraft.task_id.in_(stale), StarDraft.updated_at >= cutoff)
    return stale, set(session.scalars(drafts))


def expired_claims(
    session: Session, campaign: StarCampaign, now: datetime, among: Collection[int] | None = None
) -> list[int]:
    """The campaign's claims past their time (optionally only ``among`` these task ids): what ``expire``
    would release now. Read only, so a page can hide them before a sweep has run."""
    stale, active = _stale_and_active(session, campaign, now, among)
    return [task_id for task_id in stale if task_id not in active]


def open_task(session: Session, worker: Worker, task_id: int, now: datetime | None = None) -> StarTask:
    """The worker's task: claimed (and not past its time) or finished by a pool entry they act as, of a
    kind their roles allow; ``NotYours`` otherwise, whatever the reason."""
    task = session.get(StarTask, task_id)
    if task is None or task.participant_id not in worker.participant_ids or not worker.may(task.kind):
        raise NotYours("no such task of yours")
    if task.status == TaskStatus.CLAIMED:
        campaign = session.get_one(StarCampaign, task.campaign_id)
        if _past_their_time(session, campaign, [task], now or utcnow()):
            raise NotYours("no such task of yours")
    return task


def _past_their_time(
    session: Session, campaign: StarCampaign, tasks: list[StarTask], now: datetime
) -> set[int]:
    """Which of these loaded claimed tasks ``expired_claims`` would release now. Their claim times are at
    hand, so the database is asked only about the stale ones (whether a chat on them is still active): one
    round trip fewer on every task a worker opens (issue 27's crowd)."""
    cutoff = now - _timeout(session, campaign)
    stale = [t.id for t in tasks if t.claimed_at is not None and as_utc(t.claimed_at) < cutoff]
    return set(expired_claims(session, campaign, now, among=stale)) if stale else set()


def person_of(session: Session, worker: Worker, participant_id: int | None) -> StarParticipant:
    """The pool entry the worker acts as: the one named, or their only one; ``NotYours`` otherwise."""
    if participant_id is None:
        if len(worker.participant_ids) > 1:
            raise NotYours("you act as several participants: say which with participant_id")
        participant_id = next(iter(worker.participant_ids), None)
    if participant_id is None or participant_id not in worker.participant_ids:
        raise NotYours("you do not act as that participant")
    return session.get_one(StarParticipant, participant_id)


def _people(session: Session, worker: Worker) -> list[StarParticipant]:
    """The pool entries the worker acts as, in a stable order (one per campaign)."""
    query = select(StarParticipant).where(StarParticipant.id.in_(worker.participant_ids))
    return list(session.scalars(query.order_by(StarParticipant.id)))


def claim_deadline(task: StarTask, settings: live.CampaignSettings) -> datetime | None:
    """When an untouched claim goes back to the queue (a red-team chat in use keeps it longer)."""
    if task.status != TaskStatus.CLAIMED or task.claimed_at is None:
        return None
    return as_utc(task.claimed_at) + timedelta(minutes=settings.claim_timeout_minutes)


def _held(session: Session, person: StarParticipant, now: datetime) -> list[StarTask]:
    """The person's claimed tasks still within their time, oldest claim first."""
    query = select(StarTask).where(
        StarTask.participant_id == person.id, StarTask.status == TaskStatus.CLAIMED
    )
    tasks = list(session.scalars(query.order_by(StarTask.claimed_at)))
    campaign = session.get_one(StarCampaign, person.campaign_id)
    gone = _past_their_time(session, campaign, tasks, now)
    return [t for t in tasks if t.id not in gone]


def _finished(session: Session, participant_ids: Collection[int], limit: int) -> list[StarTask]:
    """The ``limit`` tasks these pool entries finished last, newest first."""
    query = select(StarTask).where(
        StarTask.participant_id.in_(list(participant_ids)), StarTask.status == TaskStatus.DONE
    )
    return list(session.scalars(query.order_by(StarTask.done_at.desc()).limit(limit)))


def progress(
    session: Session, worker: Worker, person: StarParticipant, now: datetime | None = None
) -> Progress:
    """The pool entry's progress line (``Progress``) for the kinds the worker may claim. Reads only: the
    claims past their time that a claim would release first count as open."""
    now = now or utcnow()
    day_start, day_end = utc_day(now)
    mine = select(func.count(StarTask.id)).where(StarTask.participant_id == person.id)
    done = mine.where(
        StarTask.status == TaskStatus.DONE, StarTask.done_at >= day_start, StarTask.done_at < day_end
    )
    claimed = mine.where(StarTask.claimed_at >= day_start, StarTask.claimed_at < day_end)
    reopened = expired_claims(session, session.get_one(StarCampaign, person.campaign_id), now)
    left = {
        kind: open_for(session, claimant(session, person.id, kind), now, reopened)
        for kind in claimable_kinds(worker, person)
    }
    return Progress(
        done_today=int(session.scalar(done) or 0),
        claimed_today=int(session.scalar(claimed) or 0),
        daily_cap=person.daily_cap,
        left=left,
    )


def task_progress(session: Session, worker: Worker, task: StarTask, now: datetime | None = None) -> Progress:
    """The progress line on a task's page: that of the pool entry holding it (call ``open_task`` first)."""
    return progress(session, worker, person_of(session, worker, task.participant_id), now)


def queue(session: Session, worker: Worker, now: datetime | None = None) -> list[QueueSection]:
    """Each campaign the worker acts in: held tasks with their deadlines, claimable kinds, recent work and
    the progress line."""
    now = now or utcnow()
    sections = []
    for person in _people(session, worker):
        campaign = session.get_one(StarCampaign, person.campaign_id)
        settings = live.settings_of(session, campaign)
        sections.append(
            QueueSection(
                person=person,
                campaign=campaign,
                kinds=claimable_kinds(worker, person),
                tasks=[(t, claim_deadline(t, settings)) for t in _held(session, person, now)],
                done=_finished(session, [person.id], RECENT_DONE),
                timeout=settings.claim_timeout_minutes,
                break_minutes=settings.break_minutes,
                progress=progress(session, worker, person, now),
            )
        )
    return sections


def my_tasks(
    session: Session, worker: Worker, now: datetime | None = None, recent: int = 50
) -> list[StarTask]:
    """The worker's claimed tasks (by id), then the ``recent`` last finished; kinds their roles allow."""
    now = now or utcnow()
    held = sorted((t for p in _people(session, worker) for t in _held(session, p, now)), key=lambda t: t.id)
    tasks = [*held, *_finished(session, worker.participant_ids, recent)]
    return [t for t in tasks if worker.may(t.kind)]


def claimable(session: Session, worker: Worker) -> list[tuple[StarParticipant, StarCampaign, list[str]]]:
    """Per pool entry the worker acts as: its campaign and the kinds it may claim."""
    people = _people(session, worker)
    return [(p, session.get_one(StarCampaign, p.campaign_id), claimable_kinds(worker, p)) for p in people]


def campaign_of(session: Session, task: StarTask) -> StarCampaign:
    """The task's campaign."""
    return session.get_one(StarCampaign, task.campaign_id)


def _draft(session: Session, task: StarTask) -> StarDraft | None:
    """The current claimer's draft; one left by an earlier claimer is not theirs to see (read only)."""
    draft = session.scalar(select(StarDraft).where(StarDraft.task_id == task.id))
    return draft if draft is not None and draft.participant_id == task.participant_id else None


def awaiting_reply(draft: StarDraft) -> bool:
    """Whether the last turn is a message the model has not answered (a failed or cut-off reply)."""
    return bool(draft.turns) and draft.turns[-1].role == "user"


def _dialogue_turns(session: Session, task: StarTask) -> tuple[str, list[tuple[str, str]]]:
    """The topic and turns of the task's submitted dialogue ("" and none before there is one)."""
    dialogue = session.get(StarDialogue, task.dialogue_id) if task.dialogue_id else None
    return (dialogue.topic, [(t.role, t.text) for t in dialogue.turns]) if dialogue else ("", [])


def task_view(session: Session, task: StarTask) -> TaskView:
    """Everything the task's page and API show its holder (call ``open_task`` first)."""
    campaign = campaign_of(session, task)
    spec, settings = campaign_spec(campaign), live.settings_of(session, campaign)
    draft = (
        _draft(session, task)
        if task.kind == TaskKind.RED_TEAM and task.status == TaskStatus.CLAIMED
        else None
    )
    topic, turns = _dialogue_turns(session, task)
    if draft is not None:
        topic, turns = draft.topic, [(t.role, t.text) for t in draft.turns]
    mine = session.scalar(select(StarAnnotation).where(StarAnnotation.task_id == task.id))
    return TaskView(
        task=task,
        campaign=campaign,
        rule=spec.rule(task.rule_id),
        rules=list(spec.rules),
        instruction=task.instruction.text if task.kind == TaskKind.RED_TEAM else None,
        topic=topic,
        turns=turns,
        likert=list(spec.likert),
        earlier=arbitration_view(session, task.id).ratings if task.kind == TaskKind.ARBITRATE else [],
        mine=mine,
        draft=draft,
        awaiting=draft is not None and awaiting_reply(draft),
        model_ready=bool(settings.target_model),
        mention_labels=mention_labels(spec),
        deadline=claim_deadline(task, settings),
        timeout=settings.claim_timeout_minutes,
        break_minutes=settings.break_minutes,
    )


def continuous_work(session: Session, participant_ids: list[int], now: datetime | None = None) -> timedelta:
    """How long the person has worked without a pause of ``IDLE_RESET``, from their claims, submissions
    and chat turns over the last day: the break reminder's clock, kept server-side so it survives reloads
    and works without JavaScript."""
    now = now or utcnow()
    since = now - timedelta(days=1)
    rows = session.execute(
        select(StarTask.claimed_at, StarTask.done_at).where(
            StarTask.participant_id.in_(participant_ids),
            or_(StarTask.claimed_at >= since, StarTask.done_at >= since),
        )
    ).all()
    drafts = session.scalars(
        select(StarDraft.updated_at).where(
            StarDraft.participant_id.in_(participant_ids), StarDraft.updated_at >= since
        )
    ).all()
    moments = sorted({as_utc(t) for row in rows for t in row if t is not None} | {as_utc(t) for t in drafts})
    start = previous = now
    for moment in reversed([m for m in moments if m <= now]):
        if previous - moment > IDLE_RESET:
            break
        start = previous = moment
    return now - start


def break_status(
    session: Session, participant_ids: list[int], minutes: int, now: datetime | None = None
) -> BreakStatus:
    """The reminder for people who set ``minutes`` (0: off): due now, or in how many seconds."""
    if minutes <= 0 or not participant_ids:
        return BreakStatus(minutes=0)
    worked = continuous_work(session, participant_ids, now)
    due_in = int((timedelta(minutes=minutes) - worked).total_seconds())
    return BreakStatus(minutes, due_in <= 0, due_in, int(worked.total_seconds() // 60))


# --- claims -------------------------------------------------------------------------------------------


def claim(
    sessions: sessionmaker[Session],
    worker: Worker,
    participant_id: int | None,
    kind: str,
    now: datetime | None = None,
    avoid: Collection[int] = (),
) -> Claim:
    """The next task of ``kind`` for the pool entry, or the one of that kind it already holds (nobody hoards
    tasks others could do). The campaign's expired claims are released first, so what is free now is
    offered now; the engine's ``claim_next`` then enforces every matching rule atomically. Tasks in
    ``avoid`` are passed over (a skip's), and so are those the person gave back (``given_back``) unless
    nothing else is left for them."""
    now = now or utcnow()
    with sessions.begin() as session:
        person = person_of(session, worker, participant_id)
        if kind not in claimable_kinds(worker, person):
            raise NotAllowed(f"you may not take {KIND_LABEL.get(kind, kind)} tasks")
        expire(session, session.get_one(StarCampaign, person.campaign_id), now)
        held = [t.id for t in _held(session, person, now) if t.kind == kind]
        who = None if held else claimant(session, person.id, kind)
        later = set() if held else given_back(session, person) - set(avoid)
    if held:
        return Claim(held[0], False)
    task = claim_as(sessions, who, now, {*avoid, *later})
    if task is None and later:  # only what they gave back is left for them: offer it after all
        task = claim_as(sessions, who, now, avoid)
    return Claim(task, True)


def _given_back_note(campaign: StarCampaign, person: StarParticipant) -> str:
    """How a give-back's audit detail ends: whose it was, which ``given_back`` finds it by."""
    return (
        f" of campaign {campaign.name} given back by pool member {person.external_id}; open for anyone again"
    )


def given_back(session: Session, person: StarParticipant) -> set[int]:
    """The tasks this pool member gave back (or skipped), with the other tasks of those dialogues: a claim
    passes over them while the person has other work, as Label Studio and Potato do with a skip, so
    "give back" then "claim next" does not hand the same task straight back. Anyone else gets them at once.

    Read from the audit trail's ``GIVE_BACK`` events, found by how their detail ends (the release itself
    leaves no trace on the task); the action is indexed (migration 0018), so a claim reads those events
    only."""
    campaign = session.get_one(StarCampaign, person.campaign_id)
    targets = session.scalars(
        select(WebAuditEvent.target).where(
            WebAuditEvent.action == GIVE_BACK,
            WebAuditEvent.detail.endswith(_given_back_note(campaign, person), autoescape=True),
        )
    ).all()
    tasks = {int(t.removeprefix(TASK_TARGET)) for t in targets if t.removeprefix(TASK_TARGET).isdigit()}
    if not tasks:
        return set()
    dialogues = select(StarTask.dialogue_id).where(StarTask.id.in_(tasks), StarTask.dialogue_id.is_not(None))
    siblings = session.scalars(select(StarTask.id).where(StarTask.dialogue_id.in_(dialogues)))
    return tasks | set(siblings)


def give_back(session: Session, worker: Worker, task_id: int, now: datetime | None = None) -> GivenBack:
    """The holder hands a task back before finishing it: it is open for anyone at once (no sweep needed),
    counts neither against the holder's daily cap nor in their finished work, and its red-team draft goes.
    Only the holder of a claim still in time may (``NotYours`` otherwise, as for opening it); a finished
    task stays finished. One event in the audit trail (``GIVE_BACK``), in the same transaction."""
    now = now or utcnow()
    task = open_task(session, worker, task_id, now)
    if task.status != TaskStatus.CLAIMED:
        raise UserError(f"task {task_id} is finished; only a task you are working on can be given back")
    person = session.get_one(StarParticipant, task.participant_id)
    campaign = campaign_of(session, task)
    if not release_claim(session, task.id, person.id):
        raise UserError(f"task {task_id} was submitted or released meanwhile")
    session.execute(delete(StarDraft).where(StarDraft.task_id == task.id))  # turns: ON DELETE CASCADE
    session.add(
        WebAuditEvent(
            actor_id=worker.user_id,
            action=GIVE_BACK,
            target=f"{TASK_TARGET}{task.id}",
            detail=f"{KIND_LABEL[task.kind]} task{_given_back_note(campaign, person)}",
        )
    )
    session.flush()
    return GivenBack(task.id, task.kind)


def skip(
    sessions: sessionmaker[Session], worker: Worker, task_id: int, now: datetime | None = None
) -> GivenBack:
    """``give_back``, then claim the next task of the same kind, passing over the skipped dialogue (an
    annotator who skips one rating of a dialogue is not handed its other one). The skipped task stays in the
    person's queue for later: their claims pass over it while they have other work (``given_back``)."""
    now = now or utcnow()
    with sessions.begin() as session:
        task = open_task(session, worker, task_id, now)
        person_id, dialogue_id = task.participant_id, task.dialogue_id
        given = give_back(session, worker, task_id, now)
        avoid = {task_id}
        if dialogue_id is not None:
            avoid |= set(session.scalars(select(StarTask.id).where(StarTask.dialogue_id == dialogue_id)))
    claimed = claim(sessions, worker, person_id, given.kind, now, avoid)
    return GivenBack(given.task_id, given.kind, claimed.task_id)


def expire(session: Session, campaign: StarCampaign, now: datetime) -> list[int]:
    """Release the campaign's claims older than its timeout (``release_expired_claims``) unless a red-team
    chat on them had a turn within the timeout; the released tasks' drafts go. Returns the task ids."""
    stale, active = _stale_and_active(session, campaign, now)
    if len(stale) == len(active):  # nothing to release: read only, no write lock taken
        return []
    released = release_expired_claims(session, campaign, _timeout(session, campaign), now, keep=active)
    if released:
        session.execute(delete(StarDraft).where(StarDraft.task_id.in_(released)))  # turns: ON DELETE CASCADE
        session.flush()
    return released


@dataclass(frozen=True)
class SweepResult:
    """What one sweep did: claims released, and open tasks nobody in the pool may take (now waiting)."""

    released: int
    waiting: int


def sweep(sessions: sessionmaker[Session], now: datetime) -> SweepResult:
    """The periodic work of every campaign, one short transaction each: release expired claims and those
    a stopped ``assay star simulate`` held (``rehearsal.release_orphaned``: at once, not after the
    timeout), and re-check shortfalls (tasks nobody may take are marked waiting, and back to open once
    someone may)."""
    with sessions() as session:
        campaign_ids = list(session.scalars(select(StarCampaign.id).order_by(StarCampaign.id)))
    released = waiting = 0
    for campaign_id in campaign_ids:
        released += rehearsal.release_orphaned(sessions, campaign_id)
        with sessions.begin() as session:
            campaign = session.get_one(StarCampaign, campaign_id)
            released += len(expire(session, campaign, now))
            waiting += sum(row.tasks for row in shortfalls(session, campaign))
    return SweepResult(released, waiting)


# --- the red-team chat ----------------------------------------------------------------------------------


def _working_on(session: Session, worker: Worker, task_id: int, now: datetime) -> StarTask:
    """The worker's red-team task they are still working on, or a one-line refusal."""
    task = open_task(session, worker, task_id, now)
    if task.kind != TaskKind.RED_TEAM or task.status != TaskStatus.CLAIMED:
        raise UserError(f"task {task_id} is not a red-team task you are working on")
    return task


def _draft_of(session: Session, task: StarTask) -> StarDraft:
    """The holder's draft, which every chat step after the topic needs."""
    draft = _draft(session, task)
    if draft is None:
        raise UserError("commit to a topic before the dialogue starts")
    return draft


def commit_topic(
    session: Session, worker: Worker, task_id: int, topic: str, now: datetime | None = None
) -> StarDraft:
    """Start the dialogue: the topic is fixed before the first message, as STAR's red teamers do. A draft an
    earlier claimer left behind is dropped unseen."""
    now = now or utcnow()
    task = _working_on(session, worker, task_id, now)
    if _draft(session, task) is not None:
        raise UserError("the topic is committed already; it cannot change once the dialogue has started")
    if not topic.strip():
        raise UserError("write down your topic before the dialogue starts")
    session.execute(delete(StarDraft).where(StarDraft.task_id == task.id))
    draft = StarDraft(
        task_id=task.id,
        participant_id=task.participant_id,
        topic=topic.strip(),
        target_model="",
        created_at=now,
        updated_at=now,
    )
    session.add(draft)
    session.flush()
    return draft


def _reply_request(session: Session, task: StarTask, draft: StarDraft) -> ReplyRequest:
    """What the model thread needs for the reply to the draft's last message."""
    settings = live.settings_of(session, campaign_of(session, task))
    conversation = target_prompt([(turn.role, turn.text) for turn in draft.turns])
    return ReplyRequest(task.id, draft.id, len(draft.turns), conversation, settings)


def add_message(
    session: Session, worker: Worker, task_id: int, text: str, now: datetime | None = None
) -> ReplyRequest:
    """Store the red teamer's message before the model sees it; what asking for its reply needs. The target
    model sees the dialogue so far and nothing about the task or the campaign."""
    now = now or utcnow()
    task = _working_on(session, worker, task_id, now)
    draft = _draft_of(session, task)
    if not text.strip():
        raise UserError("an empty message cannot be sent")
    if awaiting_reply(draft):
        raise UserError("the model has not answered your last message yet: ask for the reply first")
    draft.turns.append(StarDraftTurn(index=len(draft.turns), role="user", text=text.strip(), created_at=now))
    draft.updated_at = now
    session.flush()
    return _reply_request(session, task, draft)


def pending_reply(
    session: Session, worker: Worker, task_id: int, now: datetime | None = None
) -> ReplyRequest | None:
    """The reply to ask for again (the model failed, or the page was left mid-reply); None when the last
    message has its reply already."""
    task = _working_on(session, worker, task_id, now or utcnow())
    draft = _draft_of(session, task)
    return _reply_request(session, task, draft) if awaiting_reply(draft) else None


def save_reply(sessions: sessionmaker[Session], draft_id: int, index: int, text: str, model_id: str) -> bool:
    """Store the model's reply at ``index`` in its own transaction; False when the draft is gone (released
    or submitted meanwhile) or another reply to the same message got there first."""
    now = utcnow()
    try:
        with sessions.begin() as session:
            draft = session.get(StarDraft, draft_id)
            if draft is None or len(draft.turns) != index:
                return False
            turn = StarDraftTurn(draft_id=draft_id, index=index, role="assistant", text=text, created_at=now)
            session.add(turn)
            draft.updated_at, draft.target_model = now, model_id
    except IntegrityError:
        return False
    return True


def generate_reply(
    sessions: sessionmaker[Session],
    request: ReplyRequest,
    on_piece: Callable[[str], None],
    on_status: Callable[[str], None] | None = None,
) -> str:
    """Run the target model (in a background thread), hand each piece on, then store the whole reply, so a
    reload or a dropped connection mid-reply still ends with the reply saved. ``on_status`` hears first that
    the model is loading and about how long that takes (``live.loading_note``), when it is."""
    note = live.loading_note(request.settings.target_model)
    if note and on_status is not None:
        on_status(note)
    model = live.target_model(request.settings.target_model)
    pieces = []
    for piece in stream_chat(model, request.conversation, live.generation_params(request.settings)):
        pieces.append(piece)
        on_piece(piece)
    text = "".join(pieces).strip()
    if not save_reply(sessions, request.draft_id, request.index, text, model.model_id):
        raise UserError("this reply was not kept: another one arrived first, or the task was released")
    return text


def _answered(draft: StarDraft) -> list[StarDraftTurn]:
    """The draft's turns without a last message the model never answered."""
    turns = list(draft.turns)
    return turns[:-1] if turns and turns[-1].role == "user" else turns


def finish_problem(session: Session, task: StarTask) -> str:
    """Why the holder cannot finish this red-team task yet ("" when they can): the check ``finish`` makes
    before the answers, which a page asks again after redirecting away from the refused post. Reads only."""
    draft = _draft(session, task)
    if draft is None:
        return "commit to a topic before the dialogue starts"
    if not any(turn.role == "assistant" for turn in _answered(draft)):
        return "send at least one message and wait for the reply before finishing"
    return ""


def finish(
    session: Session,
    worker: Worker,
    task_id: int,
    pre_annotation: dict[str, Any],
    now: datetime | None = None,
) -> int:
    """Submit the dialogue with the red teamer's pre-annotation; the dialogue id. A last message the model
    never answered is left out: annotators rate what the model said."""
    now = now or utcnow()
    task = _working_on(session, worker, task_id, now)
    problem = finish_problem(session, task)
    if problem:
        raise UserError(problem)
    draft = _draft_of(session, task)
    turns = _answered(draft)
    campaign = campaign_of(session, task)
    answers = check_pre_annotation(campaign_spec(campaign), pre_annotation)
    fallback = live.settings_of(session, campaign).target_model
    dialogue_id = submit_dialogue(
        session,
        task.id,
        draft.topic,
        [(turn.role, turn.text, turn.created_at) for turn in turns],
        (draft.target_model or fallback)[:200],
        answers,
        now=now,
    )
    session.delete(draft)
    session.flush()
    return dialogue_id


# --- ratings --------------------------------------------------------------------------------------------


def submit_rating(
    session: Session, worker: Worker, task_id: int, rating: int, reason: str, now: datetime | None = None
) -> int:
    """An annotation or arbitration by the task's holder: a point on the campaign's scale and a reason; the
    annotation id. The engine opens the arbitration task once two primary ratings differ by the gap."""
    now = now or utcnow()
    task = open_task(session, worker, task_id, now)
    if task.kind == TaskKind.RED_TEAM:
        raise NotYours("no such annotation task of yours")
    return submit_annotation(session, task.id, rating, reason, now=now)
