"""A local Ray cluster of separate nodes that share no files, for tests and benchmarks.

Each node is ``ray start --block`` with its own temp dir, raylet, object store and ``ASSAY_NODE_CACHE``,
inside its own mount and pid namespace (``unshare``): the host is seen as it is, but every folder named in
``hidden`` (the test's data: round, artifacts, database) and every other node's folder is an empty tmpfs
there, so a task that read a path of the submitter's or of another node would fail. Killing a node is
killing its namespace (``Node.kill``): raylet, workers and running detectors die at once, as when a machine
is lost. Each namespace dies with the process that started it (``--kill-child`` and a parent-death signal),
so no raylet outlives a crashed test. Nodes authenticate with one fresh token (``RAY_AUTH_TOKEN``).
(bubblewrap's own pid namespace would do, but a detector's bwrap sandbox cannot mount its ``/proc`` inside
one; under ``unshare --mount-proc`` it can, so every node runs the same sandbox as a lone machine.)
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from assay.runner.hostlease import HOST_RESOURCE

RAY = str(Path(__file__).resolve().parents[1] / ".venv" / "bin" / "ray")
# A lost node is noticed in about 3 s instead of Ray's default 15-30 s.
FAST_FAILURE = {
    "RAY_health_check_period_ms": "1000",
    "RAY_health_check_timeout_ms": "1000",
    "RAY_health_check_failure_threshold": "3",
    "RAY_health_check_initial_delay_ms": "1000",
}


UNSHARE = ["unshare", "--mount", "--pid", "--fork", "--mount-proc", "--kill-child", "--"]


def _namespace(hidden: list[Path], command: list[str]) -> list[str]:
    """``command`` in a new mount and pid namespace where each ``hidden`` folder is an empty tmpfs."""
    mounts = "".join(f"mount -t tmpfs -o size=1m assay-hidden {shlex.quote(str(p))} && " for p in hidden)
    return [*UNSHARE, "sh", "-c", mounts + 'exec "$@"', "node", *command]


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL when the test process dies (PR_SET_PDEATHSIG)."""
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)


def ray_available() -> str | None:
    """Why a local multi-node cluster cannot start here, or None when it can."""
    if not Path(RAY).exists():
        return f"{RAY} does not exist (pip install 'ray[default]')"
    if shutil.which("unshare") is None:
        return "unshare (util-linux) is not installed: nodes run in their own namespaces"
    with tempfile.TemporaryDirectory() as folder:
        probe = subprocess.run(_namespace([Path(folder)], ["true"]), capture_output=True, text=True)
    if probe.returncode != 0:
        return f"cannot make a mount and pid namespace here: {probe.stderr.strip()[:200]}"
    return None


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@dataclass
class Node:
    """One node: its folder (Ray's temp dir and its cache of blobs) and the process holding its namespace."""

    name: str
    root: Path
    process: subprocess.Popen
    log: Path
    node_id: str = ""

    @property
    def cache(self) -> Path:
        return self.root / "cache"

    def processes(self) -> list[psutil.Process]:
        """Every process of the node (raylet, Ray workers, sandboxes, detectors)."""
        try:
            return psutil.Process(self.process.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []

    def running(self, marker: str) -> bool:
        """Whether a process of this node has ``marker`` in its command line (a detector at work)."""
        for process in self.processes():
            with contextlib.suppress(psutil.Error):
                if any(marker in part for part in process.cmdline()):
                    return True
        return False

    def kill(self) -> None:
        """SIGKILL the namespace: everything in it dies with its first process."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(timeout=30)


@dataclass
class Cluster:
    """A head and its worker nodes; ``env`` is what a driver needs to connect (the auth token)."""

    address: str
    env: dict[str, str]
    base: Path
    hidden: list[Path]
    nodes: list[Node] = field(default_factory=list)

    @property
    def workers(self) -> list[Node]:
        return self.nodes[1:]

    def _start(self, name: str, args: list[str], cpus: float) -> Node:
        root = self.base / name
        others = [path for path in self.base.iterdir() if path != root]
        env = {**os.environ, **self.env, **FAST_FAILURE, "ASSAY_NODE_CACHE": str(root / "cache")}
        env["TMPDIR"] = str(root / "tmp")  # a machine's own /tmp: sandboxes, and the sweep of dead ones'
        env["ASSAY_HOST_LEASE"] = str(root / "host.lease")  # and its own host lease (``hostlease``)
        env["RAY_USAGE_STATS_ENABLED"] = "0"
        command = [
            RAY,
            "start",
            "--block",
            f"--temp-dir={root / 'ray'}",
            f"--num-cpus={cpus:g}",
            f'--resources={{"{HOST_RESOURCE}": 1}}',  # a sealed run holds the node alone (issue 44)
            "--object-store-memory=80000000",
            "--include-log-monitor=false",
            "--disable-usage-stats",
            *args,
        ]
        log = root / "node.log"
        with log.open("wb") as out:
            process = subprocess.Popen(
                _namespace([*self.hidden, *others], command),
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )
        node = Node(name, root, process, log)
        self.nodes.append(node)
        return node

    def _wait_started(self, node: Node, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while "Ray runtime started" not in node.log.read_text(errors="replace"):
            if node.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"ray node {node.name} did not start:\n{node.log.read_text()[-3000:]}")
            time.sleep(0.2)

    def start_workers(self, count: int, cpus: float = 1, timeout: float = 120) -> list[Node]:
        """Start the next ``count`` of the prepared worker nodes (``local_cluster(workers=...)``) and wait
        until each has joined."""
        names = [path.name for path in sorted(self.base.iterdir()) if path.name.startswith("w")]
        names = [name for name in names if name not in {node.name for node in self.nodes}][:count]
        join = [f"--address={self.address}"]
        started = [self._start(name, join, cpus) for name in names]
        for node in started:
            self._wait_started(node, timeout)
        return started

    def stop(self) -> None:
        for node in reversed(self.nodes):
            node.kill()
        shutil.rmtree(self.base, ignore_errors=True)


@contextlib.contextmanager
def local_cluster(
    workers: int,
    hidden: list[Path],
    head_cpus: float = 0,
    worker_cpus: float = 1,
    timeout: float = 120,
    start: bool = True,
    token: str | None = None,
) -> Iterator[Cluster]:
    """A head with ``head_cpus`` (0: it schedules but runs no task) and ``workers`` nodes of
    ``worker_cpus`` (prepared only, when not ``start``: ``Cluster.start_workers`` adds them later), all
    stopped on exit whatever happened. ``token``: the cluster's auth token (default: a fresh one)."""
    port = _free_port()
    env = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token or secrets.token_hex(32)}
    base = Path(tempfile.mkdtemp(prefix="assay-ray-", dir="/tmp"))  # short: Ray's socket paths are long
    cluster = Cluster(f"127.0.0.1:{port}", env, base, [Path(path) for path in hidden])
    for name in ["head", *(f"w{i}" for i in range(workers))]:  # all first: each node hides the others
        (base / name / "ray").mkdir(parents=True)
        (base / name / "tmp").mkdir()
    try:
        head = cluster._start("head", ["--head", f"--port={port}", "--include-dashboard=false"], head_cpus)
        cluster._wait_started(head, timeout)
        if start:
            cluster.start_workers(workers, worker_cpus, timeout)
        yield cluster
    finally:
        cluster.stop()
