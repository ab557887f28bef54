"""Exclusive hosts: while a sealed run holds this machine, no other job's run shares it.

Two runs on one machine share its kernel and hardware: free memory, the page cache, CPU contention, disk
space. ``procview`` and the seccomp filter hide the counters, but contention itself cannot be masked, and
a practice run's stderr reaches its team (issue 44: 16 of 16 hash slots decoded from a concurrent test job
through sysinfo). So a task marked ``exclusive`` (a sealed job's, ``Task.exclusive``) runs only while its
executor holds the host alone.

On one machine the lease is a reader-writer ``flock`` on a file every worker of the machine opens
(``ASSAY_HOST_LEASE``, else ``assay-host.lease`` in the temporary folder; workers run by different users
must be given one shared path): exclusive holders take it alone, other runs share it. A turnstile beside
it gives a waiting exclusive holder precedence, so a stream of overlapping practice runs cannot starve a
sealed job. The kernel drops both locks when a holder dies, SIGKILL included. On Ray the same rule is a
per-node custom resource (``HOST_RESOURCE``, ``executors.RayExecutor``), which Ray's scheduler enforces.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

LEASE_ENV = "ASSAY_HOST_LEASE"
HOST_RESOURCE = "assay_host"  # on Ray: each node offers 1; an exclusive task takes all of it
SHARED_SHARE = 0.001  # ... and any other task this much, so a node runs many of them at once


def lease_path() -> Path:
    """The file every worker on this machine leases the host through."""
    configured = os.environ.get(LEASE_ENV)
    return Path(configured) if configured else Path(tempfile.gettempdir()) / "assay-host.lease"


def _open(path: Path) -> int:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
    with contextlib.suppress(OSError):  # another user's file: theirs to open to all
        os.fchmod(fd, 0o666)
    return fd


_THREAD = threading.local()  # the leases this thread holds now (``held``: path -> exclusive)


def _held() -> dict[Path, bool]:
    if not hasattr(_THREAD, "held"):
        _THREAD.held = {}
    return _THREAD.held


@contextlib.contextmanager
def host_lease(exclusive: bool, path: Path | None = None) -> Iterator[None]:
    """Hold this machine alone (``exclusive``) or shared with other shared holders, for the block; waits
    until granted. An exclusive waiter holds the turnstile, so shared holders arriving after it wait.

    Nested in a lease this thread holds already (a worker holds the host for a whole sealed job, and the
    executor asks again for each chunk of it), it takes nothing more: a shared lease inside an exclusive
    one, or the same kind again. Asking for the host alone inside a shared lease is a bug (it would wait
    for itself), refused at once."""
    path = path or lease_path()
    held = _held().get(path)
    if held is not None:
        if exclusive and not held:
            raise RuntimeError("an exclusive host lease asked for inside a shared one")
        yield
        return
    with _locked(path, exclusive):
        _held()[path] = exclusive
        try:
            yield
        finally:
            del _held()[path]


@contextlib.contextmanager
def _locked(path: Path, exclusive: bool) -> Iterator[None]:
    """The two ``flock``s: the turnstile, then the lease itself."""
    turnstile, lease = _open(path.with_name(path.name + ".turnstile")), _open(path)
    try:
        fcntl.flock(turnstile, fcntl.LOCK_EX)
        if exclusive:
            fcntl.flock(lease, fcntl.LOCK_EX)
        else:
            fcntl.flock(turnstile, fcntl.LOCK_UN)  # through the turnstile: no exclusive holder is waiting
            fcntl.flock(lease, fcntl.LOCK_SH)
        yield
    finally:
        os.close(lease)
        os.close(turnstile)


def ray_resources(exclusive: bool) -> dict[str, float]:
    """The custom resource a Ray task asks for: the whole node's share when exclusive, a sliver else."""
    return {HOST_RESOURCE: 1.0 if exclusive else SHARED_SHARE}
