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
per-node custom resource (``HOST_RESOURCE``, ``executors.RayExecutor``), which Ray's scheduler enforces;
each task also takes its node's own lease there (``executors._run_leased``), for the quiet below.

Quiet after a sealed run. A practice run that waited for the host started when the sealed run let go, so
its start (its job's claim time, its detector's clock) told the sealed job's end to the second. So an
exclusive holder may leave the host quiet (``Lease.quiet_until``, written into the lease file as it lets
go): no shared holder starts before that moment (a shared waiter sleeps until it, holding nothing, so
exclusive holders may still follow each other), and ``quiet_until`` lets a worker hold back its claims of
shared work too. The leaderboard's worker sets it to the sealed job's publication tick
(``leaderboard.hostquiet``), so a waiting practice run starts at that tick, which its team learns anyway.
"""

from __future__ import annotations

import contextlib
import fcntl
import math
import os
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

LEASE_ENV = "ASSAY_HOST_LEASE"
HOST_RESOURCE = "assay_host"  # on Ray: each node offers 1; an exclusive task takes all of it
SHARED_SHARE = 0.001  # ... and any other task this much, so a node runs many of them at once
_QUIET_BYTES = 32  # the lease file's content: the quiet-until time, fixed width so one write replaces it


@dataclass
class Lease:
    """A hold on the host. An exclusive holder may set ``quiet_until`` (epoch seconds): once it lets go,
    no shared holder starts before then (a later exclusive holder may)."""

    exclusive: bool
    quiet_until: float = 0.0


def lease_path() -> Path:
    """The file every worker on this machine leases the host through."""
    configured = os.environ.get(LEASE_ENV)
    return Path(configured) if configured else Path(tempfile.gettempdir()) / "assay-host.lease"


def next_tick(every_s: float, at: float) -> float:
    """The first multiple of ``every_s`` seconds since the epoch at or after ``at`` (0 when no period):
    the quiet an exclusive run ending at ``at`` leaves behind (``Task.quiet_every_s``)."""
    return math.ceil(at / every_s) * every_s if every_s > 0 else 0.0


def quiet_until(path: Path | None = None) -> float:
    """Until when (epoch seconds) this host takes no shared run, as the last exclusive holder left it; 0
    when never set. Read without a lock (one small ``pread`` of a fixed-width write), so a worker can ask
    before claiming shared work without waiting for a sealed run to end."""
    try:
        fd = os.open(path or lease_path(), os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return 0.0
    try:
        return _read_quiet(fd)
    finally:
        os.close(fd)


def _read_quiet(fd: int) -> float:
    try:
        return float(os.pread(fd, _QUIET_BYTES, 0).strip() or 0)
    except ValueError:  # not ours (an older lease file): no quiet recorded
        return 0.0


def _write_quiet(fd: int, until: float) -> None:
    """Record ``until`` unless a later time is recorded already; called holding the lease alone."""
    if until > _read_quiet(fd):
        os.pwrite(fd, f"{until:.6f}".ljust(_QUIET_BYTES).encode(), 0)


def _open(path: Path) -> int:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
    with contextlib.suppress(OSError):  # another user's file: theirs to open to all
        os.fchmod(fd, 0o666)
    return fd


_THREAD = threading.local()  # the leases this thread holds now (``held``: path -> Lease)


def _held() -> dict[Path, Lease]:
    if not hasattr(_THREAD, "held"):
        _THREAD.held = {}
    return _THREAD.held


@contextlib.contextmanager
def host_lease(exclusive: bool, path: Path | None = None) -> Iterator[Lease]:
    """Hold this machine alone (``exclusive``) or shared with other shared holders, for the block; waits
    until granted. An exclusive waiter holds the turnstile, so shared holders arriving after it wait; a
    shared one also waits out the quiet the last exclusive holder left (``Lease.quiet_until``).

    Nested in a lease this thread holds already (a worker holds the host for a whole sealed job, and the
    executor asks again for each chunk of it), it takes nothing more and yields the outer lease: a shared
    lease inside an exclusive one, or the same kind again. Asking for the host alone inside a shared lease
    is a bug (it would wait for itself), refused at once."""
    path = path or lease_path()
    held = _held().get(path)
    if held is not None:
        if exclusive and not held.exclusive:
            raise RuntimeError("an exclusive host lease asked for inside a shared one")
        yield held
        return
    lease = Lease(exclusive)
    with _locked(path, lease):
        _held()[path] = lease
        try:
            yield lease
        finally:
            del _held()[path]


@contextlib.contextmanager
def _locked(path: Path, lease: Lease) -> Iterator[None]:
    """The two ``flock``s: the turnstile, then the lease itself; an exclusive holder records its quiet
    before it lets go, a shared one starts only once the recorded quiet is over."""
    turnstile, fd = _open(path.with_name(path.name + ".turnstile")), _open(path)
    try:
        if lease.exclusive:
            fcntl.flock(turnstile, fcntl.LOCK_EX)
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                yield
            finally:
                _write_quiet(fd, lease.quiet_until)
        else:
            _shared(turnstile, fd)
            yield
    finally:
        os.close(fd)
        os.close(turnstile)


def _shared(turnstile: int, fd: int) -> None:
    """Take the lease shared once no exclusive holder waits or holds it and its quiet is over. While quiet
    it sleeps holding nothing, so a sealed run may take the host meanwhile (and leave a later quiet)."""
    while True:
        fcntl.flock(turnstile, fcntl.LOCK_EX)
        fcntl.flock(turnstile, fcntl.LOCK_UN)  # through the turnstile: no exclusive holder is waiting
        fcntl.flock(fd, fcntl.LOCK_SH)
        wait = _read_quiet(fd) - time.time()
        if wait <= 0:
            return
        fcntl.flock(fd, fcntl.LOCK_UN)
        time.sleep(wait)


def ray_resources(exclusive: bool) -> dict[str, float]:
    """The custom resource a Ray task asks for: the whole node's share when exclusive, a sliver else."""
    return {HOST_RESOURCE: 1.0 if exclusive else SHARED_SHARE}
