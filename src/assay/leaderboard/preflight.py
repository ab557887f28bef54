"""Can this worker do the jobs it would claim? Asked before every claim, so a broken machine claims nothing.

A job needs what its round and submission need: bubblewrap for every test and holdout job, and for practice
jobs unless the round allows unisolated runs; podman for a container-image submission (unsquashfs and
bubblewrap for a ``.sif``; the kind as its record says, ``Submission.kind``); its split's folders,
readable; for a GPU round, that many usable NVIDIA GPUs (``gpu_problem``: the device nodes, the driver's
libraries, ``nvidia-smi -L`` where it exists), so a worker without them still serves CPU rounds and
names, once per GPU round, what it lacks. Every worker needs the
database and free disk in ``ASSAY_HOME`` and the temp dir. Open rounds count too: their test jobs will need
bubblewrap, their folders and their GPUs, so a worker without them says so before the first submission
arrives.

``Preflight.check`` answers with the claimable jobs this worker can run (it may serve some: no podman, it
still takes folder jobs) and one line per problem, each with the failing command's own error. The
machine's probes (a bubblewrap run, disk space) are kept for ``PROBE_TTL_S``; what the queue needs is read
on every check. With a Ray executor the detectors run on the nodes, which check their own sandbox at run
time; here only the database, the disk and the folders (read here to ship them) are checked.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import select, text
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from assay.config import settings
from assay.leaderboard.harness import needs_bwrap
from assay.leaderboard.runnable import machine_kinds
from assay.leaderboard.submissions import recorded_image
from assay.runner import gpu, isolation
from assay.runner.container import podman_missing, sif_missing
from assay.store.enums import RoundStatus
from assay.store.models import Job, Round, Split, Submission

PROBE_TTL_S = 30.0
MIN_FREE_BYTES = 512 * 2**20
CANDIDATES = 100  # claimable jobs looked at per check, oldest first


def error_line(error: BaseException) -> str:
    """An exception as one line: its message's last line (a command's own error ends it), else its type."""
    return isolation.one_line(str(error)) or type(error).__name__


def isolation_problem() -> str | None:
    """Why detectors cannot run under bubblewrap here: the runner's one line (the failing command's own
    error); None when they can.

    The runner's answer decides, since it is what a run will use. It keeps its probe for the process's
    life, so a failed one is forgotten first (the machine may have been fixed since): a worker that stays
    up re-checks every ``PROBE_TTL_S``.
    """
    if isolation.isolation_available() == "bwrap":
        return None
    forget = getattr(isolation._probe, "cache_clear", None)
    if forget is not None:
        forget()
    return isolation.isolation_problem("bwrap")


def engine_problem(image: str) -> str | None:
    """Why the container engine an image needs cannot run it here; None when it can."""
    if not image.endswith(".sif"):
        return podman_missing()
    return sif_missing()


def gpu_problem(round_name: str, gpus: int, found: gpu.Inventory) -> str | None:
    """Why this machine (``found``) cannot run a round whose detectors hold ``gpus`` GPUs, as the one line
    a worker logs (``round gpu-r1 needs 1 GPU: no NVIDIA device here (/dev/nvidia0 missing)``); None when
    it can or the round needs none."""
    why = gpu.problem(found, gpus)
    if why is None:
        return None
    return f"round {round_name} needs {gpus} GPU{'s' if gpus > 1 else ''}: {why}"


def _existing_parent(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def disk_problems(min_free_bytes: int) -> list[str]:
    """One line per place a worker writes (``ASSAY_HOME``, the temp dir) with less free space than asked."""
    problems = []
    for label, place in (("ASSAY_HOME", settings().home), ("temp dir", Path(tempfile.gettempdir()))):
        try:
            free = shutil.disk_usage(_existing_parent(place)).free
        except OSError as err:
            problems.append(f"disk: {label} {place}: {error_line(err)}")
            continue
        if free < min_free_bytes:
            problems.append(
                f"disk: {label} {place} has {free / 2**20:.0f} MiB free; a worker needs "
                f"{min_free_bytes / 2**20:.0f} MiB"
            )
    return problems


def folder_problem(round_name: str, split: str, folders: Iterable[str]) -> str | None:
    """Why a split's folders cannot be read here (missing, not a folder, no permission); None when fine."""
    for folder in folders:
        if not os.path.isdir(folder):
            return f"round {round_name!r} split {split}: folder {folder} does not exist here"
        if not os.access(folder, os.R_OK | os.X_OK):
            return f"round {round_name!r} split {split}: folder {folder} is not readable"
    return None


@dataclass(frozen=True)
class Need:
    """What running one job (or, with ``job_id`` None, a future test job of an open round) takes."""

    job_id: int | None
    round: str
    split: str
    sealed: bool  # under bubblewrap only
    image: str | None  # the container image; None for a folder detector
    folders: tuple[str, ...]
    gpus: int = 0  # NVIDIA GPUs each of its detector runs holds


@dataclass(frozen=True)
class Readiness:
    """The claimable jobs this worker can run now, how many it cannot (``blocked``; 1 when the database
    cannot say), and every problem found, one line each (an open round's too)."""

    servable: list[int]
    problems: list[str] = field(default_factory=list)
    blocked: int = 0

    @property
    def problem(self) -> str:
        return "; ".join(self.problems)


def _job_needs(session: Session, claimable: Any) -> list[Need]:
    rows = session.execute(
        select(
            Job.id,
            Round.name,
            Round.allow_unisolated,
            Round.gpus,
            Split,
            Submission.artifact_path,
            Submission.kind,
        )
        .join(Submission, Job.submission_id == Submission.id)
        .join(Split, Submission.split_id == Split.id)
        .join(Round, Split.round_id == Round.id)
        .where(claimable)
        .order_by(Job.id)
        .limit(CANDIDATES)
    )
    return [
        Need(
            job_id,
            name,
            split.name,
            needs_bwrap(split.name, allow_unisolated),
            recorded_image(kind, Path(artifact)) if artifact else None,
            (split.models_path, split.truth_path),
            gpus,
        )
        for job_id, name, allow_unisolated, gpus, split, artifact, kind in rows
    ]


def _open_round_needs(session: Session) -> list[Need]:
    """Open rounds: their test jobs, whenever they come, need bubblewrap, every split folder and the
    round's GPUs."""
    needs = []
    for round_ in session.scalars(select(Round).where(Round.status == RoundStatus.OPEN)):
        for split in session.scalars(select(Split).where(Split.round_id == round_.id)):
            folders = (split.models_path, split.truth_path)
            needs.append(Need(None, round_.name, split.name, True, None, folders, round_.gpus))
    return needs


class Preflight:
    """The checks a worker makes before each claim; the machine's probes kept for ``ttl_s`` seconds."""

    def __init__(
        self,
        sessions: sessionmaker[Session],
        local: bool = True,
        min_free_bytes: int = MIN_FREE_BYTES,
        ttl_s: float = PROBE_TTL_S,
    ) -> None:
        self.sessions, self.local = sessions, local
        self.min_free_bytes, self.ttl_s = min_free_bytes, ttl_s
        self._probed_at = -float("inf")
        self._machine: dict[str, Any] = {}

    def machine(self) -> dict[str, Any]:
        """The machine's own answers (sandbox, disk, the submission kinds it can run), probed again once
        they are ``ttl_s`` old."""
        if time.monotonic() - self._probed_at >= self.ttl_s:
            self._machine = {
                "bwrap": isolation_problem() if self.local else None,
                "disk": disk_problems(self.min_free_bytes),
                "kinds": machine_kinds(self.local),
            }
            self._probed_at = time.monotonic()
        return self._machine

    def kinds(self) -> tuple[str, ...]:
        """The submission kinds this worker can run (``runnable.machine_kinds``): what its row records, so
        a submission no live worker could run is refused when sent; re-probed with the other probes."""
        return self.machine()["kinds"]

    def gpus(self) -> gpu.Inventory:
        """This machine's NVIDIA devices and driver libraries (``gpu.discover``), probed when a GPU round
        first asks and again with the other probes once they are ``ttl_s`` old."""
        machine = self.machine()
        if "gpus" not in machine:
            machine["gpus"] = gpu.discover()
        return machine["gpus"]

    def _blocker(self, need: Need) -> str | None:
        """The first reason this worker cannot run what ``need`` describes; None when it can. With Ray the
        nodes' GPUs are Ray's to schedule (``num_gpus``), so only a local worker checks its own."""
        machine = self.machine()
        if need.sealed and machine["bwrap"]:
            return f"isolation: a sealed job needs bwrap isolation: {machine['bwrap']}"
        if need.gpus and self.local and (why := gpu_problem(need.round, need.gpus, self.gpus())):
            return why
        if need.image is not None and self.local and (why := engine_problem(need.image)):
            return f"container images: {why}"
        return folder_problem(need.round, need.split, need.folders)

    def check(self, claimable: Any) -> Readiness:
        """What this worker can claim among the jobs ``claimable`` (an SQL condition) selects, and why not
        the rest; nothing at all while the database or the disk fails."""
        try:
            with self.sessions() as session:
                session.execute(text("SELECT 1"))
                jobs, rounds = _job_needs(session, claimable), _open_round_needs(session)
        except SQLAlchemyError as err:
            return Readiness([], [f"database: {error_line(err)}"], blocked=1)
        disk = self.machine()["disk"]
        problems, servable = list(disk), []
        for need in [*jobs, *rounds]:
            why = self._blocker(need)
            if why is None and need.job_id is not None:
                servable.append(need.job_id)
            elif why is not None and why not in problems:
                problems.append(why)
        if disk:
            return Readiness([], problems, blocked=len(jobs))
        return Readiness(servable, problems, blocked=len(jobs) - len(servable))
