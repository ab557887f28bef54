"""A node's cache of unpacked blobs: bounded in size, and nothing in use is ever removed.

Why: a cluster node runs round after round; each new model, detector and image it is sent lands in this
cache (``transfer.py``) and, left alone, stays there until the disk is full. Entries are folders named by
their blob's hash; a task holds a shared lock on each entry it uses (``hold``) from before it looks the
entry up until it has finished, and ``trim`` removes the entries used longest ago, under an exclusive lock
taken without waiting, until the cache is within its bound. An entry some task holds is skipped, so a
cache whose entries are all in use may stay over its bound until they are released.

The locks are ``flock`` locks on one small file per entry (``.locks/HASH``), which work between the
processes of a node (Ray runs each task in a worker process of its own). ``trim`` unlinks an entry's lock
file while it holds it exclusively, so ``hold`` checks after locking that its file is still the one at that
path, and starts again when it is not.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from assay.errors import UserError

CACHE_ENV = "ASSAY_NODE_CACHE"  # a node's own cache folder; default: the node's temp dir
LIMIT_ENV = "ASSAY_NODE_CACHE_BYTES"  # its bound, in bytes
DEFAULT_LIMIT = 20 * 2**30
STALE_SECONDS = 3600  # a ``.part-``/``.trash-`` folder this old was left by a killed process
_ENTRY_NAME = re.compile(r"[0-9a-f]{64}")


def node_cache() -> Path:
    """This node's cache of unpacked blobs: ``ASSAY_NODE_CACHE``, else a folder in the node's temp dir."""
    return Path(os.environ.get(CACHE_ENV) or Path(tempfile.gettempdir()) / "assay-node-cache")


def cache_limit() -> int:
    """The cache's bound in bytes: ``ASSAY_NODE_CACHE_BYTES`` (default 20 GiB)."""
    text = os.environ.get(LIMIT_ENV, "").strip()
    if not text:
        return DEFAULT_LIMIT
    try:
        limit = int(text)
    except ValueError:
        limit = -1
    if limit < 0:
        raise UserError(f"{LIMIT_ENV} must be a whole number of bytes, 0 or more (value: {text!r})")
    return limit


def cached(expected: str, cache: Path) -> Path | None:
    """The unpacked entry of a blob already in ``cache`` (checked when it was unpacked), else None."""
    folder = cache / expected
    entries = list(folder.iterdir()) if folder.is_dir() else []
    return entries[0] if len(entries) == 1 else None


def _lock_path(cache: Path, expected: str) -> Path:
    return cache / ".locks" / expected


def _lock(path: Path, mode: int) -> int | None:
    """An open descriptor of ``path`` locked with ``mode``; None when a non-blocking lock is refused.
    Retries while the file it locked was unlinked or replaced meanwhile (``trim`` removed the entry)."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, mode)
        except BlockingIOError:
            os.close(fd)
            return None
        try:
            same = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            return fd
        os.close(fd)


@contextlib.contextmanager
def hold(cache: Path, expected: str) -> Iterator[None]:
    """Keep ``trim`` from removing the entry ``expected`` (present or not yet) while the block runs; its
    last use is now (the folder's mtime), which is what ``trim`` orders by."""
    _lock_path(cache, expected).parent.mkdir(parents=True, exist_ok=True)
    fd = _lock(_lock_path(cache, expected), fcntl.LOCK_SH)
    assert fd is not None  # a blocking lock is never refused
    try:
        with contextlib.suppress(FileNotFoundError):
            os.utime(cache / expected)
        yield
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.utime(cache / expected)
        os.close(fd)


def _size(folder: Path) -> int:
    """Bytes of the files below ``folder`` (blocks on disk are close enough for a bound)."""
    total = 0
    for top, _, files in os.walk(folder):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(top, name)).st_size
    return total


def _remove(folder: Path) -> None:
    """Rename out of the way first (one step; a lookup never sees half an entry), then delete."""
    trash = folder.with_name(f".trash-{folder.name}-{os.getpid()}-{time.monotonic_ns()}")
    os.rename(folder, trash)
    shutil.rmtree(trash, ignore_errors=True)


def _sweep(cache: Path) -> None:
    """Partial unpacks and trash of processes killed long ago."""
    cutoff = time.time() - STALE_SECONDS
    for path in cache.iterdir():
        if path.name.startswith((".part-", ".trash-")):
            with contextlib.suppress(OSError):
                if path.stat().st_mtime < cutoff:
                    shutil.rmtree(path, ignore_errors=True)


def _last_used(folder: Path) -> int:
    try:
        return folder.stat().st_mtime_ns
    except FileNotFoundError:  # another task's trim removed it just now
        return 0


def trim(cache: Path, limit: int | None = None) -> list[str]:
    """Remove the entries used longest ago until ``cache`` holds at most ``limit`` bytes (default
    ``cache_limit()``), skipping any entry a task holds; the hashes removed, oldest first."""
    limit = cache_limit() if limit is None else limit
    if not cache.is_dir():
        return []
    _sweep(cache)
    entries = [path for path in cache.iterdir() if _ENTRY_NAME.fullmatch(path.name) and path.is_dir()]
    sizes = {path.name: _size(path) for path in entries}
    total = sum(sizes.values())
    removed: list[str] = []
    for path in sorted(entries, key=_last_used):
        if total <= limit:
            break
        lock = _lock_path(cache, path.name)
        if not lock.exists():
            lock.parent.mkdir(parents=True, exist_ok=True)
        fd = _lock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if fd is None:
            continue  # in use by a task of this node
        try:
            if path.is_dir():
                _remove(path)
                total -= sizes[path.name]
                removed.append(path.name)
            lock.unlink()  # while held: a waiting ``hold`` sees a new file and locks that one
        finally:
            os.close(fd)
    return removed
