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
    the CUDA driver reserves huge address ranges. Neither counts files written to a tmpfs.
    """

    wall_seconds: float = 600
    memory_bytes: int | None = 4 * GiB
    cpus: float = 1.0
    gpus: float = 0.0
    network: bool = False

    def __post_init__(self) -> None:
        if not self.wall_seconds > 0:
            raise ValueError(f"wall_seconds must be positive, not {self.wall_seconds!r}")
        if self.memory_bytes is not None and self.memory_bytes <= 0:
            raise ValueError(f"memory_bytes must be positive or None, not {self.memory_bytes!r}")
        if not self.cpus > 0:
            raise ValueError(f"cpus must be positive, not {self.cpus!r}")
        if self.gpus < 0:
            raise ValueError(f"gpus must not be negative, not {self.gpus!r}")


def _check_name(kind: str, name: str) -> None:
    """Stage and output names are single path components, so nothing can point outside the sandbox folders."""
    if not name or name in (".", "..") or "/" in name or "\0" in name:
        raise ValueError(f"{kind} name must be one plain file name, not {name!r}")


@dataclass(frozen=True)
class Task:
    """One detector run: a command line, the files it may read and the files to read back.

    ``argv`` may contain ``{input}``, ``{output}`` and ``{scratch}``; they become the sandbox's folders.
    ``stage`` maps a name inside ``{input}`` to a file or folder exposed read-only. The whole root file
    system is visible read-only except ``hide`` (ground truth, other splits, the database, ASSAY_HOME);
    ``readonly`` re-exposes paths that would otherwise be hidden, such as a detector folder inside a hidden
    tree. ``outputs`` are file names read back from ``{output}``.
    """

    key: str
    argv: list[str]
    stage: dict[str, Path] = field(default_factory=dict)
    limits: Limits = field(default_factory=Limits)
    env: dict[str, str] = field(default_factory=dict)
    readonly: list[Path] = field(default_factory=list)
    hide: list[Path] = field(default_factory=list)
    outputs: list[str] = field(default_factory=lambda: ["result.txt"])

    def __post_init__(self) -> None:
        if not self.argv:
            raise ValueError(f"task {self.key!r} has an empty argv")
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

    @property
    def ok(self) -> bool:
        """Exited 0 within its limits; the outputs may still be garbage, which is the caller's to judge."""
        return self.exit_code == 0 and not self.timed_out and not self.killed_for_memory
