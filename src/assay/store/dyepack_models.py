"""DyePack tables: released benchmarks registered by their commitment, models on the contamination board, and
verification runs (a run of a board model is one cell of the board).

Nothing here is secret. A benchmark row holds the public commitment file; a run row holds the model it
asked, its timings and the parts of the report that reveal no part of the key: counts, K values, the exact
false-positive rate and, per backdoor, only whether it was activated and how many samples hit the target.
Triggers, targets, backdoor rows, answer distributions and the salt are never stored (see
``assay.dyepack.registry``). A board model holds no credential either: an endpoint's API key stays in the
environment of the process running the checks; the row names only the variable (``assay.dyepack.board``).
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import JSON, Boolean, Float, ForeignKey, Integer, String, Text
from sqlalchemy.orm import Mapped, mapped_column, relationship

from assay.store.enums import JobStatus
from assay.store.models import Base, UtcDateTime, utcnow

RUN_STATUSES = (JobStatus.QUEUED, JobStatus.RUNNING, JobStatus.DONE, JobStatus.FAILED)


class DyePackBenchmark(Base):
    """A released benchmark, known by the commitment published with it."""

    __tablename__ = "dyepack_benchmarks"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(100), unique=True)
    description: Mapped[str] = mapped_column(Text, default="")
    url: Mapped[str] = mapped_column(String(500), default="")  # http(s) only: it is rendered as a link
    commitment: Mapped[str] = mapped_column(String(64))  # hex sha256 from commitment.txt
    release_fingerprint: Mapped[str | None] = mapped_column(String(100))
    commitment_text: Mapped[str] = mapped_column(Text)  # the whole public file, for check_commitment
    created_by: Mapped[int | None] = mapped_column(ForeignKey("web_users.id"))
    created_at: Mapped[datetime] = mapped_column(UtcDateTime(), default=utcnow)

    runs: Mapped[list[DyePackRun]] = relationship(back_populates="benchmark", order_by="DyePackRun.id.desc()")


class DyePackRun(Base):
    """One verification of a model against a registered benchmark, and its key-free result."""

    __tablename__ = "dyepack_runs"

    id: Mapped[int] = mapped_column(primary_key=True)
    benchmark_id: Mapped[int] = mapped_column(ForeignKey("dyepack_benchmarks.id"), index=True)
    model_spec: Mapped[str] = mapped_column(String(500))
    model_name: Mapped[str | None] = mapped_column(String(200))
    release_name: Mapped[str] = mapped_column(String(255), default="")  # the uploaded file's name
    alpha: Mapped[float] = mapped_column(Float)
    max_new_tokens: Mapped[int] = mapped_column(Integer)
    status: Mapped[str] = mapped_column(String(20), default="queued")  # one of RUN_STATUSES
    worker: Mapped[str] = mapped_column(String(200), default="")  # host:pid of the process holding the key
    error: Mapped[str | None] = mapped_column(Text)
    total_queries: Mapped[int] = mapped_column(Integer, default=0)
    done_queries: Mapped[int] = mapped_column(Integer, default=0)
    created_by: Mapped[int | None] = mapped_column(ForeignKey("web_users.id"))
    created_at: Mapped[datetime] = mapped_column(UtcDateTime(), default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(UtcDateTime())
    finished_at: Mapped[datetime | None] = mapped_column(UtcDateTime())
    # Stamped while the holding process works on the run (queued or running): lets a server on any host
    # fail a run whose holder died (``registry.interruption``).
    heartbeat_at: Mapped[datetime | None] = mapped_column(UtcDateTime())
    # The report, key-free (set when status is "done").
    flagged: Mapped[bool | None] = mapped_column(Boolean)
    verdict: Mapped[str | None] = mapped_column(Text)
    activated: Mapped[int | None] = mapped_column(Integer)
    backdoors: Mapped[int | None] = mapped_column(Integer)
    k_values: Mapped[list[int] | None] = mapped_column(JSON)
    fpr: Mapped[float | None] = mapped_column(Float)  # exact; may underflow to 0, log10_fpr does not
    log10_fpr: Mapped[float | None] = mapped_column(Float)
    chernoff_bound: Mapped[float | None] = mapped_column(Float)
    samples: Mapped[int | None] = mapped_column(Integer)
    samples_on_target: Mapped[int | None] = mapped_column(Integer)
    unparsed: Mapped[int | None] = mapped_column(Integer)
    per_backdoor: Mapped[list[dict] | None] = mapped_column(JSON)  # index, k, samples, on target, activated

    # The board (``assay.dyepack.board``): the registered model this run checked (None: a one-off run), and
    # how the samples were asked (``prompts.FormatRecord``: mode, template name, shots; nothing secret).
    model_id: Mapped[int | None] = mapped_column(ForeignKey("dyepack_models.id"), index=True)
    format: Mapped[dict | None] = mapped_column(JSON)

    benchmark: Mapped[DyePackBenchmark] = relationship(back_populates="runs", lazy="joined")


class DyePackModel(Base):
    """A model on the contamination board, checked against every registered release.

    ``mode``, ``fewshot``, ``system_prompt`` and the template say how the model is used, so it is asked
    that way (see ``assay.dyepack.prompts``). ``api_key_env`` is the NAME of an environment variable of the
    process running the checks; the key itself is never stored.
    """

    __tablename__ = "dyepack_models"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(100), unique=True)
    spec: Mapped[str] = mapped_column(String(500))  # hf:PATH, openai:URL, vllm:PATH or python:MOD:FUNC
    kind: Mapped[str] = mapped_column(String(20))  # hf, gguf, openai, vllm or python (from the spec)
    model_name: Mapped[str | None] = mapped_column(String(200))  # openai: the served model's name
    api_key_env: Mapped[str | None] = mapped_column(String(100))
    mode: Mapped[str] = mapped_column(String(20), default="chat")  # chat, completion or loglikelihood
    fewshot: Mapped[int] = mapped_column(Integer, default=0)
    system_prompt: Mapped[str | None] = mapped_column(Text)
    template_name: Mapped[str | None] = mapped_column(String(255))
    template_source: Mapped[str | None] = mapped_column(Text)
    added_by: Mapped[str] = mapped_column(String(100), default="")  # a web user's name or the CLI's user
    created_by: Mapped[int | None] = mapped_column(ForeignKey("web_users.id"))
    created_at: Mapped[datetime] = mapped_column(UtcDateTime(), default=utcnow)
