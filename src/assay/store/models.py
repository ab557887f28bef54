"""The database tables (SQLAlchemy 2.0 declarative), one class per table.

Leaderboard: a ``Round`` has ``Split``s (train, test, holdout, smoke), each a folder of sequestered models and
a folder with their ground truth; ``Team``s make ``Submission``s (a detector artifact and its sha256) to a
round's split; each accepted submission gets one ``Job`` that a worker claims, runs model by model
(``ModelResult``) and scores (``MetricResult``); each running worker keeps a ``Worker`` row alive. Times
are UTC.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import overload

from sqlalchemy import (
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Integer,
    String,
    Text,
    UniqueConstraint,
    false,
    true,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship
from sqlalchemy.types import TypeDecorator

from assay.store.enums import JobStatus, RoundStatus, SubmissionStatus


def utcnow() -> datetime:
    """Timezone-aware now; every timestamp in the store is UTC."""
    return datetime.now(UTC)


@overload
def as_utc(moment: datetime) -> datetime: ...
@overload
def as_utc(moment: None) -> None: ...
def as_utc(moment: datetime | None) -> datetime | None:
    """A stored time with its zone: SQLite hands back naive datetimes even for ``timezone=True`` columns,
    and every time in the store is UTC. None stays None."""
    if moment is None or moment.tzinfo is not None:
        return moment
    return moment.replace(tzinfo=UTC)


class UtcDateTime(TypeDecorator[datetime]):
    """A ``timezone=True`` column that always reads back zone-aware UTC (``as_utc``), on SQLite too, so every
    time a face hands out carries its offset (an OpenAPI ``date-time``) and no caller has to remember."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        return as_utc(value)


class Base(DeclarativeBase):
    """Base of every table; Alembic compares migrations against its metadata."""


ROUND_STATUSES = tuple(RoundStatus)
SPLIT_NAMES = ("train", "test", "holdout", "smoke")
SUBMISSION_STATUSES = tuple(SubmissionStatus)
JOB_STATUSES = tuple(JobStatus)


class Round(Base):
    __tablename__ = "rounds"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(100), unique=True)
    dataset: Mapped[str] = mapped_column(Text)  # the folder written by `assay zoo split`
    status: Mapped[str] = mapped_column(String(20), default="draft")
    metric: Mapped[str] = mapped_column(String(40), default="cross_entropy")
    submission_window_s: Mapped[int] = mapped_column(Integer, default=86_400)
    per_model_timeout_s: Mapped[float] = mapped_column(Float, default=600.0)
    total_timeout_s: Mapped[float] = mapped_column(Float, default=86_400.0)
    memory_bytes: Mapped[int] = mapped_column(BigInteger, default=4 * 2**30)
    plateau_delta: Mapped[float] = mapped_column(Float, default=0.01)
    plateau_days: Mapped[float] = mapped_column(Float, default=14.0)
    # storage, per team (assay.leaderboard.storage): unpacked bytes and distinct artifacts kept at once,
    # and how many of the latest train/smoke artifacts stay on disk
    quota_bytes: Mapped[int] = mapped_column(BigInteger, default=2 * 2**30, server_default=str(2 * 2**30))
    quota_artifacts: Mapped[int] = mapped_column(Integer, default=50, server_default="50")
    keep_practice: Mapped[int] = mapped_column(Integer, default=2, server_default="2")
    # the sandbox (assay.leaderboard.harness): scratch space and processes per model run
    scratch_bytes: Mapped[int] = mapped_column(BigInteger, default=2**30, server_default=str(2**30))
    max_processes: Mapped[int] = mapped_column(Integer, default=256, server_default="256")
    # practice (train/smoke) jobs may run where bubblewrap is missing; test and holdout never do
    allow_unisolated: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    # bits about the test labels one test submission may reveal to its team while the round is open
    # (assay.leaderboard.disclosure), and the largest container image a team may submit
    leak_bits: Mapped[float] = mapped_column(Float, default=8.0, server_default="8")
    # how a sealed test score is shown: grid (default), bins (worst case; rounds made before it) or exact
    disclosure: Mapped[str] = mapped_column(String(10), default="refined", server_default="bins")
    image_bytes: Mapped[int] = mapped_column(BigInteger, default=8 * 2**30, server_default=str(8 * 2**30))
    # the TrojAI calling convention (assay.leaderboard.harness): NIST calls detectors without the `infer`
    # word; rounds made before this setting keep it (server default). A source data folder, where the round
    # has one, is passed as --source_dataset_dirpath.
    infer_word: Mapped[bool] = mapped_column(Boolean, default=False, server_default=true())
    source_dataset: Mapped[str | None] = mapped_column(Text)
    # anyone may read the round's standings without signing in, as a member of no team does
    # (assay.leaderboard.views.may_see_round); the organiser's switch, off unless turned on
    public: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    # NVIDIA GPUs each detector run holds (assay.runner.gpu); a worker without them takes none of its jobs
    gpus: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # the round's clock: sealed results are published at multiples of this many seconds since the epoch
    # (assay.leaderboard.sealing; hourly, on the hour, unless the organiser sets another period)
    publish_every_s: Mapped[int] = mapped_column(Integer, default=3600, server_default="3600")
    created_at: Mapped[datetime] = mapped_column(UtcDateTime(), default=utcnow)
    opened_at: Mapped[datetime | None] = mapped_column(UtcDateTime())
    closed_at: Mapped[datetime | None] = mapped_column(UtcDateTime())

    splits: Mapped[list[Split]] = relationship(back_populates="round", cascade="all, delete-orphan")


class Split(Base):
    __tablename__ = "splits"
    __table_args__ = (UniqueConstraint("round_id", "name"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    round_id: Mapped[int] = mapped_column(ForeignKey("rounds.id"))
    name: Mapped[str] = mapped_column(String(20))
    models_path: Mapped[str] = mapped_column(Text)  # what a detector sees: models/id-*/ (sequestered)
    truth_path: Mapped[str] = mapped_column(Text)  # ground truth and METADATA.csv: never shown to detectors
    show_logs: Mapped[bool] = mapped_column(Boolean, default=False)  # detector output shown to the team
    model_names: Mapped[str] = mapped_column(Text, default="")  # comma-separated subset; "" = every model

    round: Mapped[Round] = relationship(back_populates="splits")


class Team(Base):
    __tablename__ = "teams"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(100), unique=True)
    contact: Mapped[str] = mapped_column(String(200), default="")
    kind: Mapped[str] = mapped_column(String(40), default="performer")
    disabled: Mapped[bool] = mapped_column(Boolean, default=False)
    created_at: Mapped[datetime] = mapped_column(UtcDateTime(), default=utcnow)


class Submission(Base):
    __tablename__ = "submissions"

    id: Mapped[int] = mapped_column(primary_key=True)
    team_id: Mapped[int] = mapped_column(ForeignKey("teams.id"))
    split_id: Mapped[int] = mapped_column(ForeignKey("splits.id"))
    artifact_path: Mapped[str] = mapped_column(Text)
    artifact_sha256: Mapped[str] = mapped_column(String(64), index=True)
    technique: Mapped[str] = mapped_column(String(200), default="")
    submitted_at: Mapped[datetime] = mapped_column(UtcDateTime(), default=utcnow)
    status: Mapped[str] = mapped_column(String(20))
    validation_errors: Mapped[str] = mapped_column(Text, default="")
    duplicate_of_id: Mapped[int | None] = mapped_column(ForeignKey("submissions.id"))
    artifact_bytes: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")  # unpacked
    # when this submission stopped holding its artifact (practice retention); the folder itself goes only
    # once no submission holds it
    artifact_removed_at: Mapped[datetime | None] = mapped_column(UtcDateTime())
    # what was sent: folder, archive, image or sif (``submissions.artifact_kind``); it, not the stored
    # files, says how the job runs ("" for rows from before it was recorded: read from their files)
    kind: Mapped[str] = mapped_column(String(10), default="", server_default="")

    team: Mapped[Team] = relationship()
    split: Mapped[Split] = relationship()
    job: Mapped[Job | None] = relationship(back_populates="submission")


class Job(Base):
    __tablename__ = "jobs"

    id: Mapped[int] = mapped_column(primary_key=True)
    submission_id: Mapped[int] = mapped_column(ForeignKey("submissions.id"), unique=True)
    status: Mapped[str] = mapped_column(String(20), default="queued", index=True)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    worker: Mapped[str | None] = mapped_column(String(200))
    claimed_at: Mapped[datetime | None] = mapped_column(UtcDateTime())
    started_at: Mapped[datetime | None] = mapped_column(UtcDateTime())  # first claim
    heartbeat_at: Mapped[datetime | None] = mapped_column(UtcDateTime())
    finished_at: Mapped[datetime | None] = mapped_column(UtcDateTime())
    log: Mapped[str] = mapped_column(Text, default="")  # the harness's own notes (isolation, limits, errors)
    # faults of the platform so far (assay.leaderboard.worker): the job is requeued, not claimed again
    # before ``not_before``, and ends as platform-error after a few
    platform_faults: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    not_before: Mapped[datetime | None] = mapped_column(UtcDateTime())

    submission: Mapped[Submission] = relationship(back_populates="job")
    results: Mapped[list[ModelResult]] = relationship(back_populates="job", cascade="all, delete-orphan")
    metrics: Mapped[list[MetricResult]] = relationship(back_populates="job", cascade="all, delete-orphan")


class ModelResult(Base):
    __tablename__ = "model_results"
    __table_args__ = (UniqueConstraint("job_id", "model_name"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id"))
    model_name: Mapped[str] = mapped_column(String(100))
    raw_output: Mapped[str | None] = mapped_column(Text)
    value: Mapped[float] = mapped_column(Float)  # the probability scored (0.5 when the output was unusable)
    flags: Mapped[str] = mapped_column(String(200), default="")  # NIST's, e.g. ":Result Parse:"
    exit_code: Mapped[int | None] = mapped_column(Integer)
    wall_seconds: Mapped[float] = mapped_column(Float)
    stdout: Mapped[str] = mapped_column(Text, default="")
    stderr: Mapped[str] = mapped_column(Text, default="")

    job: Mapped[Job] = relationship(back_populates="results")


class MetricResult(Base):
    __tablename__ = "metric_results"
    __table_args__ = (UniqueConstraint("job_id", "name", "group_column", "group_value"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id"))
    name: Mapped[str] = mapped_column(String(40))
    group_column: Mapped[str] = mapped_column(String(100), default="")  # "" = the whole split
    group_value: Mapped[str] = mapped_column(String(200), default="")
    value: Mapped[float | None] = mapped_column(Float)  # None for NaN (an AUC with one class)

    job: Mapped[Job] = relationship(back_populates="metrics")


class Worker(Base):
    """A leaderboard worker process, stamped every few seconds while it lives (``assay.leaderboard.fleet``):
    a stale ``heartbeat_at`` means it died; ``healthy`` False with ``problem`` says why it claims nothing;
    ``kinds`` and ``splits`` say what it can take, so a submission no live worker could run is refused."""

    __tablename__ = "workers"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(200), unique=True)  # host:pid, as recorded on the jobs it claims
    host: Mapped[str] = mapped_column(String(200))
    pid: Mapped[int] = mapped_column(Integer)
    version: Mapped[str] = mapped_column(String(40))
    isolation: Mapped[str] = mapped_column(String(20))  # bwrap, unshare or none
    executor: Mapped[str] = mapped_column(String(20))
    started_at: Mapped[datetime] = mapped_column(UtcDateTime(), default=utcnow)
    heartbeat_at: Mapped[datetime] = mapped_column(UtcDateTime(), default=utcnow)
    healthy: Mapped[bool] = mapped_column(Boolean, default=True)
    problem: Mapped[str] = mapped_column(Text, default="")
    job_id: Mapped[int | None] = mapped_column(ForeignKey("jobs.id"))  # the job it runs now
    # the submission kinds it can run (``Submission.kind``, comma-separated) and the splits it serves
    # (``--splits``; "" all): read at submission (``assay.leaderboard.runnable``); "" from an older release
    kinds: Mapped[str] = mapped_column(Text, default="", server_default="")
    splits: Mapped[str] = mapped_column(Text, default="", server_default="")
