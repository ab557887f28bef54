"""The leaderboard on the web: rounds, standings, a team's submissions, detector uploads and live jobs.

Pages live under ``/leaderboard``, the JSON API under ``/api/v1/leaderboard``. Who sees what, and how much,
is decided by ``assay.leaderboard.views`` (its docstring states the sharing rule), the same functions the
command line calls; this module turns the signed-in account into a ``Viewer``, calls them, and renders.
A refusal from the pillar becomes a 404 (``NotVisible``: the thing does not exist for this user) or a 403
(``NotAllowed``) for every route here, through the router's route class.

Four GET routes answer visitors who are not signed in as well (``Anyone``: ``Viewer.anonymous`` for them):
the rounds list (page and API), a round's page and its standings in the API; the pillar shows such a
visitor the public rounds only (a private round is a 404, as one that does not exist). Those anonymous
answers say ``PUBLIC_HEADERS`` (cacheable for a minute); every other route needs a sign-in, and every
signed-in answer stays ``no-store``.

Uploads: the body is refused past ``MAX_UPLOAD_BYTES`` as it arrives (``BoundedBody``), then unpacked and
validated by ``assay.leaderboard.submissions`` (no ``..``, no links, unpacked size and file-count limits).
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

from fastapi import APIRouter, Depends, File, Form, HTTPException, Query, Request, UploadFile
from fastapi import Path as PathParam
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from pydantic import BaseModel
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from assay.config import settings
from assay.durations import duration
from assay.errors import UserError
from assay.leaderboard import rounds, submissions, views
from assay.leaderboard.disclosure import metric_digits
from assay.leaderboard.sealing import MAX_PUBLISH_EVERY_S
from assay.leaderboard.status import JobProgress, QueueStatus
from assay.leaderboard.views import NotAllowed, NotVisible, RoundOut, StandingsOut, SubmissionOut, Viewer
from assay.store.enums import Role, SubmissionStatus
from assay.store.models import Submission
from assay.store.web_models import WebUser
from assay.web.paging import Page, Paging
from assay.web.params import ObjectId
from assay.web.routes import Area, redirect, render
from assay.web.security import PUBLIC_HEADERS, CurrentUser, DbSession, Visitor, require
from assay.web.uploads import FORM_OVERHEAD, TooLarge, bounded_route

MAX_UPLOAD_BYTES = 200 * 2**20  # the archive; read at request time, so tests can lower it
ARCHIVE_SUFFIXES = (".tar.gz", ".tgz", ".tar", ".zip")

RoundName = Annotated[
    str,
    PathParam(min_length=1, max_length=100, pattern=r"^[^\x00-\x1f\x7f]+$", description="The round's name."),
]
SubmitSplit = Literal["test", "smoke", "train"]
SUBMIT_SPLITS = get_args(SubmitSplit)

AREAS = [
    Area("Leaderboard", "/leaderboard", (), "Trojan-detector rounds, standings and uploads.", 10, public=True)
]


# --- uploads: a body limit enforced while the body arrives (``assay.web.uploads``) ---------------------


class UploadTooLarge(TooLarge):
    """413 with a message that says the limit and what to do."""

    def __init__(self) -> None:
        super().__init__(
            f"the upload is larger than the limit of {MAX_UPLOAD_BYTES / 2**20:g} MiB: leave out what the "
            "detector does not need to run (training data, caches, checkpoints) and upload it again"
        )


def _body_limit() -> int:
    """The archive and the form around it; read per request, so tests can lower the constants."""
    return MAX_UPLOAD_BYTES + FORM_OVERHEAD


BoundedBody = bounded_route(_body_limit, UploadTooLarge)


class LeaderboardRoute(BoundedBody):  # type: ignore[misc,valid-type]
    """A bounded body, and the pillar's refusals as HTTP errors: ``NotVisible`` 404, ``NotAllowed`` 403."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def refusals_as_http(request: Request) -> Response:
            try:
                return await handler(request)
            except NotVisible as exc:
                raise HTTPException(404, str(exc)) from None
            except NotAllowed as exc:
                raise HTTPException(403, str(exc)) from None

        return refusals_as_http


class Problem(BaseModel):
    """An error: what went wrong, in one line."""

    detail: str


pages = APIRouter(prefix="/leaderboard", include_in_schema=False, route_class=LeaderboardRoute)
api = APIRouter(
    prefix="/api/v1/leaderboard",
    tags=["leaderboard"],
    route_class=LeaderboardRoute,
    responses={401: {"model": Problem, "description": "Not signed in, or a revoked API token"}},
)


def _viewer(user: CurrentUser) -> Viewer:
    """The signed-in account as the pillar's viewer: its roles and the team it is linked to."""
    return Viewer(frozenset(user.roles), user.team.name if user.team is not None else None)


def _anyone(user: Visitor) -> Viewer:
    """The signed-in account's viewer, or a visitor's who is not signed in (``Viewer.anonymous``)."""
    return _viewer(user) if user is not None else Viewer.anonymous()


def _public_headers(viewer: Viewer) -> dict[str, str]:
    """What a visitor who is not signed in reads is the same for every visitor: caches may keep it."""
    return {} if viewer.signed_in else PUBLIC_HEADERS


SignedIn = Annotated[Viewer, Depends(_viewer)]
Anyone = Annotated[Viewer, Depends(_anyone)]
Organiser = Annotated[WebUser, Depends(require(Role.ORGANISER))]


# --- taking an upload ------------------------------------------------------------------------------------


def _archive_suffix(filename: str) -> str:
    suffix = next((s for s in ARCHIVE_SUFFIXES if filename.lower().endswith(s)), None)
    if suffix is None:
        raise UserError(
            f"{filename or 'the upload'}: upload the detector folder (entrypoint.py, metaparameters.json, "
            "metaparameters_schema.json) as a .tar.gz, .tgz, .tar or .zip archive"
        )
    return suffix


def _save_upload(archive: UploadFile, folder: Path) -> Path:
    """Copy the upload, which the form parser spooled to disk, to ``folder`` in 1 MiB pieces."""
    target = folder / f"upload{_archive_suffix(archive.filename or '')}"
    copied = 0
    with target.open("wb") as out:
        while chunk := archive.file.read(2**20):
            copied += len(chunk)
            if copied > MAX_UPLOAD_BYTES:
                raise UploadTooLarge()
            out.write(chunk)
    return target


def submit_upload(
    session: Session, team: str, round_name: str, split: str, archive: UploadFile
) -> Submission:
    """Hand the upload to ``submissions.submit``; errors name the uploaded file, never a server path.

    Anything but a database error from unpacking and validating is the archive's fault (a corrupt gzip
    stream, an encrypted zip member, a metaparameters file that is not UTF-8) and becomes a ``UserError``.
    """
    shown = archive.filename or "the upload"
    artifacts = settings().home / "artifacts"
    artifacts.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=artifacts, prefix=".upload-") as scratch:
        path = _save_upload(archive, Path(scratch))
        try:
            return submissions.submit(session, artifacts, team, round_name, split, path)
        except UserError as exc:
            message = str(exc)
        except SQLAlchemyError:
            raise
        except Exception as exc:
            message = f"{path}: cannot unpack this archive ({type(exc).__name__}: {exc})"
    raise UserError(message.replace(str(path), shown).replace(f"{artifacts}/", ""))


# --- pages -------------------------------------------------------------------------------------------------

METRIC_LABELS = {
    "cross_entropy": "Cross entropy (lower is better)",
    "ce_ci_90": "CE 90% CI half-width",
    "ce_ci_95": "CE 95% CI half-width",
    "ce_ci_98": "CE 98% CI half-width",
    "ce_ci_99": "CE 99% CI half-width",
    "roc_auc": "ROC-AUC",
    "brier": "Brier score",
    "tpr_at_5_fpr": "TPR at 5% FPR",
    "ece": "Expected calibration error",
    "n": "Models",
    "positives": "Trojaned models",
    "shown_low": "Disclosed score: at least",
    "shown_high": "Disclosed score: at most",
    "shown_share": "Share of label vectors scoring as well",
    "shown_bits": "Bits about the test labels this shows",
    "shown_showings": "Showings these answers allow",
    "shown_cells": "Cells of the grid",
}


@pages.get("", response_class=HTMLResponse)
def rounds_page(request: Request, session: DbSession, viewer: Anyone, window: Paging) -> Response:
    rounds, total = views.visible_rounds(session, viewer, window)
    return render(
        request,
        "leaderboard_rounds.html",
        headers=_public_headers(viewer),
        rounds=rounds,
        total=total,
        window=window,
        organiser=views.is_organiser(viewer),
    )


@pages.get("/rounds/{name}", response_class=HTMLResponse)
def round_page(request: Request, session: DbSession, viewer: Anyone, name: RoundName) -> Response:
    board = views.round_board(session, viewer, name)
    organiser = views.is_organiser(viewer)
    return render(
        request,
        "leaderboard_round.html",
        headers=_public_headers(viewer),
        organiser=organiser,
        **dict(board),
    )


def _upload_page(
    request: Request, session: Session, viewer: Viewer, name: str, status_code: int = 200, **extra: Any
) -> Response:
    form = views.upload_form(session, viewer, name)
    return render(
        request,
        "leaderboard_upload.html",
        status_code=status_code,
        round=form.round,
        team=form.team,
        splits=[split for split in SUBMIT_SPLITS if split in form.round.splits],
        window=form.window,
        max_bytes=MAX_UPLOAD_BYTES,
        own=form.own,
        **extra,
    )


@pages.post("/rounds/{name}/settings", response_class=HTMLResponse)
def round_settings(
    request: Request,
    session: DbSession,
    user: Organiser,
    name: RoundName,
    plateau_delta: Annotated[float, Form(ge=0, le=1e6, allow_inf_nan=False)],
    plateau_days: Annotated[float, Form(gt=0, le=3650, allow_inf_nan=False)],
    publish_every_s: Annotated[int | None, Form(ge=1, le=MAX_PUBLISH_EVERY_S)] = None,
) -> Response:
    """The organiser's plateau rule and publication clock for the round, changed and written to the audit
    trail."""
    rounds.set_plateau(session, name, plateau_delta, plateau_days, actor_id=user.id)
    if publish_every_s is not None:
        rounds.set_publication(session, name, publish_every_s, actor_id=user.id)
    return redirect(f"/leaderboard/rounds/{name}")


@pages.post("/rounds/{name}/public", response_class=HTMLResponse)
def round_public(
    session: DbSession, user: Organiser, name: RoundName, public: Annotated[bool, Form()]
) -> Response:
    """The organiser opens the round's standings to visitors who are not signed in, or closes them; the
    change is written to the audit trail."""
    rounds.set_public(session, name, public, actor_id=user.id)
    return redirect(f"/leaderboard/rounds/{name}")


@pages.get("/rounds/{name}/submit", response_class=HTMLResponse)
def upload_form(request: Request, session: DbSession, viewer: SignedIn, name: RoundName) -> Response:
    return _upload_page(request, session, viewer, name)


@pages.post("/rounds/{name}/submit", response_class=HTMLResponse)
def upload(
    request: Request,
    session: DbSession,
    viewer: SignedIn,
    name: RoundName,
    split: Annotated[SubmitSplit, Form()],
    archive: Annotated[UploadFile, File()],
) -> Response:
    """Accepted: on to the job page; rejected or unreadable: the form again, saying why."""
    round_name = views.find_round(session, viewer, name).name
    team = views.submitting_team(viewer)
    try:
        made = submit_upload(session, team, round_name, split, archive)
    except (UserError, UploadTooLarge) as exc:
        session.rollback()
        code = 413 if isinstance(exc, UploadTooLarge) else 400
        message = exc.detail if isinstance(exc, UploadTooLarge) else str(exc)
        return _upload_page(request, session, viewer, name, code, error=message, chosen=split)
    if made.status == SubmissionStatus.REJECTED:
        rejected = views.submission_view(session, viewer, made.id)
        return _upload_page(request, session, viewer, name, 400, rejected=rejected, chosen=split)
    if made.job is not None:
        return redirect(f"/leaderboard/jobs/{made.job.id}")
    return redirect(f"/leaderboard/submissions/{made.id}")


@pages.get("/submissions/{submission_id}", response_class=HTMLResponse)
def submission_page(
    request: Request, session: DbSession, viewer: SignedIn, submission_id: ObjectId
) -> Response:
    record = views.submission_view(session, viewer, submission_id)
    return render(
        request,
        "leaderboard_submission.html",
        sub=record,
        roc=views.roc_svg(session, record),
        labels=METRIC_LABELS,
        digits=metric_digits(record.metrics),
        group_name=views.group_name,
        organiser=views.is_organiser(viewer),
    )


@pages.get("/submissions/{submission_id}/logs", response_class=PlainTextResponse)
def submission_logs(session: DbSession, viewer: SignedIn, submission_id: ObjectId) -> PlainTextResponse:
    """The harness's notes, and the detector's stderr per model where the split shares it."""
    logs = views.submission_logs(session, viewer, submission_id)
    head = f"submission {logs.submission_id}: team {logs.team}, {logs.round}/{logs.split}, {logs.status}"
    lines = [head, "", "harness log:", logs.harness_log.rstrip() or "(empty)", ""]
    if not logs.detector_output_shared:
        lines.append(f"detector output is not shared for the {logs.split} split")
    for row in logs.models:
        lines += [
            f"--- {row.model}: exit code {row.exit_code}, {duration(row.seconds)} {row.flags}",
            row.stderr or "",
        ]
    return PlainTextResponse("\n".join(lines) + "\n")


@pages.get("/jobs/{job_id}", response_class=HTMLResponse)
def job_page(request: Request, session: DbSession, viewer: SignedIn, job_id: ObjectId) -> Response:
    return render(request, "leaderboard_job.html", progress=views.job_view(session, viewer, job_id))


@pages.get("/status", response_class=HTMLResponse)
def status_page(request: Request, session: DbSession, viewer: SignedIn) -> Response:
    return render(request, "leaderboard_status.html", status=views.queue_view(session, viewer))


# --- JSON API ----------------------------------------------------------------------------------------------

NOT_FOUND = {404: {"model": Problem, "description": "No such object, or not yours to see"}}


OPTIONAL_TOKEN = {"security": [{}]}  # a token is optional here: OpenAPI's empty requirement
PUBLIC_401 = {
    401: {"model": Problem, "description": "A revoked or unknown API token (without one: public rounds)"}
}


@api.get(
    "/rounds",
    response_model=Page[RoundOut],
    responses=PUBLIC_401,
    summary="Rounds you can see, newest first",
    description="Without a sign-in: the rounds an organiser made public only.",
    openapi_extra=OPTIONAL_TOKEN,
)
def api_rounds(response: Response, session: DbSession, viewer: Anyone, window: Paging) -> Page[RoundOut]:
    page = Page.of(*views.visible_rounds(session, viewer, window), window)
    response.headers.update(_public_headers(viewer))
    return page


@api.get(
    "/rounds/{name}/standings",
    response_model=StandingsOut,
    responses={**NOT_FOUND, **PUBLIC_401},
    summary="A round's ranked results on test, or on holdout once the round is closed",
    description="Without a sign-in: the rounds an organiser made public only (any other round is a 404).",
    openapi_extra=OPTIONAL_TOKEN,
)
def api_standings(
    response: Response,
    session: DbSession,
    viewer: Anyone,
    name: RoundName,
    split: Annotated[Literal["test", "holdout"], Query(description="test or holdout")] = "test",
    every: Annotated[bool, Query(alias="all", description="Every submission, not each team's best")] = False,
) -> StandingsOut:
    table = views.standings_view(session, viewer, name, split, best=not every)
    response.headers.update(_public_headers(viewer))
    return table


@api.get(
    "/submissions/{submission_id}",
    response_model=SubmissionOut,
    responses=NOT_FOUND,
    summary="One of your team's submissions (organisers: any), as much as its split shares",
)
def api_submission(session: DbSession, viewer: SignedIn, submission_id: ObjectId) -> SubmissionOut:
    return views.submission_view(session, viewer, submission_id)


@api.get(
    "/jobs/{job_id}",
    response_model=JobProgress,
    responses=NOT_FOUND,
    summary="A job's progress: models done out of total, and its status",
)
def api_job(session: DbSession, viewer: SignedIn, job_id: ObjectId) -> JobProgress:
    return views.job_view(session, viewer, job_id)


@api.post(
    "/rounds/{name}/submissions",
    response_model=SubmissionOut,
    status_code=201,
    responses={
        **NOT_FOUND,
        400: {"model": Problem, "description": "Rejected (the detail says why) or not a readable archive"},
        403: {"model": Problem, "description": "Not a member of a team, or a missing CSRF token"},
        413: {"model": Problem, "description": "The archive is larger than the upload limit"},
    },
    summary="Submit a detector archive (.tar.gz, .tgz, .tar or .zip) for your team",
)
def api_submit(
    session: DbSession,
    viewer: SignedIn,
    name: RoundName,
    archive: Annotated[UploadFile, File(description="The detector folder as .tar.gz, .tgz, .tar or .zip")],
    split: Annotated[SubmitSplit, Form(description="test (windowed), smoke or train")] = "test",
) -> Response | SubmissionOut:
    """Queued or duplicate: 201 with the record. Rejected: 400, and the rejection is kept on record."""
    round_name = views.find_round(session, viewer, name).name
    made = submit_upload(session, views.submitting_team(viewer), round_name, split, archive)
    if made.status == SubmissionStatus.REJECTED:
        detail = f"submission {made.id} rejected: " + "; ".join(made.validation_errors.splitlines())
        return JSONResponse({"detail": detail}, status_code=400)
    return views.submission_view(session, viewer, made.id)


@api.get(
    "/status",
    response_model=QueueStatus,
    responses={403: {"model": Problem, "description": "Organisers only"}},
    summary="Organisers: round states, queue depth and worker heartbeats",
)
def api_status(session: DbSession, viewer: SignedIn) -> QueueStatus:
    return views.queue_view(session, viewer)


router = APIRouter()
router.include_router(pages)
router.include_router(api)
