"""Atomic file writes: a reader never sees a half-written file, and a failure leaves nothing behind."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def atomic_path(target: str | Path) -> Iterator[Path]:
    """Yield a temporary path beside ``target``; on success rename it over ``target``, else delete it.

    Works for files and directories (HF ``datasets`` saves a directory). A failure (a full disk, a
    read-only folder) leaves ``target`` as it was and removes the folders made for it; an existing
    directory is renamed aside before the new one takes its place, never deleted first.
    """
    target = Path(target)
    made = _make_parents(target.parent)
    tmp_dir = None
    try:
        tmp_dir = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
        tmp = tmp_dir / target.name
        yield tmp
        if target.is_dir() and not target.is_symlink():
            aside = tmp_dir / f"{target.name}.old"
            os.replace(target, aside)  # removed with tmp_dir
            try:
                os.replace(tmp, target)
            except OSError:
                os.replace(aside, target)
                raise
        else:
            os.replace(tmp, target)
        made = []
    finally:
        if tmp_dir is not None:
            shutil.rmtree(tmp_dir, ignore_errors=True)
        for folder in reversed(made):
            with contextlib.suppress(OSError):
                folder.rmdir()  # only if still empty


def _make_parents(folder: Path) -> list[Path]:
    """Create ``folder`` and its missing parents; return those created, outermost first."""
    missing = [f for f in (folder, *folder.parents) if not f.exists()][::-1]
    folder.mkdir(parents=True, exist_ok=True)
    return missing


def write_text_atomic(target: str | Path, text: str, mode: int | None = None) -> None:
    """Write ``text`` to ``target`` atomically, optionally with file permissions ``mode``."""
    with atomic_path(target) as tmp:
        tmp.write_text(text, encoding="utf-8")
        if mode is not None:
            tmp.chmod(mode)
