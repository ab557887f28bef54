"""Run untrusted detector programs, one process per model, each in a sandbox with limits.

A caller builds ``Task``s (command line, staged inputs, paths to hide, limits) and hands them to an
``Executor``; each comes back as a ``TaskResult`` recording exit code, timeouts, memory kills, output tails
and the result files. Nothing here knows about leaderboards or scoring: that is the caller's job.
"""

from assay.runner.dispatch import run_task
from assay.runner.executors import Executor, LocalExecutor, RayExecutor, make_executor
from assay.runner.isolation import isolation_available, levels_available
from assay.runner.task import Limits, Task, TaskResult

__all__ = [
    "Executor",
    "Limits",
    "LocalExecutor",
    "RayExecutor",
    "Task",
    "TaskResult",
    "isolation_available",
    "levels_available",
    "make_executor",
    "run_task",
]
