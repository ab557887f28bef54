"""GPU rounds: a round may require GPUs, and a worker that lacks them leaves its jobs for one that has them.

No machine these tests run on has a GPU. The worker's host is made explicit either way: an empty dev folder
(``no_gpus``: this machine as one without GPUs, whatever it really has) or fake NVIDIA nodes made with
``os.mknod`` and fake driver libraries (``fake_gpus``, tests/fake_gpu.py), on which a real worker runs a
GPU round's job under bubblewrap with the fake nodes bound in. CUDA itself is not exercised here.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from sqlalchemy import select
from test_leaderboard import fake_detector

from assay.errors import UserError
from assay.leaderboard import rounds, submissions, views
from assay.leaderboard import worker as worker_module
from assay.leaderboard.fleet import live_workers
from assay.leaderboard.preflight import Preflight
from assay.leaderboard.worker import work
from assay.runner import LocalExecutor
from assay.store import Job, open_store
from assay.store.web_models import WebAuditEvent
from fake_board import fake_splits
from fake_gpu import fake_gpus, no_gpus  # noqa: F401

# the detector answers 0.25 when it sees exactly one GPU node, numbered 0 inside, and 0.75 otherwise
SEES_ONE_GPU = (
    "import glob\n"
    "gpus = [p for p in glob.glob('/dev/nvidia*') if p[len('/dev/nvidia'):].isdigit()]\n"
    "one = gpus == ['/dev/nvidia0'] and os.environ.get('CUDA_VISIBLE_DEVICES') == '0'\n"
    "open(args.result_filepath, 'w').write('0.25' if one else '0.75')"
)


def reason(host) -> str:
    """The line a worker without GPUs gives for ``gpu-r1``."""
    return f"round gpu-r1 needs 1 GPU: no NVIDIA device here ({host.dev}/nvidia0 missing)"


@pytest.fixture
def board(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Two open rounds, ``cpu-r1`` and ``gpu-r1`` (one GPU per run), practice runs allowed unisolated, and
    one team."""
    url = f"sqlite:///{tmp_path / 'lb.db'}"
    monkeypatch.setenv("ASSAY_DB_URL", url)
    sessions = open_store(url)
    with sessions.begin() as session:
        for name, gpus in (("cpu-r1", 0), ("gpu-r1", 1)):
            rounds.create_round(session, name, fake_splits(tmp_path / name), allow_unisolated=True, gpus=gpus)
            rounds.set_status(session, name, "open")
        rounds.add_team(session, "alpha")
    return sessions


def submit(sessions, tmp_path: Path, round_name: str, body: str = SEES_ONE_GPU) -> int:
    """A train-split submission of team alpha to ``round_name``; its job's id."""
    with sessions.begin() as session:
        folder = fake_detector(tmp_path / f"detector-{round_name}", body, round_name)
        made = submissions.submit(session, tmp_path / "artifacts", "alpha", round_name, "train", folder)
        return session.scalars(select(Job.id).where(Job.submission_id == made.id)).one()


def job(sessions, job_id: int) -> Job:
    with sessions() as session:
        found = session.get(Job, job_id)
        found.results  # noqa: B018 (loaded before the session closes)
        session.expunge_all()
        return found


def test_a_worker_without_gpus_leaves_a_gpu_rounds_job_queued_and_runs_the_cpu_round(
    board,
    no_gpus,  # noqa: F811
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Before: a round could not ask for GPUs, so a GPU detector ran wherever a worker was and failed on the
    team's account. Now the worker names what it lacks in one line and takes only the CPU round's job."""
    gpu_job, cpu_job = submit(board, tmp_path, "gpu-r1"), submit(board, tmp_path, "cpu-r1")
    why = reason(no_gpus)
    with caplog.at_level(logging.WARNING), pytest.raises(worker_module.CannotWork) as stopped:
        work(board, LocalExecutor(1), once=True)
    assert str(stopped.value) == why  # the one line, and nothing about the CPU round
    assert any(why in record.getMessage() for record in caplog.records)
    waiting = job(board, gpu_job)
    assert (waiting.status, waiting.attempts, waiting.worker, waiting.results) == ("queued", 0, None, [])
    ran = job(board, cpu_job)
    assert ran.status == "done" and {r.value for r in ran.results} == {0.75}  # no GPU node inside


def test_the_reason_is_in_the_workers_status_line(board, no_gpus, tmp_path: Path) -> None:  # noqa: F811
    """A worker that stays up shows the GPU round's line in its heartbeat row (the status page's source)."""
    gpu_job = submit(board, tmp_path, "gpu-r1")
    stopper = worker_module.Stopper()
    loop = threading.Thread(
        target=work, args=(board, LocalExecutor(1)), kwargs={"poll_s": 0.1, "stopper": stopper}
    )
    loop.start()
    try:
        deadline, alive = time.monotonic() + 30, []
        while time.monotonic() < deadline:
            with board() as session:
                alive = live_workers(session)
            if alive and not alive[0].healthy:
                break
            time.sleep(0.1)
        assert len(alive) == 1 and alive[0].job_id is None
        assert (
            alive[0].problem
            == f"round gpu-r1 needs 1 GPU: no NVIDIA device here ({no_gpus.dev}/nvidia0 missing)"
        )
    finally:
        stopper.event.set()
        loop.join(30)
    assert job(board, gpu_job).status == "queued"


def test_an_open_gpu_round_is_named_before_any_job_arrives(board, no_gpus) -> None:  # noqa: F811
    ready = Preflight(board).check(Job.status == "queued")
    assert ready.servable == [] and ready.blocked == 0
    assert ready.problems == [
        f"round gpu-r1 needs 1 GPU: no NVIDIA device here ({no_gpus.dev}/nvidia0 missing)"
    ]


def test_a_worker_with_gpus_runs_the_gpu_round_with_exactly_one_gpu(board, fake_gpus, tmp_path: Path) -> None:  # noqa: F811
    """On the fake two-GPU host the same job is served, and its detector sees one GPU node, numbered 0: the
    round's count reached the sandbox (``Limits.gpus``)."""
    if Preflight(board).machine()["bwrap"] is not None:
        pytest.skip("bubblewrap does not work here: the GPU nodes are bound by it")
    gpu_job, cpu_job = submit(board, tmp_path, "gpu-r1"), submit(board, tmp_path, "cpu-r1")
    assert Preflight(board).check(Job.status == "queued").problems == []
    assert work(board, LocalExecutor(1), once=True) == 2
    assert {r.value for r in job(board, gpu_job).results} == {0.25}
    assert {r.value for r in job(board, cpu_job).results} == {0.75}


def test_a_rounds_gpus_are_set_audited_and_shown(board) -> None:
    with board.begin() as session:
        assert rounds.set_gpus(session, "cpu-r1", 2) == ["gpus 0 -> 2"]
        assert rounds.set_gpus(session, "cpu-r1", 2) == []  # no change, nothing written
        with pytest.raises(UserError, match=r"--gpus: -1 must be a whole number of GPUs from 0 to 64"):
            rounds.set_gpus(session, "cpu-r1", -1)
        with pytest.raises(UserError, match=r"--gpus: 1.5 must be a whole number"):
            rounds.create_round(session, "bad", "/nowhere", gpus=1.5)
    with board() as session:
        details = session.scalars(select(WebAuditEvent.detail).order_by(WebAuditEvent.id)).all()
        assert details[-1] == "gpus 0 -> 2"
        assert [d.endswith(", gpus 1") for d in details if d.startswith("disclosure")] == [False, True]
        listed = {r.name: r.gpus for r in views.round_listing(session)}
        assert listed == {"cpu-r1": 2, "gpu-r1": 1}
        assert views.round_out(rounds.get_round(session, "gpu-r1")).gpus == 1


@pytest.mark.slow
def test_gpus_from_the_command_line(tmp_path: Path) -> None:
    env = {**os.environ, "ASSAY_DB_URL": f"sqlite:///{tmp_path / 'cli.db'}", "COLUMNS": "200"}
    command = [sys.executable, "-m", "assay", "leaderboard"]
    run = lambda *args: subprocess.run([*command, *args], capture_output=True, text=True, env=env)  # noqa: E731
    splits = str(fake_splits(tmp_path / "splits"))
    assert run("round", "create", "g1", "--dataset", splits, "--gpus", "1").returncode == 0
    changed = run("round", "set", "g1", "--gpus", "2")
    assert changed.returncode == 0 and "gpus 1 -> 2" in changed.stdout
    refused = run("round", "set", "g1", "--gpus", "-1")
    assert refused.returncode == 2 and "Invalid value for '--gpus'" in refused.stderr
    listed = run("round", "list")
    assert listed.returncode == 0 and "gpus" in listed.stdout
    row = next(line for line in listed.stdout.splitlines() if " g1 " in line)
    assert " 2 " in row


def test_rounds_made_before_gpu_rounds_need_none(tmp_path: Path) -> None:
    """Migration 0017 on a database at 0016 holding a round: the round is upgraded to ``gpus`` 0."""
    from alembic import command
    from alembic.config import Config
    from sqlalchemy import create_engine, text

    from assay.store.engine import MIGRATIONS

    url = f"sqlite:///{tmp_path / 'old.db'}"
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    engine = create_engine(url)
    with engine.begin() as connection:
        config.attributes["connection"] = connection
        command.upgrade(config, "0016_leaderboard_public")
        connection.execute(
            text(
                "INSERT INTO rounds (name, dataset, status, metric, submission_window_s, per_model_timeout_s,"
                " total_timeout_s, memory_bytes, plateau_delta, plateau_days, created_at)"
                " VALUES ('old', '/d', 'open', 'cross_entropy', 1, 1, 1, 1, 0.1, 1, '2026-01-01 00:00:00')"
            )
        )
    engine.dispose()
    sessions = open_store(url)
    with sessions() as session:
        assert rounds.get_round(session, "old").gpus == 0


def test_the_rounds_page_says_what_hardware_it_runs_on(tmp_path: Path) -> None:
    from assay.web import accounts
    from assay.web.app import create_app
    from web_client import PASSWORD, signed_in

    app = create_app(f"sqlite:///{tmp_path / 'web.db'}")
    with app.state.sessions.begin() as session:
        for name, gpus in (("cpu-r1", 0), ("gpu-r1", 1), ("gpu-r2", 2)):
            rounds.create_round(session, name, fake_splits(tmp_path / name), gpus=gpus)
            rounds.set_status(session, name, "open")
        accounts.create_user(session, "vic", PASSWORD, ["viewer"])
    vic = signed_in(app, "vic")
    shown = {
        name: vic.get(f"/leaderboard/rounds/{name}").text.split('id="gpus">')[1].split("<")[0]
        for name in ("cpu-r1", "gpu-r1", "gpu-r2")
    }
    assert shown == {
        "cpu-r1": "CPU only (no GPU)",
        "gpu-r1": "1 NVIDIA GPU per detector run",
        "gpu-r2": "2 NVIDIA GPUs per detector run",
    }
    listed = {r["name"]: r["gpus"] for r in vic.get("/api/v1/leaderboard/rounds").json()["items"]}
    assert listed == {"cpu-r1": 0, "gpu-r1": 1, "gpu-r2": 2}
