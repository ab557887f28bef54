"""The platform as people deploy it: the Containerfile built with podman from this machine's own wheels, and
the documented pod (``deploy/assay-pod.yaml``: PostgreSQL, the web server, a leaderboard worker) played with
``podman kube play``, serving the platform on PostgreSQL.

Checked from outside, as an operator would: the image runs as uid 10001 with no pip, compiler or wheels in
it; the pod becomes ready; an organiser made with ``assay user`` inside it scrapes ``/metrics``; the server's
logs are JSON lines; the worker keeps running; readiness drops to 503 while PostgreSQL is stopped (liveness
stays 200) and comes back when it starts again.

The images are built from this host's files (``tests/platform_image.py``: no registry here), and reused
while their inputs are unchanged: the first run builds for minutes, later ones start the pod only.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
import uuid
from pathlib import Path

import httpx
import pytest

from container_image import podman_ready
from platform_image import DEPLOY_TESTS
from web_server import free_port

pytestmark = DEPLOY_TESTS
PROJECT = Path(__file__).resolve().parents[2]
POD_FILE = PROJECT / "deploy" / "assay-pod.yaml"
BUILD = PROJECT / "build" / "test-platform"
PASSWORD = "correct horse battery"


@pytest.fixture(scope="module")
def images():  # type: ignore[no-untyped-def]
    reason = podman_ready()
    if reason is not None:
        pytest.skip(reason)
    from platform_image import build
    from postgres import postgres_bin

    if postgres_bin() is None or not Path("/usr/bin/python3").exists():
        pytest.skip("the test images need Debian's postgresql and python3")
    return build(BUILD)


def test_image_runs_unprivileged_without_build_tools(images) -> None:  # type: ignore[no-untyped-def]
    from platform_image import image_bytes, limits, podman

    assert podman("image", "inspect", "--format", "{{.Config.User}}", images.assay) == "10001:10001"
    probe = (
        "import importlib.util, os, shutil, json; print(json.dumps({'uid': os.getuid(), "
        "'pip': importlib.util.find_spec('pip') is not None, "
        "'tools': [t for t in ('gcc', 'cc', 'make', 'ld', 'pip', 'pip3') if shutil.which(t)], "
        "'wheels': any(map(os.path.exists, ('/wheels', '/assay-wheel', '/opt/pip.whl'))), "
        "'home': os.environ['ASSAY_HOME'], 'writable': os.access(os.environ['ASSAY_HOME'], os.W_OK)}))"
    )
    done = subprocess.run(
        [
            "podman",
            "run",
            "--rm",
            "--runtime",
            "runc",
            *limits(),
            "--network",
            "none",
            "--entrypoint",
            "python3",
            images.assay,
            "-c",
            probe,
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    facts = json.loads(done.stdout)
    assert facts == {
        "uid": 10001,
        "pip": False,
        "tools": [],
        "wheels": False,
        "home": "/var/lib/assay",
        "writable": True,
    }
    version = subprocess.run(
        [
            "podman",
            "run",
            "--rm",
            "--runtime",
            "runc",
            *limits(),
            "--network",
            "none",
            images.assay,
            "--version",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert version.returncode == 0 and version.stdout.startswith("assay "), version.stderr
    print(f"image {images.assay}: {image_bytes(images.assay) / 2**20:.0f} MiB")


def _pod_file(images, name: str, port: int, folder: Path) -> Path:  # type: ignore[no-untyped-def]
    """The documented pod with this run's images, port and names (so runs never share a pod or volume)."""
    text = POD_FILE.read_text()
    text = text.replace("docker.io/library/postgres:15-bookworm", images.postgres)
    text = text.replace("localhost/assay:0.1.0", images.assay)
    text = text.replace("hostPort: 8000", f"hostPort: {port}")
    text = text.replace("name: assay\n", f"name: {name}\n", 1)
    for claim in ("assay-db", "assay-home"):
        text = text.replace(f"claimName: {claim}", f"claimName: {name}-{claim}")
    assert text.count(images.assay) == 2 and images.postgres in text and f"hostPort: {port}" in text
    path = folder / "pod.yaml"
    path.write_text(text)
    return path


def _wait(url: str, status: int, timeout: float, headers: dict[str, str] | None = None) -> httpx.Response:
    deadline, last = time.monotonic() + timeout, None
    while time.monotonic() < deadline:
        try:
            last = httpx.get(url, headers=headers, timeout=5)
            if last.status_code == status:
                return last
        except httpx.HTTPError as exc:
            last = exc
        time.sleep(1)
    raise AssertionError(f"{url}: no {status} in {timeout} s (last: {last!r})")


def test_documented_pod_serves_the_platform_on_postgresql(images, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from platform_image import podman

    name, port = f"assay-test-{uuid.uuid4().hex[:8]}", free_port()
    pod_file = _pod_file(images, name, port, tmp_path)
    env = {**os.environ, "CONTAINERS_CONF": str(images.containers_conf)}
    base = f"http://127.0.0.1:{port}"
    started = time.monotonic()
    try:
        played = subprocess.run(
            ["podman", "kube", "play", str(pod_file)], capture_output=True, text=True, env=env
        )
        assert played.returncode == 0, played.stderr
        _wait(f"{base}/api/v1/ready", 200, 240)
        ready_s = time.monotonic() - started
        assert httpx.get(f"{base}/api/v1/health").json()["status"] == "ok"

        # an organiser and a token, made with the CLI inside the pod, scrape the metrics
        add = [
            "podman",
            "exec",
            "-e",
            f"ASSAY_PASSWORD={PASSWORD}",
            f"{name}-web",
            "assay",
            "user",
            "add",
            "olga",
            "--role",
            "organiser",
        ]
        assert subprocess.run(add, capture_output=True, text=True).returncode == 0
        made = subprocess.run(
            ["podman", "exec", f"{name}-web", "assay", "user", "token", "olga", "--name", "prometheus"],
            capture_output=True,
            text=True,
        )
        token = re.search(r"assay_[A-Za-z0-9_\-]+", made.stdout)
        assert token is not None, made.stdout + made.stderr
        bearer = {"Authorization": f"Bearer {token.group(0)}"}
        assert httpx.get(f"{base}/metrics").status_code == 401
        scrape = httpx.get(f"{base}/metrics", headers=bearer)
        assert scrape.status_code == 200
        assert re.search(
            r"assay_http_request_duration_seconds_count"
            r'\{method="GET",route="/api/v1/ready",status="2xx"\} [1-9]',
            scrape.text,
        )
        assert "assay_leaderboard_jobs" in scrape.text and "assay_background_jobs" in scrape.text

        # the server's log is JSON lines; the worker is up and has not failed
        logs = subprocess.run(["podman", "logs", f"{name}-web"], capture_output=True, text=True)
        records = [
            json.loads(line) for line in (logs.stdout + logs.stderr).splitlines() if line.startswith("{")
        ]
        assert any(r.get("logger") == "assay.web.access" and r.get("route") == "/metrics" for r in records)
        worker = podman("inspect", "--format", "{{.State.Status}} {{.RestartCount}}", f"{name}-worker")
        assert worker.startswith("running"), worker

        # the database goes away: not ready (but alive); it comes back: ready again
        podman("stop", "--time", "5", f"{name}-db")
        down = _wait(f"{base}/api/v1/ready", 503, 60)
        assert down.json()["database"].startswith(("unreachable", "timeout")), down.text
        assert httpx.get(f"{base}/api/v1/health").status_code == 200
        podman("start", f"{name}-db")
        _wait(f"{base}/api/v1/ready", 200, 120)
        print(f"pod ready in {ready_s:.0f} s")
    finally:
        subprocess.run(["podman", "pod", "rm", "--force", "--time", "5", name], capture_output=True, env=env)
        subprocess.run(
            ["podman", "volume", "rm", "--force", f"{name}-assay-db", f"{name}-assay-home"],
            capture_output=True,
        )
