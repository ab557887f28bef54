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


@contextlib.contextmanager
def host_lease(exclusive: bool, path: Path | None = None) -> Iterator[None]:
    """Hold this machine alone (``exclusive``) or shared with other shared holders, for the block; waits
    until granted. An exclusive waiter holds the turnstile, so shared holders arriving after it wait."""
    path = path or lease_path()
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
