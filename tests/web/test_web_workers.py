"""``assay serve --workers 3`` on a fresh PostgreSQL database (tests/postgres.py): the real command, three
uvicorn worker processes sharing one database. A session made through one worker is honoured by the
others, concurrent sign-ins and API calls all succeed, and nothing is created twice."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from sqlalchemy import func, select

from assay.store import open_store
from assay.store.web_models import WebSession
from web_client import PASSWORD, sign_in
from web_server import free_port  # tests/ is on sys.path (rootdir conftest)

pytestmark = pytest.mark.slow  # three uvicorn worker processes on PostgreSQL


def _children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(c) for c in (task / "children").read_text().split()]
    return found


def _wait_until_up(base: str, server: subprocess.Popen[str], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert server.poll() is None, server.communicate()[0]
        try:
            if httpx.get(f"{base}/api/v1/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.3)
    raise AssertionError(f"{base} did not come up in {timeout} s")


def _sign_in_and_call(base: str, n: int) -> list[int]:
    """A fresh client (own connections): sign in, then read /api/v1/me five times on new connections."""
    codes = []
    with httpx.Client(base_url=base, headers={"connection": "close"}) as http:
        codes.append(sign_in(http, "olga").status_code)
        for _ in range(5):
            me = http.get("/api/v1/me")
            codes.append(me.status_code if me.json().get("username") == "olga" else -n)
    return codes


def test_three_workers_share_one_postgresql_database(postgres, tmp_path: Path) -> None:
    url = postgres.new_database()
    env = {
        **os.environ,
        "ASSAY_HOME": str(tmp_path / "home"),
        "ASSAY_DB_URL": url,
        "ASSAY_PASSWORD": PASSWORD,
    }
    added = subprocess.run(
        [sys.executable, "-m", "assay", "user", "add", "olga", "--role", "organiser"],
        env=env,
        capture_output=True,
        text=True,
    )
    assert added.returncode == 0, added.stderr
    port = free_port()
    command = [sys.executable, "-m", "assay", "serve", "--workers", "3", "--port", str(port)]
    server = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        _wait_until_up(base, server)
        time.sleep(2)  # every worker has started listening
        assert len(_children(server.pid)) >= 3
        with ThreadPoolExecutor(8) as pool:
            results = list(pool.map(lambda n: _sign_in_and_call(base, n), range(16)))
        assert all(code in (200, 303) for codes in results for code in codes), results
    finally:
        server.terminate()
        output = server.communicate(timeout=30)[0]
    assert "Traceback" not in output, output
    with open_store(url)() as session:
        assert session.scalar(select(func.count()).select_from(WebSession)) == 16
