"""``run_task``: the one entry point executors call, for every kind of task.

A task with an ``image`` runs in its container (``container.py``), any other as a folder detector in the
best sandbox here (``sandbox.py``). It lives apart from both so that imports point one way only:
``dispatch -> container -> sandbox``, never back.
"""

from __future__ import annotations

from pathlib import Path

from assay.runner.container import run_container
from assay.runner.sandbox import run_folder
from assay.runner.task import Task, TaskResult


def run_task(task: Task, workdir: Path | None = None, isolation: str | None = None) -> TaskResult:
    """Run ``task`` and record what happened: in its container image when it has one (``isolation`` is then
    ignored), else in a fresh sandbox at ``isolation`` (None: the best available; see ``run_folder``)."""
    if task.image is not None:
        return run_container(task, workdir)
    return run_folder(task, workdir, isolation)
