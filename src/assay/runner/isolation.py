"""Which sandbox this machine offers, and the command line that puts a detector inside it.

Three levels, best first, detected at run time by trying them once:

- ``bwrap``: bubblewrap. Read-only root, tmpfs over hidden paths, only the task's scratch and output folders
  writable, no network, own pid namespace (everything dies with the detector), all capabilities dropped.
  Dropping capabilities matters when the harness runs as root: with them the detector could simply
  ``umount`` the tmpfs that hides the ground truth.
- ``unshare``: ``unshare -n -p -f --kill-child`` cuts the network and gives an own pid namespace (so a child
  that calls ``setsid`` still dies with the detector); paths are not hidden and the file system is writable.
  The detector is pid 1 there, so signals it sends itself without a handler are ignored.
- ``none``: a plain subprocess in its own process group.
"""

from __future__ import annotations

import functools
import glob
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from assay.errors import UserError

LEVELS = ("bwrap", "unshare", "none")
_UNSHARE_FLAGS = ("--net", "--pid", "--fork", "--kill-child")


@dataclass(frozen=True)
class Mounts:
    """The paths a sandbox needs: what to hide, what to expose read-only, where the task may write."""

    hide: list[Path] = field(default_factory=list)
    readonly: list[Path] = field(default_factory=list)
    stage: dict[Path, Path] = field(default_factory=dict)  # mount point inside input/ -> source
    writable: list[Path] = field(default_factory=list)
    network: bool = False
    gpus: bool = False


def _works(argv: list[str]) -> bool:
    """Whether a sandbox command runs ``true`` here: installed is not enough (containers may forbid it)."""
    try:
        done = subprocess.run([*argv, "true"], capture_output=True, timeout=30, check=False)
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0


@functools.cache
def _probe(level: str) -> bool:
    if level == "bwrap":
        bwrap = shutil.which("bwrap")
        flags = ["--unshare-net", "--unshare-pid", "--die-with-parent", "--new-session", "--cap-drop", "ALL"]
        return bwrap is not None and _works(
            [bwrap, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", *flags]
        )
    if level == "unshare":
        unshare = shutil.which("unshare")
        return unshare is not None and _works([unshare, *_UNSHARE_FLAGS, "--"])
    return level == "none"


def isolation_available() -> str:
    """The best isolation level this machine supports: ``bwrap``, ``unshare`` or ``none``."""
    return next(level for level in LEVELS if _probe(level))


def levels_available() -> list[str]:
    """Every level that works here, best first (the benchmark compares them)."""
    return [level for level in LEVELS if _probe(level)]


def choose(level: str | None) -> str:
    """``level`` if it works here, the best available when None; a UserError names what is missing."""
    if level is None:
        return isolation_available()
    if level not in LEVELS:
        raise UserError(f"unknown isolation {level!r}; choose one of {', '.join(LEVELS)}")
    if not _probe(level):
        best = isolation_available()
        raise UserError(f"isolation {level!r} is not available on this machine (best: {best})")
    return level


def _existing(paths: list[Path]) -> list[Path]:
    """Resolved, de-duplicated paths that exist: bwrap refuses to mount over nothing."""
    seen: dict[Path, None] = {}
    for path in paths:
        real = Path(path).resolve()
        if real.exists():
            seen[real] = None
    return list(seen)


def bwrap_argv(mounts: Mounts) -> list[str]:
    """The bubblewrap prefix. Order matters: later mounts sit on top of earlier ones."""
    argv = ["bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
    argv += ["--unshare-pid", "--unshare-ipc", "--unshare-uts", "--die-with-parent", "--new-session"]
    argv += ["--cap-drop", "ALL"]
    if not mounts.network:
        argv.append("--unshare-net")
    if mounts.gpus:
        # --dev gives a minimal /dev; a GPU task needs the NVIDIA device nodes back.
        for node in sorted(glob.glob("/dev/nvidia*")) + sorted(glob.glob("/dev/dri")):
            argv += ["--dev-bind", node, node]
    for path in _existing(mounts.hide):
        argv += ["--tmpfs", str(path)] if path.is_dir() else ["--ro-bind", "/dev/null", str(path)]
    for path in _existing(mounts.readonly):
        argv += ["--ro-bind", str(path), str(path)]
    for inside, source in mounts.stage.items():
        argv += ["--ro-bind", str(Path(source).resolve()), str(inside)]
    for path in mounts.writable:
        argv += ["--bind", str(path), str(path)]
    return [*argv, "--"]


def wrap(level: str, argv: list[str], mounts: Mounts) -> tuple[list[str], str]:
    """The full command line for ``level`` and a one-line description of what it protects."""
    if level == "bwrap":
        parts = ["read-only root"]
        if mounts.hide:
            parts.append("hidden paths")
        parts.append("network allowed" if mounts.network else "no network")
        parts += ["own pid namespace", "no capabilities"]
        return bwrap_argv(mounts) + argv, "bwrap: " + ", ".join(parts)
    if level == "unshare":
        if mounts.network:
            described = "unshare: own pid namespace, network allowed; paths not hidden, file system writable"
            return ["unshare", "--pid", "--fork", "--kill-child", "--", *argv], described
        described = "unshare: no network, own pid namespace; paths not hidden, file system writable"
        return ["unshare", *_UNSHARE_FLAGS, "--", *argv], described
    why = "neither bwrap nor unshare is available" if isolation_available() == "none" else "chosen"
    return argv, f"none: {why}; network not cut off, paths not hidden"
