"""STAR for people: the task queue, the red-team chat, annotation and arbitration pages, the organisers'
campaign pages and analysis report, and the JSON API under ``/api/v1/star``.

Routes parse, call ``assay.star`` and render; the rules live there. Who sees and does what is
``assay.star.workflow`` (a task opens only for the web user linked to the pool entry that holds or finished
it, with the web role for its kind; ``NotYours`` becomes a 404 so task ids reveal nothing, ``NotAllowed`` a
403; annotators never see another rating, arbitrators see the primary ratings with their reasons; the
engine's ``claim_next`` enforces matching). How far a campaign has got is ``assay.star.status``; its
settings and report are ``assay.star.live``; who labels and settles the thematic map's clusters, and what
they see, is ``assay.star.theme_labels``. No GET writes: expired claims are hidden at once by the
workflow's reads and released by the app's sweeper (``assay.web.sweeper``).

Model replies and report builds run as background jobs (``assay.web.background``): a reply is generated
and stored by its job even if the browser leaves mid-reply; the browser reads it as server-sent events
(``star.js``), and without JavaScript the form post waits for the whole reply and redirects back. The
message is committed before the model sees it, so no request holds SQLite's write lock while a model thinks.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections.abc import AsyncIterator
from dataclasses import fields
from typing import Annotated, Any, Literal, TypeVar

from fastapi import APIRouter, Depends, Form, HTTPException, Path, Request
from fastapi.responses import HTMLResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy.orm import Session

from assay.errors import UserError
from assay.star import live, reporting, status, theme_labels, workflow
from assay.star.status import CampaignStatus
from assay.star.workflow import KIND_LABEL
from assay.store.enums import STAR_ROLES, Role, TaskKind, TaskStatus
from assay.store.models import as_utc
from assay.store.star_models import StarCampaign, StarTask
from assay.store.web_models import WebUser
from assay.web import methods  # noqa: F401  (registers the theme_action path convertor used below)
from assay.web.accounts import has_role, participants_of
from assay.web.background import BackgroundWork, Job
from assay.web.params import MAX_ID, PlainText, path_id
from assay.web.routes import Area, redirect, render
from assay.web.security import DbSession, require

WORKER_ROLES = STAR_ROLES
AREAS = [
    Area("Tasks", "/star/queue", WORKER_ROLES, "Your red-team, annotation and arbitration tasks.", order=30),
    Area("Campaigns", "/star/campaigns", (Role.ORGANISER,), "STAR campaign progress and reports.", order=40),
]
NOTICES = {
    "none": "No {kind} task is open for you right now. Try again later.",
    "submitted": "Dialogue submitted, thank you. It now goes to the annotators.",
    "rated": "Rating saved, thank you.",
    "decided": "Decision saved, thank you: it settles the dialogue's label.",
    "skipped": "You skipped your last {kind} task: it is back in the pool for others and does not count "
    "against you. This is the next one.",
    "given_back": "You gave the {kind} task back: open for others again, and it does not count against you.",
    "skipped_none": "You gave the {kind} task back. No other {kind} task is open for you right now.",
}
GIVEN_BACK = "given back: open for anyone again, and not counted against you"
MAX_TEXT = 20_000
REPORT_CSP = (  # the report is self-contained: inline styles, figures as data URIs, no script at all
    "default-src 'none'; style-src 'unsafe-inline'; img-src data:; frame-ancestors 'none'; "
    "base-uri 'none'; form-action 'none'"
)
MODEL_FAILED = "the target model failed; ask for the reply again"

WorkerUser = Annotated[WebUser, Depends(require(*WORKER_ROLES))]
ThemeReviewer = Annotated[WebUser, Depends(require(Role.ANNOTATOR, Role.ARBITRATOR))]
ClusterKey = Annotated[str, Form(min_length=1, max_length=64, pattern=r"^[0-9a-f]+$")]
ThemeLabelText = Annotated[PlainText, Form(min_length=1, max_length=theme_labels.MAX_LABEL)]
Organiser = Annotated[WebUser, Depends(require(Role.ORGANISER))]
TaskId = Annotated[int, path_id("A task id from your task list.")]
CampaignName = Annotated[str, Path(min_length=1, max_length=100)]
MapEmbedder = Literal["minilm", "hashing", "none"]  # the keys of live.EMBEDDERS


AnswerT = TypeVar("AnswerT")
pages = APIRouter(prefix="/star", include_in_schema=False)
api = APIRouter(prefix="/api/v1/star", tags=["star"])


def _released(session: Session, user: WebUser) -> workflow.Worker:
    """``_worker``, then the request's transaction ends, so its connection goes back to the pool before the
    claim opens its own: a request never holds two connections, and a full pool cannot deadlock on itself."""
    worker = _worker(session, user)
    session.commit()
    return worker


def _answer(session: Session, answer: AnswerT) -> AnswerT:
    """End the request's transaction, then hand ``answer`` to FastAPI, which validates it on another thread
    hop: the connection is back in the pool by then, so it is never held by a request waiting for a thread
    (the crowd stall of issue 27; ``assay.web.admission``). The answer is plain data, not rows."""
    session.commit()
    return answer


def _worker(session: Session, user: WebUser) -> workflow.Worker:
    """The account as the workflow sees it: the pool entries it acts as, the STAR roles it holds."""
    people = frozenset(p.id for p in participants_of(session, user))
    return workflow.Worker(people, frozenset(r for r in WORKER_ROLES if has_role(user, r)), user.id)


def _background(request: Request) -> BackgroundWork:
    """The app's background work (model replies, report builds)."""
    return request.app.state.background  # type: ignore[no-any-return]


# --- the queue ------------------------------------------------------------------------------------------


@pages.get("", response_class=HTMLResponse)
def star_home(user: WorkerUser) -> Response:
    return redirect("/star/queue")


@pages.get("/queue", response_class=HTMLResponse)
def queue(request: Request, session: DbSession, user: WorkerUser, msg: str = "", kind: str = "") -> Response:
    """Each campaign the user works in: claimed tasks, a claim button per kind, recent finished work."""
    worker = _worker(session, user)
    sections = workflow.queue(session, worker)
    minutes = min((s.break_minutes for s in sections if s.break_minutes > 0), default=0)
    return render(
        request,
        "star_queue.html",
        sections=sections,
        notice=NOTICES.get(msg, "").format(kind=KIND_LABEL.get(kind, "")),
        kind_label=KIND_LABEL,
        rest=workflow.break_status(session, sorted(worker.participant_ids), minutes),
    )


@pages.post("/queue/claim")
def claim(
    request: Request,
    session: DbSession,
    user: WorkerUser,
    participant_id: Annotated[int, Form(ge=1, le=MAX_ID)],
    kind: Annotated[TaskKind, Form()],
) -> Response:
    """Claim the next task of a kind (or go back to the one of that kind already held)."""
    done = workflow.claim(request.app.state.sessions, _released(session, user), participant_id, kind)
    return redirect(f"/star/tasks/{done.task_id}" if done.task_id else f"/star/queue?msg=none&kind={kind}")


# --- task pages -----------------------------------------------------------------------------------------


def _task_page(
    request: Request,
    session: Session,
    worker: workflow.Worker,
    task: StarTask,
    status_code: int = 200,
    **extra: Any,
) -> Response:
    """The page for the task's kind and state (working on it, or finished), with the progress line."""
    view = workflow.task_view(session, task)
    context = {f.name: getattr(view, f.name) for f in fields(view)} | extra
    context["likert"] = list(enumerate(view.likert))
    context["progress"] = workflow.task_progress(session, worker, task)
    context["kind_label"] = KIND_LABEL
    people = [task.participant_id] if task.participant_id else []
    context["rest"] = workflow.break_status(session, people, view.break_minutes)
    if task.kind != TaskKind.RED_TEAM:
        return render(request, "star_rate.html", status_code, **context)
    template = "star_done.html" if task.status == TaskStatus.DONE else "star_red_team.html"
    return render(request, template, status_code, **context)


@pages.get("/tasks/{task_id}", response_class=HTMLResponse)
def task_page(
    request: Request,
    session: DbSession,
    user: WorkerUser,
    task_id: TaskId,
    problem: str = "",
    msg: str = "",
) -> Response:
    """The task; ``problem=finish`` after a refused finish says why, as the workflow sees it now, and
    ``msg=skipped`` that the task before it was skipped."""
    worker = _worker(session, user)
    task = workflow.open_task(session, worker, task_id)
    extra: dict[str, str] = {}
    if problem == "finish" and task.kind == TaskKind.RED_TEAM and task.status == TaskStatus.CLAIMED:
        extra["finish_error"] = workflow.finish_problem(session, task)
    if msg == "skipped" and task.status == TaskStatus.CLAIMED:
        extra["notice"] = NOTICES["skipped"].format(kind=KIND_LABEL[task.kind])
    return _task_page(request, session, worker, task, **extra)


def _failed(
    request: Request, session: Session, user: WebUser, task_id: int, error: Exception, status: int = 400
) -> Response:
    """Undo the request's writes and show the task page again with the reason (the form keeps its place)."""
    session.rollback()
    worker = _worker(session, user)
    task = workflow.open_task(session, worker, task_id)
    return _task_page(request, session, worker, task, status, error=str(error))


@pages.post("/tasks/{task_id}/give-back")
def give_back(
    request: Request,
    session: DbSession,
    user: WorkerUser,
    task_id: TaskId,
    then: Annotated[Literal["next", "queue"], Form()] = "queue",
) -> Response:
    """Give the task back to the pool: then take the next one of its kind (skip), or go to the queue."""
    try:
        if then == "next":
            given = workflow.skip(request.app.state.sessions, _released(session, user), task_id)
        else:
            given = workflow.give_back(session, _worker(session, user), task_id)
    except UserError as err:
        return _failed(request, session, user, task_id, err)
    if given.next_task_id is not None:
        return redirect(f"/star/tasks/{given.next_task_id}?msg=skipped")
    msg = "skipped_none" if then == "next" else "given_back"
    return redirect(f"/star/queue?msg={msg}&kind={given.kind}")


@pages.post("/tasks/{task_id}/topic")
def commit_topic(
    request: Request,
    session: DbSession,
    user: WorkerUser,
    task_id: TaskId,
    topic: Annotated[PlainText, Form(max_length=1000)],
) -> Response:
    try:
        workflow.commit_topic(session, _worker(session, user), task_id, topic)
    except UserError as err:
        return _failed(request, session, user, task_id, err)
    return redirect(f"/star/tasks/{task_id}#chat")


@pages.post("/tasks/{task_id}/messages")
def send_message(
    request: Request,
    session: DbSession,
    user: WorkerUser,
    task_id: TaskId,
    text: Annotated[PlainText, Form(max_length=MAX_TEXT)],
) -> Response:
    """Store the message, then the reply: streamed (``Accept: text/event-stream``) or waited for."""
    try:
        ask = workflow.add_message(session, _worker(session, user), task_id, text)
    except UserError as err:
        return _failed(request, session, user, task_id, err)
    return _reply(request, session, user, ask)


@pages.post("/tasks/{task_id}/reply")
def get_reply(request: Request, session: DbSession, user: WorkerUser, task_id: TaskId) -> Response:
    """Ask again for the reply to the last message (the model failed, or the page was left mid-reply)."""
    ask = workflow.pending_reply(session, _worker(session, user), task_id)
    if ask is None:
        return redirect(f"/star/tasks/{task_id}#chat")
    return _reply(request, session, user, ask)


class _Relay:
    """Hands a reply job's pieces to the event stream: pieces that arrive before the stream starts are
    kept, so the job runs from the request on, whether or not anyone listens."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._early: list[tuple[str, str]] = []
        self._target: tuple[asyncio.AbstractEventLoop, asyncio.Queue[tuple[str, str]]] | None = None

    def piece(self, text: str) -> None:
        """A piece of the reply, from the job's thread."""
        self._put("delta", text)

    def status(self, text: str) -> None:
        """What the wait is for (the model loading, and about how long), from the job's thread."""
        self._put("status", text)

    def finish(self, job: Job) -> None:
        """The whole reply, or what the red teamer is told about a failure."""
        error = job.exception
        self._put(*(("error", _model_failure(error)) if error is not None else ("done", job.wait())))

    def _put(self, name: str, text: str) -> None:
        with self._lock:
            if self._target is None:
                self._early.append((name, text))
                return
            loop, queue = self._target
        with contextlib.suppress(RuntimeError):  # the event loop is closed: nobody is listening any more
            loop.call_soon_threadsafe(queue.put_nowait, (name, text))

    async def events(self) -> AsyncIterator[bytes]:
        """``status`` while the model loads, ``delta`` per piece, then ``done`` with the whole reply or
        ``error``."""
        queue: asyncio.Queue[tuple[str, str]] = asyncio.Queue()
        with self._lock:
            self._target = (asyncio.get_running_loop(), queue)
            early, self._early = self._early, []
        for event in early:
            queue.put_nowait(event)
        while True:
            name, text = await queue.get()
            yield f"event: {name}\ndata: {json.dumps({'text': text})}\n\n".encode()
            if name not in ("delta", "status"):
                return


def _model_failure(error: BaseException) -> str:
    """What the red teamer is told: a ``UserError``'s one line, else a generic line (the background job
    logged the trace)."""
    return str(error) if isinstance(error, UserError) else MODEL_FAILED


def _start_reply(request: Request, ask: workflow.ReplyRequest, relay: _Relay | None = None) -> Job:
    """The reply as a background job: it stores the reply itself, so a dropped connection loses nothing."""
    sessions = request.app.state.sessions
    on_piece = relay.piece if relay is not None else _ignore
    on_status = relay.status if relay is not None else None
    job = _background(request).submit(
        "reply",
        f"reply in red-team task {ask.task_id}",
        lambda: workflow.generate_reply(sessions, ask, on_piece, on_status),
    )
    if relay is not None:
        job.on_done(relay.finish)
    return job


def _ignore(piece: str) -> None:
    """Pieces nobody streams (the no-JavaScript post waits for the whole reply)."""


def _reply(request: Request, session: Session, user: WebUser, ask: workflow.ReplyRequest) -> Response:
    """The reply to the message just stored: streamed as events when asked, else waited for."""
    session.commit()  # the message is stored before the model sees it, and no lock is held meanwhile
    if "text/event-stream" in request.headers.get("accept", ""):
        relay = _Relay()
        _start_reply(request, ask, relay)
        return StreamingResponse(
            relay.events(),
            media_type="text/event-stream",
            headers={"cache-control": "no-cache", "x-accel-buffering": "no"},
        )
    try:
        _start_reply(request, ask).wait()
    except Exception as err:
        worker = _worker(session, user)
        task = workflow.open_task(session, worker, ask.task_id)
        return _task_page(request, session, worker, task, 502, error=_model_failure(err))
    return redirect(f"/star/tasks/{ask.task_id}#turn-{ask.index}")


@pages.post("/tasks/{task_id}/finish")
def finish(
    request: Request,
    session: DbSession,
    user: WorkerUser,
    task_id: TaskId,
    assigned_rule_broken: Annotated[Literal["yes", "no", "unsure"], Form()],
    other_rules_broken: Annotated[list[str], Form()] = [],  # noqa: B006 (FastAPI copies form defaults)
    groups_mentioned: Annotated[list[str], Form()] = [],  # noqa: B006
) -> Response:
    """The pre-annotation, then the dialogue goes to the engine (and on to annotators)."""
    answers = {
        "assigned_rule_broken": {"yes": True, "no": False}.get(assigned_rule_broken),
        "other_rules_broken": other_rules_broken,
        "groups_mentioned": groups_mentioned,
    }
    try:
        workflow.finish(session, _worker(session, user), task_id, answers)
    except UserError as err:
        session.rollback()
        if workflow.finish_problem(session, workflow.open_task(session, _worker(session, user), task_id)):
            # post/redirect/get: the page says why, and reloading it is no re-post (nor a 405)
            return redirect(f"/star/tasks/{task_id}?problem=finish#finish-heading")
        return _failed(request, session, user, task_id, err)
    return redirect("/star/queue?msg=submitted")


@pages.post("/tasks/{task_id}/rating")
def rate(
    request: Request,
    session: DbSession,
    user: WorkerUser,
    task_id: TaskId,
    rating: Annotated[int, Form(ge=0, le=9)],
    reason: Annotated[PlainText, Form(max_length=MAX_TEXT)] = "",
) -> Response:
    """An annotation or arbitration: a point on the campaign's scale and a reason, both required."""
    worker = _worker(session, user)
    try:
        workflow.submit_rating(session, worker, task_id, rating, reason)
    except UserError as err:
        return _failed(request, session, user, task_id, err)
    decided = workflow.open_task(session, worker, task_id).kind == TaskKind.ARBITRATE
    return redirect(f"/star/queue?msg={'decided' if decided else 'rated'}")


# --- organisers: campaigns, dashboard, report -----------------------------------------------------------


def _campaign(session: Session, name: str) -> StarCampaign:
    """The campaign by name, or a 404."""
    found = status.find_campaign(session, name)
    if found is None:
        raise HTTPException(404, f"no campaign {name!r}")
    return found


@pages.get("/campaigns", response_class=HTMLResponse)
def campaigns(request: Request, session: DbSession, user: Organiser) -> Response:
    """Every campaign with its settings."""
    rows = status.list_campaigns(session)
    settings = {c.id: live.settings_of(session, c) for c in rows}
    return render(request, "star_campaigns.html", campaigns=rows, settings=settings)


def _dashboard(
    request: Request, session: Session, campaign: StarCampaign, status_code: int = 200, **extra: Any
) -> Response:
    """The campaign page: the read model, the settings form, the report and its build."""
    build = _background(request).latest("report", campaign.id)  # before the report: a build ending between
    report = live.latest_report(session, campaign)  # the two reads then still shows its report
    return render(
        request,
        "star_dashboard.html",
        status_code,
        campaign=campaign,
        progress=status.campaign_status(session, campaign),
        settings=live.settings_of(session, campaign),
        report_at=report.created_at if report else None,
        report_options=reporting.used_options(report),
        default_min_n=reporting.DEFAULT_MIN_N,
        report_build=build,
        embedders=live.EMBEDDERS,
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
    form = {
        "target_model": target_model,
        "max_new_tokens": max_new_tokens,
        "temperature": temperature,
        "claim_timeout_minutes": claim_timeout_minutes,
        "break_minutes": break_minutes,
    }
    try:
        live.update_settings(session, campaign, form)
    except UserError as err:
        session.rollback()
        return _dashboard(request, session, campaign, 400, settings_error=str(err))
    return redirect(f"/star/campaigns/{campaign.name}#settings")


@pages.post("/campaigns/{name}/report")
def build_report(
    request: Request,
    session: DbSession,
    user: Organiser,
    name: CampaignName,
    embedder: Annotated[MapEmbedder, Form()] = "minilm",
    min_n: Annotated[int, Form(ge=1, le=100_000)] = reporting.DEFAULT_MIN_N,
    paper_tests: Annotated[bool, Form()] = False,
) -> Response:
    """Start building the analysis report in the background (one per campaign at a time) with the command
    line's options (``--min-n``, ``--paper-tests``); the campaign page shows while it runs, why the last
    one failed, and which options the stored report used."""
    campaign = _campaign(session, name)
    sessions, campaign_id, user_id = request.app.state.sessions, campaign.id, user.id
    options = reporting.ReportOptions(embedder=embedder, min_n=min_n, paper_tests=paper_tests)
    _background(request).submit_unique(
        "report",
        f"STAR report for {campaign.name}",
        lambda: reporting.build_report_job(sessions, campaign_id, user_id, options),
        key=campaign.id,
    )
    return redirect(f"/star/campaigns/{campaign.name}#report-heading")


@pages.get("/campaigns/{name}/report", response_class=HTMLResponse)
def show_report(session: DbSession, user: Organiser, name: CampaignName) -> Response:
    """The stored report as it is (self-contained), under a CSP that lets its inline styles and images in."""
    row = live.latest_report(session, _campaign(session, name))
    if row is None:
        raise HTTPException(404, "no report yet: build one on the campaign page")
    return HTMLResponse(row.html, headers={"content-security-policy": REPORT_CSP})


# --- theme labelling: the rules are assay.star.theme_labels ----------------------------------------------


def _reviewer(session: Session, user: WebUser) -> theme_labels.Reviewer:
    """The account as theme labelling sees it: roles and the campaigns it is a pool member of."""
    return theme_labels.Reviewer(
        user_id=user.id,
        organiser=Role.ORGANISER in user.roles,
        roles=frozenset(user.roles),
        campaign_ids=frozenset(p.campaign_id for p in participants_of(session, user)),
    )


def _themes_page(
    request: Request,
    session: Session,
    user: WebUser,
    campaign: StarCampaign,
    status_code: int = 200,
    **extra: Any,
) -> Response:
    found = theme_labels.board(session, campaign, _reviewer(session, user))
    return render(request, "star_themes.html", status_code, campaign=campaign, board=found, **extra)


@pages.get("/campaigns/{name}/themes", response_class=HTMLResponse)
def themes(request: Request, session: DbSession, user: ThemeReviewer, name: CampaignName) -> Response:
    """The clusters of the latest map: terms, typical dialogues, your label, and disagreements to settle."""
    return _themes_page(request, session, user, _campaign(session, name))


@pages.post("/campaigns/{name}/themes/{action:theme_action}", response_class=HTMLResponse)
def label_theme(
    request: Request,
    session: DbSession,
    user: ThemeReviewer,
    name: CampaignName,
    action: Annotated[Literal["label", "settle"], Path()],
    key: ClusterKey,
    label: ThemeLabelText,
) -> Response:
    """Label a cluster (two reviewers) or settle it (a third, where the two differ)."""
    campaign = _campaign(session, name)
    change = theme_labels.review if action == "label" else theme_labels.settle
    try:
        change(session, campaign, _reviewer(session, user), key, label)
    except UserError as err:
        session.rollback()
        return _themes_page(request, session, user, campaign, 400, error=str(err), failed_key=key)
    return redirect(f"/star/campaigns/{campaign.name}/themes#cluster-{key}")


@pages.get("/campaigns/{name}/themes/labels.csv")
def theme_labels_csv(session: DbSession, user: ThemeReviewer, name: CampaignName) -> Response:
    """The decided labels as CSV, for ``assay star report --theme-labels``."""
    campaign = _campaign(session, name)
    return Response(
        theme_labels.labels_csv(theme_labels.decided_labels(session, campaign, _reviewer(session, user))),
        media_type="text/csv; charset=utf-8",
        headers={"content-disposition": f'attachment; filename="{campaign.name}-theme-labels.csv"'},
    )


# --- JSON API -------------------------------------------------------------------------------------------


class TaskOut(BaseModel):
    id: int
    campaign: str
    kind: TaskKind
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
    kinds: list[TaskKind]


class MyTasksOut(BaseModel):
    tasks: list[TaskOut] = Field(description="claimed tasks, then the 50 most recently finished")
    claimable: list[ClaimableOut]


class ClaimIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    kind: TaskKind
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


class GiveBackOut(BaseModel):
    task_id: int
    kind: TaskKind
    message: str = Field(description="the task is open for anyone again; it does not count against you")


NOT_YOURS = {404: {"description": "No such task of yours"}}
FORBIDDEN = {403: {"description": "Your roles do not allow this"}}
REFUSED = {400: {"description": "The engine refused it (one line says why)"}}


def _task_out(session: Session, task: StarTask) -> TaskOut:
    """A task as the API shows it, with when an unfinished claim goes back to the queue."""
    campaign = workflow.campaign_of(session, task)
    deadline = workflow.claim_deadline(task, live.settings_of(session, campaign))
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
def api_my_tasks(session: DbSession, user: WorkerUser) -> MyTasksOut:
    worker = _worker(session, user)
    tasks = [_task_out(session, t) for t in workflow.my_tasks(session, worker)]
    claimable = [
        ClaimableOut(participant_id=p.id, campaign=c.name, kinds=kinds)  # type: ignore[arg-type]
        for p, c, kinds in workflow.claimable(session, worker)
    ]
    return _answer(session, MyTasksOut(tasks=tasks, claimable=claimable))


@api.post(
    "/tasks/claim",
    response_model=ClaimOut,
    summary="Claim the next task of a kind you may do",
    responses={**FORBIDDEN, 404: {"description": "You do not act as that participant"}},
)
def api_claim(request: Request, session: DbSession, user: WorkerUser, body: ClaimIn) -> ClaimOut:
    worker = _released(session, user)
    done = workflow.claim(request.app.state.sessions, worker, body.participant_id, body.kind)
    if done.task_id is None:
        return ClaimOut(task=None, new=False, message=NOTICES["none"].format(kind=KIND_LABEL[body.kind]))
    message = "claimed" if done.new else "you hold a task of this kind already: finish it or give it back"
    task = workflow.open_task(session, worker, done.task_id)
    return _answer(session, ClaimOut(task=_task_out(session, task), new=done.new, message=message))


def _rating_out(likert: list[str], rating: int, reason: str) -> RatingOut:
    return RatingOut(rating=rating, label=likert[rating], reason=reason)


@api.get("/tasks/{task_id:int}", response_model=TaskViewOut, summary="One of your tasks", responses=NOT_YOURS)
def api_task(session: DbSession, user: WorkerUser, task_id: TaskId) -> TaskViewOut:
    """What the task's page shows: the dialogue (and for arbitration the primary ratings), never more."""
    view = workflow.task_view(session, workflow.open_task(session, _worker(session, user), task_id))
    mine = view.mine and _rating_out(view.likert, view.mine.rating, view.mine.reason)
    answer = TaskViewOut(
        task=_task_out(session, view.task),
        rule=view.rule.text,
        instruction=view.instruction,
        topic=view.topic,
        likert=view.likert,
        turns=[TurnOut(role=role, text=text) for role, text in view.turns],  # type: ignore[arg-type]
        earlier_ratings=[_rating_out(view.likert, r.rating, r.reason) for r in view.earlier],
        my_rating=mine or None,
    )
    return _answer(session, answer)


@api.post(
    "/tasks/{task_id}/annotation",
    response_model=AnnotationOut,
    summary="Rate the dialogue of your annotation or arbitration task",
    responses={**NOT_YOURS, **REFUSED},
)
def api_annotate(session: DbSession, user: WorkerUser, task_id: TaskId, body: AnnotationIn) -> AnnotationOut:
    worker = _worker(session, user)
    annotation_id = workflow.submit_rating(session, worker, task_id, body.rating, body.reason)
    session.commit()  # the rating is stored before the task is read back for the answer
    task = workflow.open_task(session, worker, task_id)
    return _answer(session, AnnotationOut(annotation_id=annotation_id, task=_task_out(session, task)))


@api.post(
    "/tasks/{task_id}/give-back",
    response_model=GiveBackOut,
    summary="Give a task you are working on back to the pool (skip it)",
    responses={**NOT_YOURS, **REFUSED},
)
def api_give_back(session: DbSession, user: WorkerUser, task_id: TaskId) -> GiveBackOut:
    """Open for anyone at once, not counted against you (daily cap, finished work), in the audit trail. A
    claim of the same kind afterwards may offer it to you again when it is the oldest you may take."""
    given = workflow.give_back(session, _worker(session, user), task_id)
    return _answer(session, GiveBackOut(task_id=given.task_id, kind=given.kind, message=GIVEN_BACK))  # type: ignore[arg-type]


@api.get(
    "/campaigns/{name}/progress",
    response_model=CampaignStatus,
    summary="A campaign's progress, shortfalls and agreement (organisers)",
    responses={**FORBIDDEN, 404: {"description": "No such campaign"}},
)
def api_progress(session: DbSession, user: Organiser, name: CampaignName) -> CampaignStatus:
    return status.campaign_status(session, _campaign(session, name))


class ThemeLabelIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    key: str = Field(min_length=1, max_length=64, pattern=r"^[0-9a-f]+$", description="the cluster's key")
    label: Annotated[PlainText, Field(min_length=1, max_length=theme_labels.MAX_LABEL)]


class ThemeLabelOut(BaseModel):
    key: str
    status: theme_labels.Status


class ThemeLabelsOut(BaseModel):
    labels: list[theme_labels.ThemeLabel] = Field(description="decided labels, oldest first")


THEMES_REFUSED = {**FORBIDDEN, **REFUSED, 404: {"description": "No such campaign"}}


@api.get(
    "/campaigns/{name}/themes",
    response_model=theme_labels.ThemeBoard,
    summary="The latest thematic map's clusters and their labels, as you may see them",
    responses=THEMES_REFUSED,
)
def api_themes(session: DbSession, user: ThemeReviewer, name: CampaignName) -> theme_labels.ThemeBoard:
    return theme_labels.board(session, _campaign(session, name), _reviewer(session, user))


@api.get(
    "/campaigns/{name}/themes/labels",
    response_model=ThemeLabelsOut,
    summary="The decided theme labels (what `assay star report --theme-labels` reads)",
    responses=THEMES_REFUSED,
)
def api_theme_labels(session: DbSession, user: ThemeReviewer, name: CampaignName) -> ThemeLabelsOut:
    labels = theme_labels.decided_labels(session, _campaign(session, name), _reviewer(session, user))
    return ThemeLabelsOut(labels=labels)


@api.post(
    "/campaigns/{name}/themes/{action:theme_action}",  # a word, so POST .../themes/labels is a 405
    response_model=ThemeLabelOut,
    summary="Label a cluster (two reviewers), or settle one they named differently (a third)",
    responses=THEMES_REFUSED,
)
def api_label_theme(
    session: DbSession,
    user: ThemeReviewer,
    name: CampaignName,
    action: Annotated[Literal["label", "settle"], Path()],
    body: ThemeLabelIn,
) -> ThemeLabelOut:
    campaign = _campaign(session, name)
    reviewer = _reviewer(session, user)
    if action == "label":
        done = theme_labels.review(session, campaign, reviewer, body.key, body.label)
    else:
        theme_labels.settle(session, campaign, reviewer, body.key, body.label)
        done = "settled"
    session.commit()
    return ThemeLabelOut(key=body.key, status=done)


router = APIRouter()
router.include_router(pages)
router.include_router(api)
