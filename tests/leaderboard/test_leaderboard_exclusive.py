"""Issue 44, exclusive hosts: while a sealed job's detector runs on a machine, no other job's run shares it.

Two runs on one machine share free memory, the page cache and the CPUs; a practice run (whose stderr its
team reads) beside a test run of the same team decoded 16 of 16 hash slots through sysinfo. Here two real
workers (``assay leaderboard worker --once``, two processes on this machine) take a practice job and a
sealed test job at once; each detector run writes when it started and ended. The sealed detector sends:
it writes 48 MiB into its scratch (tmpfs: shared memory, host-wide); the practice detector receives: it
samples sysinfo(2) (through ctypes) and ``/proc/meminfo`` every 20 ms while it runs. Before the host lease
and the seccomp filter the two jobs' runs overlapped (8 pairs) and the receiver saw the host move (a new
sysinfo answer at every sample); now no sealed run overlaps any practice run and the receiver sees one
thing throughout. The lease's own rules (shared holders together, an exclusive one alone and ahead of
later shared ones, nesting) are checked with threads.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker
from test_leaderboard import fake_detector

from assay.errors import UserError
from assay.leaderboard import submissions
from assay.leaderboard.harness import run_models
from assay.leaderboard.worker import work
from assay.runner import LocalExecutor, Task, TaskResult, isolation
from assay.runner.executors import _host_share
from assay.runner.hostlease import HOST_RESOURCE, host_lease
from assay.store import Job, open_store
from fake_board import open_round

SENDER = (
    "start = time.time()\n"
    "open(args.scratch_dirpath + '/blob', 'wb').write(b'x' * (48 << 20))\n"
    "time.sleep(0.3)\n"
    "print(f'ran {start} {time.time()} 0')\n"
    "open(args.result_filepath, 'w').write('0.5')\n"
)
RECEIVER = (
    "import ctypes\n"
    "libc, seen, start = ctypes.CDLL(None, use_errno=True), set(), time.time()\n"
    "while time.time() < start + 1.5:\n"
    "    answer = ctypes.create_string_buffer(256)\n"
    "    seen.add((libc.sysinfo(answer), answer.raw, open('/proc/meminfo').read()))\n"
    "    time.sleep(0.02)\n"
    "print(f'ran {start} {time.time()} {len(seen)}')\n"
    "open(args.result_filepath, 'w').write('0.5')\n"
)


def _open_round(tmp_path: Path) -> tuple[str, sessionmaker[Session]]:
    """An open round r1 over the fake splits, with team alpha; its database URL and sessions."""
    url = f"sqlite:///{tmp_path / 'lb.db'}"
    open_round(url, tmp_path / "splits")
    return url, open_store(url)


def _runs(url: str) -> dict[str, list[tuple[float, float, int]]]:
    """Each job's detector runs as (start, end, distinct host views it received), by split."""
    runs: dict[str, list[tuple[float, float, int]]] = {}
    with open_store(url)() as session:
        for job in session.scalars(select(Job)):
            for result in job.results:
                _, start, end, seen = result.stdout.split()
                runs.setdefault(job.submission.split.name, []).append((float(start), float(end), int(seen)))
    return runs


def _workers(url: str) -> set[str | None]:
    with open_store(url)() as session:
        return set(session.scalars(select(Job.worker)))


@pytest.mark.skipif(isolation.isolation_available() != "bwrap", reason="sealed jobs need bubblewrap")
def test_no_practice_run_shares_the_host_with_a_sealed_run(tmp_path: Path) -> None:
    url, sessions = _open_round(tmp_path)
    with sessions.begin() as session:  # the practice job first: it holds the host when the sealed one comes
        practice = fake_detector(tmp_path / "p", RECEIVER)
        submissions.submit(session, tmp_path / "artifacts", "alpha", "r1", "train", practice)
    with sessions.begin() as session:
        sealed = fake_detector(tmp_path / "s", SENDER)
        submissions.submit(session, tmp_path / "artifacts", "alpha", "r1", "test", sealed)
    env = {**os.environ, "ASSAY_DB_URL": url, "ASSAY_HOST_LEASE": str(tmp_path / "host.lease")}
    command = [sys.executable, "-m", "assay", "leaderboard", "worker", "--once", "--workers", "2"]
    first = subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True)
    time.sleep(1.0)  # the first worker claims the practice job; the second then takes the sealed one
    second = subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True)
    for worker in (first, second):
        _, err = worker.communicate(timeout=120)
        assert worker.returncode == 0, err
    runs = _runs(url)
    overlaps = [
        (s, p) for s in runs["test"] for p in runs["train"] if s[0] < p[1] and p[0] < s[1]
    ]  # fmt: skip
    received = [seen for _, _, seen in runs["train"]]
    print(
        f"\nworkers {_workers(url)}; sealed runs overlapping practice runs: {len(overlaps)}; distinct "
        f"host views each practice run received: {received}"
    )
    assert len(_workers(url)) == 2, "one worker ran both jobs: no concurrency to test"
    assert len(runs["test"]) == len(runs["train"]) == 4
    assert overlaps == [] and received == [1, 1, 1, 1]


def _holding(exclusive: bool, path: Path, log: list[str], name: str, hold_s: float) -> threading.Thread:
    def hold() -> None:
        with host_lease(exclusive, path):
            log.append(f"{name} in")
            time.sleep(hold_s)
            log.append(f"{name} out")

    thread = threading.Thread(target=hold)
    thread.start()
    return thread


def test_the_lease_is_shared_by_practice_and_held_alone_by_a_sealed_run(tmp_path: Path) -> None:
    path, log = tmp_path / "host.lease", []
    a = _holding(False, path, log, "a", 0.4)
    b = _holding(False, path, log, "b", 0.4)
    time.sleep(0.1)
    assert sorted(log) == ["a in", "b in"]  # shared holders together
    sealed = _holding(True, path, log, "sealed", 0.2)
    time.sleep(0.1)
    late = _holding(False, path, log, "late", 0.1)  # arrives after the sealed run asked: waits for it
    for thread in (a, b, sealed, late):
        thread.join(timeout=10)
    sealed_in, sealed_out = log.index("sealed in"), log.index("sealed out")
    assert {"a out", "b out"} <= set(log[:sealed_in]) and sealed_out == sealed_in + 1
    assert log.index("late in") > sealed_out


@pytest.mark.skipif(isolation.isolation_available() != "bwrap", reason="sealed jobs need bubblewrap")
def test_a_pool_for_sealed_jobs_leaves_practice_jobs_to_another(tmp_path: Path) -> None:
    """``worker --splits test,holdout``: sealed jobs on machines of their own, so no practice job waits on
    one (a practice job queued behind a sealed job started when it let go: its end to the second)."""
    _, sessions = _open_round(tmp_path)
    answer = "open(args.result_filepath, 'w').write('0.5')"
    for split in ("train", "test"):
        with sessions.begin() as session:
            detector = fake_detector(tmp_path / split, answer)
            submissions.submit(session, tmp_path / "artifacts", "alpha", "r1", split, detector)
    assert work(sessions, LocalExecutor(2), once=True, splits=["test", "holdout"]) == 1
    with sessions() as session:
        statuses = {job.submission.split.name: job.status for job in session.scalars(select(Job))}
    assert statuses == {"train": "queued", "test": "done"}
    with pytest.raises(UserError, match="--splits: 'tset' is not one of train, test, holdout, smoke"):
        work(sessions, LocalExecutor(1), once=True, splits=["tset"])


def test_a_lease_nests_in_one_held_by_the_same_thread(tmp_path: Path) -> None:
    path = tmp_path / "host.lease"
    with host_lease(True, path), host_lease(True, path), host_lease(False, path):
        pass  # a sealed job's chunks inside the job's own hold: nothing more to wait for
    refused = pytest.raises(RuntimeError, match="inside a shared one")
    with host_lease(False, path), refused, host_lease(True, path):
        pass


class _Holding:
    """An executor that runs nothing and records its host holds and its map calls, in order."""

    def __init__(self) -> None:
        self.events: list[str] = []

    @contextlib.contextmanager
    def holding(self, exclusive: bool) -> Iterator[None]:
        self.events.append(f"hold {'alone' if exclusive else 'shared'}")
        yield
        self.events.append("release")

    def map(self, tasks: list[Task], on_result=None) -> list[TaskResult]:  # type: ignore[no-untyped-def]
        self.events.append(f"map {len(tasks)}")
        return []


@pytest.mark.parametrize(("split", "held"), [("test", True), ("train", False)])
def test_a_sealed_job_holds_the_host_across_its_chunks(tmp_path: Path, split: str, held: bool) -> None:
    """Leased chunk by chunk, a practice run could start between a sealed job's chunks and time each one;
    a sealed job holds the host once for all of them, a practice job chunk by chunk (inside ``map``)."""
    _, sessions = _open_round(tmp_path)
    with sessions.begin() as session:
        detector = fake_detector(tmp_path / "d", "open(args.result_filepath, 'w').write('0.5')")
        job_id = submissions.submit(session, tmp_path / "artifacts", "alpha", "r1", split, detector).job.id
    executor = _Holding()
    run_models(sessions, job_id, executor, chunk=2)
    chunks = ["map 2", "map 2"]
    assert executor.events == (["hold alone", *chunks, "release"] if held else chunks)


def test_on_ray_a_sealed_task_takes_its_whole_node() -> None:
    """Ray's half: a per-node custom resource every node offers once; a sealed task takes all of it, any
    other a sliver, and a cluster that offers none refuses sealed tasks in one line (practice runs on)."""
    assert _host_share(exclusive=True, offered=True) == {HOST_RESOURCE: 1.0}
    assert _host_share(exclusive=False, offered=True) == {HOST_RESOURCE: 0.001}
    assert _host_share(exclusive=False, offered=False) == {}
    # a head alone (its nodes still joining): a sealed task waits for a node that offers the resource
    assert _host_share(exclusive=True, offered=False, nodes=False) == {HOST_RESOURCE: 1.0}
    assert _host_share(exclusive=False, offered=False, nodes=False) == {}
    refusal = re.escape("""start every node with --resources='{"assay_host": 1}'""")
    with pytest.raises(UserError, match=refusal):
        _host_share(exclusive=True, offered=False)
