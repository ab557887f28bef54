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
import json
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
from assay.runner.collect import MAX_OUTPUT_BYTES
from assay.runner.isolation import INSIDE, Mounts, choose, isolation_available, wrap
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


def environment(task: Task, space: Folders) -> dict[str, str]:
    """A small environment built from scratch: the harness's own may hold credentials and ASSAY_HOME.

    HOME and TMPDIR point at scratch so caches land somewhere writable that is removed afterwards.
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
        if "CUDA_VISIBLE_DEVICES" in os.environ:  # set by Ray to the GPUs it reserved
            env["CUDA_VISIBLE_DEVICES"] = os.environ["CUDA_VISIBLE_DEVICES"]
    else:
        env["CUDA_VISIBLE_DEVICES"] = ""
    env.update({name: fill(value, space) for name, value in task.env.items()})
    return env


def memory_killed(limits: Limits, finished: Finished, collector_lost: bool = False) -> bool:
    """Best effort: a failed run under a memory limit that died by SIGKILL or printed an allocation error.

    When the collector was lost, its exit status (often a SIGKILL the detector sent it) says nothing about
    memory: only an allocation error or a peak near the limit counts then.
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


def _collected(raw: bytes, names: list[str]) -> dict[str, bytes | None] | None:
    """The collector's JSON of base64 files; None when none came or it is malformed (the collector was
    killed, or a detector meddled with it)."""
    try:
        found = json.loads(raw)
        return {name: None if found.get(name) is None else base64.b64decode(found[name]) for name in names}
    except (ValueError, TypeError, AttributeError, binascii.Error):
        return None


def _bwrap_command(task: Task, space: Workspace) -> tuple[list[str], str]:
    """The sealed command line: bwrap around the collector around the detector."""
    mounts = Mounts(
        readonly=list(task.readonly),
        input=space.input,
        private_bytes=task.limits.scratch_bytes,
        network=task.limits.network,
        gpus=task.limits.gpus > 0,
    )
    collector = [sys.executable, "-I", "-S", COLLECTOR, "{collect_fd}", str(INSIDE_FOLDERS.output)]
    inner = [*collector, *task.outputs, "--", *(fill(arg, INSIDE_FOLDERS) for arg in task.argv)]
    return wrap("bwrap", inner, mounts)


def _refuse_unsealed(level: str, task: Task) -> None:
    if task.require_isolation and level != "bwrap":
        raise UserError(
            f"task {task.key!r} needs bwrap isolation and this machine offers {level!r}: install bubblewrap, "
            "or have the organiser allow unisolated runs for the round (logged on every job)"
        )


def _run(task: Task, level: str, space: Workspace, wall: float, join: Callable[[], None] | None) -> tuple:
    """Start the task at ``level``; its Finished record, its outputs (None: the collector was lost) and the
    isolation it had."""
    limits = task.limits
    data_only = limits.gpus > 0  # RLIMIT_DATA: CUDA's address-space reservations would trip RLIMIT_AS
    if level == "bwrap":
        argv, described = _bwrap_command(task, space)
        env = environment(task, INSIDE_FOLDERS)
        cap = len(task.outputs) * (MAX_OUTPUT_BYTES * 4 // 3 + 512) + 64
        finished = run_limited(argv, env, "/", wall, limits.memory_bytes, data_only, cap, join)
        outputs = _collected(finished.collected, task.outputs)
        lost = outputs is None and not finished.timed_out and finished.exit_code is not None
        return finished, outputs or dict.fromkeys(task.outputs), described, lost
    folders = Folders(space.input, space.scratch, space.output)
    argv, described = wrap(level, [fill(arg, folders) for arg in task.argv], Mounts(network=limits.network))
    env = environment(task, folders)
    finished = run_limited(argv, env, str(space.scratch), wall, limits.memory_bytes, data_only, join=join)
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
