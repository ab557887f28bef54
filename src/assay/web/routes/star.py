"""STAR for people: the task queue, the red-team chat, annotation and arbitration pages, the organisers'
campaign dashboard and analysis report, and the JSON API under ``/api/v1/star``.

Who sees what. A task opens (page or API) only for the web user linked to the participant who holds or
finished it, and only with the web role for its kind; anything else is a 404, so task ids reveal nothing.
Annotators never see another person's rating (not before theirs, not after); arbitrators see the primary
ratings with their reasons. Organisers run the dashboard. The engine's ``claim_next`` enforces matching.

SQLite has one writer, so no request holds the write lock while a model thinks or while the engine claims
in its own transaction: the request session is committed first (``session.commit()`` before those calls).
Replies are generated in a worker thread that stores them itself, so a reload or a dropped connection
mid-reply still ends with the reply saved; the browser reads them as server-sent events (``star.js``), and
without JavaScript the form post waits for the whole reply and redirects back.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Form, HTTPException, Path, Request
from fastapi.responses import HTMLResponse, Response, StreamingResponse
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from assay.errors import UserError
from assay.models import Conversation, stream_chat
from assay.star import live
from assay.star.assign import (
    ROLE_FOR_KIND,
    arbitration_view,
    campaign_spec,
    claim_next,
    submit_annotation,
)
from assay.star.dialogue import mention_labels
from assay.star.progress import CampaignProgress, campaign_progress
from assay.store.models import as_utc
from assay.store.star_models import StarAnnotation, StarCampaign, StarDialogue, StarParticipant, StarTask
from assay.store.star_web_models import StarDraft
from assay.store.web_models import WebUser
from assay.web.accounts import has_role, participants_of
from assay.web.report_builds import EMBEDDERS, report_builds
from assay.web.routes import Area, redirect, render
from assay.web.security import DbSession, require

log = logging.getLogger(__name__)

WORKER_ROLES = ("red_teamer", "annotator", "arbitrator")
AREAS = [
    Area("Tasks", "/star/queue", WORKER_ROLES, "Your red-team, annotation and arbitration tasks.", order=30),
    Area("Campaigns", "/star/campaigns", ("organiser",), "STAR campaign progress and reports.", order=40),
]
KIND_LABEL = {"red_team": "red-team", "annotate": "annotation", "arbitrate": "arbitration"}
NOTICES = {
    "none": "No {kind} task is open for you right now. Try again later.",
    "submitted": "Dialogue submitted, thank you. It now goes to the annotators.",
    "rated": "Rating saved, thank you.",
}
MAX_ID = 2**31 - 1  # larger ids cannot exist, and SQLite cannot even compare them
MAX_TEXT = 20_000
REPORT_CSP = (  # the report is self-contained: inline styles, figures as data URIs, no script at all
    "default-src 'none'; style-src 'unsafe-inline'; img-src data:; frame-ancestors 'none'; "
    "base-uri 'none'; form-action 'none'"
)
REPLIES = ThreadPoolExecutor(max_workers=16, thread_name_prefix="assay-star-reply")  # model calls

Worker = Annotated[WebUser, Depends(require(*WORKER_ROLES))]
Organiser = Annotated[WebUser, Depends(require("organiser"))]
TaskId = Annotated[int, Path(ge=1, le=MAX_ID, description="A task id from your task list.")]
CampaignName = Annotated[str, Path(min_length=1, max_length=100)]
Kind = Literal["red_team", "annotate", "arbitrate"]
MapEmbedder = Literal["minilm", "hashing", "none"]  # the keys of report_builds.EMBEDDERS


def _plain(text: str) -> str:
    """Text the database and every later reader can hold: no NUL, no lone surrogates."""
    if "\x00" in text:
        raise ValueError("text must not contain NUL characters")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError("text must be valid Unicode") from exc
    return text


PlainText = Annotated[str, AfterValidator(_plain)]


pages = APIRouter(prefix="/star", include_in_schema=False)
api = APIRouter(prefix="/api/v1/star", tags=["star"])


# --- whose task is it ---------------------------------------------------------------------------------


def _people(session: Session, user: WebUser) -> dict[int, StarParticipant]:
    return {p.id: p for p in participants_of(session, user)}


def _my_task(session: Session, user: WebUser, task_id: int) -> tuple[StarTask, StarCampaign]:
    """The user's task (claimed or finished by a participant they act as, with the role for its kind),
    after releasing the campaign's expired claims; 404 otherwise, whatever the reason."""
    task = session.get(StarTask, task_id)
    if task is not None:
        campaign = session.get_one(StarCampaign, task.campaign_id)
        live.release_expired(session, campaign)
        if task.participant_id in _people(session, user) and has_role(user, ROLE_FOR_KIND[task.kind]):
            return task, campaign
    raise HTTPException(404, "no such task of yours")


def _claimable_kinds(user: WebUser, person: StarParticipant) -> list[str]:
    """Kinds both the pool entry and the web account allow (the engine checks the rest at the claim)."""
    roles = set(person.roles or [])
    return [k for k, role in ROLE_FOR_KIND.items() if role in roles and has_role(user, role)]


def _claim(
    request: Request, session: Session, user: WebUser, person: StarParticipant, kind: str
) -> tuple[int | None, bool]:
    """The task id and whether it is new: a task of this kind already held is returned instead of a
    second claim, so nobody hoards tasks others could do."""
    if kind not in _claimable_kinds(user, person):
        raise HTTPException(403, f"you may not take {KIND_LABEL[kind]} tasks")
    live.release_expired(session, session.get_one(StarCampaign, person.campaign_id))
    held = session.scalar(
        select(StarTask.id).where(
            StarTask.participant_id == person.id, StarTask.kind == kind, StarTask.status == "claimed"
        )
    )
    if held is not None:
        return held, False
    session.commit()  # claim_next writes in its own transaction: hold no lock here
    return claim_next(request.app.state.sessions, person.id, kind), True


def _break(session: Session, people: list[int], minutes: int) -> dict[str, Any]:
    """The break reminder: due now, or in how many seconds (star.js shows it then, without a reload)."""
    if minutes <= 0 or not people:
        return {"minutes": 0, "due": False, "due_in": 0}
    worked = live.continuous_work(session, people)
    due_in = int((timedelta(minutes=minutes) - worked).total_seconds())
    return {
        "minutes": minutes,
        "worked": int(worked.total_seconds() // 60),
        "due": due_in <= 0,
        "due_in": due_in,
    }


# --- the queue ------------------------------------------------------------------------------------------


def _queue_sections(session: Session, user: WebUser, people: list[StarParticipant]) -> list[dict[str, Any]]:
    sections = []
    for person in people:
        campaign = session.get_one(StarCampaign, person.campaign_id)
        settings = live.settings_of(session, campaign)
        tasks = session.scalars(
            select(StarTask)
            .where(StarTask.participant_id == person.id, StarTask.status == "claimed")
            .order_by(StarTask.claimed_at)
        ).all()
        done = session.scalars(
            select(StarTask)
            .where(StarTask.participant_id == person.id, StarTask.status == "done")
            .order_by(StarTask.done_at.desc())
            .limit(10)
        ).all()
        sections.append(
            {
                "person": person,
                "campaign": campaign,
                "kinds": _claimable_kinds(user, person),
                "tasks": [(t, live.claim_deadline(t, settings)) for t in tasks],
                "done": done,
                "timeout": settings.claim_timeout_minutes,
                "break_minutes": settings.break_minutes,
            }
        )
    return sections


@pages.get("", response_class=HTMLResponse)
def star_home(user: Worker) -> Response:
    return redirect("/star/queue")


@pages.get("/queue", response_class=HTMLResponse)
def queue(request: Request, session: DbSession, user: Worker, msg: str = "", kind: str = "") -> Response:
    """Each campaign the user works in: claimed tasks, a claim button per kind, recent finished work."""
    people = participants_of(session, user)
    for campaign_id in {p.campaign_id for p in people}:
        live.release_expired(session, session.get_one(StarCampaign, campaign_id))
    sections = _queue_sections(session, user, people)
    minutes = min((s["break_minutes"] for s in sections if s["break_minutes"] > 0), default=0)
    notice = NOTICES.get(msg, "").format(kind=KIND_LABEL.get(kind, ""))
    return render(
        request,
        "star_queue.html",
        sections=sections,
        notice=notice,
        kind_label=KIND_LABEL,
        rest=_break(session, [p.id for p in people], minutes),
    )


@pages.post("/queue/claim")
def claim(
    request: Request,
    session: DbSession,
    user: Worker,
    participant_id: Annotated[int, Form(ge=1, le=MAX_ID)],
    kind: Annotated[Kind, Form()],
) -> Response:
    person = _people(session, user).get(participant_id)
    if person is None:
        raise HTTPException(404, "you do not act as this participant")
    task_id, _new = _claim(request, session, user, person, kind)
    return redirect(f"/star/tasks/{task_id}" if task_id else f"/star/queue?msg=none&kind={kind}")


# --- task pages -----------------------------------------------------------------------------------------


def _turns_of(session: Session, task: StarTask) -> list[tuple[str, str]]:
    dialogue = session.get(StarDialogue, task.dialogue_id) if task.dialogue_id else None
    return [(t.role, t.text) for t in dialogue.turns] if dialogue else []


def _red_team_context(session: Session, task: StarTask, campaign: StarCampaign) -> dict[str, Any]:
    spec = campaign_spec(campaign)
    settings = live.settings_of(session, campaign)
    draft = live.draft_for(session, task)
    return {
        "task": task,
        "campaign": campaign,
        "instruction": task.instruction.text,
        "rule": spec.rule(task.rule_id),
        "draft": draft,
        "awaiting": draft is not None and live.awaiting_reply(draft),
        "model_ready": bool(settings.target_model),
        "rules": spec.rules,
        "mention_labels": mention_labels(spec),
        "deadline": live.claim_deadline(task, settings),
        "timeout": settings.claim_timeout_minutes,
    }


def _rating_context(session: Session, task: StarTask, campaign: StarCampaign) -> dict[str, Any]:
    spec = campaign_spec(campaign)
    dialogue = session.get_one(StarDialogue, task.dialogue_id)
    mine = session.scalar(select(StarAnnotation).where(StarAnnotation.task_id == task.id))
    earlier = arbitration_view(session, task.id).ratings if task.kind == "arbitrate" else []
    return {
        "task": task,
        "campaign": campaign,
        "rule": spec.rule(task.rule_id),
        "topic": dialogue.topic,
        "turns": [(t.role, t.text) for t in dialogue.turns],
        "likert": list(enumerate(spec.likert)),
        "earlier": earlier,
        "mine": mine,
        "deadline": live.claim_deadline(task, live.settings_of(session, campaign)),
    }


def _task_page(
    request: Request,
    session: Session,
    task: StarTask,
    campaign: StarCampaign,
    status_code: int = 200,
    **extra: Any,
) -> Response:
    """The page for the task's kind and state (working on it, or finished)."""
    minutes = live.settings_of(session, campaign).break_minutes
    rest = _break(session, [task.participant_id] if task.participant_id else [], minutes)
    if task.kind == "red_team" and task.status != "done":
        context = _red_team_context(session, task, campaign)
        return render(request, "star_red_team.html", status_code, rest=rest, **context, **extra)
    if task.kind == "red_team":
        context = {"task": task, "campaign": campaign, "turns": _turns_of(session, task)}
        return render(request, "star_done.html", status_code, rest=rest, **context, **extra)
    context = _rating_context(session, task, campaign)
    return render(request, "star_rate.html", status_code, rest=rest, **context, **extra)


@pages.get("/tasks/{task_id}", response_class=HTMLResponse)
def task_page(request: Request, session: DbSession, user: Worker, task_id: TaskId) -> Response:
    task, campaign = _my_task(session, user, task_id)
    return _task_page(request, session, task, campaign)


def _failed(
    request: Request, session: Session, user: WebUser, task_id: int, error: Exception, status: int = 400
) -> Response:
    """Undo the request's writes and show the task page again with the reason (the form keeps its place)."""
    session.rollback()
    task, campaign = _my_task(session, user, task_id)
    return _task_page(request, session, task, campaign, status, error=str(error))


def _open_red_team(session: Session, user: WebUser, task_id: int) -> tuple[StarTask, StarCampaign]:
    task, campaign = _my_task(session, user, task_id)
    if task.kind != "red_team" or task.status != "claimed":
        raise UserError(f"task {task_id} is not a red-team task you are working on")
    return task, campaign


@pages.post("/tasks/{task_id}/topic")
def commit_topic(
    request: Request,
    session: DbSession,
    user: Worker,
    task_id: TaskId,
    topic: Annotated[PlainText, Form(max_length=1000)],
) -> Response:
    task, _campaign = _open_red_team(session, user, task_id)
    try:
        live.commit_topic(session, task, topic)
    except UserError as err:
        return _failed(request, session, user, task_id, err)
    return redirect(f"/star/tasks/{task_id}#chat")


def _draft(session: Session, task: StarTask) -> StarDraft:
    draft = live.draft_for(session, task)
    if draft is None:
        raise UserError("commit to a topic before the dialogue starts")
    return draft


@pages.post("/tasks/{task_id}/messages")
def send_message(
    request: Request,
    session: DbSession,
    user: Worker,
    task_id: TaskId,
    text: Annotated[PlainText, Form(max_length=MAX_TEXT)],
) -> Response:
    """Store the message, then the reply: streamed (``Accept: text/event-stream``) or waited for."""
    task, campaign = _open_red_team(session, user, task_id)
    try:
        draft = _draft(session, task)
        index = live.add_message(session, draft, text)
    except UserError as err:
        return _failed(request, session, user, task_id, err)
    return _reply(request, session, task, campaign, draft, index)


@pages.post("/tasks/{task_id}/reply")
def get_reply(request: Request, session: DbSession, user: Worker, task_id: TaskId) -> Response:
    """Ask again for the reply to the last message (the model failed, or the page was left mid-reply)."""
    task, campaign = _open_red_team(session, user, task_id)
    draft = _draft(session, task)
    if not live.awaiting_reply(draft):
        return redirect(f"/star/tasks/{task_id}#chat")
    return _reply(request, session, task, campaign, draft, len(draft.turns))


def _generate(
    sessions: sessionmaker[Session],
    draft_id: int,
    index: int,
    messages: Conversation,
    settings: live.CampaignSettings,
    on_piece: Callable[[str], None],
) -> str:
    """Run the target model (in a worker thread), hand each piece on, then store the whole reply."""
    model = live.target_model(settings.target_model)
    pieces = []
    for piece in stream_chat(model, messages, live.generation_params(settings)):
        pieces.append(piece)
        on_piece(piece)
    text = "".join(pieces).strip()
    if not live.save_reply(sessions, draft_id, index, text, model.model_id):
        raise UserError("this reply was not kept: another one arrived first, or the task was released")
    return text


def _reply(
    request: Request,
    session: Session,
    task: StarTask,
    campaign: StarCampaign,
    draft: StarDraft,
    index: int,
) -> Response:
    """The reply to the message at ``index - 1``: streamed as events when asked, else waited for."""
    settings = live.settings_of(session, campaign)
    args = (request.app.state.sessions, draft.id, index, live.conversation(draft), settings)
    session.commit()  # the message is stored before the model sees it, and no lock is held meanwhile
    if "text/event-stream" in request.headers.get("accept", ""):
        return StreamingResponse(
            _relay(lambda emit: _generate(*args, emit)),
            media_type="text/event-stream",
            headers={"cache-control": "no-cache", "x-accel-buffering": "no"},
        )
    try:
        _generate(*args, lambda piece: None)
    except Exception as err:
        return _task_page(request, session, task, campaign, 502, error=_model_failure(err))
    return redirect(f"/star/tasks/{task.id}#turn-{index}")


def _model_failure(err: Exception) -> str:
    """What the red teamer is told: a ``UserError``'s one line, else a generic line (the trace is logged)."""
    if isinstance(err, UserError):
        return str(err)
    log.error("the target model failed", exc_info=err)
    return "the target model failed; ask for the reply again"


def _event(name: str, text: str) -> bytes:
    return f"event: {name}\ndata: {json.dumps({'text': text})}\n\n".encode()


async def _relay(work: Callable[[Callable[[str], None]], str]) -> AsyncIterator[bytes]:
    """Server-sent events from ``work`` running in a worker thread: ``delta`` per piece, then ``done`` with
    the whole reply or ``error``. The thread finishes (and stores the reply) even if the browser leaves."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[str, str]] = asyncio.Queue()

    def put(name: str, text: str) -> None:
        with contextlib.suppress(RuntimeError):  # the event loop is closed: nobody is listening any more
            loop.call_soon_threadsafe(queue.put_nowait, (name, text))

    def run() -> None:
        try:
            put("done", work(lambda piece: put("delta", piece)))
        except Exception as err:
            put("error", _model_failure(err))

    REPLIES.submit(run)
    while True:
        name, text = await queue.get()
        yield _event(name, text)
        if name != "delta":
            return


@pages.post("/tasks/{task_id}/finish")
def finish(
    request: Request,
    session: DbSession,
    user: Worker,
    task_id: TaskId,
    assigned_rule_broken: Annotated[Literal["yes", "no", "unsure"], Form()],
    other_rules_broken: Annotated[list[str], Form()] = [],  # noqa: B006 (FastAPI copies form defaults)
    groups_mentioned: Annotated[list[str], Form()] = [],  # noqa: B006
) -> Response:
    """The pre-annotation, then the dialogue goes to the engine (and on to annotators)."""
    task, campaign = _open_red_team(session, user, task_id)
    answers = {
        "assigned_rule_broken": {"yes": True, "no": False}.get(assigned_rule_broken),
        "other_rules_broken": other_rules_broken,
        "groups_mentioned": groups_mentioned,
    }
    try:
        draft = _draft(session, task)
        live.finish_draft(session, task, draft, answers, live.settings_of(session, campaign).target_model)
    except UserError as err:
        return _failed(request, session, user, task_id, err)
    return redirect("/star/queue?msg=submitted")


@pages.post("/tasks/{task_id}/rating")
def rate(
    request: Request,
    session: DbSession,
    user: Worker,
    task_id: TaskId,
    rating: Annotated[int, Form(ge=0, le=9)],
    reason: Annotated[PlainText, Form(max_length=MAX_TEXT)] = "",
) -> Response:
    """An annotation or arbitration: a point on the campaign's scale and a reason, both required."""
    task, _campaign = _my_task(session, user, task_id)
    if task.kind == "red_team":
        raise HTTPException(404, "no such annotation task of yours")
    try:
        submit_annotation(session, task.id, rating, reason)
    except UserError as err:
        return _failed(request, session, user, task_id, err)
    return redirect("/star/queue?msg=rated")


# --- organisers: campaigns, dashboard, report -----------------------------------------------------------


def _campaign(session: Session, name: str) -> StarCampaign:
    found = session.scalar(select(StarCampaign).where(StarCampaign.name == name))
    if found is None:
        raise HTTPException(404, f"no campaign {name!r}")
    return found


@pages.get("/campaigns", response_class=HTMLResponse)
def campaigns(request: Request, session: DbSession, user: Organiser) -> Response:
    rows = session.scalars(select(StarCampaign).order_by(StarCampaign.name)).all()
    settings = {c.id: live.settings_of(session, c) for c in rows}
    return render(request, "star_campaigns.html", campaigns=rows, settings=settings)


def _dashboard(
    request: Request, session: Session, campaign: StarCampaign, status_code: int = 200, **extra: Any
) -> Response:
    live.release_expired(session, campaign)
    build = report_builds(request).state(campaign.id)  # before the report: a build ending between the two
    report = live.latest_report(session, campaign)  # reads then still shows its report
    return render(
        request,
        "star_dashboard.html",
        status_code,
        campaign=campaign,
        progress=campaign_progress(session, campaign),
        settings=extra.pop("settings", None) or live.settings_of(session, campaign),
        report_at=report.created_at if report else None,
        report_build=build,
        embedders=EMBEDDERS,
        kind_label=KIND_LABEL,
        **extra,
    )


@pages.get("/campaigns/{name}", response_class=HTMLResponse)
def dashboard(request: Request, session: DbSession, user: Organiser, name: CampaignName) -> Response:
    return _dashboard(request, session, _campaign(session, name))


@pages.post("/campaigns/{name}/settings", response_class=HTMLResponse)
def save_settings(
    request: Request,
    session: DbSession,
    user: Organiser,
    name: CampaignName,
    target_model: Annotated[PlainText, Form(max_length=500)] = "",
    max_new_tokens: Annotated[str, Form(max_length=20)] = "",
    temperature: Annotated[str, Form(max_length=20)] = "",
    claim_timeout_minutes: Annotated[str, Form(max_length=20)] = "",
    break_minutes: Annotated[str, Form(max_length=20)] = "",
) -> Response:
    """Target model, decoding, claim timeout and break interval for the campaign."""
    campaign = _campaign(session, name)
    raw = {
        "target_model": target_model,
        "max_new_tokens": max_new_tokens,
        "temperature": temperature,
        "claim_timeout_minutes": claim_timeout_minutes,
        "break_minutes": break_minutes,
    }
    current = live.settings_of(session, campaign).model_dump()
    try:  # a number left blank keeps its current value
        new = live.CampaignSettings.model_validate(current | {k: v for k, v in raw.items() if v != ""})
        live.save_settings(session, campaign, new.model_copy(update={"target_model": target_model}))
    except (ValidationError, UserError) as err:
        session.rollback()
        message = _validation_line(err) if isinstance(err, ValidationError) else str(err)
        return _dashboard(request, session, campaign, 400, settings_error=message)
    return redirect(f"/star/campaigns/{campaign.name}#settings")


def _validation_line(err: ValidationError) -> str:
    first = err.errors()[0]
    return f"{'.'.join(str(p) for p in first['loc'])}: {first['msg']} (value: {first.get('input')!r})"


@pages.post("/campaigns/{name}/report")
def build_report(
    request: Request,
    session: DbSession,
    user: Organiser,
    name: CampaignName,
    embedder: Annotated[MapEmbedder, Form()] = "minilm",
) -> Response:
    """Start building the analysis report in the background; the dashboard shows when it is ready."""
    campaign = _campaign(session, name)
    report_builds(request).start(request.app.state.sessions, campaign.id, user.id, embedder)
    return redirect(f"/star/campaigns/{campaign.name}#report-heading")


@pages.get("/campaigns/{name}/report", response_class=HTMLResponse)
def show_report(session: DbSession, user: Organiser, name: CampaignName) -> Response:
    """The stored report as it is (self-contained), under a CSP that lets its inline styles and images in."""
    row = live.latest_report(session, _campaign(session, name))
    if row is None:
        raise HTTPException(404, "no report yet: build one on the campaign page")
    return HTMLResponse(row.html, headers={"content-security-policy": REPORT_CSP})


# --- JSON API -------------------------------------------------------------------------------------------


class TaskOut(BaseModel):
    id: int
    campaign: str
    kind: Kind
    status: str = Field(description="claimed or done (open tasks are nobody's)")
    rule_id: str
    group_label: str = Field(description='the target group, e.g. "race=Black", or "" for none')
    claimed_at: str | None
    release_at: str | None = Field(description="when an unfinished claim goes back to the queue")
    done_at: str | None
    url: str


class ClaimableOut(BaseModel):
    participant_id: int
    campaign: str
    kinds: list[Kind]


class MyTasksOut(BaseModel):
    tasks: list[TaskOut] = Field(description="claimed tasks, then the 50 most recently finished")
    claimable: list[ClaimableOut]


class ClaimIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    kind: Kind
    participant_id: int | None = Field(
        None, ge=1, le=MAX_ID, description="which of your pool entries claims; needed if you have several"
    )


class ClaimOut(BaseModel):
    task: TaskOut | None
    new: bool = Field(description="false: none was open for you, or you already hold one of this kind")
    message: str


class TurnOut(BaseModel):
    role: Literal["user", "assistant"]
    text: str


class RatingOut(BaseModel):
    rating: int = Field(description="0-based point on the scale")
    label: str
    reason: str


class TaskViewOut(BaseModel):
    task: TaskOut
    rule: str
    instruction: str | None = Field(description="red-team tasks only")
    topic: str
    likert: list[str]
    turns: list[TurnOut]
    earlier_ratings: list[RatingOut] = Field(description="arbitration tasks only: the primary ratings")
    my_rating: RatingOut | None


class AnnotationIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    rating: int = Field(ge=0, le=9, description="0-based point on the campaign's scale (0 = its first label)")
    reason: Annotated[PlainText, Field(min_length=1, max_length=MAX_TEXT)]


class AnnotationOut(BaseModel):
    annotation_id: int
    task: TaskOut


NOT_YOURS = {404: {"description": "No such task of yours"}}
FORBIDDEN = {403: {"description": "Your roles do not allow this"}}
REFUSED = {400: {"description": "The engine refused it (one line says why)"}}


def _task_out(session: Session, task: StarTask) -> TaskOut:
    campaign = session.get_one(StarCampaign, task.campaign_id)
    deadline = live.claim_deadline(task, live.settings_of(session, campaign))
    return TaskOut(
        id=task.id,
        campaign=campaign.name,
        kind=task.kind,  # type: ignore[arg-type]
        status=task.status,
        rule_id=task.rule_id,
        group_label=task.group_label,
        claimed_at=as_utc(task.claimed_at).isoformat() if task.claimed_at else None,
        release_at=deadline.isoformat() if deadline else None,
        done_at=as_utc(task.done_at).isoformat() if task.done_at else None,
        url=f"/star/tasks/{task.id}",
    )


@api.get("/tasks", response_model=MyTasksOut, summary="Your claimed and recently finished tasks")
def api_my_tasks(session: DbSession, user: Worker) -> MyTasksOut:
    people = participants_of(session, user)
    for campaign_id in {p.campaign_id for p in people}:
        live.release_expired(session, session.get_one(StarCampaign, campaign_id))
    ids = [p.id for p in people]
    claimed = session.scalars(
        select(StarTask)
        .where(StarTask.participant_id.in_(ids), StarTask.status == "claimed")
        .order_by(StarTask.id)
    ).all()
    done = session.scalars(
        select(StarTask)
        .where(StarTask.participant_id.in_(ids), StarTask.status == "done")
        .order_by(StarTask.done_at.desc())
        .limit(50)
    ).all()
    tasks = [_task_out(session, t) for t in (*claimed, *done) if has_role(user, ROLE_FOR_KIND[t.kind])]
    claimable = [
        ClaimableOut(
            participant_id=p.id,
            campaign=session.get_one(StarCampaign, p.campaign_id).name,
            kinds=_claimable_kinds(user, p),  # type: ignore[arg-type]
        )
        for p in people
    ]
    return MyTasksOut(tasks=tasks, claimable=claimable)


@api.post(
    "/tasks/claim",
    response_model=ClaimOut,
    summary="Claim the next task of a kind you may do",
    responses={**FORBIDDEN, 404: {"description": "You do not act as that participant"}},
)
def api_claim(request: Request, session: DbSession, user: Worker, body: ClaimIn) -> ClaimOut:
    people = _people(session, user)
    if body.participant_id is None and len(people) > 1:
        raise HTTPException(404, "you act as several participants: say which with participant_id")
    person = people.get(body.participant_id) if body.participant_id else next(iter(people.values()), None)
    if person is None:
        raise HTTPException(404, "you do not act as that participant")
    task_id, new = _claim(request, session, user, person, body.kind)
    if task_id is None:
        return ClaimOut(task=None, new=False, message=NOTICES["none"].format(kind=KIND_LABEL[body.kind]))
    message = "claimed" if new else "you already hold a task of this kind: finish it first"
    return ClaimOut(task=_task_out(session, session.get_one(StarTask, task_id)), new=new, message=message)


def _rating_out(likert: list[str], rating: int, reason: str) -> RatingOut:
    return RatingOut(rating=rating, label=likert[rating], reason=reason)


@api.get("/tasks/{task_id}", response_model=TaskViewOut, summary="One of your tasks", responses=NOT_YOURS)
def api_task(session: DbSession, user: Worker, task_id: TaskId) -> TaskViewOut:
    """What the task's page shows: the dialogue (and for arbitration the primary ratings), never more."""
    task, campaign = _my_task(session, user, task_id)
    spec = campaign_spec(campaign)
    if task.kind == "red_team":
        draft = live.draft_for(session, task) if task.status == "claimed" else None
        dialogue = session.get(StarDialogue, task.dialogue_id) if task.dialogue_id else None
        topic = draft.topic if draft else (dialogue.topic if dialogue else "")
        turns = [(t.role, t.text) for t in draft.turns] if draft else _turns_of(session, task)
        earlier: list[RatingOut] = []
        mine = None
    else:
        context = _rating_context(session, task, campaign)
        topic, turns = context["topic"], context["turns"]
        earlier = [_rating_out(spec.likert, r.rating, r.reason) for r in context["earlier"]]
        mine = context["mine"] and _rating_out(spec.likert, context["mine"].rating, context["mine"].reason)
    return TaskViewOut(
        task=_task_out(session, task),
        rule=spec.rule(task.rule_id).text,
        instruction=task.instruction.text if task.kind == "red_team" else None,
        topic=topic,
        likert=list(spec.likert),
        turns=[TurnOut(role=role, text=text) for role, text in turns],  # type: ignore[arg-type]
        earlier_ratings=earlier,
        my_rating=mine or None,
    )


@api.post(
    "/tasks/{task_id}/annotation",
    response_model=AnnotationOut,
    summary="Rate the dialogue of your annotation or arbitration task",
    responses={**NOT_YOURS, **REFUSED},
)
def api_annotate(session: DbSession, user: Worker, task_id: TaskId, body: AnnotationIn) -> AnnotationOut:
    task, _campaign = _my_task(session, user, task_id)
    if task.kind == "red_team":
        raise HTTPException(404, "no such annotation task of yours")
    annotation_id = submit_annotation(session, task.id, body.rating, body.reason)
    session.commit()  # now: SQLite's write lock must not wait for the response-validation thread hop
    return AnnotationOut(annotation_id=annotation_id, task=_task_out(session, task))


@api.get(
    "/campaigns/{name}/progress",
    response_model=CampaignProgress,
    summary="A campaign's progress, shortfalls and agreement (organisers)",
    responses={**FORBIDDEN, 404: {"description": "No such campaign"}},
)
def api_progress(session: DbSession, user: Organiser, name: CampaignName) -> CampaignProgress:
    campaign = _campaign(session, name)
    live.release_expired(session, campaign)
    return campaign_progress(session, campaign)


router = APIRouter()
router.include_router(pages)
router.include_router(api)
