"""Joining a Ray cluster fails in one line, within seconds, where the head is not there or refuses this
process's token (issue 36): before, ``assay leaderboard worker --executor ray`` retried for a minute and
ended in a traceback. The command line is run as an operator runs it, so the exit code and the lines it
prints are what they see; the worker fails before it opens the database or claims anything."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from assay.errors import UserError
from web_server import free_port

pytest.importorskip("ray")


def _worker(address: str, env: dict[str, str]) -> tuple[subprocess.CompletedProcess[str], float]:
    """``assay leaderboard worker --executor ray --address ADDRESS --once`` and how long it took."""
    started = time.monotonic()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "assay",
            "leaderboard",
            "worker",
            "--executor",
            "ray",
            "--address",
            address,
            "--once",
        ],
        env={**env, "RAY_USAGE_STATS_ENABLED": "0"},
        capture_output=True,
        text=True,
        timeout=180,
    )
    return done, time.monotonic() - started


def _clean_environment() -> dict[str, str]:
    """This environment without any Ray token: a node or driver started with nothing set."""
    return {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}


def test_an_unreachable_head_is_one_line(tmp_path: Path) -> None:
    address = f"127.0.0.1:{free_port()}"  # nothing listens there
    done, took = _worker(address, _clean_environment())
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.strip().count("\n") == 0, done.stderr
    assert f"cannot reach the Ray head at {address}" in done.stderr and "ray start --head" in done.stderr
    assert took < 30, took  # ray.init alone: over a minute of retries
    assert not (Path(os.environ["ASSAY_HOME"]) / "assay.db").exists()  # failed before taking work


@pytest.mark.slow
def test_a_port_that_is_not_a_ray_head_is_one_line() -> None:
    """Something accepts the connection but never answers (a wrong port, a stuck head): the GCS call's own
    timeout, in seconds, where ray.init retried for a minute."""
    from assay.runner.executors import RayExecutor, _check_head

    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)  # the kernel completes the handshake; nobody reads
        executor = RayExecutor(f"127.0.0.1:{silent.getsockname()[1]}")
        started = time.monotonic()
        with pytest.raises(UserError, match=r"does not answer as a Ray head \(.*\); check --address$"):
            _check_head(executor.ray, executor.address, timeout=0.5)
    assert time.monotonic() - started < 30


@pytest.mark.slow
def test_a_missing_token_is_one_line_and_the_right_one_connects() -> None:
    from ray_cluster import local_cluster, ray_available

    reason = ray_available()
    if reason is not None:
        pytest.skip(reason)
    with local_cluster(workers=0, hidden=[]) as cluster:  # a head that wants its token
        done, took = _worker(cluster.address, _clean_environment())
        assert done.returncode == 2, done.stderr[-2000:]
        assert done.stderr.strip().count("\n") == 0, done.stderr
        assert f"the Ray head at {cluster.address} refused this process" in done.stderr
        assert "RAY_AUTH_TOKEN" in done.stderr and took < 30, took
        joined, _ = _worker(cluster.address, {**_clean_environment(), **cluster.env})
        assert joined.returncode == 0, joined.stderr[-3000:]
        assert "0 job(s) run" in joined.stdout + joined.stderr
