"""What to run and what came back: the records that cross from the leaderboard to an executor and back.

They are plain, picklable dataclasses so that a thread pool and a Ray cluster can pass them alike.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

GiB = 2**30


@dataclass(frozen=True)
class Limits:
    """Resources one detector run may use.

    ``cpus`` and ``gpus`` are what a scheduler reserves (Ray) and what thread pools are told
    (``OMP_NUM_THREADS``); they are not enforced by the kernel. ``memory_bytes`` is enforced as an
    address-space limit (RLIMIT_AS), or as a private-memory limit (RLIMIT_DATA) when ``gpus`` > 0, because
    the CUDA driver reserves huge address ranges. Neither counts files written to a tmpfs: under bwrap,
    ``scratch_bytes`` bounds the task's own tmpfs (scratch, output, ``/tmp``, ``/dev/shm``).
    ``max_processes`` bounds processes and threads together, through a pids cgroup where one can be made.
    """

    wall_seconds: float = 600
    memory_bytes: int | None = 4 * GiB
    cpus: float = 1.0
    gpus: float = 0.0
    network: bool = False
    scratch_bytes: int = 1 * GiB
    max_processes: int = 256

    def __post_init__(self) -> None:
        if not self.wall_seconds > 0:
            raise ValueError(f"wall_seconds must be positive, not {self.wall_seconds!r}")
        if self.memory_bytes is not None and self.memory_bytes <= 0:
            raise ValueError(f"memory_bytes must be positive or None, not {self.memory_bytes!r}")
        if not self.cpus > 0:
            raise ValueError(f"cpus must be positive, not {self.cpus!r}")
        if self.gpus < 0:
            raise ValueError(f"gpus must not be negative, not {self.gpus!r}")
        if self.scratch_bytes < 2**20:
            raise ValueError(f"scratch_bytes must be at least 1 MiB, not {self.scratch_bytes!r}")
        if self.max_processes < 4:  # bwrap, its init, the collector and the detector itself
            raise ValueError(f"max_processes must be at least 4, not {self.max_processes!r}")


def _check_name(kind: str, name: str) -> None:
    """Stage and output names are single path components, so nothing can point outside the sandbox folders."""
    if not name or name in (".", "..") or "/" in name or "\0" in name:
        raise ValueError(f"{kind} name must be one plain file name, not {name!r}")


@dataclass(frozen=True)
class Task:
    """One detector run: a command line, the files it may read and the files to read back.

    ``argv`` may contain ``{input}``, ``{output}`` and ``{scratch}``; they become the sandbox's folders.
    ``stage`` maps a name inside ``{input}`` to a file or folder exposed read-only. Under bwrap nothing else
    of the host exists inside but the runtime (system libraries, this Python, ``assay``) and ``readonly``,
    extra host paths shown read-only where they are. ``outputs`` are file names read back from ``{output}``.
    ``deadline`` (epoch seconds) is a hard end shared by a job's tasks: a task runs until the earlier of it
    and its own ``wall_seconds``, and one that would start after it is not started. ``require_isolation``
    refuses to run it anywhere bwrap is not available. ``exclusive`` runs it only while its executor holds
    the host (a Ray node) alone: no other job's task shares it (``hostlease``; a sealed job's tasks).
    ``quiet_every_s`` (exclusive tasks): the host then takes no shared task until the next multiple of it
    (epoch seconds) at or after the run ends, so a shared task's start tells no more than that tick (the
    round's publication clock, for a sealed job).

    Staged entries are copied into a fresh folder of the run, under their stage names, with new inodes and
    one fixed modification time, so nothing inside (a path, ``/proc``, ``stat``) tells which model or host
    file it is. ``shared_stage`` names entries that are the same for every task of a job (the detector's
    own folder, a training set): they cannot tell one task from another, so they are hard-linked (copied
    only across file systems), which costs nothing however large they are.

    ``image`` runs the task in that container image instead (``assay.runner.container``: an image archive
    from ``podman save``/``docker save``, ``podman:REF``, or a ``.sif``), with the same inputs, limits and
    result handling: ``argv`` is then a folder detector's, whose interpreter and ``entrypoint.py`` give way
    to the image's own entrypoint. ``labels`` go on its container (``container.remove_labelled``): the job
    and worker it runs for, so a stopped or reclaiming worker finds what is left of a run by them.
    """

    key: str
    argv: list[str]
    stage: dict[str, Path] = field(default_factory=dict)
    limits: Limits = field(default_factory=Limits)
    env: dict[str, str] = field(default_factory=dict)
    readonly: list[Path] = field(default_factory=list)
    outputs: list[str] = field(default_factory=lambda: ["result.txt"])
    deadline: float | None = None
    require_isolation: bool = False
    image: str | None = None
    shared_stage: frozenset[str] = frozenset()
    exclusive: bool = False
    labels: dict[str, str] = field(default_factory=dict)
    quiet_every_s: float = 0.0

    def __post_init__(self) -> None:
        if not self.argv:
            raise ValueError(f"task {self.key!r} has an empty argv")
        if not set(self.shared_stage) <= set(self.stage):
            extra = sorted(set(self.shared_stage) - set(self.stage))
            raise ValueError(f"task {self.key!r}: shared_stage names {extra!r}, which are not staged")
        for name in self.stage:
            _check_name("stage", name)
        for name in self.outputs:
            _check_name("output", name)


@dataclass
class TaskResult:
    """What one detector run did. Everything a detector can cause is recorded here, never raised.

    ``exit_code`` is None only when the program could not be started; a signal shows as ``-N`` (bare) or
    ``128 + N`` (through bwrap). ``outputs`` maps each requested name to its bytes, or None when the file is
    missing, is not a regular file (a symlink could point at ground truth) or is too large.
    ``stdout``/``stderr`` keep the last 64 KiB. ``worker`` is ``hostname:pid`` of the harness process.
    ``deadline_reached``: stopped (or never started) because the shared ``Task.deadline`` came first.
    ``peak_memory_bytes``: the largest resident set of the run's processes that were waited for.
    ``collector_lost``: under bwrap, the result collector never handed back one whole answer (it was killed
    from outside the sandbox, say by the kernel; the detector can neither signal it nor write for it): the
    outputs are all None and the exit code is the collector's, not the detector's, so it is no evidence of a
    memory kill. ``node``: the Ray node it ran on ("" off Ray).
    """

    key: str
    exit_code: int | None
    timed_out: bool
    killed_for_memory: bool
    wall_seconds: float
    stdout: str
    stderr: str
    outputs: dict[str, bytes | None]
    isolation: str
    worker: str
    deadline_reached: bool = False
    peak_memory_bytes: int = 0
    collector_lost: bool = False
    node: str = ""

    @property
    def ok(self) -> bool:
        """Exited 0 within its limits; the outputs may still be garbage, which is the caller's to judge."""
        return (
            self.exit_code == 0
            and not self.timed_out
            and not self.killed_for_memory
            and not self.collector_lost
        )
