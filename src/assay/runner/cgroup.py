"""A pids cgroup per task: bounds how many processes and threads a detector may have; kills them all after.

RLIMIT_NPROC cannot do this job: it counts every process of the user on the whole machine, and the kernel
never applies it to root, which a harness in a container often is. A cgroup counts only the task's own
processes, whatever user they run as, and lists them, so the harness can kill a ``setsid``-escaped orphan even
at isolation levels without a pid namespace. Where no writable pids controller exists (cgroup v1 ``pids`` or
a cgroup v2 tree with ``pids`` enabled), ``task_cgroup`` yields None and the caller says so in its record.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

from assay.retry import retry

_V1 = Path("/sys/fs/cgroup/pids")
_V2 = Path("/sys/fs/cgroup")
_PARENT = "assay-runner"


def _pids_root() -> Path | None:
    """The hierarchy with a pids controller: cgroup v1's own, or v2's when its root delegates ``pids``."""
    if (_V1 / "cgroup.procs").exists():
        return _V1
    with contextlib.suppress(OSError):
        if "pids" in (_V2 / "cgroup.subtree_control").read_text().split():
            return _V2
    return None


def _writable_parent() -> Path | None:
    """The folder to make task cgroups in, or None when this machine (or user) offers none."""
    root = _pids_root()
    if root is None:
        return None
    parent = root / _PARENT
    try:
        parent.mkdir(exist_ok=True)
        if root is _V2:
            (parent / "cgroup.subtree_control").write_text("+pids")
    except OSError:
        return None
    return parent if os.access(parent, os.W_OK) else None


def _members(group: Path) -> list[int]:
    try:
        return [int(pid) for pid in (group / "cgroup.procs").read_text().split()]
    except OSError:
        return []


def kill_all(group: Path, seconds: float = 5.0) -> None:
    """SIGKILL every process in ``group`` until it is empty (a fork in flight may add one more)."""
    deadline = time.monotonic() + seconds
    while (pids := _members(group)) and time.monotonic() < deadline:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.01)


def joiner(group: Path) -> Callable[[], None]:
    """A function for the child to run before exec: enter ``group`` (writing 0 moves the writer itself)."""
    procs = str(group / "cgroup.procs")

    def join() -> None:
        fd = os.open(procs, os.O_WRONLY)
        try:
            os.write(fd, b"0")
        finally:
            os.close(fd)

    return join


@contextlib.contextmanager
def task_cgroup(max_processes: int) -> Iterator[Path | None]:
    """A fresh pids cgroup capped at ``max_processes``; everything in it is killed and it is removed after."""
    parent = _writable_parent()
    if parent is None:
        yield None
        return
    group = parent / uuid.uuid4().hex
    try:
        group.mkdir()
        (group / "pids.max").write_text(str(max_processes))
    except OSError:
        with contextlib.suppress(OSError):
            group.rmdir()
        yield None
        return
    try:
        yield group
    finally:
        kill_all(group)
        # rmdir fails while the last killed process is still being torn down
        retry(group.rmdir, on=OSError, attempts=100, wait=0.01, default=None)
