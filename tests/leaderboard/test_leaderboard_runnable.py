"""Issue 49: an image sent to a round whose live workers cannot run images is refused when sent, in one line.

Before, a container image uploaded to a round served only by workers without podman (the worker image has
none) was accepted (201) and then stayed queued for ever. Now each worker records the submission kinds it
can run and the splits it serves (``fleet.Presence``), and ``submissions.submit`` (the API's, the pages'
and ``assay leaderboard submit``'s one way in) refuses a kind no live worker serving the split can run:
nothing stored. No live worker, a dead one, or an older release's row without kinds: accepted as before.
Hand-written image archives: no podman needed.
"""

from __future__ import annotations

import json
import tarfile
from datetime import timedelta
from pathlib import Path

import pytest
from fastapi import FastAPI
from sqlalchemy import select
from starlette.testclient import TestClient
from typer.testing import CliRunner

from assay.cli import app as cli_app
from assay.errors import UserError
from assay.leaderboard import rounds, runnable
from assay.leaderboard.fleet import Presence, live_workers
from assay.store import Submission
from assay.store.models import Worker, utcnow
from assay.web import accounts
from assay.web.app import create_app
from container_image import ENTRYPOINT, METAPARAMETERS, SCHEMA, handmade_archive
from fake_board import fake_splits

PROJECT = Path(__file__).resolve().parents[2]
CONSTANT = PROJECT / "detectors" / "constant"
NO_PODMAN = (
    "round r1: no live worker can run container-image submissions (its workers lack podman); "
    "submit a detector folder, .tar.gz, .zip or .sif"
)
IMAGE_FILES = {
    "entrypoint.py": ENTRYPOINT.encode(),
    "metaparameters.json": json.dumps(METAPARAMETERS).encode(),
    "metaparameters_schema.json": json.dumps(SCHEMA).encode(),
}


@pytest.fixture
def board(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[FastAPI, TestClient]:
    """An open round r1, team alpha, and an API client of its member tom; the CLI sees the same file."""
    url = f"sqlite:///{tmp_path / 'store.db'}"
    monkeypatch.setenv("ASSAY_DB_URL", url)
    web = create_app(url)
    with web.state.sessions.begin() as session:
        rounds.create_round(session, "r1", fake_splits(tmp_path / "splits"), submission_window_s=3600)
        rounds.set_status(session, "r1", "open")
        alpha = rounds.add_team(session, "alpha")
        tom = accounts.create_user(session, "tom", "a long enough password", ["team_member"], team=alpha)
        token = accounts.create_api_token(session, tom, "ci")
    return web, TestClient(web, headers={"Authorization": f"Bearer {token}"})


def add_worker(web: FastAPI, name: str, kinds: str, age_s: float = 1.0, splits: str = "") -> None:
    """A worker row as ``fleet.Presence`` writes it, last stamped ``age_s`` ago."""
    stamp = utcnow() - timedelta(seconds=age_s)
    with web.state.sessions.begin() as session:
        session.add(
            Worker(
                name=name,
                host=name.split(":")[0],
                pid=int(name.split(":")[1]),
                version="0",
                isolation="bwrap",
                executor="local",
                started_at=stamp,
                heartbeat_at=stamp,
                kinds=kinds,
                splits=splits,
            )
        )


def image(tmp_path: Path) -> Path:
    return handmade_archive(
        tmp_path / "image.tar", [{"bin": b"x"}, IMAGE_FILES], ["python3", "/entrypoint.py"]
    )


def post(client: TestClient, artifact: Path, split: str = "train"):  # type: ignore[no-untyped-def]
    return client.post(
        "/api/v1/leaderboard/rounds/r1/submissions",
        data={"split": split},
        files={"archive": (artifact.name, artifact.read_bytes())},
    )


def stored(web: FastAPI, home: Path) -> tuple[int, list[str]]:
    """Submission rows, and what the artifacts folder holds."""
    with web.state.sessions() as session:
        rows = len(session.scalars(select(Submission)).all())
    folder = home / "artifacts"
    return rows, sorted(p.name for p in folder.iterdir()) if folder.exists() else []


def test_an_image_no_live_worker_can_run_is_refused_in_one_line(
    board: tuple[FastAPI, TestClient], tmp_path: Path, assay_home: Path
) -> None:
    """Was: 201, queued, and never claimed by the workers without podman."""
    web, client = board
    add_worker(web, "w1:1", "folder,archive,sif")
    refused = post(client, image(tmp_path))
    assert (refused.status_code, refused.json()["detail"]) == (400, NO_PODMAN)
    assert stored(web, assay_home) == (0, [])
    for artifact in (str(image(tmp_path)), "podman:localhost/detector:latest"):  # podman is never asked
        result = CliRunner().invoke(
            cli_app,
            ["leaderboard", "submit", artifact, "--team", "alpha", "--round", "r1", "--split", "train"],
        )
        assert isinstance(result.exception, UserError), result.output
        assert str(result.exception) == NO_PODMAN
    assert stored(web, assay_home) == (0, [])


def test_a_sif_is_refused_where_no_live_worker_can_run_one(
    board: tuple[FastAPI, TestClient], tmp_path: Path
) -> None:
    web, _ = board
    add_worker(web, "w1:1", "folder,archive,image")
    sif = tmp_path / "detector.sif"
    sif.write_bytes(b"not read: refused before")
    result = CliRunner().invoke(
        cli_app, ["leaderboard", "submit", str(sif), "--team", "alpha", "--round", "r1", "--split", "train"]
    )
    assert isinstance(result.exception, UserError)
    assert str(result.exception) == (
        "round r1: no live worker can run .sif submissions (its workers lack unsquashfs or a working "
        "bubblewrap); submit a detector folder, .tar.gz, .zip or an image archive "
        "(podman or docker save .tar)"
    )


@pytest.mark.parametrize(
    "workers",
    [
        pytest.param(
            [("w1:1", "folder,archive,sif", 1.0), ("w2:2", "folder,archive,image", 1.0)], id="one-can"
        ),
        pytest.param([], id="no-live-worker"),
        pytest.param([("w1:1", "folder,archive", 300.0)], id="dead-worker"),
        pytest.param([("w1:1", "", 1.0)], id="older-release-row"),
    ],
)
def test_an_image_is_accepted_unless_every_live_worker_lacks_podman(
    board: tuple[FastAPI, TestClient], tmp_path: Path, workers: list[tuple[str, str, float]]
) -> None:
    web, client = board
    for name, kinds, age_s in workers:
        add_worker(web, name, kinds, age_s)
    made = post(client, image(tmp_path))
    assert made.status_code == 201, made.text
    assert made.json()["status"] == "queued"
    with web.state.sessions() as session:
        assert session.scalars(select(Submission.kind)).one() == "image"


def test_a_detector_folder_is_never_refused(board: tuple[FastAPI, TestClient], tmp_path: Path) -> None:
    web, client = board
    add_worker(web, "w1:1", "folder,archive")
    archive = tmp_path / "constant.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(CONSTANT, arcname="detector", filter=lambda m: None if "__pycache__" in m.name else m)
    assert post(client, archive).status_code == 201
    result = CliRunner().invoke(
        cli_app,
        ["leaderboard", "submit", str(CONSTANT), "--team", "alpha", "--round", "r1", "--split", "smoke"],
    )
    assert result.exit_code == 0, result.output


def test_only_the_workers_serving_the_split_count(board: tuple[FastAPI, TestClient], tmp_path: Path) -> None:
    """A pool of its own for sealed jobs (``--splits test,holdout``) with podman does not run train jobs."""
    web, client = board
    add_worker(web, "sealed:1", "folder,archive,image", splits="test,holdout")
    add_worker(web, "practice:2", "folder,archive", splits="train,smoke")
    refused = post(client, image(tmp_path), split="train")
    assert refused.status_code == 400
    assert refused.json()["detail"] == NO_PODMAN.replace(", .zip or .sif", " or .zip")  # and none runs a .sif
    assert post(client, image(tmp_path), split="test").status_code == 201


def test_a_worker_records_what_it_can_run_and_where(board: tuple[FastAPI, TestClient]) -> None:
    web, _ = board
    sessions = web.state.sessions
    with Presence(sessions, "bwrap", "local", ("folder", "archive"), ("train", "smoke")) as presence:
        with web.state.sessions() as session:
            (alive,) = live_workers(session)
        assert (alive.kinds, alive.splits) == (["folder", "archive"], ["train", "smoke"])
        presence.able(("folder", "archive", "image"))  # podman installed since: the next write says so
        with web.state.sessions() as session:
            (alive,) = live_workers(session)
        assert alive.kinds == ["folder", "archive", "image"]


def test_a_machine_runs_images_only_with_podman(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runnable, "podman_missing", lambda: "podman and runc not installed")
    monkeypatch.setattr(runnable, "sif_missing", lambda: None)
    assert runnable.machine_kinds() == ("folder", "archive", "sif")
    monkeypatch.setattr(runnable, "podman_missing", lambda: None)
    assert runnable.machine_kinds() == ("folder", "archive", "image", "sif")
    monkeypatch.setattr(runnable, "podman_missing", lambda: "missing")
    assert runnable.machine_kinds(local=False) == runnable.KINDS  # Ray: the nodes check at run time
