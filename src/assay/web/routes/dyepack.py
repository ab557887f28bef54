"""DyePack pages and JSON API: register released benchmarks by their commitment, verify models, show verdicts.

Viewers and organisers read; only organisers register and run (a run loads the model spec's code or files
on the server). Keys never leave the request that uploads them except into the run's background job:
see ``assay.dyepack.registry`` for the rule and for what is shown (nothing that reveals a trigger, a target
or a backdoor row, to anyone). Verifications run in the app's ``dyepack`` lane of background work
(``assay.web.background``), never on the event loop; each run this process holds beats a heartbeat
(``registry.heartbeat``) from the moment it is queued, so servers on other hosts can fail it if we die.
Reads never write: runs whose holder stopped are failed by the app's sweeper (``assay.web.sweeper``).

Request bodies are bounded while they arrive (``assay.web.uploads``): a run's form at
``registry.MAX_RELEASE_BYTES + registry.MAX_KEY_BYTES + FORM_OVERHEAD``, everything else (registration,
JSON) at ``MAX_FORM_BYTES``; a file over its own limit inside an allowed body is refused too. All 413.
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import Annotated, Any
from urllib.parse import quote

from fastapi import APIRouter, Depends, File, Form, HTTPException, Query, Request, UploadFile
from fastapi.responses import HTMLResponse, Response
from pydantic import AfterValidator, BaseModel, Field
from sqlalchemy.orm import Session
from starlette.datastructures import UploadFile as StarletteUpload  # what the form parser hands over

from assay.data import Benchmark
from assay.dyepack import board, registry
from assay.dyepack.board_export import to_csv, to_html
from assay.dyepack.fpr import DEFAULT_ALPHA
from assay.dyepack.key import DyePackKey
from assay.dyepack.prompts import MODES, Mode
from assay.errors import UserError
from assay.models import GenerationParams
from assay.store.dyepack_models import DyePackBenchmark, DyePackRun
from assay.store.enums import Role
from assay.store.models import as_utc
from assay.store.paging import Window
from assay.store.web_models import WebUser
from assay.web.accounts import has_role
from assay.web.paging import Page, Paging
from assay.web.params import MAX_ID, path_id
from assay.web.routes import Area, redirect, render
from assay.web.security import DbSession, require
from assay.web.uploads import FORM_OVERHEAD, TooLarge, bounded_route

MAX_FORM_BYTES = 2**20  # any other DyePack request: a commitment (10,000 characters) and a few short fields


def _size(n: float) -> str:
    """Bytes for people, in the decimal units the DyePack limits are set in."""
    return f"{n / 1e6:g} MB" if n >= 1e6 else f"{n / 1e3:g} kB" if n >= 1e3 else f"{n:g} bytes"


def _form_too_large() -> TooLarge:
    """Registration and JSON bodies are small; a big one is a release or a key sent to the wrong form."""
    return TooLarge(
        f"the request is larger than the limit of {MAX_FORM_BYTES / 2**20:g} MiB: a commitment.txt is a few "
        "hundred bytes; send the commitment, not the release or its key"
    )


def _run_body_limit() -> int:
    """Read per request, so tests can lower the constants."""
    return registry.MAX_RELEASE_BYTES + registry.MAX_KEY_BYTES + FORM_OVERHEAD


def _run_too_large() -> TooLarge:
    """Says both file limits, since the body limit is their sum."""
    return TooLarge(
        f"the upload is larger than the limit of {_size(_run_body_limit())} (the release file at most "
        f"{_size(registry.MAX_RELEASE_BYTES)}, the key at most {_size(registry.MAX_KEY_BYTES)}): "
        "upload the released benchmark file and its key.json, nothing else"
    )


def _form_limit() -> int:
    """Read per request, like ``_run_body_limit``."""
    return MAX_FORM_BYTES


FormBody = bounded_route(_form_limit, _form_too_large)
RunBody = bounded_route(_run_body_limit, _run_too_large)
pages = APIRouter(prefix="/dyepack", include_in_schema=False, route_class=FormBody)
run_form = APIRouter(prefix="/dyepack", include_in_schema=False, route_class=RunBody)  # takes a release
api = APIRouter(prefix="/api/v1/dyepack", tags=["dyepack"], route_class=FormBody)
router = APIRouter()

AREAS = [
    Area(
        "DyePack",
        "/dyepack",
        (Role.VIEWER,),
        "Contamination checks: released benchmarks, verification runs, verdicts with exact FPRs.",
        order=400,
    )
]
Viewer = Annotated[WebUser, Depends(require(Role.VIEWER))]
Organiser = Annotated[WebUser, Depends(require(Role.ORGANISER))]
Id = Annotated[int, path_id()]

FPR_MEANING = (
    "the probability that a model which never saw this test set follows at least this many of its backdoors"
)
LANE = "dyepack"  # the background lane verifications run in


# ---------------------------------------------------------------- shared helpers


def _benchmark(session: Session, benchmark_id: int) -> DyePackBenchmark:
    found = registry.get_benchmark(session, benchmark_id)
    if found is None:
        raise HTTPException(404, f"no DyePack benchmark with id {benchmark_id}")
    return found


def _run(session: Session, run_id: int) -> DyePackRun:
    found = registry.get_run(session, run_id)
    if found is None:
        raise HTTPException(404, f"no DyePack run with id {run_id}")
    return found


def _upload(upload: UploadFile | None, limit: int, what: str) -> tuple[bytes, str]:
    """An upload's bytes and its file name; ``TooLarge`` past ``limit``, reading no more than one byte over.

    The form parser spooled the file to disk; only one that fits its limit is read into memory.
    """
    if not isinstance(upload, StarletteUpload):  # None, or a plain text field sent under the file's name
        return b"", ""
    data = upload.file.read(limit + 1)
    if len(data) > limit:
        raise TooLarge(f"{what}: larger than the limit of {_size(limit)}")
    return data, upload.filename or ""


def _number(text: str, field_name: str, low: float, high: float, integer: bool = False) -> float:
    """A form number in (low, high) (``integer``: in [low, high]), or a one-line error naming the field."""
    try:
        value = int(text) if integer else float(text)
    except ValueError:
        value = math.nan
    inside = low <= value <= high if integer else low < value < high
    if not inside:
        what = f"a whole number from {low:g} to {high:g}" if integer else f"a number in ({low:g}, {high:g})"
        raise UserError(f"{field_name}: must be {what} (value: {text[:40]!r})")
    return value


def _start(
    request: Request,
    session: Session,
    benchmark: DyePackBenchmark,
    job: registry.VerificationJob,
    release_name: str,
    user: WebUser,
) -> int:
    """Record a queued run and commit it (the job reads it), then run it in the background; the run id.

    The background job is reserved before the commit, so the sweeper counts the run as held by this process
    from the moment any process can see it; the heartbeat runs from the queue on (a wait is not a death).
    """
    run_id = registry.create_run(session, benchmark, job, release_name, user.id).id
    background = request.app.state.background
    ticket = background.reserve(LANE, f"DyePack run {run_id} ({benchmark.name})", key=run_id)
    try:
        session.commit()
    except BaseException:
        background.cancel(ticket)
        raise
    sessions = request.app.state.sessions
    heart = registry.heartbeat(sessions, run_id)
    background.start(ticket, lambda: registry.execute_run(sessions, run_id, job, heart))
    return run_id


# ---------------------------------------------------------------- pages


def _index_page(
    request: Request,
    session: Session,
    user: WebUser,
    status_code: int = 200,
    window: Window | None = None,
    **extra: Any,
) -> Response:
    window = window or Window()
    benchmarks, total = registry.list_benchmarks(session, window)
    return render(
        request,
        "dyepack_index.html",
        status_code=status_code,
        benchmarks=benchmarks,
        total=total,
        window=window,
        runs=registry.list_runs(session, window=Window(limit=20))[0],
        can_write=has_role(user, Role.ORGANISER),
        form=extra.pop("form", {}),
        **extra,
    )


def _benchmark_page(
    request: Request,
    session: Session,
    benchmark: DyePackBenchmark,
    user: WebUser,
    status_code: int = 200,
    **extra: Any,
) -> Response:
    return render(
        request,
        "dyepack_benchmark.html",
        status_code=status_code,
        benchmark=benchmark,
        runs=registry.list_runs(session, benchmark.id)[0],
        run_total=registry.list_runs(session, benchmark.id, Window(limit=1))[1],
        floor=registry.release_floor(session, benchmark.id),
        default_alpha=DEFAULT_ALPHA,
        can_write=has_role(user, Role.ORGANISER),
        form=extra.pop("form", {"alpha": "0.001", "max_new_tokens": "32"}),
        **extra,
    )


@pages.get("", response_class=HTMLResponse)
def index(request: Request, session: DbSession, user: Viewer, window: Paging) -> Response:
    return _index_page(request, session, user, window=window)


@pages.post("/benchmarks", response_class=HTMLResponse)
def register(
    request: Request,
    session: DbSession,
    user: Organiser,
    name: Annotated[str, Form()] = "",
    commitment: Annotated[str, Form()] = "",
    commitment_file: Annotated[UploadFile | None, File()] = None,
    description: Annotated[str, Form()] = "",
    url: Annotated[str, Form()] = "",
) -> Response:
    """Register a release by its commitment: the uploaded commitment.txt or its pasted text."""
    form = {"name": name, "commitment": commitment, "description": description, "url": url}
    try:
        data, _ = _upload(commitment_file, registry.MAX_COMMITMENT_CHARS, "commitment file")
        if data.strip() and commitment.strip():
            raise UserError("commitment: upload commitment.txt or paste its contents, not both")
        try:
            text = data.decode("utf-8") if data.strip() else commitment
        except UnicodeDecodeError:
            raise UserError("commitment: the uploaded file is not UTF-8 text") from None
        benchmark = registry.register_benchmark(session, name, text, description, url, user.id)
    except TooLarge as err:
        return _index_page(request, session, user, 413, error=err.detail, form=form)
    except UserError as err:
        session.rollback()
        return _index_page(request, session, user, 400, error=err, form=form)
    return redirect(f"/dyepack/benchmarks/{benchmark.id}")


@pages.get("/benchmarks/{benchmark_id}", response_class=HTMLResponse)
def benchmark_page(request: Request, session: DbSession, user: Viewer, benchmark_id: Id) -> Response:
    return _benchmark_page(request, session, _benchmark(session, benchmark_id), user)


def _job_from_form(
    benchmark: DyePackBenchmark, release: UploadFile | None, key: UploadFile | None, form: dict[str, str]
) -> tuple[registry.VerificationJob, str]:
    """Check every field of the run form, cheapest first; the key is parsed in memory and checked."""
    spec, model_name = registry.check_model_spec(form["model"], form["model_name"])
    alpha, params = _run_settings(form)
    secret, bench, filename = _key_and_release(benchmark, release, key)
    registry.check_can_flag(secret, alpha)
    return registry.VerificationJob(spec, model_name, params, alpha, secret, bench), filename


def _run_settings(form: dict[str, str]) -> tuple[float, GenerationParams]:
    """Alpha and the tokens per reply, from a form."""
    alpha = _number(form["alpha"], "alpha", 0.0, 1.0)
    tokens = int(_number(form["max_new_tokens"], "max new tokens", 1, 4096, integer=True))
    return alpha, GenerationParams(max_new_tokens=tokens)


def _key_and_release(
    benchmark: DyePackBenchmark, release: UploadFile | None, key: UploadFile | None
) -> tuple[DyePackKey, Benchmark, str]:
    """The uploaded key, checked against the benchmark's commitment, and the release it was made for; both
    in memory only."""
    secret = registry.parse_key(_upload(key, registry.MAX_KEY_BYTES, "key file")[0])
    registry.check_key(benchmark, secret)
    data, filename = _upload(release, registry.MAX_RELEASE_BYTES, "release file")
    if not data:
        raise UserError("release file: required (the released benchmark file)")
    return secret, registry.read_release(data, filename, secret), filename


@run_form.post("/benchmarks/{benchmark_id}/runs", response_class=HTMLResponse)
def start_run(
    request: Request,
    session: DbSession,
    user: Organiser,
    benchmark_id: Id,
    release: Annotated[UploadFile | None, File()] = None,
    key: Annotated[UploadFile | None, File()] = None,
    model: Annotated[str, Form()] = "",
    model_name: Annotated[str, Form()] = "",
    alpha: Annotated[str, Form()] = "0.001",
    max_new_tokens: Annotated[str, Form()] = "32",
) -> Response:
    """Start a verification in the background and go to its page, which follows it to the verdict."""
    benchmark = _benchmark(session, benchmark_id)
    form = {"model": model, "model_name": model_name, "alpha": alpha, "max_new_tokens": max_new_tokens}
    try:
        job, release_name = _job_from_form(benchmark, release, key, form)
    except TooLarge as err:
        return _benchmark_page(request, session, benchmark, user, 413, error=err.detail, form=form)
    except UserError as err:
        return _benchmark_page(request, session, benchmark, user, 400, error=err, form=form)
    return redirect(f"/dyepack/runs/{_start(request, session, benchmark, job, release_name, user)}")


@pages.get("/runs/{run_id}", response_class=HTMLResponse)
def run_page(request: Request, session: DbSession, user: Viewer, run_id: Id) -> Response:
    run = _run(session, run_id)
    return render(
        request,
        "dyepack_run.html",
        run=run,
        seconds=registry.run_seconds(run),
        fpr_text=registry.format_probability(run.fpr, run.log10_fpr),
        chernoff_text=registry.format_probability(run.chernoff_bound, None),
        k_text=", ".join(str(k) for k in sorted(set(run.k_values or []))),
    )


# ---------------------------------------------------------------- JSON API


UtcTime = Annotated[datetime, AfterValidator(as_utc)]


class Problem(BaseModel):
    detail: str


ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": Problem, "description": "not signed in"},
    403: {"model": Problem, "description": "the role does not allow it"},
}


class BenchmarkIn(BaseModel):
    name: str = Field(min_length=1, max_length=100)
    commitment: str = Field(
        min_length=1,
        max_length=registry.MAX_COMMITMENT_CHARS,
        description="the contents of the release's commitment.txt",
    )
    description: str = Field("", max_length=2000)
    url: str = Field("", max_length=500, description="an http(s) link to the release")


class BenchmarkOut(BaseModel):
    id: int
    name: str
    description: str
    url: str
    commitment: str = Field(description="hex SHA-256 of the salted key, as published")
    release_fingerprint: str | None
    created_at: UtcTime
    runs: int


class BackdoorOutcome(BaseModel):
    """One backdoor's outcome, without its trigger, target or answers (they are part of the secret key)."""

    index: int
    k: int
    samples: int
    samples_on_target: int
    activated: bool


class RunOut(BaseModel):
    id: int
    benchmark_id: int
    benchmark: str
    model: str
    model_name: str | None
    release_name: str
    status: str = Field(description="queued, running, done or failed")
    error: str | None
    created_at: UtcTime
    started_at: UtcTime | None
    finished_at: UtcTime | None
    seconds: float | None
    total_queries: int
    done_queries: int
    alpha: float
    max_new_tokens: int
    flagged: bool | None
    verdict: str | None
    activated: int | None
    backdoors: int | None
    k_values: list[int] | None
    fpr: float | None = Field(description=f"exact false-positive rate: {FPR_MEANING}")
    log10_fpr: float | None
    chernoff_bound: float | None
    samples: int | None
    samples_on_target: int | None
    unparsed: int | None


class RunVerdict(RunOut):
    per_backdoor: list[BackdoorOutcome]


def _benchmark_out(benchmark: DyePackBenchmark, runs: int) -> BenchmarkOut:
    return BenchmarkOut(
        id=benchmark.id,
        name=benchmark.name,
        description=benchmark.description,
        url=benchmark.url,
        commitment=benchmark.commitment,
        release_fingerprint=benchmark.release_fingerprint,
        created_at=benchmark.created_at,
        runs=runs,
    )


_DERIVED = ("benchmark", "model", "seconds")


def _run_out(run: DyePackRun) -> dict[str, Any]:
    """The API fields of a run: its columns, plus the benchmark's name and the duration."""
    copied = {name: getattr(run, name) for name in RunOut.model_fields if name not in _DERIVED}
    return {
        **copied,
        "benchmark": run.benchmark.name,
        "model": run.model_spec,
        "seconds": registry.run_seconds(run),
    }


@api.get(
    "/benchmarks",
    response_model=Page[BenchmarkOut],
    responses=ERRORS,
    summary="Registered releases, newest first",
)
def api_benchmarks(session: DbSession, user: Viewer, window: Paging) -> Page[BenchmarkOut]:
    rows, total = registry.list_benchmarks(session, window)
    return Page.of([_benchmark_out(b, n) for b, n in rows], total, window)


@api.post(
    "/benchmarks",
    response_model=BenchmarkOut,
    status_code=201,
    responses={
        **ERRORS,
        400: {"model": Problem, "description": "a field is malformed"},
        413: {"model": Problem, "description": "the request body is over the limit"},
    },
    summary="Register a release by its commitment (organisers)",
)
def api_register(body: BenchmarkIn, session: DbSession, user: Organiser) -> BenchmarkOut:
    benchmark = registry.register_benchmark(
        session, body.name, body.commitment, body.description, body.url, user.id
    )
    return _benchmark_out(benchmark, 0)


@api.get("/runs", response_model=Page[RunOut], responses=ERRORS, summary="Verification runs, newest first")
def api_runs(
    session: DbSession,
    user: Viewer,
    window: Paging,
    benchmark_id: Annotated[int | None, Query(ge=1, le=MAX_ID)] = None,
) -> Page[RunOut]:
    runs, total = registry.list_runs(session, benchmark_id, window)
    return Page.of([RunOut(**_run_out(run)) for run in runs], total, window)


@api.get(
    "/runs/{run_id}",
    response_model=RunVerdict,
    responses={**ERRORS, 404: {"model": Problem, "description": "no such run"}},
    summary="One run's verdict, exact false-positive rate and per-backdoor outcomes (no key material)",
)
def api_run(session: DbSession, user: Viewer, run_id: Id) -> RunVerdict:
    run = _run(session, run_id)
    return RunVerdict(**_run_out(run), per_backdoor=run.per_backdoor or [])


# ---------------------------------------------------------------- the contamination board
# Every registered model against every release (``assay.dyepack.board`` decides what is pending and what a
# cell shows). An organiser adds models and, per release, uploads its key and release file to check the
# models pending against it: one background run each, the key held in memory by those runs only.

BOARD_DEFAULTS = {"alpha": "0.001", "max_new_tokens": "32", "mode": "chat", "fewshot": "0"}


def _board_page(
    request: Request,
    session: Session,
    user: WebUser,
    status_code: int = 200,
    window: Window | None = None,
    after: tuple[str, str] = ("", ""),
    **extra: Any,
) -> Response:
    """The board a window of releases (columns) at a time, with the site's pager: all 3,002 releases at once
    were 0.9 MB and a second per view (issue 36). The summary still counts the whole board. ``after``: the
    action just done and its subject, for the notice (``_board_notice``)."""
    matrix = board.build_board(session)
    if after[0]:
        extra["notice"] = _board_notice(matrix, *after)
    window = window or Window()
    shown = slice(window.offset, window.offset + window.limit)
    return render(
        request,
        "dyepack_board.html",
        status_code=status_code,
        board=matrix,
        releases=matrix.releases[shown],
        rows=[(model, row[shown]) for model, row in zip(matrix.models, matrix.cells, strict=True)],
        window=window,
        total=len(matrix.releases),
        live=any(c.state in ("queued", "running") for row in matrix.cells for c in row),
        can_write=has_role(user, Role.ORGANISER),
        modes=MODES,
        form=BOARD_DEFAULTS | extra.pop("form", {}),
        **extra,
    )


def _board_release(session: Session, release_id: str) -> DyePackBenchmark:
    """The release a check form names, or a one-line error."""
    found = registry.get_benchmark(session, int(_number(release_id, "release", 1, MAX_ID, integer=True)))
    if found is None:
        raise UserError(f"release: no registered release with id {release_id[:20]}")
    return found


def _board_notice(matrix: board.Board, msg: str, subject: str) -> str:
    """What the board says after an organiser's action, from the board's state now (a stale or hand-typed
    address says nothing false); ``subject``: the model's id, the release's id, or a dropped model's name."""
    if msg == "added":
        model = next((m for m in matrix.models if str(m.id) == subject), None)
        n = len(matrix.releases)
        return (
            f"Added {model.name} to the board: pending against {n} release{'' if n == 1 else 's'}. Upload a "
            "release's key below to check it."
            if model
            else ""
        )
    if msg == "checking":
        at = next((i for i, r in enumerate(matrix.releases) if str(r.id) == subject), None)
        if at is None:
            return ""
        live = sum(row[at].state in ("queued", "running") for row in matrix.cells)
        name = matrix.releases[at].name
        if live:
            return f"Checking {live} model{'' if live == 1 else 's'} against {name} in the background."
        return f"The checks against {name} have finished: their verdicts are on the board."
    if msg == "dropped" and subject and all(m.name != subject for m in matrix.models):
        return f"Dropped {subject} from the board; its past checks stay in the list of runs."
    return ""


@pages.get("/board", response_class=HTMLResponse)
def board_page(
    request: Request, session: DbSession, user: Viewer, window: Paging, msg: str = "", subject: str = ""
) -> Response:
    return _board_page(request, session, user, window=window, after=(msg, subject[:100]))


@pages.post("/board/models", response_class=HTMLResponse)
def board_add_model(
    request: Request,
    session: DbSession,
    user: Organiser,
    name: Annotated[str, Form()] = "",
    model: Annotated[str, Form()] = "",
    model_name: Annotated[str, Form()] = "",
    api_key_env: Annotated[str, Form()] = "",
    mode: Annotated[str, Form()] = "chat",
    fewshot: Annotated[str, Form()] = "0",
    system_prompt: Annotated[str, Form()] = "",
) -> Response:
    """Put a model on the board; it is pending against every release."""
    form = {"name": name, "model": model, "model_name": model_name, "mode": mode, "fewshot": fewshot}
    form["system_prompt"] = system_prompt  # api_key_env is not sent back: someone may have pasted a key
    try:
        shots = int(_number(fewshot, "fewshot", 0, board.MAX_FEWSHOT, integer=True))
        added = board.add_model(
            session,
            name,
            model,
            model_name=model_name,
            api_key_env=api_key_env,
            mode=mode,
            fewshot=shots,
            system_prompt=system_prompt,
            added_by=user.username,
            user_id=user.id,
        )
    except UserError as err:
        session.rollback()
        return _board_page(request, session, user, 400, error=err, form=form)
    return redirect(f"/dyepack/board?msg=added&subject={added.id}")


@pages.post("/board/models/{model_id}/drop", response_class=HTMLResponse)
def board_drop_model(request: Request, session: DbSession, user: Organiser, model_id: Id) -> Response:
    """Take a model off the board (``board.drop_model``: not while a check of it runs)."""
    try:
        dropped = board.drop_model(session, model_id)
    except UserError as err:
        session.rollback()
        return _board_page(request, session, user, 400, error=err)
    return redirect(f"/dyepack/board?msg=dropped&subject={quote(dropped.name)}")


@run_form.post("/board/check", response_class=HTMLResponse)
def board_check(
    request: Request,
    session: DbSession,
    user: Organiser,
    release: Annotated[UploadFile | None, File()] = None,
    key: Annotated[UploadFile | None, File()] = None,
    release_id: Annotated[str, Form()] = "",
    alpha: Annotated[str, Form()] = "0.001",
    max_new_tokens: Annotated[str, Form()] = "32",
    retry_failed: Annotated[str, Form()] = "",
) -> Response:
    """Check every model pending against one release (and those whose check failed, when the box is
    ticked), each in a background run holding the key in memory."""
    form = {"release_id": release_id, "alpha": alpha, "max_new_tokens": max_new_tokens}
    form["retry_failed"] = retry_failed
    try:
        benchmark = _board_release(session, release_id)
        alpha_value, params = _run_settings(form)
        secret, bench, filename = _key_and_release(benchmark, release, key)
        retry = bool(retry_failed)
        jobs = board.jobs_for(session, benchmark, secret, bench, alpha_value, params, retry)
    except TooLarge as err:
        return _board_page(request, session, user, 413, error=err.detail, form=form)
    except UserError as err:
        return _board_page(request, session, user, 400, error=err, form=form)
    if not jobs:
        failed = "" if retry else " (a failed check runs again only with the retry box ticked)"
        notice = f"Every model is checked against {benchmark.name}, or being checked: nothing to do{failed}."
        return _board_page(request, session, user, notice=notice, form=form)
    for job in jobs:
        _start(request, session, benchmark, job, filename, user)
    return redirect(f"/dyepack/board?msg=checking&subject={benchmark.id}")


def _download(text: str, media_type: str, filename: str) -> Response:
    return Response(
        text, media_type=media_type, headers={"content-disposition": f'attachment; filename="{filename}"'}
    )


@pages.get("/board/export.csv")
def board_csv(session: DbSession, user: Viewer) -> Response:
    """The board as CSV, one row per cell (what ``assay dyepack board export`` writes as board.csv)."""
    return _download(to_csv(board.build_board(session)), "text/csv; charset=utf-8", "dyepack-board.csv")


@pages.get("/board/export.html")
def board_html(session: DbSession, user: Viewer) -> Response:
    """The board as one self-contained page to publish (board.html of the command line's export)."""
    return _download(to_html(board.build_board(session)), "text/html; charset=utf-8", "dyepack-board.html")


class BoardModelIn(BaseModel):
    name: str = Field(min_length=1, max_length=100)
    spec: str = Field(
        min_length=1,
        max_length=500,
        description="hf:PATH (folder or .gguf), openai:URL, vllm:PATH, python:M:F",
    )
    model_name: str = Field("", max_length=200, description="openai: the served model's name")
    api_key_env: str = Field(
        "",
        max_length=100,
        description="openai: NAME of the server's environment variable holding the API key (never the key)",
    )
    mode: Mode = Field("chat", description="how the model is used")
    fewshot: int = Field(0, ge=0, le=board.MAX_FEWSHOT)
    system_prompt: str = Field("", max_length=2000)


@api.get(
    "/board",
    response_model=board.Board,
    responses=ERRORS,
    summary="The contamination board: every model against every release, key-free",
)
def api_board(session: DbSession, user: Viewer) -> board.Board:
    return board.build_board(session)


@api.post(
    "/board/models",
    response_model=board.ModelRow,
    status_code=201,
    responses={
        **ERRORS,
        400: {"model": Problem, "description": "a field is malformed"},
        413: {"model": Problem, "description": "the request body is over the limit"},
    },
    summary="Put a model on the board (organisers)",
)
def api_board_model(body: BoardModelIn, session: DbSession, user: Organiser) -> board.ModelRow:
    added = board.add_model(session, **body.model_dump(), added_by=user.username, user_id=user.id)
    return board.model_row(added)


@api.delete(
    "/board/models/{model_id}",
    response_model=board.ModelRow,
    responses={
        **ERRORS,
        400: {"model": Problem, "description": "no such model, or a check of it is under way"},
    },
    summary="Take a model off the board; its past checks stay as runs (organisers)",
)
def api_board_drop(session: DbSession, user: Organiser, model_id: Id) -> board.ModelRow:
    return board.model_row(board.drop_model(session, model_id))


router.include_router(pages)
router.include_router(run_form)
router.include_router(api)
