"""Behind a proxy, the sign-in throttle counts each client, not the proxy (issue 36).

``assay serve`` believes ``X-Forwarded-For`` only from the proxies it is told to trust
(``--forwarded-allow-ips`` or uvicorn's ``FORWARDED_ALLOW_IPS``; loopback by default). A proxy in front of a
container is not loopback, so without the setting every user was one client to the throttle: one person's
failed guesses made everyone wait. Here the "proxy" is 127.0.0.2 (a loopback address that is not the
default trusted one): with the setting its forwarded address is the one counted, without it the proxy's own
is, and a client that is not the proxy cannot choose its address by sending the header itself.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from web_client import sign_in
from web_server import free_port

PROXY, STRANGER, USER = "127.0.0.2", "127.0.0.3", "198.51.100.7"


@contextmanager
def _serve(tmp_path: Path, options: list[str], env: dict[str, str]) -> Iterator[tuple[str, Path]]:
    """``assay serve`` with ``options`` on a fresh SQLite database; its base URL and database file."""
    database, port = tmp_path / "web.db", free_port()
    environ = {**os.environ, "ASSAY_DB_URL": f"sqlite:///{database}", **env}
    server = subprocess.Popen(
        [sys.executable, "-m", "assay", "serve", "--port", str(port), *options],
        env=environ,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    base, deadline = f"http://127.0.0.1:{port}", time.monotonic() + 60
    try:
        while True:
            try:
                if httpx.get(f"{base}/api/v1/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert server.poll() is None and time.monotonic() < deadline, server.stderr.read()
            time.sleep(0.2)
        yield base, database
    finally:
        server.terminate()
        server.wait(30)


def _fail_sign_in(base: str, source: str) -> None:
    """One failed sign-in over a connection from ``source``, claiming to forward for ``USER``."""
    transport = httpx.HTTPTransport(local_address=source)
    with httpx.Client(base_url=base, transport=transport, headers={"X-Forwarded-For": USER}) as client:
        assert sign_in(client, "nobody", "not the password").status_code in (200, 400, 401, 429)


def _counted(database: Path) -> set[str]:
    """The client addresses the throttle has counted failures for."""
    with sqlite3.connect(database) as connection:
        rows = connection.execute("SELECT key FROM web_login_throttles WHERE scope = 'client'").fetchall()
    return {key for (key,) in rows}


@pytest.mark.slow  # a server process each
@pytest.mark.parametrize(
    ("options", "trusted"), [(["--forwarded-allow-ips", PROXY], True), ([], False)], ids=["set", "unset"]
)
def test_the_throttle_counts_the_forwarded_client_only_from_a_trusted_proxy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, options: list[str], trusted: bool
) -> None:
    monkeypatch.delenv("FORWARDED_ALLOW_IPS", raising=False)
    with _serve(tmp_path, options, {}) as (base, database):
        _fail_sign_in(base, PROXY)
        assert _counted(database) == ({USER} if trusted else {PROXY})
        _fail_sign_in(base, STRANGER)  # not the proxy: its header is not believed
        assert _counted(database) == ({USER, STRANGER} if trusted else {PROXY, STRANGER})


def test_the_environment_names_the_proxies_when_the_option_is_not_given(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``FORWARDED_ALLOW_IPS`` (what the image's environment or the pod file sets) reaches uvicorn."""
    import uvicorn

    from assay.web.cli import proxy_options

    monkeypatch.setenv("FORWARDED_ALLOW_IPS", "10.88.0.0/16")
    assert uvicorn.Config(app=None, **proxy_options(None)).forwarded_allow_ips == "10.88.0.0/16"
    assert uvicorn.Config(app=None, **proxy_options(PROXY)).forwarded_allow_ips == PROXY
