"""Operating the platform: liveness and readiness, Prometheus metrics, JSON logs.

Readiness is checked against the three states a pod meets: a database at head (200), one whose schema is
behind the code (503, migrations pending) and one that cannot be read (503, unreachable); on PostgreSQL a
stopped server. Metrics are scraped as Prometheus would (a bearer token) and parsed with prometheus_client's
own parser: the latency histogram counts exactly the requests made, by route template.
"""

from __future__ import annotations

import io
import json
import logging
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import text
from starlette.testclient import TestClient

from assay.leaderboard import rounds
from assay.store import Job, Submission
from assay.web import accounts
from assay.web.app import create_app
from assay.web.logs import JsonFormatter, uvicorn_log_config
from assay.web.ops import readiness, script_heads
from fake_board import fake_splits
from web_client import PASSWORD


def _app(tmp_path: Path):  # type: ignore[no-untyped-def]
    return create_app(f"sqlite:///{tmp_path / 'web.db'}")


def _token(app, username: str, *roles: str) -> dict[str, str]:  # type: ignore[no-untyped-def]
    with app.state.sessions.begin() as session:
        user = accounts.create_user(session, username, PASSWORD, roles=list(roles))
        raw = accounts.create_api_token(session, user, "prometheus")
    return {"Authorization": f"Bearer {raw}"}


def _head_and_parent() -> tuple[str, str]:
    """The newest head of the migration chain and the revision before it."""
    from alembic.config import Config
    from alembic.script import ScriptDirectory

    from assay.store.engine import MIGRATIONS

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    scripts = ScriptDirectory.from_config(config)
    head = max(script_heads(), key=lambda h: len(list(scripts.iterate_revisions(h, "base"))))
    parent = scripts.get_revision(head).down_revision
    return head, parent if isinstance(parent, str) else parent[0]


@pytest.mark.slow  # a fresh store and app: about 2 s on quiet cores, more when shared
def test_health_and_ready_answer_visitors_and_ready_follows_the_schema(tmp_path: Path) -> None:
    app = _app(tmp_path)
    client = TestClient(app)
    assert client.get("/api/v1/health").json()["status"] == "ok"
    ready = client.get("/api/v1/ready")
    assert ready.status_code == 200 and ready.json()["ready"] is True
    assert ready.json()["revisions"] == list(script_heads())

    # another process moves the schema back a revision: this server must stop taking traffic
    engine = app.state.sessions.kw["bind"]
    head, before = _head_and_parent()
    moved = "UPDATE alembic_version SET version_num = :to WHERE version_num = :at"
    with engine.begin() as connection:
        connection.execute(text(moved), {"to": before, "at": head})
    behind = client.get("/api/v1/ready")
    assert behind.status_code == 503
    assert f"want {head}" in behind.json()["database"] and before in behind.json()["revisions"]
    assert behind.json()["database"].startswith("migrations pending: at ")
    with engine.begin() as connection:
        connection.execute(text(moved), {"to": head, "at": before})
    assert client.get("/api/v1/ready").status_code == 200

    # the file is no longer a database: unreachable, while liveness still answers
    engine.dispose()
    (tmp_path / "web.db").write_bytes(b"not a database" * 100)
    for suffix in ("-wal", "-shm"):
        (tmp_path / f"web.db{suffix}").unlink(missing_ok=True)
    broken = client.get("/api/v1/ready")
    assert broken.status_code == 503 and broken.json()["database"].startswith("unreachable: ")
    assert client.get("/api/v1/health").status_code == 200


@pytest.mark.slow
def test_ready_fails_when_postgresql_stops(tmp_path: Path) -> None:
    from postgres import postgres_bin, postgres_server

    if postgres_bin() is None:
        pytest.skip("PostgreSQL is not installed")
    with postgres_server() as server:
        app = create_app(server.new_database())
        client = TestClient(app)
        assert client.get("/api/v1/ready").status_code == 200
    down = client.get("/api/v1/ready")  # the server is stopped and its folder removed
    assert down.status_code == 503, down.text
    assert down.json()["database"].startswith("unreachable: ") and down.json()["revisions"] == []
    assert client.get("/api/v1/health").status_code == 200


def test_readiness_times_out_on_a_hung_database() -> None:
    class Hung:
        def connect(self):  # type: ignore[no-untyped-def]
            import time

            time.sleep(1.0)
            raise AssertionError("never reached in time")

    state = readiness(Hung(), timeout_s=0.1)  # type: ignore[arg-type]
    assert state.ready is False and state.database == "timeout"


def _families(body: str) -> dict[str, list]:  # type: ignore[type-arg]
    return {f.name: f.samples for f in text_string_to_metric_families(body)}


@pytest.mark.slow  # a fresh store and app: about 2 s on quiet cores, more when shared
def test_metrics_are_for_organisers_and_count_requests_by_route_template(tmp_path: Path) -> None:
    app = _app(tmp_path)
    with app.state.sessions.begin() as session:
        rounds.create_round(session, "r1", fake_splits(tmp_path / "splits"))
        team = rounds.add_team(session, "t1")
        split = rounds.get_split(rounds.get_round(session, "r1"), "test")
        for status in ("queued", "queued", "running", "done"):
            submission = Submission(
                team=team, split=split, artifact_path="", artifact_sha256="x", status="queued"
            )
            session.add(Job(submission=submission, status=status))
    organiser = _token(app, "olga", "organiser")
    annotator = _token(app, "anna", "annotator")
    client = TestClient(app)
    assert client.get("/metrics").status_code == 401
    assert client.get("/metrics", headers=annotator).status_code == 403

    for _ in range(3):
        client.get("/api/v1/health")
    client.get("/leaderboard/rounds/r1", headers=organiser)
    client.get("/no/such/page/12345")
    scrape = client.get("/metrics", headers=organiser)
    assert scrape.status_code == 200 and scrape.headers["content-type"].startswith("text/plain")
    families = _families(scrape.text)

    counts = {
        (s.labels["method"], s.labels["route"], s.labels["status"]): s.value
        for s in families["assay_http_request_duration_seconds"]
        if s.name.endswith("_count")
    }
    assert counts[("GET", "/api/v1/health", "2xx")] == 3
    assert counts[("GET", "/metrics", "4xx")] == 2  # the refused scrapes
    assert ("GET", "/leaderboard/rounds/{name}", "2xx") in counts  # the template, not the round's name
    assert counts[("GET", "<unmatched>", "4xx")] == 1
    assert not any("12345" in route or "r1" in route for _, route, _ in counts)
    jobs = {s.labels["status"]: s.value for s in families["assay_leaderboard_jobs"]}
    assert jobs == {"queued": 2.0, "running": 1.0, "done": 1.0}
    assert families["assay_leaderboard_stale_jobs"][0].value == 1.0  # running with no heartbeat at all
    assert "assay_star_tasks" in families and "assay_background_jobs" in families


def test_json_logs_one_object_a_line_with_request_fields(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("ASSAY_LOG_FORMAT", "json")
    app = _app(tmp_path)
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    access = logging.getLogger("assay.web.access")
    access.addHandler(handler)
    access.setLevel(logging.INFO)
    try:
        TestClient(app).get("/api/v1/health?x=\u00e9")
    finally:
        access.removeHandler(handler)
    lines = stream.getvalue().splitlines()
    assert len(lines) == 1 and lines[0].isascii()
    record = json.loads(lines[0])
    assert record["logger"] == "assay.web.access" and record["level"] == "info"
    assert (record["method"], record["route"], record["path"]) == ("GET", "/api/v1/health", "/api/v1/health")
    assert record["status"] == 422 and record["duration_ms"] > 0  # an undeclared query parameter
    config = uvicorn_log_config("json")
    assert config["formatters"]["main"]["()"] == "assay.web.logs.JsonFormatter"
    try:
        raise ValueError("boom")
    except ValueError:
        exc = logging.LogRecord("x", logging.ERROR, __file__, 1, "failed %s", ("here",), None)
        import sys

        exc.exc_info = sys.exc_info()
    failed = json.loads(JsonFormatter().format(exc))
    assert failed["message"] == "failed here" and "ValueError: boom" in failed["exception"]


@pytest.mark.slow
def test_metrics_sum_every_worker_of_a_multi_worker_server(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import os
    import subprocess
    import sys
    import time
    from concurrent.futures import ThreadPoolExecutor

    import httpx

    from web_server import free_port

    url = f"sqlite:///{tmp_path / 'web.db'}"
    headers = _token(create_app(url), "olga", "organiser")
    shared = tmp_path / "metrics"
    shared.mkdir()
    port = free_port()
    env = {**os.environ, "ASSAY_DB_URL": url, "PROMETHEUS_MULTIPROC_DIR": str(shared)}
    server = subprocess.Popen(
        [sys.executable, "-m", "assay", "serve", "--workers", "2", "--port", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline, answered = time.monotonic() + 120, 0
        while True:
            try:
                if httpx.get(f"{base}/api/v1/health", timeout=2).status_code == 200:
                    answered += 1
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline and server.poll() is None, "server did not start"
            time.sleep(0.5)

        def health(_: int) -> int:
            return httpx.get(f"{base}/api/v1/health", timeout=30).status_code

        # batches of concurrent requests until both workers have answered (each writes its own pid's file)
        with ThreadPoolExecutor(16) as pool:
            for _ in range(20):
                answered += list(pool.map(health, range(32))).count(200)
                if len({f.name.rsplit("_", 1)[-1] for f in shared.glob("histogram_*.db")}) >= 2:
                    break
            else:
                raise AssertionError("one worker answered everything")
        for _ in range(2):  # whichever worker answers the scrape reports both workers' requests
            families = _families(httpx.get(f"{base}/metrics", headers=headers, timeout=10).text)
            counts = {
                s.labels["route"]: s.value
                for s in families["assay_http_request_duration_seconds"]
                if s.name.endswith("_count") and s.labels["status"] == "2xx"
            }
            assert counts["/api/v1/health"] == answered  # not one worker's share: both answered some
    finally:
        server.terminate()
        server.wait(30)
