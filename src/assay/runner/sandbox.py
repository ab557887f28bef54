"""Run one untrusted detector: fresh folders, the best sandbox available, limits, and a record of the outcome.

``run_task`` is the only entry point executors need. It raises only for the caller's mistakes (a missing
stage source, an isolation level this machine lacks); whatever the detector does (non-zero exit, timeout,
crash, memory blow-up, garbage or missing output) ends up in the ``TaskResult``.
"""

from __future__ import annotations

import math
import os
import socket
from pathlib import Path

from assay.runner.isolation import Mounts, choose, isolation_available, wrap
from assay.runner.process import Finished, run_limited
from assay.runner.task import Limits, Task, TaskResult
from assay.runner.workspace import Workspace, check_sources, copy_in, mount_points, read_output, workspace

__all__ = ["Limits", "Task", "TaskResult", "isolation_available", "run_task"]

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


def _fill(text: str, space: Workspace) -> str:
    """Replace the placeholders; plain ``str.replace`` so other braces (JSON arguments) survive."""
    for name, path in (("input", space.input), ("output", space.output), ("scratch", space.scratch)):
        text = text.replace("{" + name + "}", str(path))
    return text


def _environment(task: Task, space: Workspace) -> dict[str, str]:
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
    env.update({name: _fill(value, space) for name, value in task.env.items()})
    return env


def _memory_killed(limits: Limits, finished: Finished) -> bool:
    """Best effort: a failed run under a memory limit that died by SIGKILL or printed an allocation error."""
    if limits.memory_bytes is None or finished.timed_out or finished.exit_code in (0, None):
        return False
    if finished.exit_code in _SIGKILL_CODES:
        return True
    stderr = finished.stderr.lower()
    return any(marker in stderr for marker in _MEMORY_MARKERS)


def _prepare(level: str, task: Task, space: Workspace) -> Mounts:
    """Stage the inputs the way ``level`` can expose them and list the mounts bwrap needs."""
    if level != "bwrap":
        copy_in(space, task.stage)
        return Mounts(network=task.limits.network)
    return Mounts(
        hide=[*task.hide, space.base],  # the base: other tasks' folders
        readonly=[*task.readonly, space.input],
        stage=mount_points(space, task.stage),
        writable=[space.scratch, space.output],
        network=task.limits.network,
        gpus=task.limits.gpus > 0,
    )


def run_task(task: Task, workdir: Path | None = None, isolation: str | None = None) -> TaskResult:
    """Run ``task`` in a fresh folder under ``workdir`` (default: the temp dir) and remove the folder after.

    ``isolation`` forces a level (``bwrap``, ``unshare``, ``none``); None picks the best available.
    """
    level = choose(isolation)
    check_sources(task.stage)
    worker = f"{socket.gethostname()}:{os.getpid()}"
    with workspace(task.key, workdir) as space:
        mounts = _prepare(level, task, space)
        argv, described = wrap(level, [_fill(arg, space) for arg in task.argv], mounts)
        limits = task.limits
        env = _environment(task, space)
        # GPU tasks get RLIMIT_DATA: CUDA's address-space reservations would trip RLIMIT_AS at start-up.
        finished = run_limited(
            argv, env, str(space.scratch), limits.wall_seconds, limits.memory_bytes, data_only=limits.gpus > 0
        )
        outputs = {name: read_output(space, name) for name in task.outputs}
    stderr = finished.stderr.decode("utf-8", errors="replace")
    if finished.start_error:
        stderr += finished.start_error
    return TaskResult(
        key=task.key,
        exit_code=finished.exit_code,
        timed_out=finished.timed_out,
        killed_for_memory=_memory_killed(task.limits, finished),
        wall_seconds=finished.wall_seconds,
        stdout=finished.stdout.decode("utf-8", errors="replace"),
        stderr=stderr,
        outputs=outputs,
        isolation=described,
        worker=worker,
    )
