"""Run one job: a submitted detector on every model of a split, each in its own sandbox, then score it.

Per model the sandbox is built from nothing but an allow-list (``assay.runner``): that model's ``model.pt``,
``reduced-config.json`` and clean examples, the detector itself, the round's public training split, and the
runtime. The round folder (all ground truth), the store, ``ASSAY_HOME``, other rounds and the rest of the
host do not exist inside, and no path, argument or variable names the model. Every job refuses to run where
bwrap is missing; a round may allow unisolated practice (train/smoke) jobs, logged on each, never test or
holdout. The total time limit is one deadline from the job's first claim, enforced
inside every model run. Models run in an order shuffled from OS entropy, so no fact a team can see (the
job id, its times) ties a moment of the run to a model. Each result is committed as it
arrives, so a job interrupted at any moment resumes with the models still missing. Output that is missing,
unparseable, NaN or outside [0, 1] scores as 0.5 and carries NIST's flag; a run stopped for memory carries
``:Memory:``. A result file is read as NIST reads it (its first line). A test job's score is also stored as
its disclosed form (``disclosure``), the only one its team sees while the round is open.
"""

from __future__ import annotations

import contextlib
import math
import random
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session, sessionmaker

from assay.leaderboard.disclosure import disclosed_metrics
from assay.leaderboard.rounds import split_models
from assay.leaderboard.scoring import DEFAULT_PREDICTION, read_metadata, read_truth, score
from assay.leaderboard.submissions import checked_artifact
from assay.runner import Executor, Limits, Task, TaskResult, isolation_available
from assay.runner.container import JOB_LABEL, owner_labels, remove_labelled
from assay.runner.isolation import host_view
from assay.store.models import Job, MetricResult, ModelResult, as_utc, utcnow

PARSE_FLAG = ":Result Parse:"
MISSING_FLAG = ":Missing Results:"
TIMEOUT_FLAG = ":Timeout:"
MEMORY_FLAG = ":Memory:"
SEALED_SPLITS = ("test", "holdout")  # their ground truth is the organiser's: never run them unisolated
# What a detector is given of each model (what the sequestered view holds), under the same names.
MODEL_FILES = ("model.pt", "model.safetensors", "reduced-config.json", "clean-example-data")
LOG_LIMIT = 64 * 1024


def storable(text: str) -> str:
    """Detector text made safe for every database: PostgreSQL's text type cannot hold NUL characters.

    Undecodable bytes were already replaced when the output was decoded (U+FFFD); NUL becomes U+FFFD too,
    so a detector that prints one loses nothing but that character, on SQLite and PostgreSQL alike.
    """
    return text.replace("\x00", "\ufffd")


def parse_result(result: TaskResult) -> tuple[float, str, str | None]:
    """The value scored, NIST's flag ("" when fine), and the raw output text (the whole file, cut to 200).

    NIST's harness reads the first line of the result file, so a value followed by more lines scores;
    ``extra_lines`` lets the job log say so.
    """
    if result.timed_out:
        return DEFAULT_PREDICTION, TIMEOUT_FLAG, None
    if result.killed_for_memory:
        return DEFAULT_PREDICTION, MEMORY_FLAG, None
    raw = result.outputs.get("result.txt")
    if raw is None:
        return DEFAULT_PREDICTION, MISSING_FLAG, None
    text = storable(raw.decode("utf-8", errors="replace"))
    first = text.splitlines()[0].strip() if text.strip() else ""
    try:
        value = float(first)
    except ValueError:
        return DEFAULT_PREDICTION, PARSE_FLAG, text.strip()[:200]
    if not math.isfinite(value) or not 0.0 <= value <= 1.0:
        return DEFAULT_PREDICTION, PARSE_FLAG, text.strip()[:200]
    return value, "", text.strip()[:200]


def extra_lines(raw: bytes | None) -> int:
    """Non-blank lines after the first in a result file: NIST ignores them; our job log warns."""
    if raw is None:
        return 0
    return sum(1 for line in raw.decode("utf-8", errors="replace").splitlines()[1:] if line.strip())


@dataclass(frozen=True)
class Convention:
    """How a round calls its detectors (NIST's by default): the ``infer`` word or not, source data."""

    infer_word: bool = False
    source_dataset: Path | None = None


def detector_arguments(
    model: str,
    result: str,
    scratch: str,
    own: str,
    training: str | None,
    source: str | None,
    infer_word: bool,
) -> list[str]:
    """The TrojAI ``infer`` arguments in NIST's order, for a folder detector or a container alike.

    ``model`` is the folder holding ``model.pt``, ``config.json`` and ``clean-example-data``, as NIST's
    harness lays each model out; ``own`` the folder of the detector's metaparameters, schema and learned
    parameters; ``training`` and ``source`` the round's training split and source data, where it has them.
    """
    argv = ["infer"] if infer_word else []
    argv += ["--model_filepath", f"{model}/model.pt", "--result_filepath", result]
    argv += ["--scratch_dirpath", scratch, "--examples_dirpath", f"{model}/clean-example-data"]
    argv += ["--round_training_dataset_dirpath", training or scratch]
    argv += ["--metaparameters_filepath", f"{own}/metaparameters.json"]
    argv += ["--schema_filepath", f"{own}/metaparameters_schema.json"]
    argv += ["--learned_parameters_dirpath", f"{own}/learned_parameters"]
    if source is not None:
        argv += ["--source_dataset_dirpath", source]
    return argv


def detector_task(
    artifact: Path,
    model_dir: Path,
    limits: Limits,
    training: Path | None = None,
    convention: Convention = Convention(),
    **fields: Any,
) -> Task:
    """The sandboxed TrojAI ``infer`` call for one model; ``fields`` go to ``Task`` (deadline, isolation).

    The detector runs in this interpreter, so ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD`` gives a bare
    ``torch.load(model_filepath)`` the default NIST's containers have (torch < 2.6: whole modules load).
    """
    argv = [
        sys.executable,
        "{input}/detector/entrypoint.py",
        *detector_arguments(
            "{input}",
            "{output}/result.txt",
            "{scratch}",
            "{input}/detector",
            "{input}/round-training-dataset" if training else None,
            "{input}/source-dataset" if convention.source_dataset else None,
            convention.infer_word,
        ),
    ]
    stage = {
        "detector": artifact,
        **{name: model_dir / name for name in MODEL_FILES if (model_dir / name).exists()},
    }
    if "reduced-config.json" in stage:  # NIST's harness copies it beside the model, where it exists
        stage["config.json"] = stage["reduced-config.json"]
    if training is not None:
        stage["round-training-dataset"] = training
    if convention.source_dataset is not None:
        stage["source-dataset"] = convention.source_dataset
    # No model name anywhere the detector can read: staged paths are neutral, and so is the environment.
    env = {"TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1"}
    shared = frozenset({"detector", "round-training-dataset", "source-dataset"} & set(stage))
    return Task(
        key=model_dir.name, argv=argv, stage=stage, shared_stage=shared, limits=limits, env=env, **fields
    )


def _job_context(sessions: sessionmaker[Session], job_id: int) -> dict:
    with sessions() as session:
        job = session.get(Job, job_id)
        if job is None:
            raise ValueError(f"no job {job_id}")
        split = job.submission.split
        round_ = split.round
        training = Path(round_.dataset) / "train"
        limits = Limits(
            wall_seconds=round_.per_model_timeout_s,
            memory_bytes=round_.memory_bytes,
            scratch_bytes=round_.scratch_bytes,
            max_processes=round_.max_processes,
            gpus=round_.gpus,
        )
        return {
            "artifact": Path(job.submission.artifact_path),
            "kind": job.submission.kind,
            "worker": job.worker or "",
            "attempts": job.attempts,
            "sha256": job.submission.artifact_sha256,
            "models_path": Path(split.models_path),
            "truth_path": Path(split.truth_path),
            "models": split_models(split),
            "done": {r.model_name for r in job.results},
            "split": split.name,
            "training": training if (training / "models").is_dir() else None,
            "convention": Convention(
                round_.infer_word, Path(round_.source_dataset) if round_.source_dataset else None
            ),
            "limits": limits,
            "deadline": as_utc(job.started_at or utcnow()).timestamp() + round_.total_timeout_s,
            "total_timeout_s": round_.total_timeout_s,
            "publish_every_s": round_.publish_every_s,
            "allow_unisolated": round_.allow_unisolated,
            "metric": round_.metric,
            "leak_bits": round_.leak_bits,
            "disclosure": round_.disclosure,
        }


def _record(sessions: sessionmaker[Session], job_id: int, result: TaskResult, worker: str = "") -> bool:
    """Store one model's result, unless the job has been taken over from ``worker`` meanwhile (its
    heartbeat went stale and the new worker killed this run's containers): a run that lost its claim
    records nothing, so a detector killed for that is never scored against the team. Whether stored."""
    value, flag, raw = parse_result(result)
    stderr = storable(result.stderr)
    if flag == MEMORY_FLAG:
        stderr += (
            f"\n[harness] stopped for memory: peak resident {result.peak_memory_bytes / 2**20:.0f} MiB\n"
        )
    elif result.deadline_reached:
        stderr += "\n[harness] stopped at the job's total time limit\n"
    elif result.collector_lost:
        stderr += (
            "\n[harness] the result collector was lost (killed from outside the sandbox, or no whole "
            "answer came back): scored as missing\n"
        )
    with sessions.begin() as session:
        job = session.get(Job, job_id)
        assert job is not None
        if (job.worker or "") != worker:
            return False
        session.add(
            ModelResult(
                job_id=job_id,
                model_name=result.key,
                raw_output=raw,
                value=value,
                flags=flag,
                exit_code=result.exit_code,
                wall_seconds=result.wall_seconds,
                stdout=storable(result.stdout)[-LOG_LIMIT:],
                stderr=stderr[-LOG_LIMIT:],
            )
        )
        job.heartbeat_at = utcnow()
    return True


def _note(sessions: sessionmaker[Session], job_id: int, line: str) -> None:
    with sessions.begin() as session:
        job = session.get(Job, job_id)
        assert job is not None
        if line not in job.log.splitlines():
            job.log = f"{job.log}{line}\n"


def needs_bwrap(split: str, allow_unisolated: bool) -> bool:
    """The one rule: every job runs under bwrap, except practice (train/smoke) jobs of a round that allows
    unisolated runs; the harness and the worker's pre-flight check (``preflight``) both ask here."""
    return split in SEALED_SPLITS or not allow_unisolated


def _sealing(context: dict, sessions: sessionmaker[Session], job_id: int) -> bool:
    """Whether the job's tasks must run under bwrap: every job, unless the round allows unisolated practice
    and this is a practice (train/smoke) job; test and holdout jobs never take that override (an open
    detector could read the sequestered truth and the database). The override still needs a read-only view
    of this machine (``host_view``): where a detector could write outside its scratch, the job is refused.
    Either way the job log says exactly what the detector could read and write."""
    if needs_bwrap(context["split"], context["allow_unisolated"]):
        return True
    level = isolation_available()
    if level == "bwrap":
        return False
    view = host_view(level)
    if view is None:
        _note(
            sessions,
            job_id,
            f"override refused: the round allows unisolated practice runs, but under isolation {level!r} "
            "the detector could write this machine's files (install bubblewrap, or allow user namespaces)",
        )
        return True
    _note(
        sessions,
        job_id,
        "override: the round allows unisolated practice runs; this job ran with isolation "
        f"{level!r}, its detector could read this machine's files: {view}",
    )
    return False


def run_models(
    sessions: sessionmaker[Session],
    job_id: int,
    executor: Executor,
    chunk: int = 4,
    on_model: Callable[[str], None] | None = None,
) -> bool:
    """Run the detector on every model the job has no result for; False when the total time ran out."""
    context = _job_context(sessions, job_id)
    todo = [m for m in context["models"] if m not in context["done"]]
    random.SystemRandom().shuffle(todo)  # from a secret the team never sees: the order names no model
    fields = {"deadline": context["deadline"], "require_isolation": _sealing(context, sessions, job_id)}
    fields["exclusive"] = context["split"] in SEALED_SPLITS  # the host alone while it runs (issue 44)
    # and no practice run on it before the round's next publication tick (``hostquiet``; Ray's nodes)
    fields["quiet_every_s"] = context["publish_every_s"] if fields["exclusive"] else 0.0
    # the record says how it runs; stored files unlike the record are the platform's fault (ArtifactFault)
    fields["image"] = checked_artifact(context["kind"], context["artifact"], context["sha256"])
    fields["labels"] = owner_labels(job_id, context["worker"])
    if context["attempts"] > 1:  # run before: a dead worker's containers may still be running it
        _clear_leftovers(sessions, job_id)
    tasks = [
        detector_task(
            context["artifact"],
            context["models_path"] / m,
            context["limits"],
            context["training"],
            context["convention"],
            **fields,
        )
        for m in todo
    ]
    noted: set[str] = set()
    reached = False

    def done(result: TaskResult) -> None:
        nonlocal reached
        if result.isolation not in noted:  # one log line per isolation level, not one write per model
            noted.add(result.isolation)
            _note(sessions, job_id, f"isolation: {result.isolation}")
        reached = reached or result.deadline_reached
        if result.exit_code is None and result.deadline_reached:
            return  # never started: scored as missing, like NIST's models a job did not reach
        if extra_lines(result.outputs.get("result.txt")):
            _note(sessions, job_id, "warning: a result file had lines after the first; scored its first line")
        if not _record(sessions, job_id, result, context["worker"]):
            return  # the job was taken over: this run's results are no longer its
        if on_model is not None:
            on_model(result.key)

    # A sealed job holds the host alone across its chunks, so no other job's run slips in between them
    # and times them (the local executor's host lease; Ray's is per task). A practice job leases chunk by
    # chunk, so a sealed job waits at most for one chunk.
    holding = getattr(executor, "holding", None) if fields["exclusive"] else None
    with (
        _leaving_nothing(fields["labels"]),
        holding(True) if holding is not None else contextlib.nullcontext(),
    ):
        for i in range(0, len(tasks), chunk):
            if time.time() >= context["deadline"]:
                reached = True
                break
            executor.map(tasks[i : i + chunk], done)
    if reached:
        _note(sessions, job_id, f"total time limit of {context['total_timeout_s']:g} s reached")
    return not reached


def _clear_leftovers(sessions: sessionmaker[Session], job_id: int) -> None:
    """Remove this host's containers of an earlier run of the job (a worker killed with SIGKILL, or one
    whose heartbeat went stale, left them under conmon) before it runs again: never two runs of one job."""
    removed = remove_labelled({JOB_LABEL: str(job_id)})
    if removed:
        _note(sessions, job_id, f"removed {removed} container(s) left running by an earlier run of this job")


@contextlib.contextmanager
def _leaving_nothing(labels: dict[str, str]) -> Iterator[None]:
    """Models run inside; should they stop early (the worker stopped, a fault), every container this run
    of the job started on this host goes too, whatever state its podman client was left in."""
    try:
        yield
    except BaseException:
        remove_labelled(labels)
        raise


def score_job(sessions: sessionmaker[Session], job_id: int) -> None:
    """Compute the job's metrics (overall and per METADATA factor) from its model results and store them."""
    context = _job_context(sessions, job_id)
    with sessions.begin() as session:
        job = session.get(Job, job_id)
        assert job is not None
        predictions = {r.model_name: r.value for r in job.results}
        models = set(context["models"])
        truth = {m: t for m, t in read_truth(context["truth_path"]).items() if m in models}
        metadata_path = context["truth_path"] / "METADATA.csv"
        metadata = read_metadata(metadata_path) if metadata_path.is_file() else None
        if metadata is not None:
            metadata = {m: row for m, row in metadata.items() if m in models}
        report = score(predictions, truth, metadata)
        overall = dict(report.overall)
        if context["split"] == "test":
            scored = {m: predictions.get(m, DEFAULT_PREDICTION) for m in truth}
            exact = overall.get(context["metric"])
            overall.update(
                disclosed_metrics(
                    scored, truth, context["metric"], context["leak_bits"], context["disclosure"], exact
                )
            )
        job.metrics.clear()
        session.flush()
        for name, value in overall.items():
            job.metrics.append(MetricResult(name=name, value=_finite(value)))
        for column, groups in report.groups.items():
            for group, metrics in groups.items():
                for name, value in metrics.items():
                    job.metrics.append(
                        MetricResult(name=name, group_column=column, group_value=group, value=_finite(value))
                    )
        if all(r.flags for r in job.results):
            job.log += ":No Results:\n"


def _finite(value: float | int) -> float | None:
    value = float(value)
    return value if math.isfinite(value) else None
