"""A registry of released DyePack benchmarks and of verification runs against them, over a SQLAlchemy Session.

The web pages use it; the functions are plain so that a command line can too (``assay dyepack board run``
runs the contamination board's checks through ``execute_run`` in its own process: ``assay.dyepack.board``).

How a key is handled. A maintainer's key is the only thing that turns a release into an accusation, so the
registry never keeps it: ``parse_key`` reads it from bytes into memory, ``check_key`` compares it with the
commitment registered for the benchmark, ``execute_run`` uses it for one verification and drops it. It is
never written to disk (not even to the response cache: cached prompts would tell which rows carry
backdoors) nor to the database. What is recorded is key-free: counts, K values, the exact false-positive
rate, and per backdoor only whether it was activated and how many of its samples hit the target. Answer
distributions and majority answers are left out too: next to "activated" they would give the target away.
Messages that might quote the key (a model's error, a release row) go through ``redact`` first. The price:
a run cannot outlive the process that holds its key; ``sweep`` marks such runs failed.

How a stopped holder is noticed. The holding process stamps ``heartbeat_at`` on each of its queued and
running runs: every ``HEARTBEAT_SECONDS`` from a ``heartbeat`` thread (so a slow model or a long wait in the
queue still counts as alive), and with each throttled progress write. ``interruption`` judges a run: the
holder's ``host:pid`` answers at once when it is this process or another on this host; otherwise, on any
host, a run silent for ``STALE_AFTER`` (heartbeat, else start, else creation) is taken as orphaned. Servers
compare their own clock with the holder's stamps, so the window is minutes, far beyond any clock skew.
``sweep`` applies that judgement to every queued and running run: a server runs it at start-up and then
periodically (never on a page view: reads do not write), and any process can run it once.
"""

from __future__ import annotations

import logging
import os
import re
import socket
import tempfile
import time
from collections.abc import Callable, Container
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path

from pydantic import BaseModel, ValidationError
from sqlalchemy import func, select, update
from sqlalchemy.orm import Session, sessionmaker

from assay.data import Benchmark, read_benchmark
from assay.data.tables import SUFFIXES
from assay.dyepack.fpr import smallest_fpr, weakness
from assay.dyepack.key import NONE_LABEL, DyePackKey, check_commitment, read_commitment
from assay.dyepack.prompts import PromptFormat
from assay.dyepack.verify import VerifyReport, check_release, verify
from assay.errors import UserError
from assay.models import GenerationParams, load_model
from assay.models.spec import check_spec_form
from assay.store.dyepack_models import DyePackBenchmark, DyePackRun
from assay.store.enums import ACTIVE_JOBS, JobStatus
from assay.store.heartbeat import Heartbeat
from assay.store.models import as_utc, utcnow
from assay.store.paging import Window, page_of

logger = logging.getLogger(__name__)

MAX_COMMITMENT_CHARS = 10_000
MAX_KEY_BYTES = 1_000_000
MAX_RELEASE_BYTES = 200_000_000
INTERRUPTED = "interrupted: the server process that held this run's key stopped; start the run again"
HEARTBEAT_SECONDS = 30.0  # how often a holder stamps its queued and running runs
PROGRESS_SECONDS = 1.0  # at most one progress write (which also stamps the heartbeat) per this many seconds
STALE_AFTER = timedelta(minutes=10)  # a run silent this long is failed by whichever server looks at it
_HEX64 = re.compile(r"[0-9a-f]{64}")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")  # in one-line fields
_CONTROL_MULTILINE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")  # tab and newline allowed


# ---------------------------------------------------------------- benchmarks


def clean_text(value: str, field_name: str, max_chars: int, *, multiline: bool = False) -> str:
    """Stripped text that any database stores: valid UTF-8, no control characters, at most ``max_chars``."""
    value = value.replace("\r\n", "\n").strip() if multiline else value.strip()
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise UserError(f"{field_name}: not valid UTF-8 text") from None
    if (_CONTROL_MULTILINE if multiline else _CONTROL).search(value):
        raise UserError(f"{field_name}: control characters are not allowed")
    if len(value) > max_chars:
        raise UserError(f"{field_name}: at most {max_chars} characters (got {len(value)})")
    return value


def parse_commitment(text: str) -> dict[str, str]:
    """The fields of a commitment text (``key.read_commitment``); errors name the 'commitment' field."""
    text = clean_text(text, "commitment", MAX_COMMITMENT_CHARS, multiline=True)
    if not text:
        raise UserError("commitment: empty; upload commitment.txt or paste its contents")
    with tempfile.TemporaryDirectory(prefix="assay-commitment-") as folder:
        path = Path(folder) / "commitment.txt"
        path.write_text(text + "\n", encoding="utf-8")
        try:
            fields = read_commitment(path)
        except UserError as err:
            raise UserError(str(err).replace(str(path), "commitment")) from None
    if not _HEX64.fullmatch(fields["commitment"].lower()):
        raise UserError("commitment: field 'commitment' must be 64 hexadecimal digits (a SHA-256)")
    return fields


_UNSAFE_IN_URL = '<>"`{}|\\^'  # RFC 3986 leaves these out of a link: they must be percent-encoded


def clean_url(url: str) -> str:
    """An optional http(s) link, refused with the real reason: another scheme (``javascript:``: it is shown
    as a link), spaces, characters a link must percent-encode (markup), or no host."""
    url = clean_text(url, "url", 500)
    if not url:
        return url
    value = f"(value: {url[:80]!r})"
    if not re.match(r"https?://", url, flags=re.IGNORECASE):
        raise UserError(f"url: must start with http:// or https:// {value}")
    if re.search(r"\s", url):
        raise UserError(f"url: must be one link without spaces or line breaks {value}")
    bad = next((c for c in url if c in _UNSAFE_IN_URL), None)
    if bad is not None:
        code = f"%{ord(bad):02X}"
        raise UserError(f"url: {bad!r} cannot stand in a link unencoded (write it as {code}) {value}")
    if not re.match(r"https?://[^/?#]+", url, flags=re.IGNORECASE):
        raise UserError(f"url: names no host after the scheme {value}")
    return url


def register_benchmark(
    session: Session,
    name: str,
    commitment_text: str,
    description: str = "",
    url: str = "",
    user_id: int | None = None,
) -> DyePackBenchmark:
    """Record a released benchmark by its published commitment; a bad field is a one-line ``UserError``."""
    name = clean_text(name, "name", 100)
    if not name:
        raise UserError("name: required")
    commitment_text = clean_text(commitment_text, "commitment", MAX_COMMITMENT_CHARS, multiline=True)
    fields = parse_commitment(commitment_text)
    description = clean_text(description, "description", 2000, multiline=True)
    url = clean_url(url)
    if session.scalar(select(DyePackBenchmark.id).where(DyePackBenchmark.name == name)) is not None:
        raise UserError(f"name: a benchmark named {name!r} is already registered")
    benchmark = DyePackBenchmark(
        name=name,
        description=description,
        url=url,
        commitment=fields["commitment"].lower(),
        release_fingerprint=fields.get("release-fingerprint"),
        commitment_text=commitment_text + "\n",
        created_by=user_id,
    )
    session.add(benchmark)
    session.flush()
    return benchmark


def list_benchmarks(
    session: Session, window: Window | None = None
) -> tuple[list[tuple[DyePackBenchmark, int]], int]:
    """A window of the registered benchmarks, newest first, each with its number of runs; and the total."""
    counts = (
        select(DyePackRun.benchmark_id, func.count().label("n")).group_by(DyePackRun.benchmark_id).subquery()
    )
    query = (
        select(DyePackBenchmark, func.coalesce(counts.c.n, 0))
        .outerjoin(counts, counts.c.benchmark_id == DyePackBenchmark.id)
        .order_by(DyePackBenchmark.id.desc())
    )
    rows, total = page_of(session, query, window or Window())
    return [(benchmark, int(n)) for benchmark, n in rows], total


def get_benchmark(session: Session, benchmark_id: int) -> DyePackBenchmark | None:
    """A registered benchmark by id, or None."""
    return session.get(DyePackBenchmark, benchmark_id)


# ---------------------------------------------------------------- the key and the release


def parse_key(data: bytes) -> DyePackKey:
    """A key from an upload. Errors name the field but never quote a value: every value in it is secret."""
    if len(data) > MAX_KEY_BYTES:
        raise UserError(
            f"key file: larger than {MAX_KEY_BYTES // 1_000_000} MB; is it the key.json of a release?"
        )
    if not data.strip():
        raise UserError("key file: required (the key.json written by assay dyepack prepare)")
    try:
        return DyePackKey.model_validate_json(data)
    except ValidationError as err:
        first = err.errors(include_input=False, include_url=False)[0]
        where = ".".join(str(part) for part in first["loc"]) or "(top level)"
        raise UserError(
            f"key file: field '{where}' {first['msg']} (values are not shown: the key is secret)"
        ) from None


def check_key(benchmark: DyePackBenchmark, key: DyePackKey) -> None:
    """Refuse a key that is not the one committed to when ``benchmark`` was released."""
    with tempfile.TemporaryDirectory(prefix="assay-commitment-") as folder:
        path = Path(folder) / "commitment.txt"
        path.write_text(benchmark.commitment_text, encoding="utf-8")
        ok, reason = check_commitment(key, path)
    if not ok:
        raise UserError(
            f"key file: does not match the commitment registered for {benchmark.name!r} ({reason})"
        )


def check_can_flag(key: DyePackKey, alpha: float) -> None:
    """Refuse a run that could never flag: the key's smallest possible FPR (every backdoor activated)
    exceeds ``alpha`` (``fpr.weakness``: it names that FPR and the B or K that would reach alpha)."""
    weak = weakness([b.k for b in key.backdoors], alpha)
    if weak is not None:
        raise UserError(f"key file: {weak}; or raise alpha")


@dataclass(frozen=True)
class ReleaseFloor:
    """The strongest accusation a registered release can make: its smallest FPR, every backdoor activated.
    The commitment hides B and K, so it is known once a finished run has recorded the key's K values."""

    smallest_fpr: float
    k_values: list[int]
    run_id: int

    def weak(self, alpha: float) -> str | None:
        return weakness(self.k_values, alpha)


def release_floor(session: Session, benchmark_id: int) -> ReleaseFloor | None:
    """The release's smallest possible FPR from its newest run that recorded K values, or None."""
    run = session.scalars(
        select(DyePackRun)
        .where(DyePackRun.benchmark_id == benchmark_id, DyePackRun.k_values.is_not(None))
        .order_by(DyePackRun.id.desc())
        .limit(1)
    ).first()
    if run is None or not run.k_values:
        return None
    return ReleaseFloor(smallest_fpr(run.k_values), list(run.k_values), run.id)


def secrets_of(key: DyePackKey) -> list[str]:
    """The key's strings that must never be shown: triggers, target phrases and labels, the salt."""
    found = {key.salt, *(key.phrases or [])}
    for backdoor in key.backdoors:
        found.update({backdoor.trigger, backdoor.target_label})
    found.discard(NONE_LABEL)  # a fixed word of the code, not a secret
    return sorted((s for s in found if len(s.strip()) >= 3), key=len, reverse=True)


def redact(text: str, key: DyePackKey, *others: str) -> str:
    """``text`` with every secret string of ``key`` (and ``others``, e.g. an endpoint's API key) replaced,
    cut to one line of at most 500 characters."""
    for secret in [*secrets_of(key), *(o for o in others if o)]:
        text = text.replace(secret, "[redacted]")
    line = text.strip().splitlines()[0] if text.strip() else "unknown error"
    return line if len(line) <= 500 else line[:497] + "..."


def read_release(data: bytes, filename: str, key: DyePackKey) -> Benchmark:
    """Parse an uploaded release and check that it is the one the key was made for.

    The upload lives in a temporary folder only while it is parsed; messages name the upload, not the
    folder, and never quote what the key hides (which rows carry a backdoor).
    """
    shown = clean_text(Path(filename or "release").name, "release file", 255) or "release"
    suffix = Path(shown).suffix.lower()
    if suffix not in SUFFIXES:
        raise UserError(f"release file: {shown!r} is not {', '.join(SUFFIXES)}; upload the released file")
    if len(data) > MAX_RELEASE_BYTES:
        raise UserError(f"release file: larger than {MAX_RELEASE_BYTES // 1_000_000} MB")
    with tempfile.TemporaryDirectory(prefix="assay-release-") as folder:
        path = Path(folder) / f"release{suffix}"
        path.write_bytes(data)
        try:
            bench = read_benchmark(path, style=key.style, split=key.split)
        except UserError as err:
            raise UserError(redact(str(err).replace(str(path), f"release file {shown}"), key)) from None
    if bench.fingerprint != key.release_fingerprint:
        raise UserError(
            f"release file: {shown} is not the release this key was made for (content fingerprint "
            f"{bench.fingerprint[:23]}..., the key's {key.release_fingerprint[:23]}...)"
        )
    try:
        check_release(bench, key)
    except UserError:
        raise UserError(f"release file: {shown} does not have the rows the key's backdoors name") from None
    return bench


def check_model_spec(spec: str, model_name: str = "") -> tuple[str, str | None]:
    """The spec and model name, cleaned; the backend loads the model later, in the run's own thread."""
    spec = check_spec_form(clean_text(spec, "model", 500), "model:")
    return spec, clean_text(model_name, "model name", 200) or None


# ---------------------------------------------------------------- runs


@dataclass(frozen=True)
class VerificationJob:
    """What a background thread needs for one run. The key and release are excluded from ``repr``.

    A board cell (``assay.dyepack.board``) also names its model row, the format the model is asked in
    (default: our chat prompt) and the environment variable holding an endpoint's API key, read only when
    the run starts so the key is never in the job, the database or a message.
    """

    spec: str
    model_name: str | None
    params: GenerationParams
    alpha: float
    key: DyePackKey = field(repr=False)
    release: Benchmark = field(repr=False)
    fmt: PromptFormat | None = field(default=None, repr=False)
    model_id: int | None = None
    api_key_env: str | None = None


def endpoint_key(variable: str | None) -> str | None:
    """The API key an endpoint model names by its environment variable, read when its run starts; None
    (the backend's default, ``$OPENAI_API_KEY``) when it names none."""
    if variable is None:
        return None
    value = os.environ.get(variable, "")
    if not value:
        raise UserError(
            f"api key: the environment variable {variable} is not set in the process running the check"
        )
    return value


def this_worker() -> str:
    """Which process holds a run's key: ``host:pid``."""
    return f"{socket.gethostname()}:{os.getpid()}"


def create_run(
    session: Session,
    benchmark: DyePackBenchmark,
    job: VerificationJob,
    release_name: str,
    user_id: int | None = None,
) -> DyePackRun:
    """A queued run row, owned by this process; the caller hands ``job`` to ``execute_run``."""
    run = DyePackRun(
        benchmark_id=benchmark.id,
        model_spec=job.spec,
        model_name=job.model_name,
        release_name=release_name[:255],
        alpha=job.alpha,
        max_new_tokens=job.params.max_new_tokens,
        status=JobStatus.QUEUED,
        worker=this_worker(),
        total_queries=sum(len(b.rows) for b in job.key.backdoors),
        created_by=user_id,
        model_id=job.model_id,
    )
    session.add(run)
    session.flush()
    return run


def public_outcomes(report: VerifyReport) -> list[dict]:
    """Per backdoor, what may be shown to anyone: no trigger, target, majority or answer counts."""
    return [
        {
            "index": r.index,
            "k": r.k,
            "samples": r.samples,
            "samples_on_target": r.samples_on_target,
            "activated": r.activated,
        }
        for r in report.per_backdoor
    ]


def record_report(run: DyePackRun, report: VerifyReport) -> None:
    """Copy the key-free part of a report onto its run and mark it done."""
    run.status, run.finished_at, run.error = JobStatus.DONE, utcnow(), None
    run.flagged, run.verdict = report.flagged, report.verdict
    run.activated, run.backdoors, run.k_values = report.activated, report.backdoors, report.fpr.k_values
    run.fpr, run.log10_fpr, run.chernoff_bound = (
        report.fpr.fpr,
        report.fpr.log10_fpr,
        report.fpr.chernoff_bound,
    )
    run.samples, run.samples_on_target, run.unparsed = (
        report.samples,
        report.samples_on_target,
        report.unparsed,
    )
    run.done_queries = report.samples
    run.per_backdoor = public_outcomes(report)
    run.format = report.format.model_dump(mode="json")


def _update(sessions: sessionmaker[Session], run_id: int, **values: object) -> None:
    with sessions.begin() as session:
        run = session.get(DyePackRun, run_id)
        if run is not None:
            for name, value in values.items():
                setattr(run, name, value)


class _Progress:
    """``on_result`` callback: counts replies; writes the count, and a heartbeat, at most every
    ``PROGRESS_SECONDS`` (one write per reply would make a fast model hammer the database)."""

    def __init__(self, sessions: sessionmaker[Session], run_id: int) -> None:
        self.sessions, self.run_id, self.count, self.last = sessions, run_id, 0, time.monotonic()

    def __call__(self, _index: int, _text: str) -> None:
        self.count += 1
        if time.monotonic() - self.last >= PROGRESS_SECONDS:
            self.last = time.monotonic()
            _update(self.sessions, self.run_id, done_queries=self.count, heartbeat_at=utcnow())


def beat(sessions: sessionmaker[Session], run_id: int) -> None:
    """Stamp ``run_id``'s heartbeat, unless it has finished (or another server failed it meanwhile)."""
    with sessions.begin() as session:
        session.execute(
            update(DyePackRun)
            .where(DyePackRun.id == run_id, DyePackRun.status.in_(ACTIVE_JOBS))
            .values(heartbeat_at=utcnow())
        )


def heartbeat(sessions: sessionmaker[Session], run_id: int, every: float | None = None) -> Heartbeat:
    """A started heartbeat for ``run_id`` (every ``HEARTBEAT_SECONDS``), from the moment the run is queued to
    when its thread ends: a run waiting behind others or held up by a slow model still shows its holder is
    alive, where the progress callback alone would fall silent."""
    period = HEARTBEAT_SECONDS if every is None else every
    return Heartbeat(lambda: beat(sessions, run_id), period, f"dyepack-beat-{run_id}").start()


def execute_run(
    sessions: sessionmaker[Session], run_id: int, job: VerificationJob, heart: Heartbeat | None = None
) -> None:
    """Load the model, verify, record the outcome; meant for a background thread, so it never raises.
    ``heart`` (the run's ``heartbeat``, started when it was queued) stops when the run ends.

    No response cache: it would store the backdoor prompts, and the key is dropped after the run anyway.
    """
    try:
        _execute(sessions, run_id, job)
    finally:
        if heart is not None:
            heart.stop()


def _execute(sessions: sessionmaker[Session], run_id: int, job: VerificationJob) -> None:
    now = utcnow()
    _update(sessions, run_id, status=JobStatus.RUNNING, started_at=now, heartbeat_at=now)
    api_key = ""
    try:
        api_key = endpoint_key(job.api_key_env) or ""
        model = load_model(job.spec, model_name=job.model_name, api_key=api_key or None)
        label = f"{job.spec} ({job.model_name})" if job.model_name else job.spec
        report, _audit = verify(
            model, label, job.release, job.key, job.params, job.alpha, _Progress(sessions, run_id), job.fmt
        )
    except UserError as err:
        message = redact(str(err), job.key, api_key)
        _update(sessions, run_id, status=JobStatus.FAILED, finished_at=utcnow(), error=message)
    except Exception as err:  # a crashing model function or a bug: record it, keep the server up
        logger.warning("dyepack run %s failed with %s", run_id, type(err).__name__)
        message = redact(f"the run stopped with {type(err).__name__}: {err}", job.key, api_key)
        _update(sessions, run_id, status=JobStatus.FAILED, finished_at=utcnow(), error=message)
    else:
        with sessions.begin() as session:
            run = session.get(DyePackRun, run_id)
            if run is not None:
                record_report(run, report)


def get_run(session: Session, run_id: int) -> DyePackRun | None:
    """A verification run by id, or None."""
    return session.get(DyePackRun, run_id)


def run_seconds(run: DyePackRun) -> float | None:
    """How long a finished run took, or None while it has not both started and finished."""
    if run.started_at is None or run.finished_at is None:
        return None
    return (as_utc(run.finished_at) - as_utc(run.started_at)).total_seconds()


def list_runs(
    session: Session, benchmark_id: int | None = None, window: Window | None = None
) -> tuple[list[DyePackRun], int]:
    """A window of the runs, newest first, optionally of one benchmark; and how many there are in all."""
    query = select(DyePackRun).order_by(DyePackRun.id.desc())
    if benchmark_id is not None:
        query = query.where(DyePackRun.benchmark_id == benchmark_id)
    return page_of(session, query, window or Window())


def last_sign_of_life(run: DyePackRun) -> datetime:
    """The run's newest heartbeat, start or creation: a run that never beat is judged from when it began."""
    moments = [m for m in (run.heartbeat_at, run.started_at, run.created_at) if m is not None]
    return max((as_utc(m) for m in moments), default=utcnow())


def stale_message() -> str:
    """The error of a run failed for want of a heartbeat (the window in minutes, or seconds in tests)."""
    seconds = STALE_AFTER.total_seconds()
    window = f"{seconds / 60:g} minutes" if seconds % 60 == 0 else f"{seconds:g} seconds"
    return (
        f"interrupted: no heartbeat for {window} from the server process that held this run's key; "
        "start the run again"
    )


def _stopped_on_this_host(worker: str) -> bool:
    """True when ``worker`` (``host:pid``) names a process on this host that no longer exists."""
    host, _, pid_text = worker.rpartition(":")
    if host != socket.gethostname() or not pid_text.isdigit():
        return False
    try:
        os.kill(int(pid_text), 0)
    except ProcessLookupError:
        return True
    except (OSError, OverflowError):  # alive under another user, or not a pid at all: let the heartbeat say
        return False
    return False


def interruption(run: DyePackRun, active: Container[int], now: datetime | None = None) -> str | None:
    """Why ``run`` (queued or running) can never finish, or None while its key holder may still finish it.

    ``active``: the run ids this process holds keys for. This process, and a dead pid on this host, give a
    quick answer; on any host, a run silent for ``STALE_AFTER`` is taken as orphaned.
    """
    if run.worker == this_worker():
        return None if run.id in active else INTERRUPTED
    if _stopped_on_this_host(run.worker):
        return INTERRUPTED
    if (now or utcnow()) - last_sign_of_life(run) > STALE_AFTER:
        return stale_message()
    return None


def fail_interrupted_runs(session: Session, reason: Callable[[DyePackRun], str | None]) -> int:
    """Mark queued or running runs failed where ``reason`` gives one (e.g. ``interruption``): their key
    holder has stopped, so they can never finish."""
    stuck = session.scalars(select(DyePackRun).where(DyePackRun.status.in_(ACTIVE_JOBS)))
    failed = 0
    for run in stuck:
        why = reason(run)
        if why is not None:
            run.status, run.error, run.finished_at = JobStatus.FAILED, why, utcnow()
            failed += 1
    session.flush()
    return failed


def sweep(sessions: sessionmaker[Session], now: datetime, held: Container[int] = ()) -> int:
    """The periodic work: fail the runs whose key holder stopped (``interruption`` at ``now``); how many.

    ``held``: the runs this process holds keys for, consulted as each run is judged (after the runs are
    read), so a run queued meanwhile is never taken for an orphan. Read only when nothing is stuck.
    """
    with sessions.begin() as session:
        return fail_interrupted_runs(session, lambda run: interruption(run, held, now))


def format_probability(p: float | None, log10_p: float | None) -> str:
    """A probability for people: 3 significant digits, or a power of ten where the float underflowed."""
    if p is None:
        return ""
    if p == 0.0 and log10_p is not None:
        return f"10^{log10_p:.1f}"
    return f"{p:.3g}"


class DyePackSummary(BaseModel):
    """Registered releases and verification runs at a glance (the organiser dashboard)."""

    benchmarks: int
    runs: dict[str, int]  # status -> count
    flagged: int


def run_summary(session: Session) -> DyePackSummary:
    """Counts for the organisers' dashboard: releases, runs by status, flagged runs."""
    runs = session.execute(select(DyePackRun.status, func.count()).group_by(DyePackRun.status)).all()
    return DyePackSummary(
        benchmarks=session.scalar(select(func.count()).select_from(DyePackBenchmark)) or 0,
        runs={str(status): int(count) for status, count in runs},
        flagged=session.scalar(select(func.count()).where(DyePackRun.flagged.is_(True))) or 0,
    )
