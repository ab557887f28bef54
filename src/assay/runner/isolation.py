"""Which sandbox this machine offers, and the command line that puts a detector inside it.

Three levels, best first, detected at run time by trying them once:

- ``bwrap``: bubblewrap. An empty root (deny by default) into which only an allow-list is bound read-only:
  the system libraries, this Python and ``assay``, and the task's input folder (copies under neutral
  names, see ``assay.runner.workspace``); the task's scratch, output, ``/dev/shm`` and ``/tmp`` are folders
  of one size-bounded tmpfs of its own (``/dev/shm`` and ``/tmp`` are links into it), so a run's private
  pages are bounded by that one size; it vanishes with the run. No network, own pid namespace (everything
  dies with the detector), all capabilities dropped (as root, capabilities would let it mount the host's
  disk), and, with bubblewrap 0.8 or later, no nested user namespaces (in one of its own a detector would
  hold every capability again: it could mount a tmpfs outside the size bound, or probe the kernel).
- ``unshare``: ``unshare -n -p -f --kill-child`` cuts the network and gives an own pid namespace (so a child
  that calls ``setsid`` still dies with the detector); paths are not hidden and the file system is writable.
  The detector is pid 1 there, so signals it sends itself without a handler are ignored.
- ``none``: a plain subprocess in its own process group.
"""

from __future__ import annotations

import functools
import glob
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from assay.errors import UserError

LEVELS = ("bwrap", "unshare", "none")
_UNSHARE_FLAGS = ("--net", "--pid", "--fork", "--kill-child")


INSIDE = Path("/task")  # the task's own tmpfs inside a bwrap sandbox: input/, scratch/, output/, shm/, tmp/
_DISABLE_USERNS = (0, 8)  # the bubblewrap release that added --disable-userns
_SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
# The dynamic loader's cache and time zone; no passwd, hosts or ssl: nothing a sealed detector needs.
_ETC = ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/localtime", "/etc/alternatives")
_DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom")


@dataclass(frozen=True)
class Mounts:
    """What a bwrap sandbox is built from, on an empty root: nothing else of the host exists inside.

    ``readonly``: host paths shown read-only at the same place (the runtime, extra inputs).
    ``input``: the host folder shown read-only as ``/task/input`` (the task's staged copies).
    ``private_bytes``: the size of the task's own tmpfs (scratch, output, /dev/shm and /tmp together).
    """

    readonly: list[Path] = field(default_factory=list)
    input: Path | None = None
    private_bytes: int = 2**30
    network: bool = False
    gpus: bool = False


def _works(argv: list[str]) -> bool:
    """Whether a sandbox command runs this Python here: installed is not enough (containers may forbid
    it). Python, not ``true``: the runtime is all a slim image is sure to hold (ours has no coreutils)."""
    try:
        done = subprocess.run([*argv, sys.executable, "-c", ""], capture_output=True, timeout=30, check=False)
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0


@functools.cache
def _probe(level: str) -> bool:
    if level == "bwrap":
        # The very sandbox tasks get, so a machine that allows bwrap but not, say, its tmpfs size is caught.
        return shutil.which("bwrap") is not None and _works(bwrap_argv(Mounts()))
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
    """De-duplicated absolute paths that exist, outermost first: bwrap refuses to mount over nothing."""
    seen = {Path(os.path.abspath(path)): None for path in paths if os.path.lexists(path)}
    return sorted(seen, key=lambda path: len(path.parts))


def runtime_paths() -> list[Path]:
    """What a detector needs to run: system libraries and this Python (interpreter, its libraries, assay).

    Only ``bin``, ``lib`` and ``pyvenv.cfg`` of each prefix, never a prefix itself: a virtual environment
    may sit inside a checkout or a home folder that holds other things. ``assay`` goes in by its package
    folder alone, since an editable install points into the project checkout.
    """
    import assay

    prefixes = {Path(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    parts = [prefix / name for prefix in sorted(prefixes) for name in ("bin", "lib", "lib64", "pyvenv.cfg")]
    return _existing([*map(Path, _SYSTEM_DIRS), *map(Path, _ETC), *parts, Path(assay.__file__).parent])


def _show(path: Path) -> list[str]:
    """Bind ``path`` read-only, or recreate it as a link when it is one (``/lib -> usr/lib``)."""
    if path.is_symlink():
        return ["--symlink", os.readlink(path), str(path)]
    return ["--ro-bind", str(path), str(path)]


def _devices(gpus: bool) -> list[str]:
    """A minimal read-only /dev; /dev/shm points into the task's bounded tmpfs."""
    argv = ["--tmpfs", "/dev"]
    for node in _DEVICES:
        argv += ["--dev-bind", node, node]
    for number, name in enumerate(("stdin", "stdout", "stderr")):
        argv += ["--symlink", f"/proc/self/fd/{number}", f"/dev/{name}"]
    argv += ["--symlink", "/proc/self/fd", "/dev/fd", "--symlink", str(INSIDE / "shm"), "/dev/shm"]
    if gpus:
        for node in sorted(glob.glob("/dev/nvidia*")) + sorted(glob.glob("/dev/dri")):
            argv += ["--dev-bind", node, node]
    return argv


@functools.cache
def bwrap_version() -> tuple[int, ...]:
    """The installed bubblewrap's version, e.g. (0, 8, 0); () when it cannot be told."""
    try:
        done = subprocess.run(["bwrap", "--version"], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.SubprocessError):
        return ()
    found = re.search(r"(\d+)\.(\d+)(?:\.(\d+))?", done.stdout)
    return tuple(int(part) for part in found.groups() if part is not None) if found else ()


@functools.cache
def nested_userns_disabled() -> bool:
    """Whether bwrap here can forbid nested user namespaces (0.8+, and a user namespace of its own works)."""
    if bwrap_version() < _DISABLE_USERNS:
        return False
    return _works(["bwrap", "--unshare-user", "--disable-userns", "--ro-bind", "/", "/", "--"])


@functools.cache
def hostname_settable() -> bool:
    """Whether bubblewrap may name the sandbox's host. In a container under podman's default seccomp
    profile it may not (``sethostname`` is allowed only with CAP_SYS_ADMIN, which the container's user
    lacks), though it may do all else the sandbox needs; the sandbox then keeps its own UTS namespace with
    the container's hostname, which names the container, not the machine."""
    return _works(["bwrap", *_namespaces(), "--hostname", "sandbox", "--ro-bind", "/", "/", "--"])


def _namespaces() -> list[str]:
    """Own user (without nested ones where bwrap can), pid, ipc, uts and cgroup namespaces."""
    user = ["--unshare-user", "--disable-userns"] if nested_userns_disabled() else ["--unshare-user-try"]
    return [*user, "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]


def bwrap_argv(mounts: Mounts) -> list[str]:
    """The bubblewrap prefix: an empty, read-only root with only the allow-listed paths bound into it.

    Order matters: later mounts sit on top of earlier ones, and the remounts come last. The task's tmpfs
    and the ``/tmp`` link come before the runtime binds: a runtime path may lie under ``/tmp`` (a checkout
    or virtual environment there), and its mount point then goes on that tmpfs.
    """
    argv = ["bwrap", "--tmpfs", "/", "--proc", "/proc", *_devices(mounts.gpus)]
    argv += ["--size", str(mounts.private_bytes), "--tmpfs", str(INSIDE)]
    argv += [arg for name in ("input", "scratch", "output") for arg in ("--dir", str(INSIDE / name))]
    argv += [arg for name in ("shm", "tmp") for arg in ("--perms", "1777", "--dir", str(INSIDE / name))]
    argv += ["--symlink", str(INSIDE / "tmp"), "/tmp", *_namespaces()]
    argv += ["--die-with-parent", "--new-session", "--cap-drop", "ALL"]
    argv += ["--hostname", "sandbox"] if hostname_settable() else []
    if not mounts.network:
        argv.append("--unshare-net")
    for path in _existing([*runtime_paths(), *mounts.readonly]):
        argv += _show(path)
    if mounts.input is not None:
        argv += ["--ro-bind", str(Path(mounts.input).resolve()), str(INSIDE / "input")]
    argv += ["--remount-ro", "/dev", "--remount-ro", "/"]
    return [*argv, "--"]


def wrap(level: str, argv: list[str], mounts: Mounts) -> tuple[list[str], str]:
    """The full command line for ``level`` and a one-line description of what it protects."""
    if level == "bwrap":
        parts = ["empty read-only root with inputs and runtime only"]
        parts.append(f"{mounts.private_bytes / 2**20:.0f} MiB private scratch")
        parts.append("network allowed" if mounts.network else "no network")
        parts += ["own pid namespace", "no capabilities"]
        if not hostname_settable():
            parts.append("the container's hostname (its seccomp profile forbids naming the sandbox)")
        if nested_userns_disabled():
            parts.append("no nested user namespaces")
        else:
            shown = ".".join(map(str, bwrap_version())) or "unknown"
            parts.append(f"nested user namespaces NOT disabled (bubblewrap {shown}; 0.8 or later can)")
        return bwrap_argv(mounts) + argv, "bwrap: " + ", ".join(parts)
    if level == "unshare":
        if mounts.network:
            described = "unshare: own pid namespace, network allowed; paths not hidden, file system writable"
            return ["unshare", "--pid", "--fork", "--kill-child", "--", *argv], described
        described = "unshare: no network, own pid namespace; paths not hidden, file system writable"
        return ["unshare", *_UNSHARE_FLAGS, "--", *argv], described
    why = "neither bwrap nor unshare is available" if isolation_available() == "none" else "chosen"
    return argv, f"none: {why}; network not cut off, paths not hidden"
