"""The per-task folder: ``input/`` with the staged files, empty ``scratch/`` and ``output/``.

Every task gets a fresh folder inside a base folder that the sandbox hides as a whole, so concurrent tasks
cannot see each other's inputs or results. Outputs are read back without following symlinks: a detector
could otherwise leave ``result.txt -> /round/ground_truth.csv`` and have the harness read it.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from assay.errors import UserError

MAX_OUTPUT_BYTES = 16 * 2**20


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
    """Where task folders go when the caller gives none: one folder in the system temp dir."""
    return Path(tempfile.gettempdir()) / "assay-runner"


@contextlib.contextmanager
def workspace(key: str, base: Path | None = None) -> Iterator[Workspace]:
    """A fresh task folder, removed afterwards whatever happened."""
    base = (base or default_base()).resolve()
    base.mkdir(parents=True, exist_ok=True)
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", key)[:60] or "task"
    root = Path(tempfile.mkdtemp(prefix=f"{safe}-", dir=base))
    space = Workspace(base, root)
    try:
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


def copy_in(space: Workspace, stage: dict[str, Path]) -> None:
    """Expose stage entries by hard links or copies (no bind mounts without bwrap)."""
    for name, source in stage.items():
        source, target = Path(source).resolve(), space.input / name
        if source.is_dir():
            shutil.copytree(source, target, copy_function=_link_or_copy, symlinks=True)
        else:
            _link_or_copy(str(source), str(target))


def mount_points(space: Workspace, stage: dict[str, Path]) -> dict[Path, Path]:
    """Empty files and folders for bwrap to bind the stage entries onto; mount point -> source."""
    points = {}
    for name, source in stage.items():
        target = space.input / name
        if Path(source).is_dir():
            target.mkdir()
        else:
            target.touch()
        points[target] = Path(source)
    return points


def read_output(space: Workspace, name: str) -> bytes | None:
    """A regular file's bytes, or None when missing, a symlink, something else, or over the size cap."""
    try:
        fd = os.open(space.output / name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_OUTPUT_BYTES:
            return None
        data = handle.read(MAX_OUTPUT_BYTES + 1)
    return None if len(data) > MAX_OUTPUT_BYTES else data
