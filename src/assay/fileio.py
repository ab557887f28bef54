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

    Works for files and directories (HF ``datasets`` saves a directory).
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp_dir = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    tmp = tmp_dir / target.name
    try:
        yield tmp
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        os.replace(tmp, target)
    finally:
        shutil.rmtree(tmp_dir, ignore_errors=True)


def write_text_atomic(target: str | Path, text: str, mode: int | None = None) -> None:
    """Write ``text`` to ``target`` atomically, optionally with file permissions ``mode``."""
    with atomic_path(target) as tmp:
        tmp.write_text(text, encoding="utf-8")
        if mode is not None:
            tmp.chmod(mode)
