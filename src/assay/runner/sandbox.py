"""Run one untrusted folder detector: fresh folders, the best sandbox available, limits, and a record of the
outcome; and the helpers every way of running a task shares (``container.py`` imports them from here).

``run_folder`` raises only for the caller's mistakes (a missing stage source, an isolation level this
machine lacks, a sealed task where bwrap is missing); whatever the detector does (non-zero exit, timeout,
crash, memory blow-up, garbage or missing output) ends up in the ``TaskResult``. Under bwrap the
detector's output folder lives on its own tmpfs; ``collect.py`` hands the result files back through a side
pipe once the detector is done. Executors call ``assay.runner.dispatch.run_task``, which sends image tasks
to ``container.py`` instead.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import math
import os
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from assay.errors import UserError
from assay.runner.cgroup import joiner, task_cgroup
from assay.runner.collect import MAX_OUTPUT_BYTES, unframe
from assay.runner.gpu import Passthrough, passthrough
from assay.runner.isolation import (
    GPU_LIBS,
    INSIDE,
    Mounts,
    choose,
    isolation_available,
    isolation_problem,
    wrap,
)
from assay.runner.process import Finished, run_limited
from assay.runner.task import Limits, Task, TaskResult
from assay.runner.workspace import Workspace, check_sources, read_output, stage_in, workspace

COLLECTOR = str(Path(__file__).with_name("collect.py"))

__all__ = ["Limits", "Task", "TaskResult", "isolation_available", "run_folder"]

_DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"
# What an allocation failure prints (Python, C, C++, the dynamic loader, OpenBLAS, CUDA), compared lower-case.
_MEMORY_MARKERS = (
    b"memoryerror",
    b"cannot allocate memory",
    b"bad_alloc",
    b"out of memory",
    b"unable to allocate",
    b"failed to map segment",
    b"memory allocation",
)
_SIGKILL_CODES = (-9, 128 + 9)  # bare subprocess, and bwrap reporting its child's SIGKILL
_NEAR_LIMIT = 0.9  # a peak resident set this close to the memory limit is evidence of a memory kill


@dataclass(frozen=True)
class Folders:
    """Where the task's folders are as the detector sees them: the host paths, or ``/task/...`` in bwrap."""

    input: Path
    scratch: Path
    output: Path


INSIDE_FOLDERS = Folders(INSIDE / "input", INSIDE / "scratch", INSIDE / "output")


def fill(text: str, space: Folders) -> str:
    """Replace the placeholders; plain ``str.replace`` so other braces (JSON arguments) survive."""
    for name, path in (("input", space.input), ("output", space.output), ("scratch", space.scratch)):
        text = text.replace("{" + name + "}", str(path))
    return text


def environment(task: Task, space: Folders, gpus: Passthrough | None = None) -> dict[str, str]:
    """A small environment built from scratch: the harness's own may hold credentials and ASSAY_HOME.

    HOME and TMPDIR point at scratch so caches land somewhere writable that is removed afterwards. A CPU
    task gets ``CUDA_VISIBLE_DEVICES=""``; a GPU task given only its own nodes (``gpus``) numbers them from
    0, and one that sees the host's /dev (``unshare``, ``none``) gets Ray's ``CUDA_VISIBLE_DEVICES``.
    """
    threads = str(max(1, math.ceil(task.limits.cpus)))
    env = {
        "PATH": os.environ.get("PATH", _DEFAULT_PATH),
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "HOME": str(space.scratch),
        "TMPDIR": str(space.scratch),
        "USER": "detector",  # so getpass and friends need no /etc/passwd
        "LOGNAME": "detector",
        "PYTHONUNBUFFERED": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
        "OMP_NUM_THREADS": threads,
        "MKL_NUM_THREADS": threads,
        "OPENBLAS_NUM_THREADS": threads,
    }
    if task.limits.gpus > 0:
        if gpus is not None:
            env["CUDA_VISIBLE_DEVICES"] = gpus.visible
        elif "CUDA_VISIBLE_DEVICES" in os.environ:  # set by Ray to the GPUs it reserved
            env["CUDA_VISIBLE_DEVICES"] = os.environ["CUDA_VISIBLE_DEVICES"]
    else:
        env["CUDA_VISIBLE_DEVICES"] = ""
    env.update({name: fill(value, space) for name, value in task.env.items()})
    return env


def memory_killed(limits: Limits, finished: Finished, collector_lost: bool = False) -> bool:
    """Best effort: a failed run under a memory limit that died by SIGKILL or printed an allocation error.

    When the collector was lost, the exit status is its own (say a SIGKILL from outside the sandbox), not the
    detector's, so it says nothing about memory: only an allocation error or a peak near the limit counts.
    """
    if limits.memory_bytes is None or finished.timed_out or finished.exit_code in (0, None):
        return False
    stderr = finished.stderr.lower()
    if any(marker in stderr for marker in _MEMORY_MARKERS):
        return True
    if collector_lost:
        return finished.peak_memory_bytes >= _NEAR_LIMIT * limits.memory_bytes
    return finished.exit_code in _SIGKILL_CODES


def not_started(task: Task, worker: str) -> TaskResult:
    """The record of a task whose job ran out of time before its turn came."""
    return TaskResult(
        key=task.key,
        exit_code=None,
        timed_out=True,
        killed_for_memory=False,
        wall_seconds=0.0,
        stdout="",
        stderr="not started: the job's total time limit had passed",
        outputs=dict.fromkeys(task.outputs),
        isolation="not started",
        worker=worker,
        deadline_reached=True,
    )


def collected(
    raw: bytes, exit_code: int | None, names: list[str]
) -> tuple[int, dict[str, bytes | None]] | None:
    """The detector's exit status and result files from the collector's side pipe; None when the collector
    was lost: the sandbox (whose exit status is the collector's) did not exit 0, or the stream is not exactly
    one frame (``collect.unframe``). A detector cannot write a frame of its own (see ``collect.py``); should
    it find a way, a second frame or a killed collector still spoils the whole answer, never forges it."""
    message = unframe(raw) if exit_code == 0 else None
    if message is None:
        return None
    status, files = message
    try:
        return status, {
            name: None if files.get(name) is None else base64.b64decode(files[name]) for name in names
        }
    except (ValueError, binascii.Error):
        return None


def gpu_passthrough(task: Task) -> Passthrough | None:
    """The NVIDIA nodes and driver libraries a sealed task gets (None for a CPU task): the GPUs Ray
    reserved for it (``CUDA_VISIBLE_DEVICES``), else the first ones; a ``UserError`` (the platform's fault)
    when this machine has too few."""
    return passthrough(task.limits.gpus, os.environ.get("CUDA_VISIBLE_DEVICES"))


def _bwrap_command(task: Task, space: Workspace, gpus: Passthrough | None) -> tuple[list[str], str]:
    """The sealed command line: bwrap around the collector around the detector."""
    mounts = Mounts(
        readonly=list(task.readonly),
        input=space.input,
        private_bytes=task.limits.scratch_bytes,
        memory_bytes=task.limits.memory_bytes,
        network=task.limits.network,
        gpus=gpus,
    )
    collector = [sys.executable, "-I", "-S", COLLECTOR, "{collect_fd}", str(INSIDE_FOLDERS.output)]
    inner = [*collector, *task.outputs, "--", *(fill(arg, INSIDE_FOLDERS) for arg in task.argv)]
    return wrap("bwrap", inner, mounts)


def _refuse_unsealed(level: str, task: Task) -> None:
    """Refuse a sealed task below bwrap, in one line with bubblewrap's own error. It names no task: the key
    is the model's name, and the line reaches the job log a team reads."""
    if task.require_isolation and level != "bwrap":
        why = isolation_problem("bwrap") or "bwrap works here, but the caller asked for less"
        raise UserError(
            f"this job needs bwrap isolation and this machine offers {level!r} ({why}): install bubblewrap, "
            "or have the organiser allow unisolated runs for the round (logged on every job)"
        )


def _run(task: Task, level: str, space: Workspace, wall: float, join: Callable[[], None] | None) -> tuple:
    """Start the task at ``level``; its Finished record, its outputs, the isolation it had, and whether the
    collector was lost (bwrap only)."""
    if level == "bwrap":
        return _run_sealed(task, space, wall, join)
    return _run_below(task, level, space, wall, join)


def _run_sealed(task: Task, space: Workspace, wall: float, join: Callable[[], None] | None) -> tuple:
    """bwrap: the outputs and the detector's exit status come from the collector's one frame; without it
    (and not timed out) the collector was lost, and the exit status is the sandbox's own."""
    limits = task.limits
    gpus = gpu_passthrough(task)
    argv, described = _bwrap_command(task, space, gpus)
    env = environment(task, INSIDE_FOLDERS, gpus)
    if gpus is not None and gpus.libraries:  # the folder the driver's libraries are bound to
        env["LD_LIBRARY_PATH"] = ":".join(filter(None, (env.get("LD_LIBRARY_PATH"), str(GPU_LIBS))))
    cap = len(task.outputs) * (MAX_OUTPUT_BYTES * 4 // 3 + 512) + 512
    data_only = limits.gpus > 0  # RLIMIT_DATA: CUDA's address-space reservations would trip RLIMIT_AS
    finished = run_limited(argv, env, "/", wall, limits.memory_bytes, data_only, cap, join)
    answer = None if finished.timed_out else collected(finished.collected, finished.exit_code, task.outputs)
    if answer is None:
        lost = not finished.timed_out and finished.exit_code is not None
        return finished, dict.fromkeys(task.outputs), described, lost
    return dataclasses.replace(finished, exit_code=answer[0]), answer[1], described, False


def _run_below(
    task: Task, level: str, space: Workspace, wall: float, join: Callable[[], None] | None
) -> tuple:
    """``unshare`` or ``none``: the run's own host folders; what else it may write is the level's
    (``isolation.host_view``: nothing, but for ``none`` run by a user other than root)."""
    limits = task.limits
    folders = Folders(space.input, space.scratch, space.output)
    mounts = Mounts(
        network=limits.network, writable=[space.scratch, space.output], private_bytes=limits.scratch_bytes
    )
    argv, described = wrap(level, [fill(arg, folders) for arg in task.argv], mounts)
    env = environment(task, folders)
    finished = run_limited(
        argv, env, str(space.scratch), wall, limits.memory_bytes, limits.gpus > 0, join=join
    )
    return finished, {name: read_output(space, name) for name in task.outputs}, described, False


def run_folder(task: Task, workdir: Path | None = None, isolation: str | None = None) -> TaskResult:
    """Run the folder detector ``task`` in a fresh sandbox (bwrap: on an empty root; else a folder under
    ``workdir``, default the temp dir, removed after) and record what happened.

    ``isolation`` forces a level (``bwrap``, ``unshare``, ``none``); None picks the best available.
    """
    level = choose(isolation)
    _refuse_unsealed(level, task)
    check_sources(task.stage)
    worker = f"{socket.gethostname()}:{os.getpid()}"
    wall = time_left(task)
    if wall <= 0:
        return not_started(task, worker)
    with workspace(workdir) as space, task_cgroup(task.limits.max_processes) as group:
        stage_in(space, task.stage, task.shared_stage)
        wall = min(wall, time_left(task))  # copying takes time off the job's deadline, not past it
        if wall <= 0:
            return not_started(task, worker)
        finished, outputs, described, lost = _run(task, level, space, wall, joiner(group) if group else None)
    if group is None:
        described += "; process count not bounded (no pids cgroup)"
    else:
        described += f"; at most {task.limits.max_processes} processes"
    return task_result(task, finished, outputs, described, worker, wall, collector_lost=lost)


def time_left(task: Task) -> float:
    """Seconds the task may run now: its own limit, cut to the job's shared deadline (<= 0: do not start)."""
    if task.deadline is None:
        return task.limits.wall_seconds
    return min(task.limits.wall_seconds, task.deadline - time.time())


def task_result(
    task: Task,
    finished: Finished,
    outputs: dict[str, bytes | None],
    described: str,
    worker: str,
    wall: float,
    peak_memory_bytes: int | None = None,
    collector_lost: bool = False,
) -> TaskResult:
    """The record of a finished run, for every way of running a task (``peak_memory_bytes`` None: the
    peak measured by ``run_limited``)."""
    stderr = finished.stderr.decode("utf-8", errors="replace") + (finished.start_error or "")
    return TaskResult(
        key=task.key,
        exit_code=finished.exit_code,
        timed_out=finished.timed_out,
        killed_for_memory=memory_killed(task.limits, finished, collector_lost),
        wall_seconds=finished.wall_seconds,
        stdout=finished.stdout.decode("utf-8", errors="replace"),
        stderr=stderr,
        outputs=outputs,
        isolation=described,
        worker=worker,
        deadline_reached=finished.timed_out and wall < task.limits.wall_seconds,
        peak_memory_bytes=finished.peak_memory_bytes if peak_memory_bytes is None else peak_memory_bytes,
        collector_lost=collector_lost,
    )
