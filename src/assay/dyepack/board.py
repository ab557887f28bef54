"""The contamination board: every registered model checked against every registered release.

Releases are the registry's benchmarks, known by their published commitment; models are rows of
``dyepack_models`` (a spec, how the model is used, who added it). A cell is the newest verification run of a
model against a release (``dyepack_runs`` with ``model_id`` set): its newest finished run speaks for it, else
a run under way, else its newest failure; a cell with no run at all is *pending*, and ``assay dyepack board
run`` or the board page's "check pending" form checks exactly the pending cells. A failed cell is *failed*,
not pending: it is tried again only when the organiser asks (``retry_failed``: ``board run
--retry-failed``, the form's "retry failed checks" box), since a model that cannot be asked would otherwise
be re-run, and counted pending, for ever; a model nobody can fix leaves the board (``drop_model``).
Everything a cell shows is key-free (the run row's counts, exact FPR and format: see
``assay.dyepack.registry``).

Where the keys come from. A check needs each release's key and the registry's rule is that a key is held in
memory only, for the run, by the process that runs it. So the board never stores keys or their paths: the
command line is given a folder at run time (``--keys DIR``; each key is matched to its release by its
commitment, so file names do not matter) and finds each release beside its key, where ``prepare`` writes
both, or under ``--releases``; the web page takes one release's key and release file as an upload and
checks that release's pending models in the background, then drops them.

Endpoints. An ``openai:`` model whose server wants an API key names the environment variable that holds it
(``api_key_env``); the key is read when its run starts. A URL with credentials or a query string is refused,
since the spec is shown on the board.
"""

from __future__ import annotations

import getpass
import re
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, Field, ValidationError
from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from assay.data import Benchmark, read_benchmark
from assay.dyepack import registry
from assay.dyepack.key import DyePackKey
from assay.dyepack.prompts import MODES, FormatRecord, PromptFormat, Template
from assay.dyepack.verify import DEFAULT_ALPHA, check_release, release_format
from assay.errors import UserError, shown
from assay.models import GenerationParams
from assay.models.spec import split_spec
from assay.store.dyepack_models import DyePackBenchmark, DyePackModel, DyePackRun
from assay.store.enums import ACTIVE_JOBS, JobStatus
from assay.store.models import utcnow

CellState = Literal["pending", "queued", "running", "done", "failed"]
MAX_FEWSHOT = 50
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,99}")


# ---------------------------------------------------------------- models


def model_kind(spec: str) -> str:
    """``hf``, ``gguf`` (an ``hf:`` spec naming a .gguf file), ``openai``, ``vllm`` or ``python``."""
    backend, rest = split_spec(spec)
    return "gguf" if backend == "hf" and rest.lower().endswith(".gguf") else backend


def _key_variable(kind: str, spec: str, api_key_env: str) -> str | None:
    """The checked name of the variable holding an endpoint's API key. An ``openai:`` URL carrying
    credentials or a query is refused (the spec is shown on the board), and so is anything that is not a
    variable's name (a pasted key), without quoting either."""
    if kind == "openai":
        try:
            parts = urlsplit(split_spec(spec)[1])
        except ValueError:  # e.g. an unbalanced "[" in the host
            raise UserError("model: the endpoint is not an http(s) URL") from None
        if parts.username or parts.password or parts.query or parts.fragment:
            raise UserError(
                "model: an endpoint URL with a user name, password or query string would show them on the "
                "board; give the bare URL and put the API key in an environment variable named by api key env"
            )
    elif api_key_env:
        raise UserError(f"api key env: only openai: endpoints take an API key (the model is {kind})")
    if api_key_env and not _ENV_NAME.fullmatch(api_key_env):
        raise UserError(
            f"api key env: the NAME of an environment variable (letters, digits, '_'), not the key itself "
            f"(value: {len(api_key_env)} characters, not shown)"
        )
    return api_key_env or None


def add_model(
    session: Session,
    name: str,
    spec: str,
    *,
    model_name: str = "",
    api_key_env: str = "",
    mode: str = "chat",
    fewshot: int = 0,
    system_prompt: str = "",
    template: Template | None = None,
    added_by: str = "",
    user_id: int | None = None,
) -> DyePackModel:
    """Put a model on the board; it is then pending against every release. A bad field: one-line error."""
    name = registry.clean_text(name, "name", 100)
    if not name:
        raise UserError("name: required")
    spec, served = registry.check_model_spec(spec, model_name)
    kind = model_kind(spec)
    key_variable = _key_variable(kind, spec, registry.clean_text(api_key_env, "api key env", 100))
    if mode not in MODES:
        raise UserError(f"mode: must be one of {', '.join(MODES)} (value: {shown(mode)})")
    if not 0 <= fewshot <= MAX_FEWSHOT:
        raise UserError(f"fewshot: must be a whole number from 0 to {MAX_FEWSHOT} (value: {fewshot})")
    if session.scalar(select(DyePackModel.id).where(DyePackModel.name == name)) is not None:
        raise UserError(f"name: a model named {name!r} is already on the board")
    model = DyePackModel(
        name=name,
        spec=spec,
        kind=kind,
        model_name=served,
        api_key_env=key_variable,
        mode=mode,
        fewshot=fewshot,
        system_prompt=registry.clean_text(system_prompt, "system prompt", 2000, multiline=True) or None,
        template_name=Path(template.name).name if template else None,
        template_source=template.source if template else None,
        added_by=registry.clean_text(added_by, "added by", 100) or command_line_user(),
        created_by=user_id,
    )
    session.add(model)
    session.flush()
    return model


def command_line_user() -> str:
    """Who added a model from the command line: the login name, where there is one."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no passwd entry in a container
        return "command line"


def model_format(model: DyePackModel, release: Benchmark, key: DyePackKey) -> PromptFormat:
    """How ``model`` is asked about ``release``: its mode, template, system prompt and few-shot examples
    (drawn, as ``verify`` draws them, from the release's rows without a backdoor)."""
    fmt = release_format(release, key, model.mode, None, model.fewshot, system_prompt=model.system_prompt)
    if model.template_source is not None:
        fmt = replace(fmt, template=Template(model.template_source, model.template_name or "template"))
    return fmt


def format_label(record: dict | None) -> str:
    """A format in a few words: ``chat``, ``completion · mmlu.jinja · 5-shot``, ``loglikelihood``."""
    fmt = FormatRecord.model_validate(record or {})  # runs from before formats were recorded asked by chat
    parts = [fmt.mode]
    if fmt.template not in ("assay-chat", "plain"):
        parts.append(fmt.template)
    if fmt.fewshot:
        parts.append(f"{fmt.fewshot}-shot")
    if fmt.lm_eval_task:
        parts.append(f"lm-eval {fmt.lm_eval_task}")
    return " · ".join(parts)


def planned_format(model: DyePackModel) -> str:
    """The label of the format ``model`` will be asked in."""
    template = model.template_name or ("assay-chat" if model.mode == "chat" else "plain")
    return format_label({"mode": model.mode, "template": template, "fewshot": model.fewshot})


# ---------------------------------------------------------------- the matrix


class ReleaseColumn(BaseModel):
    id: int
    name: str
    commitment: str
    release_fingerprint: str | None
    url: str


class ModelRow(BaseModel):
    id: int
    name: str
    spec: str
    kind: str = Field(description="hf, gguf, openai, vllm or python")
    model_name: str | None
    api_key_env: str | None = Field(
        description="the environment variable holding the endpoint's API key; the key is never stored"
    )
    format: str = Field(description="how the model is asked: mode, template, few-shot examples")
    added_by: str
    created_at: datetime


class Cell(BaseModel):
    """One model against one release: the run that speaks for it, key-free."""

    model_id: int
    release_id: int
    state: CellState
    run_id: int | None = None
    activated: int | None = None
    backdoors: int | None = None
    fpr: float | None = Field(None, description="exact false-positive rate of the accusation")
    log10_fpr: float | None = None
    fpr_text: str = ""
    alpha: float | None = None
    flagged: bool | None = None
    format: str | None = Field(None, description="how the samples were asked (the run's recorded format)")
    error: str | None = None
    finished_at: datetime | None = None

    def needs_check(self, retry_failed: bool = False) -> bool:
        """Pending (never checked), or failed when the organiser asked to retry failures: the next check
        runs it."""
        return self.state == "pending" or (retry_failed and self.state == "failed")


class Board(BaseModel):
    """The matrix: ``cells[i][j]`` is ``models[i]`` against ``releases[j]``."""

    created: datetime
    releases: list[ReleaseColumn]
    models: list[ModelRow]
    cells: list[list[Cell]]
    pending: int = Field(description="cells never checked: the next check runs them")
    failed: int = Field(description="cells whose newest check failed: run again only when asked to retry")
    flagged: int = Field(description="cells whose check flagged the model as contaminated")


def model_row(model: DyePackModel) -> ModelRow:
    """A board row's heading: what the model is and how it is asked (an API key only by its variable)."""
    return ModelRow(
        id=model.id,
        name=model.name,
        spec=model.spec,
        kind=model.kind,
        model_name=model.model_name,
        api_key_env=model.api_key_env,
        format=planned_format(model),
        added_by=model.added_by,
        created_at=model.created_at,
    )


def cell_of(model_id: int, release_id: int, runs: Sequence[DyePackRun]) -> Cell:
    """The cell of ``runs`` (this model against this release, newest first): see the module docstring."""
    run = (
        next((r for r in runs if r.status == JobStatus.DONE), None)
        or next((r for r in runs if r.status in ACTIVE_JOBS), None)
        or (runs[0] if runs else None)
    )
    if run is None:
        return Cell(model_id=model_id, release_id=release_id, state="pending")
    done = run.status == JobStatus.DONE
    return Cell(
        model_id=model_id,
        release_id=release_id,
        state=run.status,  # type: ignore[arg-type]  # one of the run statuses
        run_id=run.id,
        activated=run.activated,
        backdoors=run.backdoors,
        fpr=run.fpr,
        log10_fpr=run.log10_fpr,
        fpr_text=registry.format_probability(run.fpr, run.log10_fpr),
        alpha=run.alpha,
        flagged=run.flagged if done else None,
        format=format_label(run.format) if done else None,
        error=run.error if run.status == JobStatus.FAILED else None,
        finished_at=run.finished_at,
    )


def _runs_by_cell(session: Session, release_id: int | None = None) -> dict[tuple[int, int], list[DyePackRun]]:
    """The board's runs (those of registered models), newest first, by (model, release)."""
    query = select(DyePackRun).where(DyePackRun.model_id.is_not(None)).order_by(DyePackRun.id.desc())
    if release_id is not None:
        query = query.where(DyePackRun.benchmark_id == release_id)
    found: dict[tuple[int, int], list[DyePackRun]] = defaultdict(list)
    for run in session.scalars(query):
        found[(run.model_id, run.benchmark_id)].append(run)  # type: ignore[index]  # model_id is set
    return found


def list_models(session: Session) -> list[DyePackModel]:
    """The board's models, oldest first (the board's row order)."""
    return list(session.scalars(select(DyePackModel).order_by(DyePackModel.id)))


def build_board(session: Session) -> Board:
    """The whole matrix, read only: releases oldest first as columns, models oldest first as rows."""
    releases = list(session.scalars(select(DyePackBenchmark).order_by(DyePackBenchmark.id)))
    models = list_models(session)
    runs = _runs_by_cell(session)
    cells = [[cell_of(m.id, r.id, runs.get((m.id, r.id), [])) for r in releases] for m in models]
    return Board(
        created=utcnow(),
        releases=[
            ReleaseColumn(
                id=r.id,
                name=r.name,
                commitment=r.commitment,
                release_fingerprint=r.release_fingerprint,
                url=r.url,
            )
            for r in releases
        ],
        models=[model_row(m) for m in models],
        cells=cells,
        pending=sum(c.state == "pending" for row in cells for c in row),
        failed=sum(c.state == "failed" for row in cells for c in row),
        flagged=sum(bool(c.flagged) for row in cells for c in row),
    )


def pending_models(session: Session, release_id: int, retry_failed: bool = False) -> list[DyePackModel]:
    """The models never checked against a release (and, with ``retry_failed``, those whose check failed),
    oldest first."""
    runs = _runs_by_cell(session, release_id)
    return [
        m
        for m in list_models(session)
        if cell_of(m.id, release_id, runs.get((m.id, release_id), [])).needs_check(retry_failed)
    ]


def model_named(session: Session, name: str) -> int:
    """The id of the board's model called ``name``; a one-line error naming it otherwise."""
    found = session.scalar(select(DyePackModel.id).where(DyePackModel.name == name))
    if found is None:
        raise UserError(f"model: no model named {shown(name)} on the board")
    return found


def drop_model(session: Session, model_id: int) -> DyePackModel:
    """Take a model off the board (one that cannot be asked, or is no longer wanted); its runs stay in the
    registry as plain verification runs, so no verdict is lost. Refused while one of its checks is under
    way: that run would finish into a row nobody shows."""
    model = session.get(DyePackModel, model_id)
    if model is None:
        raise UserError(f"model: no model with id {model_id} on the board")
    runs = select(DyePackRun.id).where(DyePackRun.model_id == model_id)
    if session.scalar(runs.where(DyePackRun.status.in_(ACTIVE_JOBS)).limit(1)) is not None:
        raise UserError(f"model {model.name!r}: a check of it is under way; drop it once it has finished")
    session.execute(
        update(DyePackRun)
        .where(DyePackRun.model_id == model_id)
        .values(model_id=None)
        .execution_options(synchronize_session="fetch")
    )
    session.delete(model)
    session.flush()
    return model


def jobs_for(
    session: Session,
    benchmark: DyePackBenchmark,
    key: DyePackKey,
    release: Benchmark,
    alpha: float = DEFAULT_ALPHA,
    params: GenerationParams | None = None,
    retry_failed: bool = False,
) -> list[registry.VerificationJob]:
    """One verification job per model pending against ``benchmark`` (failed ones too with
    ``retry_failed``), each asked in its model's format. ``key`` must be the release's
    (``registry.check_key``) and ``release`` the file it was made for."""
    params = params or GenerationParams(max_new_tokens=32)
    return [
        registry.VerificationJob(
            model.spec,
            model.model_name,
            params,
            alpha,
            key,
            release,
            fmt=model_format(model, release, key),
            model_id=model.id,
            api_key_env=model.api_key_env,
        )
        for model in pending_models(session, benchmark.id, retry_failed)
    ]


# ---------------------------------------------------------------- keys and releases from folders


@dataclass(frozen=True)
class HeldKey:
    """A key read from the maintainer's folder, and where it was (its release is looked for beside it)."""

    key: DyePackKey = field(repr=False)
    path: Path


def keys_in(folder: Path) -> dict[str, HeldKey]:
    """Every DyePack key under ``folder`` (any ``*.json`` that parses as one), by its commitment. Other JSON
    files (a release saved as JSON, notes) are passed over, so the folder may hold whole releases."""
    if not folder.is_dir():
        raise UserError(f"{folder}: --keys must be a folder holding the releases' key files")
    found: dict[str, HeldKey] = {}
    for path in sorted(folder.rglob("*.json")):
        if not path.is_file() or path.stat().st_size > registry.MAX_KEY_BYTES:
            continue
        try:
            key = DyePackKey.model_validate_json(path.read_bytes())
        except ValidationError:
            continue
        found.setdefault(key.commitment(), HeldKey(key, path))
    return found


def find_release(held: HeldKey, search: Sequence[Path] = ()) -> Benchmark:
    """The release ``held`` was made for: the file the key names, beside the key (where ``prepare`` writes
    both) or anywhere under ``search``, whose content fingerprint is the key's."""
    key, name = held.key, held.key.release_file
    candidates = [held.path.parent / name, *(p for folder in search for p in sorted(folder.rglob(name)))]
    for path in candidates:
        if not path.exists():
            continue
        try:
            bench = read_benchmark(path, style=key.style, split=key.split)
        except UserError:
            continue
        if bench.fingerprint == key.release_fingerprint:
            check_release(bench, key)
            return bench
    raise UserError(
        f"{held.path}: the release it was made for ({name!r}, content fingerprint "
        f"{key.release_fingerprint[:23]}...) is neither beside it nor under --releases"
    )


@dataclass(frozen=True)
class ReleasePlan:
    """What ``check_pending`` will do for one release: its pending jobs, or why they wait."""

    release: str
    benchmark_id: int
    jobs: list[registry.VerificationJob] = field(repr=False)
    release_file: str = ""
    waiting: str | None = None


def plan_checks(
    session: Session,
    keys: dict[str, HeldKey],
    search: Sequence[Path] = (),
    alpha: float = DEFAULT_ALPHA,
    params: GenerationParams | None = None,
    retry_failed: bool = False,
) -> list[ReleasePlan]:
    """Per release with pending cells (or failed ones, with ``retry_failed``), its jobs; a release whose
    key is not in ``keys`` waits. Every key and release is checked here, so a bad one stops the command
    before any model is asked."""
    plans = []
    for benchmark in session.scalars(select(DyePackBenchmark).order_by(DyePackBenchmark.id)):
        pending = len(pending_models(session, benchmark.id, retry_failed))
        if not pending:
            continue
        held = keys.get(benchmark.commitment)
        if held is None:
            why = (
                f"no key under --keys has its commitment {benchmark.commitment[:16]}...: "
                f"{pending} cell(s) wait"
            )
            plans.append(ReleasePlan(benchmark.name, benchmark.id, [], waiting=why))
            continue
        registry.check_key(benchmark, held.key)
        release = find_release(held, search)
        jobs = jobs_for(session, benchmark, held.key, release, alpha, params, retry_failed)
        plans.append(ReleasePlan(benchmark.name, benchmark.id, jobs, held.key.release_file))
    return plans


def check_pending(
    sessions: sessionmaker[Session], plans: Sequence[ReleasePlan], on_run: Callable[[int], None] | None = None
) -> list[int]:
    """Run the planned jobs one after another in this process (the key stays in its memory), each recorded
    as it ends; ``on_run(run_id)`` after each. Each run row is created just before it starts, and beats
    a heartbeat while it runs, like a web run. Returns the run ids."""
    done = []
    for plan in plans:
        for job in plan.jobs:
            with sessions.begin() as session:
                benchmark = session.get_one(DyePackBenchmark, plan.benchmark_id)
                run_id = registry.create_run(session, benchmark, job, plan.release_file).id
            registry.execute_run(sessions, run_id, job, registry.heartbeat(sessions, run_id))
            done.append(run_id)
            if on_run is not None:
                on_run(run_id)
    return done
