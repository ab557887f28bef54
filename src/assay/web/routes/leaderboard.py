"""The leaderboard on the web: rounds, standings, a team's submissions, detector uploads and live jobs.

Pages live under ``/leaderboard``, the JSON API under ``/api/v1/leaderboard``; both call the same helpers,
so a rule holds in both or in neither. Who sees what (the sharing rule):

- Rounds and their test standings: every signed-in user (draft rounds: organisers only). A standings row is
  the public aggregate only: rank, team, technique, overall metrics, number of flagged models.
- Holdout: organisers always; everyone else only once the round is closed. Before that holdout standings and
  holdout submissions are absent from pages and API alike (404), not shown empty.
- A submission, its job and its logs: members of the submitting team and organisers; to anyone else the
  submission does not exist (404). How much detail the team sees depends on the split (``detail_level``):
  train and smoke, whose ground truth the team holds: everything (each model's answer, the truth, flags,
  exit code, time, the detector's stderr, metrics by METADATA factor); test: the overall metrics, the ROC
  curve and each model's NIST flag only (no answers, times or output, so a detector cannot carry facts about
  sequestered models out); holdout: the overall metrics and ROC only. Organisers see everything.
- Uploads: members of an enabled team, to an open round's train, smoke or test split. The body is refused
  past ``MAX_UPLOAD_BYTES`` as it arrives (``BoundedBody``), then unpacked and validated by
  ``assay.leaderboard.submissions`` (no ``..``, no links, unpacked size and file-count limits).
"""

from __future__ import annotations

import tempfile
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

from fastapi import APIRouter, Depends, File, Form, HTTPException, Query, Request, UploadFile
from fastapi import Path as PathParam
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from pydantic import BaseModel
from sqlalchemy import select
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from assay.config import settings
from assay.errors import UserError
from assay.leaderboard import publish, submissions
from assay.leaderboard.publish import Standing
from assay.leaderboard.rounds import get_split
from assay.leaderboard.scoring import read_truth
from assay.leaderboard.status import JobProgress, QueueStatus, job_progress, queue_status
from assay.store.models import SPLIT_NAMES, Job, Round, Submission, Team, as_utc, utcnow
from assay.store.web_models import WebUser
from assay.web.accounts import has_role
from assay.web.routes import Area, redirect, render
from assay.web.security import CurrentUser, DbSession, require
from assay.web.uploads import FORM_OVERHEAD, TooLarge, bounded_route

MAX_UPLOAD_BYTES = 200 * 2**20  # the archive; read at request time, so tests can lower it
ARCHIVE_SUFFIXES = (".tar.gz", ".tgz", ".tar", ".zip")
MAX_ID = 2**31 - 1  # ids are 32-bit on PostgreSQL; a larger one is a 422, never a database error

RoundName = Annotated[
    str,
    PathParam(min_length=1, max_length=100, pattern=r"^[^\x00-\x1f\x7f]+$", description="The round's name."),
]
ObjectId = Annotated[int, PathParam(ge=1, le=MAX_ID)]
SubmitSplit = Literal["test", "smoke", "train"]
SUBMIT_SPLITS = get_args(SubmitSplit)
Detail = Literal["full", "errors", "aggregate"]
Organiser = Annotated[WebUser, Depends(require("organiser"))]

AREAS = [Area("Leaderboard", "/leaderboard", (), "Trojan-detector rounds, standings and uploads.", order=10)]


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


class Problem(BaseModel):
    """An error: what went wrong, in one line."""

    detail: str


pages = APIRouter(prefix="/leaderboard", include_in_schema=False, route_class=BoundedBody)
api = APIRouter(
    prefix="/api/v1/leaderboard",
    tags=["leaderboard"],
    route_class=BoundedBody,
    responses={401: {"model": Problem, "description": "Not signed in, or a revoked API token"}},
)


# --- who may see what ------------------------------------------------------------------------------------


def is_organiser(user: WebUser) -> bool:
    return "organiser" in user.roles


def user_team(user: WebUser) -> Team | None:
    """The team whose submissions the user may see and make: only team members have one here."""
    return user.team if user.team is not None and has_role(user, "team_member") else None


def holdout_hidden(round_: Round, user: WebUser) -> bool:
    """Holdout results stay with the organisers until the round closes."""
    return round_.status not in ("closed", "archived") and not is_organiser(user)


def may_see(user: WebUser, submission: Submission) -> bool:
    """Organisers see every submission; a team member their own team's, holdout ones once it is public."""
    if is_organiser(user):
        return True
    team = user_team(user)
    round_ = submission.split.round
    hidden = round_.status == "draft" or (submission.split.name == "holdout" and holdout_hidden(round_, user))
    return team is not None and submission.team_id == team.id and not hidden


def detail_level(user: WebUser, submission: Submission) -> Detail:
    """How much of a visible submission the user sees (the module docstring gives the rule and why)."""
    if is_organiser(user) or submission.split.show_logs:
        return "full"
    return "errors" if submission.split.name == "test" else "aggregate"


def _round_or_404(session: Session, name: str, user: WebUser) -> Round:
    found = session.scalar(select(Round).where(Round.name == name))
    if found is None or (found.status == "draft" and not is_organiser(user)):
        raise HTTPException(404, f"no round named {name!r}")
    return found


def _submission_or_404(session: Session, user: WebUser, submission_id: int) -> Submission:
    found = session.get(Submission, submission_id)
    if found is None or not may_see(user, found):
        raise HTTPException(404, f"no submission {submission_id}")
    return found


def _job_or_404(session: Session, user: WebUser, job_id: int) -> Job:
    found = session.get(Job, job_id)
    if found is None or not may_see(user, found.submission):
        raise HTTPException(404, f"no job {job_id}")
    return found


def _team_or_403(user: WebUser) -> Team:
    team = user_team(user)
    if team is None:
        raise HTTPException(403, "only members of a team can submit: ask an organiser to add you to one")
    return team


# --- records handed to templates and the API -------------------------------------------------------------


class RoundOut(BaseModel):
    name: str
    status: str
    metric: str
    submission_window_s: int
    opened_at: datetime | None
    closed_at: datetime | None
    splits: list[str]


class StandingsOut(BaseModel):
    round: str
    split: str
    metric: str
    best_per_team: bool
    rows: list[Standing]


class ModelRow(BaseModel):
    """One model of a job; ``answer``, ``truth``, ``exit_code``, ``seconds`` and ``stderr`` at "full" only."""

    model: str
    flags: str
    answer: float | None = None
    truth: int | None = None
    exit_code: int | None = None
    seconds: float | None = None
    stderr: str | None = None


class SubmissionOut(BaseModel):
    id: int
    team: str
    round: str
    split: str
    status: str
    technique: str
    submitted_at: datetime
    sha256: str
    validation_errors: list[str]
    duplicate_of: int | None
    job: JobProgress | None
    detail: Detail
    metrics: dict[str, float | None]
    groups: dict[str, dict[str, dict[str, float | None]]]
    models: list[ModelRow]
    log: str


def round_out(round_: Round) -> RoundOut:
    return RoundOut(
        name=round_.name,
        status=round_.status,
        metric=round_.metric,
        submission_window_s=round_.submission_window_s,
        opened_at=as_utc(round_.opened_at),
        closed_at=as_utc(round_.closed_at),
        splits=[name for name in SPLIT_NAMES if name in {s.name for s in round_.splits}],
    )


def visible_rounds(session: Session, user: WebUser) -> list[Round]:
    rounds = session.scalars(select(Round).order_by(Round.id.desc())).all()
    return [r for r in rounds if r.status != "draft" or is_organiser(user)]


def _truth(submission: Submission) -> dict[str, int]:
    try:
        return read_truth(submission.split.truth_path)
    except UserError:  # a moved round folder: the page still shows what the store holds
        return {}


def _model_rows(submission: Submission, detail: Detail) -> list[ModelRow]:
    if submission.job is None or detail == "aggregate":
        return []
    results = sorted(submission.job.results, key=lambda r: r.model_name)
    if detail == "errors":
        return [ModelRow(model=r.model_name, flags=r.flags) for r in results]
    truth = _truth(submission)
    return [
        ModelRow(
            model=r.model_name,
            flags=r.flags,
            answer=r.value,
            truth=truth.get(r.model_name),
            exit_code=r.exit_code,
            seconds=round(r.wall_seconds, 3),
            stderr=r.stderr,
        )
        for r in results
    ]


def submission_record(session: Session, user: WebUser, submission: Submission) -> SubmissionOut:
    """A visible submission as this user may see it (``detail_level``)."""
    detail = detail_level(user, submission)
    job = submission.job
    metrics = {m.name: m.value for m in job.metrics if not m.group_column} if job else {}
    groups: dict[str, dict[str, dict[str, float | None]]] = {}
    if job is not None and detail == "full":
        for m in job.metrics:
            if m.group_column:
                groups.setdefault(m.group_column, {}).setdefault(m.group_value, {})[m.name] = m.value
    original = session.get(Submission, submission.duplicate_of_id) if submission.duplicate_of_id else None
    return SubmissionOut(
        id=submission.id,
        team=submission.team.name,
        round=submission.split.round.name,
        split=submission.split.name,
        status=submission.status,
        technique=submission.technique,
        submitted_at=as_utc(submission.submitted_at),  # type: ignore[arg-type]
        sha256=submission.artifact_sha256,
        validation_errors=submission.validation_errors.splitlines(),
        duplicate_of=original.id if original is not None and may_see(user, original) else None,
        job=job_progress(session, job) if job is not None else None,
        detail=detail,
        metrics=metrics,
        groups=groups,
        models=_model_rows(submission, detail),
        log=job.log if job is not None else "",
    )


def standings_for(session: Session, user: WebUser, round_: Round, split: str, best: bool) -> StandingsOut:
    """Ranked public rows; holdout ones 404 for non-organisers until the round closes."""
    if split == "holdout" and holdout_hidden(round_, user):
        raise HTTPException(404, "holdout standings are published when the round closes")
    rows = publish.standings(session, round_.name, split, best_per_team=best)
    return StandingsOut(round=round_.name, split=split, metric=round_.metric, best_per_team=best, rows=rows)


def window_reopens(session: Session, team: Team, round_: Round) -> datetime | None:
    """When the team may next submit to the test split (None: now)."""
    test = get_split(round_, "test")
    now = utcnow()
    return submissions.window_reopens_at(session, team.id, test.id, round_.submission_window_s, now)


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
    session: Session, user: WebUser, round_: Round, split: str, archive: UploadFile
) -> Submission:
    """Hand the upload to ``submissions.submit``; errors name the uploaded file, never a server path.

    Anything but a database error from unpacking and validating is the archive's fault (a corrupt gzip
    stream, an encrypted zip member, a metaparameters file that is not UTF-8) and becomes a ``UserError``.
    """
    team = _team_or_403(user)
    shown = archive.filename or "the upload"
    artifacts = settings().home / "artifacts"
    artifacts.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=artifacts, prefix=".upload-") as scratch:
        path = _save_upload(archive, Path(scratch))
        try:
            return submissions.submit(session, artifacts, team.name, round_.name, split, path)
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
}


def _roc(session: Session, submission_id: int) -> str:
    try:
        return publish.roc_svg(session, submission_id, size=240)
    except UserError:  # the round's truth folder moved: the scores in the store are still worth showing
        return ""


def _linkable(user: WebUser, rows: list[Standing]) -> set[int]:
    """Standings rows whose submission page this user may open."""
    team = user_team(user)
    return {r.submission_id for r in rows if is_organiser(user) or (team is not None and r.team == team.name)}


def _team_submissions(session: Session, user: WebUser, team: Team | None, round_: Round) -> list[Submission]:
    if team is None:
        return []
    split_ids = [s.id for s in round_.splits]
    found = session.scalars(
        select(Submission)
        .where(Submission.team_id == team.id, Submission.split_id.in_(split_ids))
        .order_by(Submission.id.desc())
    )
    return [s for s in found if may_see(user, s)]


@pages.get("", response_class=HTMLResponse)
def rounds_page(request: Request, session: DbSession, user: CurrentUser) -> Response:
    return render(
        request, "leaderboard_rounds.html", rounds=visible_rounds(session, user), organiser=is_organiser(user)
    )


@pages.get("/rounds/{name}", response_class=HTMLResponse)
def round_page(request: Request, session: DbSession, user: CurrentUser, name: RoundName) -> Response:
    round_ = _round_or_404(session, name, user)
    team = user_team(user)
    best = publish.standings(session, round_.name, "test")
    every = publish.standings(session, round_.name, "test", best_per_team=False)
    holdout = None if holdout_hidden(round_, user) else publish.standings(session, round_.name, "holdout")
    return render(
        request,
        "leaderboard_round.html",
        round=round_,
        team=team,
        best=best,
        every=every,
        holdout=holdout,
        linkable=_linkable(user, every + (holdout or [])),
        trend=publish.progress(session, round_.name),
        own=_team_submissions(session, user, team, round_),
        window=window_reopens(session, team, round_) if team is not None else None,
    )


def _upload_page(
    request: Request, session: Session, user: WebUser, round_: Round, status_code: int = 200, **extra: Any
) -> Response:
    team = _team_or_403(user)
    return render(
        request,
        "leaderboard_upload.html",
        status_code=status_code,
        round=round_,
        team=team,
        splits=[name for name in SUBMIT_SPLITS if name in {s.name for s in round_.splits}],
        window=window_reopens(session, team, round_),
        max_bytes=MAX_UPLOAD_BYTES,
        own=_team_submissions(session, user, team, round_)[:5],
        **extra,
    )


@pages.get("/rounds/{name}/submit", response_class=HTMLResponse)
def upload_form(request: Request, session: DbSession, user: CurrentUser, name: RoundName) -> Response:
    return _upload_page(request, session, user, _round_or_404(session, name, user))


@pages.post("/rounds/{name}/submit", response_class=HTMLResponse)
def upload(
    request: Request,
    session: DbSession,
    user: CurrentUser,
    name: RoundName,
    split: Annotated[SubmitSplit, Form()],
    archive: Annotated[UploadFile, File()],
) -> Response:
    """Accepted: on to the job page; rejected or unreadable: the form again, saying why."""
    round_ = _round_or_404(session, name, user)
    _team_or_403(user)
    try:
        made = submit_upload(session, user, round_, split, archive)
    except (UserError, UploadTooLarge) as exc:
        session.rollback()
        code = 413 if isinstance(exc, UploadTooLarge) else 400
        message = exc.detail if isinstance(exc, UploadTooLarge) else str(exc)
        return _upload_page(request, session, user, round_, code, error=message, chosen=split)
    if made.status == "rejected":
        return _upload_page(request, session, user, round_, 400, rejected=made, chosen=split)
    if made.job is not None:
        return redirect(f"/leaderboard/jobs/{made.job.id}")
    return redirect(f"/leaderboard/submissions/{made.id}")


@pages.get("/submissions/{submission_id}", response_class=HTMLResponse)
def submission_page(
    request: Request, session: DbSession, user: CurrentUser, submission_id: ObjectId
) -> Response:
    found = _submission_or_404(session, user, submission_id)
    record = submission_record(session, user, found)
    roc = _roc(session, found.id) if record.metrics else ""
    return render(
        request,
        "leaderboard_submission.html",
        sub=record,
        roc=roc,
        labels=METRIC_LABELS,
        organiser=is_organiser(user),
    )


@pages.get("/submissions/{submission_id}/logs", response_class=PlainTextResponse)
def submission_logs(session: DbSession, user: CurrentUser, submission_id: ObjectId) -> PlainTextResponse:
    """The harness's notes, and the detector's stderr per model where the split shares it."""
    record = submission_record(session, user, _submission_or_404(session, user, submission_id))
    head = f"submission {record.id}: team {record.team}, {record.round}/{record.split}, {record.status}"
    lines = [head, "", "harness log:", record.log.rstrip() or "(empty)", ""]
    if record.detail != "full":
        lines.append(f"detector output is not shared for the {record.split} split")
    else:
        for row in record.models:
            lines += [
                f"--- {row.model}: exit code {row.exit_code}, {row.seconds} s {row.flags}",
                row.stderr or "",
            ]
    return PlainTextResponse("\n".join(lines) + "\n")


@pages.get("/jobs/{job_id}", response_class=HTMLResponse)
def job_page(request: Request, session: DbSession, user: CurrentUser, job_id: ObjectId) -> Response:
    job = _job_or_404(session, user, job_id)
    return render(request, "leaderboard_job.html", progress=job_progress(session, job))


@pages.get("/status", response_class=HTMLResponse)
def status_page(request: Request, session: DbSession, user: Organiser) -> Response:
    return render(request, "leaderboard_status.html", status=queue_status(session))


# --- JSON API ----------------------------------------------------------------------------------------------

NOT_FOUND = {404: {"model": Problem, "description": "No such object, or not yours to see"}}


@api.get("/rounds", response_model=list[RoundOut], summary="Rounds you can see, newest first")
def api_rounds(session: DbSession, user: CurrentUser) -> list[RoundOut]:
    return [round_out(r) for r in visible_rounds(session, user)]


@api.get(
    "/rounds/{name}/standings",
    response_model=StandingsOut,
    responses=NOT_FOUND,
    summary="A round's ranked results on test, or on holdout once the round is closed",
)
def api_standings(
    session: DbSession,
    user: CurrentUser,
    name: RoundName,
    split: Annotated[Literal["test", "holdout"], Query(description="test or holdout")] = "test",
    every: Annotated[bool, Query(alias="all", description="Every submission, not each team's best")] = False,
) -> StandingsOut:
    return standings_for(session, user, _round_or_404(session, name, user), split, not every)


@api.get(
    "/submissions/{submission_id}",
    response_model=SubmissionOut,
    responses=NOT_FOUND,
    summary="One of your team's submissions (organisers: any), as much as its split shares",
)
def api_submission(session: DbSession, user: CurrentUser, submission_id: ObjectId) -> SubmissionOut:
    return submission_record(session, user, _submission_or_404(session, user, submission_id))


@api.get(
    "/jobs/{job_id}",
    response_model=JobProgress,
    responses=NOT_FOUND,
    summary="A job's progress: models done out of total, and its status",
)
def api_job(session: DbSession, user: CurrentUser, job_id: ObjectId) -> JobProgress:
    return job_progress(session, _job_or_404(session, user, job_id))


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
    user: CurrentUser,
    name: RoundName,
    archive: Annotated[UploadFile, File(description="The detector folder as .tar.gz, .tgz, .tar or .zip")],
    split: Annotated[SubmitSplit, Form(description="test (windowed), smoke or train")] = "test",
) -> Response | SubmissionOut:
    """Queued or duplicate: 201 with the record. Rejected: 400, and the rejection is kept on record."""
    round_ = _round_or_404(session, name, user)
    _team_or_403(user)
    made = submit_upload(session, user, round_, split, archive)
    if made.status == "rejected":
        detail = f"submission {made.id} rejected: " + "; ".join(made.validation_errors.splitlines())
        return JSONResponse({"detail": detail}, status_code=400)
    return submission_record(session, user, made)


@api.get(
    "/status",
    response_model=QueueStatus,
    responses={403: {"model": Problem, "description": "Organisers only"}},
    summary="Organisers: round states, queue depth and worker heartbeats",
)
def api_status(session: DbSession, user: Organiser) -> QueueStatus:
    return queue_status(session)


router = APIRouter()
router.include_router(pages)
router.include_router(api)
