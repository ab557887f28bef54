"""Stopping a worker: SIGTERM (what ``podman stop`` sends PID 1) or Ctrl-C gives its job back at once.

A real ``python -m assay leaderboard worker`` subprocess on a real SQLite file runs a slow detector; it is
stopped mid-job, and a second worker finishes the job. Also: the worker's liveness as ``leaderboard status``
and ``/metrics`` show it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from sqlalchemy import select
from test_leaderboard_worker import job_of, lb, submit  # noqa: F401 (lb is a fixture)

from assay.leaderboard.worker import work
from assay.runner import LocalExecutor
from assay.store import ModelResult
from fake_board import TRUTH

SLOW = "time.sleep(3)\nopen(args.result_filepath, 'w').write('0.25')"


def live_workers(session):  # type: ignore[no-untyped-def]
    """``fleet.live_workers``, imported when first used (a worker without heartbeats had none)."""
    from assay.leaderboard.fleet import live_workers

    return live_workers(session)


def start_worker(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "assay", "leaderboard", "worker", *args],
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def wait_for(check, seconds: float = 120.0):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if found := check():
            return found
        time.sleep(0.1)
    raise AssertionError(f"not within {seconds} s")


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_stopped_worker_gives_its_job_back_at_once(lb, tmp_path: Path, signum: int) -> None:  # noqa: F811
    """Was: SIGTERM killed the worker at once; its job stayed `running` under a dead worker until the
    heartbeat went stale (61 s), and its detector ran on unattended."""
    made = submit(lb, tmp_path, "slow", SLOW, split="train")
    worker = start_worker("--workers", "1")

    def results() -> int:
        with lb() as session:
            return len(session.scalars(select(ModelResult)).all())

    wait_for(lambda: results() >= 1)
    with lb() as session:
        (alive,) = live_workers(session)
        assert alive.job_id is not None and alive.healthy and alive.pid == worker.pid
    detectors = wait_for(lambda: children(worker.pid))
    os.kill(worker.pid, signum)
    signalled = time.monotonic()
    wait_for(lambda: job_of(lb, made.id).status == "queued", 5.0)
    assert time.monotonic() - signalled < 5.0
    assert worker.wait(10) == 0, worker.stderr.read() if worker.stderr else ""
    job = job_of(lb, made.id)
    assert job.worker is None and 1 <= len(job.results) < len(TRUTH)
    assert f"released: {alive.name} was stopped" in job.log
    kept = {r.model_name: r.id for r in job.results}
    assert not [pid for pid in detectors if Path(f"/proc/{pid}").exists()]  # its detector did not run on
    with lb() as session:
        assert live_workers(session) == []

    assert work(lb, LocalExecutor(2), once=True) == 1
    job = job_of(lb, made.id)
    assert job.status == "done" and job.attempts == 2
    assert sorted(r.model_name for r in job.results) == sorted(TRUTH)  # each model scored exactly once
    assert {r.model_name: r.id for r in job.results if r.model_name in kept} == kept


def children(parent: int) -> list[int]:
    """The processes ``parent`` started (the detectors a worker runs, each in its own process group)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == parent:
            found.append(int(entry.name))
    return found


@pytest.mark.slow
def test_status_and_metrics_list_live_workers(lb, tmp_path: Path) -> None:  # noqa: F811
    """An idle worker is visible: `leaderboard status --json` and the /metrics gauge list it."""
    from assay.web.metrics import state_families

    worker = start_worker()
    try:
        wait_for(lambda: _status()["workers"])
        state = _status()
        (alive,) = state["workers"]
        assert alive["pid"] == worker.pid and alive["healthy"] and alive["job_id"] is None
        assert alive["kinds"][:2] == ["folder", "archive"] and alive["splits"] == []  # what it can take
        assert state["unhealthy"] == 0
        plain = subprocess.run(
            [sys.executable, "-m", "assay", "leaderboard", "status"],
            capture_output=True,
            text=True,
            check=True,
        )
        assert "workers alive: 1, 0 unhealthy" in plain.stdout and f"{alive['name']} (assay " in plain.stdout
        assert f"; runs {','.join(alive['kinds'])}): idle" in plain.stdout
        background = SimpleNamespace(status=lambda: SimpleNamespace(lanes=[]))
        with lb() as session:
            families = {f.name: f for f in state_families(session, background)}
        gauge = {s.labels["state"]: s.value for s in families["assay_leaderboard_workers"].samples}
        assert gauge == {"live": 1.0, "unhealthy": 0.0}
    finally:
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(10) == 0
    assert _status()["workers"] == []


def _status() -> dict:
    done = subprocess.run(
        [sys.executable, "-m", "assay", "leaderboard", "status", "--json"],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(done.stdout)
