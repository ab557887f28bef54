"""A worker's life with a job (issue 49): stopped, it leaves nothing running; each claim is one log line.

SIGTERM or SIGKILL of a worker mid-job, then the job's detector processes and containers are gone within a
few seconds (of the stop, or of the reclaim).

Was, with an image submission: after SIGTERM the detector's podman container ran on under conmon until it
ended by itself (229.5 s); after SIGKILL the next worker reclaimed the job and two containers ran it at
once. Containers are found here by their image, not by the labels the fix puts on them, so these tests
failed before it. Real ``python -m assay leaderboard worker`` subprocesses on a SQLite file; the podman
tests skip where podman is missing, as the other container tests do.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import select, update
from test_leaderboard import fake_detector
from test_leaderboard_container import fake_board, submit  # noqa: F401 (a fixture)
from test_leaderboard_worker_stop import start_worker, wait_for

from assay.store import Job, Submission
from assay.store.models import utcnow
from container_image import build_image, podman_ready
from host_processes import processes_with

MISSING = podman_ready()
SLEEP = "import time; time.sleep(120)"  # the image's --probe code: far past the few seconds a test waits


def job_row(sessions, submission_id: int) -> Job:  # type: ignore[no-untyped-def]
    with sessions() as session:
        job = session.get(Submission, submission_id).job
        session.expunge_all()
        return job


def worker_of(process: subprocess.Popen[str]) -> str:
    return f"{socket.gethostname()}:{process.pid}"


def kill_worker(process: subprocess.Popen[str], signum: int, sessions, submission_id: int) -> None:  # type: ignore[no-untyped-def]
    """Stop the worker; after a SIGKILL its heartbeat is made an hour old, so the next worker reclaims at
    once instead of after ``STALE_AFTER_S``."""
    os.kill(process.pid, signum)
    code = process.wait(10)
    if signum == signal.SIGTERM:
        assert code == 0, process.stderr.read() if process.stderr else ""
        return
    with sessions.begin() as session:
        session.execute(update(Job).values(heartbeat_at=utcnow() - timedelta(hours=1)))


# --- containers ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sleeper(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str]]:
    """The test image's root file system with an entrypoint that sleeps: its docker-archive and image ID;
    removed afterwards from the runner's storage, where the workers loaded it."""
    if MISSING is not None:
        pytest.skip(f"podman: {MISSING}")
    folder = tmp_path_factory.mktemp("sleeper")
    build_image(folder)  # writes rootfs.tar there
    layer = folder / "rootfs.tar"
    tag = "localhost/assay-test-sleeper:" + hashlib.sha256(layer.read_bytes()).hexdigest()[:12]
    entry = json.dumps(["python3", "/entrypoint.py", "--probe", SLEEP])
    podman = ["podman", "import", "--quiet", f"--change=ENTRYPOINT {entry}", str(layer), tag]
    subprocess.run(podman, check=True, capture_output=True)
    archive = folder / "sleeper.tar"
    subprocess.run(
        ["podman", "save", "--quiet", "--format", "docker-archive", "--output", str(archive), tag],
        check=True,
        capture_output=True,
    )
    image_id = subprocess.run(
        ["podman", "image", "inspect", "--format", "{{.Id}}", tag], check=True, capture_output=True, text=True
    ).stdout.strip()
    subprocess.run(["podman", "rmi", "--force", tag], capture_output=True, check=False)
    yield archive, image_id
    from assay.runner.container import ImageSpec, _podman

    subprocess.run([*_podman(ImageSpec("archive", "")), "rmi", "--force", image_id], capture_output=True)


def containers(image_id: str) -> list[str]:
    """Running containers of the image in the runner's private storage, whatever their labels."""
    from assay.runner.container import ImageSpec, _podman

    listed = subprocess.run(
        [*_podman(ImageSpec("archive", "")), "ps", "--quiet", "--filter", f"ancestor={image_id}"],
        capture_output=True,
        text=True,
        check=False,
    )
    return listed.stdout.split()


@pytest.mark.slow
@pytest.mark.skipif(MISSING is not None, reason=f"podman: {MISSING}")
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL])
def test_a_stopped_worker_leaves_no_container_of_its_job(
    fake_board,  # noqa: F811
    sleeper: tuple[Path, str],
    signum: int,
) -> None:
    sessions, artifacts = fake_board
    archive, image_id = sleeper
    made = submit(sessions, artifacts, "alpha", archive)
    assert made.status == "queued", made.validation_errors
    first = start_worker("--workers", "1")
    try:
        wait_for(lambda: containers(image_id), 120)
        kill_worker(first, signum, sessions, made.id)
    finally:
        first.kill()
    if signum == signal.SIGTERM:
        assert job_row(sessions, made.id).status == "queued"
        wait_for(lambda: not containers(image_id), 5)
        return
    second = start_worker("--workers", "1")
    try:
        wait_for(lambda: job_row(sessions, made.id).worker == worker_of(second), 60)
        reclaimed = time.monotonic()
        wait_for(lambda: len(containers(image_id)) <= 1, 5)  # the dead worker's is gone
        while time.monotonic() < reclaimed + 8:  # never two runs of the job at once
            assert len(containers(image_id)) <= 1
            time.sleep(0.2)
        assert containers(image_id), "the reclaiming worker runs the job"
        os.kill(second.pid, signal.SIGTERM)
        assert second.wait(10) == 0
    finally:
        second.kill()
    wait_for(lambda: not containers(image_id), 5)
    job = job_row(sessions, made.id)
    assert job.status == "queued" and "removed 1 container(s) left running" in job.log, job.log


# --- bubblewrap -------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_killed_worker_leaves_no_detector_process(fake_board, tmp_path: Path) -> None:  # noqa: F811
    """Under bubblewrap the detector dies with the worker (``--die-with-parent``, and the runner's
    parent-death signal): nothing of the job runs on after a SIGKILL, with no reclaim needed."""
    sessions, artifacts = fake_board
    token = uuid.uuid4().hex
    body = f"import subprocess, sys\nsubprocess.run([sys.executable, '-c', {SLEEP!r}, {token!r}])"
    made = submit(sessions, artifacts, "alpha", fake_detector(tmp_path / "sleepy", body))
    assert made.status == "queued", made.validation_errors
    worker = start_worker("--workers", "1")
    try:
        wait_for(lambda: processes_with(token), 60)
        time.sleep(0.5)  # past bwrap's own fork (see tests/runner/test_runner_orphans.py)
        os.kill(worker.pid, signal.SIGKILL)
        worker.wait(10)
    finally:
        worker.kill()
    wait_for(lambda: not processes_with(token), 5)


# --- the log ------------------------------------------------------------------------------------------------


def test_each_claim_and_reclaim_is_one_log_line(
    fake_board,  # noqa: F811
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Was: the worker logged no line when it claimed or reclaimed a job, only when one ended."""
    from assay.leaderboard.fleet import worker_name
    from assay.leaderboard.worker import work
    from assay.runner import LocalExecutor

    sessions, artifacts = fake_board
    answer = "open(args.result_filepath, 'w').write('0.25')"
    orphan = submit(sessions, artifacts, "alpha", fake_detector(tmp_path / "orphan", answer))
    fresh = submit(sessions, artifacts, "beta", fake_detector(tmp_path / "fresh", answer), split="smoke")
    with sessions.begin() as session:
        session.execute(
            update(Job)
            .where(Job.submission_id == orphan.id)
            .values(status="running", worker="gone:1", heartbeat_at=utcnow() - timedelta(hours=1))
        )
    with caplog.at_level("INFO", logger="assay.leaderboard.worker"):
        assert work(sessions, LocalExecutor(2), once=True) == 2
    claims = [r for r in caplog.records if " by " in r.getMessage() and "claimed" in r.getMessage()]
    me = worker_name()
    orphan_job, fresh_job = job_row(sessions, orphan.id).id, job_row(sessions, fresh.id).id
    assert [r.getMessage() for r in claims] == [
        f"job {orphan_job} reclaimed from gone:1 (no heartbeat) by {me}: submission {orphan.id}, team alpha, "
        "split train",
        f"job {fresh_job} claimed by {me}: submission {fresh.id}, team beta, split smoke",
    ]
    assert claims[0].fields == {  # type: ignore[attr-defined]  (JSON logs carry them as fields)
        "job": orphan_job,
        "submission": orphan.id,
        "team": "alpha",
        "split": "train",
        "worker": me,
        "reclaimed_from": "gone:1",
    }


def test_a_run_that_lost_its_job_records_nothing(fake_board, tmp_path: Path) -> None:  # noqa: F811
    """A worker whose heartbeat went stale while it ran (the database out of reach, say) finds its job
    taken over, and the new worker killing this run's containers: what its detectors answered after that
    is not stored, so no model is scored from a run the job no longer belongs to (was: stored, and the
    new worker skipped those models as done)."""
    from assay.leaderboard.harness import run_models
    from assay.leaderboard.worker import claim_job
    from assay.runner import LocalExecutor

    sessions, artifacts = fake_board
    answer = "open(args.result_filepath, 'w').write('0.25')"
    made = submit(sessions, artifacts, "alpha", fake_detector(tmp_path / "detector", answer))
    job_id = claim_job(sessions, "old:1")
    assert job_id is not None

    class TakenOver(LocalExecutor):
        def map(self, tasks, on_result=None):  # type: ignore[no-untyped-def]
            with sessions.begin() as session:
                session.execute(update(Job).where(Job.id == job_id).values(worker="new:2"))
            return super().map(tasks, on_result)

    run_models(sessions, job_id, TakenOver(1))
    with sessions() as session:
        assert session.get(Submission, made.id).job.results == []


def test_workers_claiming_at_once_take_each_job_once(db_url: str, tmp_path: Path) -> None:
    """The claim reads its candidate, then updates it only as it was read: of workers racing for the same
    jobs, each job goes to exactly one (on SQLite and PostgreSQL)."""
    import threading

    from assay.leaderboard import rounds, submissions
    from assay.leaderboard.worker import claim_job
    from assay.store import open_store
    from fake_board import fake_splits

    sessions = open_store(db_url)
    with sessions.begin() as session:
        rounds.create_round(session, "r1", fake_splits(tmp_path / "splits"), submission_window_s=0)
        rounds.set_status(session, "r1", "open")
        rounds.add_team(session, "alpha")
        for i in range(6):
            detector = fake_detector(tmp_path / f"d{i}", f"# {i}\n")
            submissions.submit(session, tmp_path / "artifacts", "alpha", "r1", "train", detector)
    claimed: list[tuple[str, int]] = []
    start = threading.Barrier(4)

    def claim_all(name: str) -> None:
        start.wait()
        for _ in range(12):  # a race lost is None, as an empty queue is: try on
            if (job := claim_job(sessions, name)) is not None:
                claimed.append((name, job))

    threads = [threading.Thread(target=claim_all, args=(f"w:{n}",)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    jobs = [job for _, job in claimed]
    assert sorted(jobs) == sorted(set(jobs)) and len(jobs) == 6, claimed
    with sessions() as session:
        assert {job.worker for job in session.scalars(select(Job))} <= {f"w:{n}" for n in range(4)}


@pytest.mark.slow
@pytest.mark.skipif(MISSING is not None, reason=f"podman: {MISSING}")
def test_a_task_removes_a_dead_holders_containers_of_its_job_on_its_node(sleeper) -> None:  # type: ignore[no-untyped-def]
    """On a Ray node nobody runs the harness's own sweep: the first task of a job there removes the
    containers of that job another worker started (a dead holder's), and keeps its own worker's and other
    jobs'. Before, they ran on until podman's ``--timeout``."""
    from assay.runner.container import ImageSpec, _podman, owner_labels, remove_other_runs, ulimit_flags

    archive, image_id = sleeper
    podman = _podman(ImageSpec("archive", ""))
    subprocess.run([*podman, "load", "--quiet", "--input", str(archive)], check=True, capture_output=True)
    job = str(900000 + os.getpid() % 1000)
    started = {}
    for key, labels in {
        "dead": owner_labels(int(job), "gone-host:1"),
        "mine": owner_labels(int(job), "this-host:2"),
        "other job": owner_labels(int(job) + 1, "gone-host:1"),
    }.items():
        flags = [f"--label={k}={v}" for k, v in labels.items()]
        run = [*podman, "run", "--detach", "--network", "none", *ulimit_flags(), *flags, image_id]
        started[key] = subprocess.run(run, check=True, capture_output=True, text=True).stdout.strip()
    try:
        assert remove_other_runs(owner_labels(int(job), "this-host:2")) == 1
        running = set(containers(image_id))
        assert not any(started["dead"].startswith(c) for c in running), running
        assert {key for key, cid in started.items() if any(cid.startswith(c) for c in running)} == {
            "mine",
            "other job",
        }
        assert remove_other_runs(owner_labels(int(job), "this-host:2")) == 0  # once per job and worker
    finally:
        subprocess.run([*podman, "rm", "--force", "--time", "0", *started.values()], capture_output=True)
