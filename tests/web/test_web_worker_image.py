"""The worker image (``podman build --target worker``, by docs/deploy.md's commands: the platform, torch, Ray
and bubblewrap) scores a real detector on a sealed split, inside bubblewrap, inside the container.

The attack it answers: a worker without bubblewrap either refuses every sealed job or, told to run anyway,
runs detectors in the open where they read the ground truth and the database. The platform image has no
bubblewrap, so its worker scores nothing; this one does, run with ``--security-opt unmask=/proc/*`` (podman
masks parts of /proc, and the kernel then refuses the fresh /proc bubblewrap mounts for the detector's pid
namespace; no capability and no ``--privileged`` is needed). Run without that option, the same worker
refuses the sealed job in one line, and no result is written.

Like the platform's image test this builds for minutes the first time: ``make test-deploy`` runs it.
"""

from __future__ import annotations

import json
import secrets
import subprocess
import time
import uuid
from pathlib import Path

import pytest
from sqlalchemy import select

from platform_image import DEPLOY_TESTS

pytestmark = DEPLOY_TESTS
PROJECT = Path(__file__).resolve().parents[2]
BUILD = PROJECT / "build" / "test-platform"
UID = 10001  # the image's user


@pytest.fixture(scope="module")
def worker_image(deploy_store: dict[str, str]) -> str:
    if not Path("/usr/bin/bwrap").exists():
        pytest.skip("the worker image's bubblewrap comes from this host here (no Debian mirror in builds)")
    from platform_image import build

    return build(BUILD)[0].worker


def _programme(folder: Path) -> str:
    """A tiny real round (4 digits MLPs, 1 in test) and two teams in a SQLite store; its URL."""
    from assay.leaderboard import rounds
    from assay.store import open_store
    from platform_image import tiny_round

    splits = tiny_round(folder)
    url = f"sqlite:///{folder / 'store.db'}"
    sessions = open_store(url)
    with sessions.begin() as session:
        rounds.create_round(session, "r1", splits, per_model_timeout_s=300)
        rounds.set_status(session, "r1", "open")
        for team in ("alpha", "beta"):
            rounds.add_team(session, team)
    sessions.kw["bind"].dispose()
    return url


def _submit(folder: Path, url: str, team: str) -> int:
    """The meta-classifier baseline submitted by ``team`` to the test split (one per team and day); the
    id of its queued job. Files written here go to the image's user."""
    from assay.leaderboard import submissions
    from assay.store import Job, open_store

    sessions = open_store(url)
    with sessions.begin() as session:
        artifacts = folder / "home" / "artifacts"
        made = submissions.submit(
            session, artifacts, team, "r1", "test", PROJECT / "detectors" / "meta_classifier"
        )
        assert made.status == "queued", made.validation_errors
        submission_id = made.id
    with sessions() as session:
        job_id = session.scalars(select(Job.id).where(Job.submission_id == submission_id)).one()
    sessions.kw["bind"].dispose()
    subprocess.run(["chown", "-R", f"{UID}:{UID}", str(folder)], check=True)
    return job_id


def _work_once(image: str, folder: Path, url: str, *options: str) -> subprocess.CompletedProcess[str]:
    """``assay leaderboard worker --once`` in the image, the programme's folder at its own path."""
    command = ["podman", "run", "--rm", "--network", "none", *options]
    command += [
        "-v",
        f"{folder}:{folder}",
        "-e",
        f"ASSAY_DB_URL={url}",
        "-e",
        f"ASSAY_HOME={folder / 'home'}",
    ]
    command += [image, "leaderboard", "worker", "--once"]
    return subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)


def _job(url: str, job_id: int) -> tuple[str, dict[str, float | None], str]:
    from assay.store import Job, open_store

    sessions = open_store(url)
    with sessions() as session:
        job = session.get(Job, job_id)
        found = job.status, {r.model_name: r.value for r in job.results}, job.log
    sessions.kw["bind"].dispose()
    return found


def test_worker_image_scores_a_sealed_split_in_bubblewrap(worker_image: str, tmp_path: Path) -> None:
    folder = tmp_path / "programme"
    folder.mkdir()
    url = _programme(folder)
    facts = (
        "import json, os, torch, shutil\n"
        "print(json.dumps([os.getuid(), torch.__version__, shutil.which('bwrap')]))"
    )
    podman_run = ["podman", "run", "--rm", "--network", "none"]
    probe = subprocess.run(
        [*podman_run, "--entrypoint", "python3", worker_image, "-c", facts],
        capture_output=True,
        text=True,
        check=False,
    )
    assert probe.returncode == 0, probe.stderr
    uid, version, bwrap = json.loads(probe.stdout)
    assert uid == UID and version.split("+")[0] == __import__("torch").__version__.split("+")[0] and bwrap

    # before: podman's masked /proc, so bubblewrap cannot start a sandbox; the sealed job is refused
    first = _submit(folder, url, "alpha")
    masked = _work_once(worker_image, folder, url)
    status, values, log = _job(url, first)
    assert "needs bwrap isolation" in masked.stdout + masked.stderr + log, masked.stderr[-2000:]
    assert not any(v is not None for v in values.values())

    # after: /proc unmasked (no capability added, not privileged): every test model scored under bwrap
    second = _submit(folder, url, "beta")
    scored = _work_once(worker_image, folder, url, "--security-opt", "unmask=/proc/*")
    assert scored.returncode == 0, scored.stderr[-3000:]
    models = sorted(p.name for p in (folder / "round" / "splits" / "test" / "models").iterdir())
    status, values, log = _job(url, second)
    assert status == "done", log[-2000:]
    assert sorted(values) == models and all(0.0 <= v <= 1.0 for v in values.values()), values
    isolation = [line for line in log.splitlines() if line.startswith("isolation: ")]
    assert len(isolation) == 1 and isolation[0].startswith("isolation: bwrap: empty read-only root"), log
    assert "no network" in isolation[0] and "the container's hostname" in isolation[0]
    print(isolation[0])


def _detached(name: str, image: str, options: list[str], argv: list[str]) -> None:
    from platform_image import podman

    podman("run", "--detach", "--name", name, *options, image, *argv)


def _logged(name: str, text: str, timeout: float) -> None:
    """Wait until container ``name`` has logged ``text``."""
    deadline = time.monotonic() + timeout
    while True:
        logs = subprocess.run(["podman", "logs", name], capture_output=True, text=True)
        if text in logs.stdout + logs.stderr:
            return
        assert time.monotonic() < deadline, f"{name}: no {text!r} in {timeout} s:\n{logs.stderr[-3000:]}"
        time.sleep(1)


def test_worker_image_runs_a_job_on_ray_nodes_in_containers(worker_image: str, tmp_path: Path) -> None:
    """docs/deploy.md's Ray cluster in containers: the head and the leaderboard worker (the driver) in one
    container, a node in another, both from the worker image on the host's network, one token as a podman
    secret. The job's models run on the node (the head has no CPUs), in bubblewrap, and the job is done."""
    from platform_image import podman
    from web_server import free_port

    folder = tmp_path / "programme"
    folder.mkdir()
    url = _programme(folder)
    job_id = _submit(folder, url, "alpha")
    token, secret = tmp_path / "ray-token", f"assay-test-ray-{uuid.uuid4().hex[:8]}"
    token.write_text(secrets.token_hex(32))
    head, node, port = f"{secret}-head", f"{secret}-node", free_port()
    ray = ["--network", "host", "--security-opt", "unmask=/proc/*", "--pids-limit", "4096"]
    ray += ["--secret", f"{secret},uid={UID},mode=0400", "-e", "RAY_AUTH_MODE=token"]
    ray += ["-e", f"RAY_AUTH_TOKEN_PATH=/run/secrets/{secret}", "-e", "RAY_USAGE_STATS_ENABLED=0"]
    driver = (
        f"ray start --head --port={port} --num-cpus=0 --include-dashboard=false --disable-usage-stats "
        f"&& exec assay leaderboard worker --executor ray --address 127.0.0.1:{port} --once"
    )
    podman("secret", "create", secret, str(token))
    try:
        programme = [
            "-v",
            f"{folder}:{folder}",
            "-e",
            f"ASSAY_DB_URL={url}",
            "-e",
            f"ASSAY_HOME={folder / 'home'}",
        ]
        _detached(head, worker_image, [*ray, *programme, "--entrypoint", "sh"], ["-c", driver])
        _logged(head, "Ray runtime started", 120)
        join = ["start", f"--address=127.0.0.1:{port}", "--block", "--disable-usage-stats", "--num-cpus=1"]
        join.append('--resources={"assay_host": 1}')  # as the docs start a node: sealed runs hold it alone
        _detached(node, worker_image, [*ray, "--entrypoint", "ray"], join)
        exited = podman("wait", head, timeout=600)
        logs = subprocess.run(["podman", "logs", head], capture_output=True, text=True)
        assert exited == "0", logs.stderr[-3000:]
    finally:
        subprocess.run(
            ["podman", "rm", "--force", "--volumes", "--time", "5", head, node], capture_output=True
        )
        subprocess.run(["podman", "secret", "rm", secret], capture_output=True)
    status, values, log = _job(url, job_id)
    assert status == "done" and values and all(v is not None for v in values.values()), log[-2000:]
    assert "isolation: bwrap" in log, log[-2000:]
