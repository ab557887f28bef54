"""Run one command under limits and make sure nothing it started outlives it.

The command gets its own session (so its process group can be killed as one), an address-space limit and
no core dumps. Its output is read by threads into bounded buffers, so a detector printing gigabytes costs
64 KiB, and a grandchild holding the pipes open cannot block the harness for more than a few seconds.
A grandchild that leaves the group with ``setsid`` escapes the group kill; a pid namespace (bwrap,
unshare) or the task's pids cgroup (``assay.runner.cgroup``, where one can be made) catches it.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import resource
import select
import signal
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO

from assay.runner.seccomp import filled as seccomp_filled

TAIL_BYTES = 64 * 1024
_READ_CHUNK = 16 * 1024
_DRAIN_SECONDS = 5.0  # how long to wait for pipes held open by escaped grandchildren


@dataclass
class Finished:
    """How the command ended, before anyone interprets it."""

    exit_code: int | None
    timed_out: bool
    wall_seconds: float
    stdout: bytes
    stderr: bytes
    start_error: str | None = None
    collected: bytes = b""  # what the sandbox's collector wrote to the side pipe (bwrap: the result files)
    peak_memory_bytes: int = 0  # the largest resident set of the command and the descendants it waited for


class _Tail:
    """Keeps the last ``TAIL_BYTES`` of a stream and counts what it dropped."""

    def __init__(self) -> None:
        self.chunks: deque[bytes] = deque()
        self.kept = 0
        self.dropped = 0
        self.lock = threading.Lock()  # a pump outliving the run (escaped grandchild) may still be adding

    def add(self, data: bytes) -> None:
        with self.lock:
            self.chunks.append(data)
            self.kept += len(data)
            while self.kept - len(self.chunks[0]) >= TAIL_BYTES:
                old = self.chunks.popleft()
                self.kept -= len(old)
                self.dropped += len(old)

    def value(self) -> bytes:
        with self.lock:
            data, dropped = b"".join(self.chunks), self.dropped
        cut = max(0, len(data) - TAIL_BYTES)
        if cut or dropped:
            return b"[first %d bytes cut]\n" % (dropped + cut) + data[cut:]
        return data


def _pump(stream: IO[bytes], tail: _Tail | _Cap) -> None:
    """Read until end of file, then close: the pump owns its pipe, so a blocked read never races a close."""
    fd = stream.fileno()
    try:
        while chunk := os.read(fd, _READ_CHUNK):
            tail.add(chunk)
    except OSError:
        pass
    finally:
        stream.close()


_PR_SET_PDEATHSIG = 1  # linux/prctl.h
try:
    _LIBC: ctypes.CDLL | None = ctypes.CDLL(None, use_errno=True)
except OSError:  # no C library to ask (not Linux): the process group kill still applies
    _LIBC = None


def _limiter(
    memory_bytes: int | None, data_only: bool = False, join: Callable[[], None] | None = None
) -> Callable[[], None]:
    """A preexec function that only calls setrlimit (and joins a cgroup): little work between fork and exec.

    RLIMIT_AS caps every mapping, shared ones included. ``data_only`` caps only private writable memory
    (RLIMIT_DATA): the CUDA driver reserves far more address space than any RLIMIT_AS worth setting.
    """
    setrlimit, core = resource.setrlimit, resource.RLIMIT_CORE
    kind = resource.RLIMIT_DATA if data_only else resource.RLIMIT_AS
    prctl = _LIBC.prctl if _LIBC is not None else None

    def limit() -> None:
        if prctl is not None:  # die with the harness: a killed worker leaves no detector running
            prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if join is not None:
            join()
        setrlimit(core, (0, 0))
        if memory_bytes is not None:
            setrlimit(kind, (memory_bytes, memory_bytes))

    return limit


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def _wait_exit(proc: subprocess.Popen[bytes], seconds: float) -> bool:
    """Wait until ``proc`` exits without reaping it, so its pid (the group id) cannot be reused yet.

    Returns False on timeout. Uses a pidfd where the kernel has one; else polls ``waitid(WNOWAIT)``.
    """
    deadline = time.monotonic() + seconds
    try:
        fd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):
        fd = None
    if fd is not None:
        try:
            ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
            return bool(ready)
        finally:
            os.close(fd)
    while True:
        if os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.01)


def _side_pipe(collect_bytes: int) -> tuple[int, int, _Cap] | None:
    """A pipe whose write end the command inherits, read into a capped buffer; None when not asked for."""
    if collect_bytes <= 0:
        return None
    read_end, write_end = os.pipe()
    return read_end, write_end, _Cap(collect_bytes)


class _Cap:
    """Keeps the first ``limit`` bytes of a stream (a result, unlike a log, is wanted from its start)."""

    def __init__(self, limit: int) -> None:
        self.limit, self.data, self.overflow = limit, bytearray(), False

    def add(self, chunk: bytes) -> None:
        room = self.limit - len(self.data)
        self.data += chunk[:room]
        self.overflow = self.overflow or len(chunk) > room


def _wait_rusage(proc: subprocess.Popen[bytes]) -> tuple[int, int]:
    """Reap ``proc`` with wait4: its exit code as Popen reports it, and its peak resident set in bytes."""
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, usage.ru_maxrss * 1024  # Linux reports KiB


def run_limited(
    argv: list[str],
    env: dict[str, str],
    cwd: str,
    wall_seconds: float,
    memory_bytes: int | None,
    data_only: bool = False,
    collect_bytes: int = 0,
    join: Callable[[], None] | None = None,
    on_timeout: Callable[[], None] | None = None,
) -> Finished:
    """Run ``argv`` to completion or ``wall_seconds``, then kill its whole process group either way.

    ``data_only`` picks RLIMIT_DATA over RLIMIT_AS for the memory limit (see ``_limiter``). With
    ``collect_bytes`` the command inherits the write end of a side pipe and finds its number in the
    ``{collect_fd}`` argument; up to that many bytes of it come back in ``Finished.collected``. ``join``
    runs in the child before exec (a cgroup to enter). ``on_timeout`` runs when the time is up, after the
    group kill and before the pipes are drained: what else must die (a container that holds the pipes).
    """
    side = _side_pipe(collect_bytes)
    if side is not None:
        argv = [arg.replace("{collect_fd}", str(side[1])) for arg in argv]
    with seccomp_filled(argv) as (argv, program):
        return _run(argv, env, cwd, wall_seconds, (memory_bytes, data_only, join), side, program, on_timeout)


def _run(
    argv: list[str],
    env: dict[str, str],
    cwd: str,
    wall_seconds: float,
    limiter: tuple[int | None, bool, Callable[[], None] | None],
    side: tuple[int, int, _Cap] | None,
    program: tuple[int, ...],
    on_timeout: Callable[[], None] | None,
) -> Finished:
    """``run_limited`` once its command line is complete: start, pump, wait, kill the group, reap."""
    start = time.monotonic()
    try:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            cwd=cwd,
            start_new_session=True,
            pass_fds=((side[1],) if side else ()) + program,
            preexec_fn=_limiter(*limiter),
        )
    except OSError as err:  # missing program, or the limit is too small to even exec
        if side is not None:
            os.close(side[0]), os.close(side[1])
        return Finished(None, False, time.monotonic() - start, b"", b"", start_error=f"cannot start: {err}")
    tails = (_Tail(), _Tail())
    streams: list[tuple[IO[bytes], _Tail | _Cap]] = list(zip((proc.stdout, proc.stderr), tails, strict=True))
    if side is not None:
        os.close(side[1])  # the command holds its own copy; the pump sees end of file when it is gone
        streams.append((os.fdopen(side[0], "rb", buffering=0), side[2]))
    pumps = [threading.Thread(target=_pump, args=stream, daemon=True) for stream in streams]
    for pump in pumps:
        pump.start()
    try:
        exited = _wait_exit(proc, wall_seconds)
    except BaseException:  # Ctrl-C or a cancelled worker: the detector must not run on unattended
        _kill_group(proc.pid)
        _wait_rusage(proc)
        raise
    wall = time.monotonic() - start
    # The leader is exited-but-unreaped (or still running): its pid still names the group, so this kills
    # exactly the children it left behind, or everything on timeout.
    _kill_group(proc.pid)
    if not exited and on_timeout is not None:
        on_timeout()
    exit_code, peak = _wait_rusage(proc)
    drained = time.monotonic() + _DRAIN_SECONDS
    for pump in pumps:  # a pump still blocked (pipe kept by an escaped process) stays behind as a daemon
        pump.join(max(0.0, drained - time.monotonic()))
    collected = bytes(side[2].data) if side is not None and not side[2].overflow else b""
    return Finished(exit_code, not exited, wall, tails[0].value(), tails[1].value(), None, collected, peak)
