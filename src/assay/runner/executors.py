"""Executors: run many tasks, in parallel, and hand back results in task order.

Each task is its own subprocess, so a thread pool is enough on one machine; Ray spreads them over a cluster
of nodes that share no file system (inputs and results travel by content hash, ``transfer.py``) and
reserves the CPUs, GPUs and memory each task's limits ask for.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import socket
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol

from assay.errors import UserError
from assay.runner.dispatch import run_task
from assay.runner.hostlease import HOST_RESOURCE, Lease, host_lease, next_tick, quiet_until, ray_resources
from assay.runner.nodecache import cached, node_cache, trim
from assay.runner.task import Task, TaskResult
from assay.runner.transfer import Shipment, landed, ship_all

OnResult = Callable[[TaskResult], None]


class Executor(Protocol):
    """Runs tasks; ``on_result`` is called in the calling thread as each one finishes."""

    def map(self, tasks: Sequence[Task], on_result: OnResult | None = None) -> list[TaskResult]: ...


def _quiet_after(tasks: Sequence[Task]) -> float:
    """Until when a host that just ran ``tasks`` takes no shared task: their clock's next tick from now."""
    return max(next_tick(task.quiet_every_s, time.time()) for task in tasks)


def _in_order(tasks: Sequence[Task], done: dict[int, TaskResult]) -> list[TaskResult]:
    return [done[index] for index in range(len(tasks))]


class LocalExecutor:
    """``workers`` tasks at a time on this machine, with threads waiting on the detector processes."""

    def __init__(self, workers: int = 1, workdir: Path | None = None, isolation: str | None = None) -> None:
        if workers < 1:
            raise UserError(f"workers must be at least 1, not {workers}")
        self.workers, self.workdir, self.isolation = workers, workdir, isolation

    def map(self, tasks: Sequence[Task], on_result: OnResult | None = None) -> list[TaskResult]:
        """Run ``tasks`` holding this machine's lease (``hostlease``): alone when any is ``exclusive``, and
        then leaving it quiet until their clock's next tick (``Task.quiet_every_s``)."""
        exclusive = any(task.exclusive for task in tasks)
        with self.holding(exclusive) as lease:
            try:
                return self._map(tasks, on_result)
            finally:
                if exclusive:
                    lease.quiet_until = max(lease.quiet_until, _quiet_after(tasks))

    def holding(self, exclusive: bool) -> contextlib.AbstractContextManager[Lease]:
        """Hold this machine (alone, when ``exclusive``) across several ``map`` calls: a sealed job's
        chunks, so no other job's run slips in between them and times them. An exclusive holder may set
        the lease's ``quiet_until``: no shared run starts here before it."""
        return host_lease(exclusive)

    def quiet_until(self) -> float:
        """Until when (epoch seconds) this machine takes no shared run: the quiet its last sealed holder
        left (``hostlease``), so a worker claims no practice job it would only make wait."""
        return quiet_until()

    def _map(self, tasks: Sequence[Task], on_result: OnResult | None) -> list[TaskResult]:
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


def _run_shipped(
    shipment: Shipment, refs: dict[str, Any], workdir: Path | None, isolation: str | None
) -> TaskResult:
    """On a Ray node: the shipment's blobs into this node's cache (fetched from the object store only when
    missing there, each checked against its hash), then the task on those local copies, in the same sandbox
    as anywhere else. The result carries its files' bytes and this node's id. When the task added to the
    node's cache, the cache is then trimmed to its bound (``ASSAY_NODE_CACHE_BYTES``), sparing what other
    tasks of the node hold; a task that found everything there leaves it as it is (no walk of the cache)."""
    import ray

    cache = node_cache()
    grows = any(cached(expected, cache) is None for expected in refs)
    # A blob comes back as a numpy array over the object store's shared memory: read in place, not copied.
    with landed(shipment, lambda expected: ray.get(refs[expected]), cache) as task:
        result = _run_leased(task, workdir, isolation)
    if grows:
        trim(cache)
    result.node = ray.get_runtime_context().get_node_id()
    return result


def _run_leased(task: Task, workdir: Path | None, isolation: str | None) -> TaskResult:
    """On a Ray node: ``task`` under the node's own host lease. Ray's resource already keeps a sealed task
    alone on its node; the lease keeps the node quiet after it (``Task.quiet_every_s``), so a practice task
    of any worker that lands there starts at the tick, not when the sealed one ended (``hostlease``)."""
    with host_lease(task.exclusive) as lease:
        try:
            return run_task(task, workdir, isolation)
        finally:
            if task.exclusive:
                lease.quiet_until = max(lease.quiet_until, _quiet_after([task]))


def _put_file(ray: Any, file: Path) -> Any:
    """A blob file into Ray's object store as a uint8 array mapped from disk, so this process never holds
    it in memory; the file is deleted once the store has its copy."""
    import numpy as np

    try:
        return ray.put(np.memmap(file, dtype=np.uint8, mode="r").view(np.ndarray))
    finally:
        file.unlink()


HEAD_TIMEOUT_S = 5.0  # how long the head may take to answer before it counts as unreachable


def _check_head(ray: Any, address: str, timeout: float = HEAD_TIMEOUT_S) -> None:
    """A ``UserError`` naming what to fix when the head at ``HOST:PORT`` cannot be reached, does not answer
    as a Ray head, or refuses this process's token. ``ray.init`` retried these for 20 s (a token) to
    minutes (no head) and ended in a traceback; a TCP connect and one GCS call answer in seconds."""
    _check_port(address, timeout)
    standalone = getattr(getattr(ray._raylet, "InnerGcsClient", None), "standalone", None)
    if standalone is None:  # another Ray: leave it to ray.init
        return
    try:
        with _native_stderr_muted():
            standalone(address, None, round(timeout * 1000))
    except ray.exceptions.AuthenticationError:
        raise UserError(
            f"the Ray head at {address} refused this process: set RAY_AUTH_MODE=token and RAY_AUTH_TOKEN "
            "(or RAY_AUTH_TOKEN_PATH) to the cluster's token (docs/deploy.md)"
        ) from None
    except ray.exceptions.RpcError as err:
        raise UserError(f"{address} does not answer as a Ray head ({err}); check --address") from None


def _check_port(address: str, timeout: float) -> None:
    """Whether anything listens at ``HOST:PORT``: a refused or silent port is a one-line ``UserError``."""
    host, _, port = address.rpartition(":")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except (OSError, ValueError) as err:
        reason = getattr(err, "strerror", None) or str(err) or type(err).__name__
        raise UserError(
            f"cannot reach the Ray head at {address} ({reason}): start it with 'ray start --head "
            "--port=PORT' or fix --address (docs/deploy.md)"
        ) from None


@contextlib.contextmanager
def _native_stderr_muted() -> Iterator[None]:
    """Ray's C++ client logs every failed try on file descriptor 2; the one line raised says it all."""
    saved = os.dup(2)
    try:
        with open(os.devnull, "wb") as null:
            os.dup2(null.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _host_share(exclusive: bool, offered: bool, nodes: bool = True) -> dict[str, float]:
    """The per-node custom resource a Ray task takes (``hostlease.ray_resources``); on a cluster whose
    nodes do not offer it (``offered``) shared tasks run as before and an exclusive one is refused. A
    cluster with no node to run tasks yet (``nodes`` False: a head with no CPUs, its nodes still starting)
    says nothing either way: an exclusive task asks for the resource and waits for a node that offers it,
    as the documented nodes do."""
    if offered:
        return ray_resources(exclusive)
    if exclusive and not nodes:
        return ray_resources(exclusive)
    if exclusive:
        raise UserError(
            f"this Ray cluster offers no {HOST_RESOURCE!r} resource, so a sealed run cannot hold a node "
            f"alone: start every node with --resources='{{\"{HOST_RESOURCE}\": 1}}'"
        )
    return {}


class RayExecutor:
    """Tasks as Ray tasks that reserve ``cpus``, ``gpus`` and ``memory`` from each task's limits, on nodes
    that share no file system with the submitter.

    Connects on first use: to ``address`` (``auto``, ``HOST:PORT`` or ``ray://host:10001``) or, when None,
    to a running local cluster or a new one; ``init_kwargs`` go to ``ray.init``. Inputs travel by content
    (``assay.runner.transfer``): each distinct staged file or folder is packed once (again only when its
    files changed, or after a ``map`` that did not use it), put into Ray's object store once per hash, and
    unpacked on each node into its own cache; results come back as values. Only the runtime (this Python
    with ``assay``, bubblewrap) must be installed alike on every node.

    A task whose node dies (a killed raylet, a lost machine) is run again elsewhere, up to ``max_retries``
    times; an error of the caller's (``UserError``, a blob that fails its hash) is never retried. Each task
    is reported once, by its position, however often it ran.
    """

    def __init__(
        self,
        address: str | None = None,
        workdir: Path | None = None,
        isolation: str | None = None,
        init_kwargs: dict[str, Any] | None = None,
        max_retries: int = 3,
    ) -> None:
        self.ray = _import_ray()
        self.address, self.workdir, self.isolation = address, workdir, isolation
        # Ray forwards its workers' log lines to this process's stdout, which is the command's own
        # (``--json``); a task's output is in its result anyway. (A lost node's error line Ray prints there
        # all the same.)
        self.init_kwargs = {"log_to_driver": False, **(init_kwargs or {})}
        self.max_retries = max_retries
        self._remotes: dict[Callable[..., Any], Any] = {}
        self._packed: dict[tuple[Path, tuple], str] = {}  # (source, signature) -> hash, of the last map
        self._refs: dict[str, Any] = {}  # hash -> object in the store, of the last map

    def connect(self) -> None:
        """Join the cluster now (``ray.init``) unless already joined. A head that is not there or that
        refuses this process's token is one line, within seconds (``_check_head``), not Ray's minute of
        retries ending in a traceback; ``make_executor`` calls this, so a worker fails before taking work."""
        if self.ray.is_initialized():
            return
        if self.address not in (None, "auto") and not self.address.startswith("ray://"):
            _check_head(self.ray, self.address)
        self.ray.init(address=self.address, **self.init_kwargs)

    def _remote(self, function: Callable[..., Any]) -> Any:
        self.connect()
        if function not in self._remotes:
            self._remotes[function] = self.ray.remote(function)
        return self._remotes[function]

    def _options(self, cpus: float, gpus: float = 0.0, memory: int | None = None) -> dict[str, Any]:
        options: dict[str, Any] = {"num_cpus": cpus, "num_gpus": gpus, "max_retries": self.max_retries}
        options["retry_exceptions"] = False  # system failures only: a lost node, a killed worker process
        if memory is not None:
            options["memory"] = memory
        return options

    def _value(self, ref: Any) -> Any:
        """The task's value; a ``UserError`` raised on the node is raised here as itself (one line for
        the CLI), not wrapped in Ray's multi-line ``RayTaskError``."""
        try:
            return self.ray.get(ref)
        except self.ray.exceptions.RayTaskError as err:
            if isinstance(err.cause, UserError):
                raise err.cause from None
            raise

    def _gather(self, refs: list[Any], on_result: Callable[[Any], None] | None) -> list[Any]:
        """Values of ``refs`` in order; ``on_result`` once per position as each arrives."""
        index = {ref: position for position, ref in enumerate(refs)}
        done: dict[int, Any] = {}
        pending = list(refs)
        try:
            while pending:
                ready, pending = self.ray.wait(pending, num_returns=1)
                for ref in ready:
                    if index[ref] in done:
                        continue
                    done[index[ref]] = value = self._value(ref)
                    if on_result is not None:
                        on_result(value)
        except BaseException:
            for ref in pending:
                self.ray.cancel(ref, force=True)
            raise
        return [done[position] for position in range(len(refs))]

    def map(self, tasks: Sequence[Task], on_result: OnResult | None = None) -> list[TaskResult]:
        remote = self._remote(_run_shipped)
        packed = dict(self._packed)  # updated only once this call has put its blobs
        with tempfile.TemporaryDirectory(prefix="assay-blobs-") as spool:
            # only sources new or changed are packed, each into a file of its own
            shipments, blobs = ship_all(list(tasks), Path(spool), packed)
            refs: dict[str, Any] = {}
            for shipment in shipments:
                for h in [*shipment.stage.values(), shipment.image]:
                    if h is not None and h not in refs:
                        refs[h] = self._refs[h] if h in self._refs else _put_file(self.ray, blobs[h])
        calls = []
        cluster = self.ray.cluster_resources()
        offered, nodes = bool(cluster.get(HOST_RESOURCE)), bool(cluster.get("CPU"))
        for shipment in shipments:
            limits = shipment.task.limits
            needed = {h: refs[h] for h in [*shipment.stage.values(), shipment.image] if h is not None}
            options = self._options(limits.cpus, limits.gpus, limits.memory_bytes)
            options["resources"] = _host_share(shipment.task.exclusive, offered, nodes)
            calls.append(remote.options(**options).remote(shipment, needed, self.workdir, self.isolation))
        # Keep what this call used, for the next one (a job's next chunk: the same detector, the same
        # training split); anything older leaves the object store.
        self._refs = refs
        self._packed = {key: h for key, h in packed.items() if h in refs}
        return self._gather(calls, on_result)

    def call_map(
        self,
        function: Callable[..., Any],
        arguments: Sequence[tuple[Any, ...]],
        on_result: Callable[[Any], None] | None = None,
        cpus: float = 1.0,
    ) -> list[Any]:
        """``function(*args)`` for each tuple on the cluster, values in order (the zoo trains models so).

        ``function`` must be importable on every node and take and return values, never paths of the
        caller's; it is run again where its node died, so it must have no effect but its value.
        """
        remote = self._remote(function).options(**self._options(cpus))
        return self._gather([remote.remote(*args) for args in arguments], on_result)


def make_executor(name: str, workers: int = 1, address: str | None = None) -> Executor:
    """The executor the CLI's ``--executor`` names: ``local`` (``workers`` at a time) or ``ray``."""
    if name == "local":
        if address is not None:
            raise UserError("--address is for the ray executor; the local executor runs on this machine")
        return LocalExecutor(workers)
    if name == "ray":
        executor = RayExecutor(address)
        executor.connect()
        return executor
    raise UserError(f"unknown executor {name!r}; choose local or ray")
