"""The organiser dashboard, the demo seed behind ``assay serve --demo``, and who may open the admin areas.

The demo seed is the fixture: every role exists, with a campaign holding one finished dialogue and a
registered DyePack release, so each role's refusals are checked against real rows.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from starlette.testclient import TestClient

from assay.web.app import create_app
from assay.web.demo import PEOPLE, seed_demo
from web_client import sign_in
from web_server import free_port

ADMIN_PAGES = ["/dashboard", "/admin/users", "/leaderboard/status", "/star/campaigns"]
ADMIN_API = [
    "/api/v1/dashboard",
    "/api/v1/leaderboard/status",
    "/api/v1/star/campaigns/demo-campaign/progress",
]


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    app = create_app(f"sqlite:///{tmp_path / 'web.db'}")
    return app, seed_demo(app.state.sessions, tmp_path / "demo")


def signed_in(app, seeded, username: str) -> TestClient:  # type: ignore[no-untyped-def]
    client = TestClient(app)
    response = sign_in(client, username, seeded.passwords[username])
    assert response.status_code == 303, response.text
    return client


def test_dashboard_shows_every_pillar_and_matches_its_api(site) -> None:  # type: ignore[no-untyped-def]
    app, seeded = site
    olga = signed_in(app, seeded, "olga")
    page = olga.get("/dashboard")
    assert page.status_code == 200
    assert "demo-campaign" in page.text and "1 registered release;" in page.text
    overview = olga.get("/api/v1/dashboard").json()
    campaign = overview["campaigns"][0]
    assert campaign["name"] == "demo-campaign" and campaign["dialogues"] == 1
    assert campaign["tasks"]["annotate"] == {"open": 2}  # the seeded dialogue waits for two annotators
    assert overview["dyepack"] == {"benchmarks": 1, "runs": {}, "flagged": 0}
    assert overview["leaderboard"]["queued"] == 0 and overview["leaderboard"]["rounds"] == []


@pytest.mark.parametrize("username", [u for u, (roles, _, _) in PEOPLE.items() if "organiser" not in roles])
def test_admin_areas_refuse_every_other_role(site, username: str) -> None:  # type: ignore[no-untyped-def]
    app, seeded = site
    client = signed_in(app, seeded, username)
    for url in ADMIN_PAGES:
        assert client.get(url, follow_redirects=False).status_code == 403, url
    for url in ADMIN_API:
        assert client.get(url).status_code == 403, url
    assert "/dashboard" not in re.findall(r'<li><a href="([^"]+)"', client.get("/").text)


def test_anonymous_gets_401_on_the_api_and_a_login_redirect_on_pages(site) -> None:  # type: ignore[no-untyped-def]
    app, _ = site
    client = TestClient(app)
    for url in ADMIN_API:
        assert client.get(url).status_code == 401
    for url in ADMIN_PAGES:
        response = client.get(url, follow_redirects=False)
        assert response.status_code == 303 and response.headers["location"].startswith("/login?next=")


def test_demo_refuses_a_database_that_has_users(site, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from assay.errors import UserError

    app, _ = site
    with pytest.raises(UserError, match="empty database"):
        seed_demo(app.state.sessions, tmp_path / "again")


@pytest.mark.slow  # `assay serve --demo`, 8 s
def test_assay_serve_demo_end_to_end(tmp_path: Path) -> None:
    """The real command: it trains the small demo round, seeds, prints passwords and serves on 127.0.0.1."""
    port = free_port()
    env = {**os.environ, "ASSAY_HOME": str(tmp_path / "home"), "ASSAY_ARGON2_FAST": "1", "COLUMNS": "200"}
    command = [sys.executable, "-m", "assay", "serve", "--demo", "--port", str(port), "--target", ""]
    server = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        base, lines = f"http://127.0.0.1:{port}", []
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            line = server.stdout.readline()  # type: ignore[union-attr]
            lines.append(line)
            if "Uvicorn running" in line or server.poll() is not None:
                break
        output = "".join(lines)
        assert "Uvicorn running" in output, output
        password = re.search(r"olga\s*│\s*organiser\s*│\s*(\S+)", output).group(1)  # type: ignore[union-attr]
        with httpx.Client(base_url=base) as client:
            assert sign_in(client, "olga", password).status_code == 303
            rounds = client.get("/api/v1/leaderboard/rounds").json()["items"]
            assert [r["name"] for r in rounds] == ["demo-round"]
            assert "demo-campaign" in client.get("/dashboard").text
    finally:
        server.terminate()
        server.wait(timeout=30)
