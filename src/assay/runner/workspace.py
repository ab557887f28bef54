"""The per-task folder: ``input/`` with the staged files, empty ``scratch/`` and ``output/``.

Every task gets a fresh folder with a random name inside a base folder (nothing of the task's key, which
names the model). Its ``input/`` holds copies of the staged entries, which is what the detector is shown
(bound read-only at ``/task/input`` under bwrap): a copy has a new inode and one fixed modification time,
and its path is the run's own, so neither ``/proc/self/mountinfo``, the command line nor ``stat`` tells
which model or host file it came from. Under bwrap, scratch and output live on the sandbox's own tmpfs;
at the weaker levels they are the folder's. Each folder names its owner, so the next worker on the host
removes what a killed one left behind. Outputs are read back without following any link below the task
folder: a detector could otherwise leave ``result.txt -> /round/ground_truth.csv``, or replace ``output``
itself by a link, and have the harness read it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import stat
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from assay.errors import UserError
from assay.runner.collect import read_regular

OWNER_FILE = ".owner"  # "host pid start-time" of the harness process using the folder
NEUTRAL_MTIME_NS = 946_684_800 * 10**9  # 2000-01-01 UTC: the time every copied input shows


@dataclass(frozen=True)
class Workspace:
    """The folders of one task, as absolute paths (the same inside and outside the sandbox)."""

    base: Path
    root: Path

    @property
    def input(self) -> Path:
        return self.root / "input"

    @property
    def scratch(self) -> Path:
        return self.root / "scratch"

    @property
    def output(self) -> Path:
        return self.root / "output"


def default_base() -> Path:
    """Where task folders go when the caller gives none: ``assay-runner`` in the system temp dir, or
    ``assay-runner-UID`` when that one is not this user's alone (``private_temp_folder``)."""
    return private_temp_folder("assay-runner", "task folders")


def private_temp_folder(name: str, purpose: str) -> Path:
    """``name`` in the system temp dir, or ``name-UID`` when that one is not this user's alone. Whoever
    makes the shared name first owns everything made in it later (issue 47: another user's process, or an
    unisolated practice run), so a folder of another owner, a link, or one others may write to is never
    used; with both names taken so, one line says which and why, naming ``purpose``."""
    temp = Path(tempfile.gettempdir())
    problems = []
    for candidate in (temp / name, temp / f"{name}-{os.geteuid()}"):
        problem = private_folder_problem(candidate)
        if problem is None:
            return candidate
        problems.append(f"{candidate} {problem}")
    raise UserError(f"no private folder for {purpose}: {'; '.join(problems)}; remove one or pass a folder")


def private_folder_problem(path: Path) -> str | None:
    """Make ``path`` (mode 0700) if it is missing; why it cannot hold this user's task folders (None: it
    can): not a folder (a link too: never followed), another owner, or writable by group or others. The
    sticky temp dir lets nobody else replace a folder of ours between the check and its use."""
    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=0o700)
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode):
        return "is not a folder" + (" (a symbolic link)" if stat.S_ISLNK(info.st_mode) else "")
    if info.st_uid != os.geteuid():
        return f"belongs to uid {info.st_uid}, not to this user (uid {os.geteuid()})"
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"may be written by other users (mode {stat.S_IMODE(info.st_mode):04o})"
    return None


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (field 22 of /proc/PID/stat), None if gone."""
    try:
        stat_line = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat_line.rsplit(")", 1)[1].split()[19]


def _pid_namespace() -> str:
    """This process's pid namespace (``pid:[INODE]``): pids mean something only inside it."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return "?"


def owner_line() -> str:
    """This process as ``owner_is_dead`` reads it: host, pid, start time and pid namespace."""
    pid = os.getpid()
    return f"{socket.gethostname()} {pid} {_start_time(pid)} {_pid_namespace()}"


def owner_is_dead(owner: str) -> bool:
    """Whether the owner line names a process of this host that is gone (a reused pid has another start).

    A harness in another pid namespace with the same host name and temp dir (containers sharing ``/tmp``,
    Ray nodes on one machine) is never judged: its pids mean other processes here. Owner lines of three
    fields (before the namespace was recorded) are judged as before.
    """
    parts = owner.split()
    if len(parts) not in (3, 4) or parts[0] != socket.gethostname() or not parts[1].isdigit():
        return False
    if len(parts) == 4 and parts[3] != _pid_namespace():
        return False
    return _start_time(int(parts[1])) != parts[2]


def sweep_stale(base: Path) -> list[Path]:
    """Remove task folders left by dead harness processes of this host (a worker killed mid-task)."""
    removed = []
    for root in base.iterdir() if base.is_dir() else ():
        try:
            owner = (root / OWNER_FILE).read_text()
        except OSError:
            continue
        if owner_is_dead(owner):
            shutil.rmtree(root, ignore_errors=True)
            removed.append(root)
    return removed


@contextlib.contextmanager
def workspace(base: Path | None = None) -> Iterator[Workspace]:
    """A fresh task folder with a random name, removed afterwards whatever happened; stale ones of dead
    workers go first."""
    base = (base or default_base()).resolve()
    base.mkdir(parents=True, exist_ok=True)
    sweep_stale(base)
    root = Path(tempfile.mkdtemp(prefix="task-", dir=base))
    space = Workspace(base, root)
    try:
        (root / OWNER_FILE).write_text(owner_line())
        for folder in (space.input, space.scratch, space.output):
            folder.mkdir()
        yield space
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _link_or_copy(source: str, target: str) -> None:
    """Hard-link when on the same file system (free), else copy."""
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


def check_sources(stage: dict[str, Path]) -> None:
    """A missing stage source is the caller's mistake, not the detector's: say so before running anything."""
    for name, source in stage.items():
        if not Path(source).exists():
            raise UserError(f"stage entry {name!r}: {source} does not exist")


def _copy_fresh(source: Path, target: Path) -> None:
    """Copy a file or tree with its permissions but new inodes and ``NEUTRAL_MTIME_NS`` everywhere; links
    are followed (a link could name a host path), dangling ones left out."""
    if source.is_dir():
        shutil.copytree(source, target, copy_function=shutil.copy, ignore_dangling_symlinks=True)
        paths = [Path(top) / name for top, dirs, files in os.walk(target) for name in dirs + files]
    else:
        shutil.copy(source, target)
        paths = []
    for path in [*paths, target]:
        info = os.lstat(path)
        if stat.S_ISDIR(info.st_mode):  # a read-only folder could not be emptied by a non-root harness
            os.chmod(path, info.st_mode | stat.S_IWUSR)
        os.utime(path, ns=(NEUTRAL_MTIME_NS, NEUTRAL_MTIME_NS), follow_symlinks=False)


def stage_in(space: Workspace, stage: dict[str, Path], shared: frozenset[str] = frozenset()) -> None:
    """Put the stage entries into ``space.input``: fresh copies (``_copy_fresh``), or hard links for the
    ``shared`` entries, which are the same for every task and so name none of them."""
    for name, source in stage.items():
        source, target = Path(source).resolve(), space.input / name
        if name not in shared:
            _copy_fresh(source, target)
        elif source.is_dir():
            shutil.copytree(source, target, copy_function=_link_or_copy, symlinks=True)
        else:
            _link_or_copy(str(source), str(target))


def read_output(space: Workspace, name: str) -> bytes | None:
    """A regular file's bytes, or None when missing, reached through a link, something else, or over the
    size cap (``output`` itself is opened without following a link too)."""
    return read_regular(space.root, "output", name)
