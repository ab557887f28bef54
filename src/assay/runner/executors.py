"""Executors: run many tasks, in parallel, and hand back results in task order.

Each task is its own subprocess, so a thread pool is enough on one machine; Ray spreads them over a cluster
and reserves the CPUs, GPUs and memory each task's limits ask for.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

from assay.errors import UserError
from assay.runner.dispatch import run_task
from assay.runner.task import Task, TaskResult

OnResult = Callable[[TaskResult], None]


class Executor(Protocol):
    """Runs tasks; ``on_result`` is called in the calling thread as each one finishes."""

    def map(self, tasks: Sequence[Task], on_result: OnResult | None = None) -> list[TaskResult]: ...


def _in_order(tasks: Sequence[Task], done: dict[int, TaskResult]) -> list[TaskResult]:
    return [done[index] for index in range(len(tasks))]


class LocalExecutor:
    """``workers`` tasks at a time on this machine, with threads waiting on the detector processes."""

    def __init__(self, workers: int = 1, workdir: Path | None = None, isolation: str | None = None) -> None:
        if workers < 1:
            raise UserError(f"workers must be at least 1, not {workers}")
        self.workers, self.workdir, self.isolation = workers, workdir, isolation

    def map(self, tasks: Sequence[Task], on_result: OnResult | None = None) -> list[TaskResult]:
        done: dict[int, TaskResult] = {}
        with concurrent.futures.ThreadPoolExecutor(self.workers, thread_name_prefix="assay-runner") as pool:
            futures = {
                pool.submit(run_task, task, self.workdir, self.isolation): index
                for index, task in enumerate(tasks)
            }
            try:
                for future in concurrent.futures.as_completed(futures):
                    done[futures[future]] = result = future.result()
                    if on_result is not None:
                        on_result(result)
            except BaseException:
                for future in futures:
                    future.cancel()  # the caller's error (bad stage, bad callback): stop queued tasks
                raise
        return _in_order(tasks, done)


def _import_ray() -> Any:
    try:
        import ray
    except ImportError as err:
        raise UserError("the ray executor needs ray: pip install 'ray[default]'") from err
    return ray


class RayExecutor:
    """Tasks as Ray tasks that reserve ``cpus``, ``gpus`` and ``memory`` from each task's limits.

    Connects on first use: to ``address`` (``auto`` or ``ray://host:10001``) or, when None, to a running
    local cluster or a new one. Stage sources, detector folders and the Python installation must be at the
    same paths on every node (a shared file system); ``init_kwargs`` go to ``ray.init``.
    """

    def __init__(
        self,
        address: str | None = None,
        workdir: Path | None = None,
        isolation: str | None = None,
        init_kwargs: dict[str, Any] | None = None,
    ) -> None:
        self.ray = _import_ray()
        self.address, self.workdir, self.isolation = address, workdir, isolation
        self.init_kwargs = init_kwargs or {}
        self._remote: Any = None

    def _connect(self) -> Any:
        if not self.ray.is_initialized():
            self.ray.init(address=self.address, **self.init_kwargs)
        if self._remote is None:
            self._remote = self.ray.remote(run_task)
        return self._remote

    def _submit(self, remote: Any, task: Task) -> Any:
        options: dict[str, Any] = {"num_cpus": task.limits.cpus, "num_gpus": task.limits.gpus}
        if task.limits.memory_bytes is not None:
            options["memory"] = task.limits.memory_bytes
        # run_task never fails for what a detector does, so a retry would only repeat a harness error.
        return remote.options(max_retries=0, **options).remote(task, self.workdir, self.isolation)

    def map(self, tasks: Sequence[Task], on_result: OnResult | None = None) -> list[TaskResult]:
        remote = self._connect()
        refs = [self._submit(remote, task) for task in tasks]
        index = {ref: position for position, ref in enumerate(refs)}
        done: dict[int, TaskResult] = {}
        pending = list(refs)
        try:
            while pending:
                ready, pending = self.ray.wait(pending, num_returns=1)
                for ref in ready:
                    done[index[ref]] = result = self.ray.get(ref)
                    if on_result is not None:
                        on_result(result)
        except BaseException:
            for ref in pending:
                self.ray.cancel(ref, force=True)
            raise
        return _in_order(tasks, done)


def make_executor(name: str, workers: int = 1, address: str | None = None) -> Executor:
    """The executor the CLI's ``--executor`` names: ``local`` (``workers`` at a time) or ``ray``."""
    if name == "local":
        if address is not None:
            raise UserError("--address is for the ray executor; the local executor runs on this machine")
        return LocalExecutor(workers)
    if name == "ray":
        return RayExecutor(address)
    raise UserError(f"unknown executor {name!r}; choose local or ray")
