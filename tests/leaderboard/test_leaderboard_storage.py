"""Storage integrity of leaderboard submissions, on SQLite and PostgreSQL: per-team quotas checked before
anything is kept (a zip bomb leaves no bytes behind), retention of practice artifacts that never deletes a
folder another submission holds, garbage collection (orphans, stale temp folders, dry runs), identical
artifacts across teams, and folders or archives holding links.

The round is a small fake ``assay zoo split`` folder (empty model files): nothing here runs a detector, so
jobs are finished by writing their status.
"""

from __future__ import annotations

import io
import json
import os
import random
import shutil
import tarfile
import time
import zipfile
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker
from starlette.testclient import TestClient
from typer.testing import CliRunner

from assay.errors import UserError
from assay.leaderboard import rounds, storage, submissions
from assay.leaderboard.cli import app as leaderboard_cli
from assay.store import Job, Round, Submission, Team, open_store
from assay.store.models import utcnow
from assay.web import accounts
from assay.web.app import create_app

PROJECT = Path(__file__).resolve().parents[2]
CONSTANT = PROJECT / "detectors" / "constant"
MODELS = ("id-00000000", "id-00000001", "id-00000002", "id-00000003")
MiB = 2**20
T0 = utcnow() - timedelta(days=1)


def fake_splits(root: Path) -> Path:
    """An ``assay zoo split`` folder: train, test, holdout (with sequestered views), 4 empty models each."""
    (root).mkdir(parents=True)
    (root / "split.json").write_text("{}")
    for view in ("train", "test", "test-sequestered", "holdout", "holdout-sequestered"):
        for name in MODELS:
            (root / view / "models" / name).mkdir(parents=True)
            (root / view / "models" / name / "model.pt").write_bytes(b"")
    return root


def detector(folder: Path, payload: bytes = b"") -> Path:
    """The constant detector with ``payload`` as ``learned_parameters/blob.bin``: distinct payloads make
    distinct artifacts, and equal lengths equal sizes."""
    shutil.copytree(CONSTANT, folder, ignore=shutil.ignore_patterns("__pycache__"))
    (folder / "learned_parameters").mkdir(exist_ok=True)
    (folder / "learned_parameters" / "blob.bin").write_bytes(payload)
    return folder


def noise(size: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(size)


def disk_bytes(folder: Path) -> int:
    """Every byte under ``folder`` (temp folders included): what the artifacts folder costs."""
    return sum(p.lstat().st_size for p in folder.rglob("*") if p.is_file()) if folder.exists() else 0


def stored(artifacts: Path) -> set[str]:
    """The artifact folders on disk (temp folders left out)."""
    return (
        {p.name for p in artifacts.iterdir() if not p.name.startswith(".")} if artifacts.exists() else set()
    )


@pytest.fixture
def lab(db_url: str, tmp_path: Path):  # type: ignore[no-untyped-def]
    """``make(**settings)``: an open round r1 with those settings and teams alpha and beta; the artifacts
    folder."""
    sessions = open_store(db_url)
    dataset = fake_splits(tmp_path / "splits")

    def make(**settings: object) -> sessionmaker[Session]:
        with sessions.begin() as session:
            rounds.create_round(session, "r1", dataset, submission_window_s=3600, **settings)
            rounds.set_status(session, "r1", "open")
            rounds.add_team(session, "alpha")
            rounds.add_team(session, "beta")
        return sessions

    return make, tmp_path / "artifacts"


def submit(sessions, artifacts: Path, team: str, artifact: Path, split: str = "test", at: float = 0.0):  # type: ignore[no-untyped-def]
    """Submit at ``at`` hours after T0; the submission, detached."""
    with sessions.begin() as session:
        made = submissions.submit(
            session, artifacts, team, "r1", split, artifact, now=T0 + timedelta(hours=at)
        )
        session.expunge(made)
        return made


def finish(sessions, *made: Submission) -> None:  # type: ignore[no-untyped-def]
    with sessions.begin() as session:
        for submission in made:
            session.scalars(select(Job).where(Job.submission_id == submission.id)).one().status = "done"


def team_usage(sessions, team: str) -> tuple[int, int]:  # type: ignore[no-untyped-def]
    with sessions() as session:
        team_id = session.scalar(select(Team.id).where(Team.name == team))
        round_id = session.scalar(select(Round.id).where(Round.name == "r1"))
        return storage.usage(session, team_id, round_id)


# --- quotas --------------------------------------------------------------------------------------------


def test_a_zip_bomb_over_the_quota_leaves_no_bytes(lab, tmp_path: Path) -> None:
    make, artifacts = lab
    sessions = make(quota_bytes=50 * MiB)
    bomb = tmp_path / "bomb.zip"
    with zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as archive:
        for path in CONSTANT.rglob("*"):
            if path.is_file():
                archive.write(path, f"det/{path.relative_to(CONSTANT)}")
        with archive.open("det/learned_parameters/zeros.bin", "w") as member:
            for _ in range(100):
                member.write(bytes(MiB))
    assert bomb.stat().st_size < MiB
    artifacts.mkdir()
    before = disk_bytes(artifacts)
    made = submit(sessions, artifacts, "alpha", bomb)
    assert made.status == "rejected" and made.validation_errors.startswith("storage quota:")
    assert "team 'alpha' stores 0 artifact(s) (0.0 MiB) in round 'r1'" in made.validation_errors
    assert "would exceed 50.0 MiB" in made.validation_errors and "\n" not in made.validation_errors
    assert disk_bytes(artifacts) == before and list(artifacts.iterdir()) == []
    assert made.artifact_path == ""
    with sessions() as session:
        assert session.scalars(select(Job)).all() == []


def test_a_small_tar_gz_declaring_a_huge_member_is_refused_from_its_header(tmp_path: Path) -> None:
    """A .tar.gz whose first header declares a 3 GiB member, followed by only 1 MiB of its data: a check
    that reads from the headers refuses it with the limit; one that inflated members to find the next
    header (``getmembers``) would run off the end of the stream instead."""
    import gzip

    info = tarfile.TarInfo("det/zeros.bin")
    info.size = 3 * 2**30
    bomb = tmp_path / "bomb.tar.gz"
    bomb.write_bytes(gzip.compress(info.tobuf(format=tarfile.PAX_FORMAT) + bytes(MiB)))
    with pytest.raises(UserError, match="unpacks to at least 3221225472 bytes; the limit is"):
        submissions.unpack(bomb, tmp_path / "out")
    assert not (tmp_path / "out").exists() or list((tmp_path / "out").rglob("*")) == []
    with tarfile.open(bomb) as archive, pytest.raises((tarfile.ReadError, EOFError)):
        archive.getmembers()  # the old way: it must inflate the whole member to look past it


def test_the_exact_quota_check_after_unpacking_keeps_nothing(lab, tmp_path: Path) -> None:
    """B declares the very size of A, which alpha holds (it might be A again), so only the check after
    unpacking can refuse it."""
    make, artifacts = lab
    sessions = make(quota_bytes=3 * MiB, keep_practice=5)
    a = submit(sessions, artifacts, "alpha", detector(tmp_path / "a", noise(2 * MiB, 1)), "train")
    assert a.status == "queued" and a.artifact_bytes > 2 * MiB
    assert team_usage(sessions, "alpha") == (a.artifact_bytes, 1)
    before = disk_bytes(artifacts)
    b = submit(sessions, artifacts, "alpha", detector(tmp_path / "b", noise(2 * MiB, 2)), "train", at=1)
    assert b.status == "rejected" and b.validation_errors.startswith("storage quota: team 'alpha' stores 1")
    assert b.artifact_sha256 != a.artifact_sha256 and b.artifact_bytes == a.artifact_bytes
    assert disk_bytes(artifacts) == before and stored(artifacts) == {a.artifact_sha256}
    # the same bytes again, as an archive on another split: alpha holds them, so they cost nothing
    archive = shutil.make_archive(str(tmp_path / "a"), "gztar", tmp_path, "a")
    again = submit(sessions, artifacts, "alpha", Path(archive), "test", at=2)
    assert again.status == "queued" and again.artifact_sha256 == a.artifact_sha256
    assert team_usage(sessions, "alpha") == (a.artifact_bytes, 1)
    # beta's quota is its own: the same bytes cost beta their size
    beta = submit(sessions, artifacts, "beta", tmp_path / "b", "train", at=3)
    assert beta.status == "queued" and team_usage(sessions, "beta") == (beta.artifact_bytes, 1)


def test_the_artifact_count_quota(lab, tmp_path: Path) -> None:
    make, artifacts = lab
    sessions = make(quota_artifacts=2, keep_practice=5)
    made = [
        submit(sessions, artifacts, "alpha", detector(tmp_path / f"d{i}", noise(100 + i, i)), "train", at=i)
        for i in range(3)
    ]
    assert [m.status for m in made] == ["queued", "queued", "rejected"]
    assert made[2].validation_errors.startswith("artifact quota: team 'alpha' stores 2 artifact(s)")
    assert made[2].validation_errors.endswith("the limit is 2 artifact(s)")
    assert stored(artifacts) == {made[0].artifact_sha256, made[1].artifact_sha256}
    again = submit(sessions, artifacts, "alpha", tmp_path / "d1", "smoke", at=4)  # held already: free
    assert again.status == "queued"


# --- retention -----------------------------------------------------------------------------------------


def test_retention_keeps_the_latest_practice_artifacts(lab, tmp_path: Path) -> None:
    make, artifacts = lab
    sessions = make(keep_practice=2)
    a = submit(sessions, artifacts, "alpha", detector(tmp_path / "a", b"a"), "train", at=0)
    b = submit(sessions, artifacts, "alpha", detector(tmp_path / "b", b"b"), "smoke", at=1)
    finish(sessions, b)
    c = submit(sessions, artifacts, "alpha", detector(tmp_path / "c", b"c"), "train", at=2)
    finish(sessions, c)
    # a is past the latest two, but its job is still queued: the worker needs its files
    assert stored(artifacts) == {a.artifact_sha256, b.artifact_sha256, c.artifact_sha256}
    finish(sessions, a)
    d = submit(sessions, artifacts, "alpha", detector(tmp_path / "d", b"d"), "train", at=3)
    assert stored(artifacts) == {c.artifact_sha256, d.artifact_sha256}
    with sessions() as session:
        removed = {s.id for s in session.scalars(select(Submission)) if s.artifact_removed_at is not None}
    assert removed == {a.id, b.id}
    assert team_usage(sessions, "alpha") == (c.artifact_bytes + d.artifact_bytes, 2)


def test_retention_never_deletes_what_another_team_runs_on_test(lab, tmp_path: Path) -> None:
    make, artifacts = lab
    sessions = make(keep_practice=1)
    x = detector(tmp_path / "x", b"x")
    theirs = submit(sessions, artifacts, "beta", x, "test", at=0)
    finish(sessions, theirs)
    mine = submit(sessions, artifacts, "alpha", x, "train", at=1)
    finish(sessions, mine)
    later = submit(sessions, artifacts, "alpha", detector(tmp_path / "y", b"y"), "train", at=2)
    assert mine.artifact_sha256 == theirs.artifact_sha256
    assert stored(artifacts) == {theirs.artifact_sha256, later.artifact_sha256}  # beta's test still holds x
    with sessions() as session:
        assert session.get(Submission, mine.id).artifact_removed_at is not None  # type: ignore[union-attr]
    assert team_usage(sessions, "alpha") == (later.artifact_bytes, 1)


# --- garbage collection --------------------------------------------------------------------------------


def _age(path: Path, hours: float) -> Path:
    stamp = time.time() - hours * 3600
    os.utime(path, (stamp, stamp))
    return path


def test_gc_removes_orphans_and_stale_temp_folders_and_dry_run_removes_nothing(lab, tmp_path: Path) -> None:
    make, artifacts = lab
    sessions = make(keep_practice=5)
    made = [
        submit(sessions, artifacts, "alpha", detector(tmp_path / f"d{i}", bytes([i]) * 1000), "train", at=i)
        for i in range(3)
    ]
    finish(sessions, *made)
    shared = submit(sessions, artifacts, "beta", tmp_path / "d0", "test", at=3)  # beta's test holds d0
    orphan_old, orphan_new = "a" * 64, "b" * 64
    for name in (orphan_old, orphan_new, ".incoming-old", ".incoming-new", ".upload-old", "notes"):
        (artifacts / name).mkdir()
        (artifacts / name / "file").write_bytes(b"z" * 5000)
    for name in (orphan_old, ".incoming-old", ".upload-old", "notes"):
        _age(artifacts / name, 2)
    with sessions.begin() as session:
        session.scalars(select(Round)).one().keep_practice = 1  # d0 and d1 now past alpha's latest one

    listing, before = sorted(p.name for p in artifacts.iterdir()), disk_bytes(artifacts)
    with sessions.begin() as session:
        dry = storage.collect_garbage(session, artifacts, dry_run=True)
    expected = sorted([orphan_old, ".incoming-old", ".upload-old", made[1].artifact_sha256])
    assert sorted(dry.removed) == expected and sorted(dry.released) == [made[0].id, made[1].id]
    assert sorted(p.name for p in artifacts.iterdir()) == listing and disk_bytes(artifacts) == before
    with sessions() as session:
        assert all(s.artifact_removed_at is None for s in session.scalars(select(Submission)))

    with sessions.begin() as session:
        report = storage.collect_garbage(session, artifacts)
    assert sorted(report.removed) == expected and report.bytes_freed == dry.bytes_freed > 15_000
    assert before - disk_bytes(artifacts) == report.bytes_freed
    assert sorted(p.name for p in artifacts.iterdir()) == sorted(
        [shared.artifact_sha256, made[2].artifact_sha256, orphan_new, ".incoming-new", "notes"]
    )
    with sessions.begin() as session:
        assert storage.collect_garbage(session, artifacts).removed == []  # nothing left to do


def test_cli_round_settings_and_gc(tmp_path: Path, assay_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ASSAY_DB_URL", f"sqlite:///{tmp_path / 'cli.db'}")
    runner = CliRunner()
    created = runner.invoke(
        leaderboard_cli,
        ["round", "create", "r1", "--dataset", str(fake_splits(tmp_path / "splits")), "--quota-gb", "0.5",
         "--quota-artifacts", "7", "--keep-practice", "3", "--scratch-gb", "0.25", "--max-processes", "64",
         "--allow-unisolated"],
    )  # fmt: skip
    assert created.exit_code == 0, created.output
    with open_store()() as session:
        round_ = session.scalars(select(Round)).one()
        assert (round_.quota_bytes, round_.quota_artifacts, round_.keep_practice) == (2**29, 7, 3)
        assert (round_.scratch_bytes, round_.max_processes, round_.allow_unisolated) == (2**28, 64, True)
    orphan = assay_home / "artifacts" / ("c" * 64)
    orphan.mkdir(parents=True)
    (orphan / "file").write_bytes(b"z" * 2048)
    _age(orphan, 3)
    dry = runner.invoke(leaderboard_cli, ["gc", "--dry-run", "--json"])
    assert dry.exit_code == 0, dry.output
    assert json.loads(dry.output) == {
        "dry_run": True,
        "released": [],
        "removed": ["c" * 64],
        "bytes_freed": 2048,
    }
    assert orphan.is_dir()
    done = runner.invoke(leaderboard_cli, ["gc"])
    assert done.exit_code == 0 and "removed 1 folder(s)" in done.output and not orphan.exists()


# --- identical artifacts across teams ------------------------------------------------------------------


def test_identical_bytes_from_another_team_run_for_that_team(lab, tmp_path: Path) -> None:
    make, artifacts = lab
    sessions = make()
    x = detector(tmp_path / "x", b"x")
    first = submit(sessions, artifacts, "alpha", x, "test", at=0)
    archive = Path(shutil.make_archive(str(tmp_path / "x"), "zip", tmp_path, "x"))
    copied = submit(sessions, artifacts, "beta", archive, "test", at=0.1)
    assert first.status == copied.status == "queued" and copied.artifact_sha256 == first.artifact_sha256
    assert copied.duplicate_of_id == first.id  # for the organiser's eyes
    with sessions() as session:
        jobs = session.scalars(select(Job).order_by(Job.id)).all()
        assert [j.submission_id for j in jobs] == [first.id, copied.id]
    # it counts against beta's window like any submission
    other = submit(sessions, artifacts, "beta", detector(tmp_path / "y", b"y"), "test", at=0.5)
    assert other.status == "rejected" and "window" in other.validation_errors
    # the same team sending the same bytes to the same split again: a duplicate, not run
    again = submit(sessions, artifacts, "alpha", x, "test", at=2)
    assert again.status == "duplicate" and again.duplicate_of_id == first.id
    with sessions() as session:
        assert session.scalar(select(Job).where(Job.submission_id == again.id)) is None


@pytest.mark.usefixtures("fast_argon2")
def test_the_web_never_tells_a_team_another_sent_the_same_bytes(tmp_path: Path) -> None:
    web = create_app(f"sqlite:///{tmp_path / 'web.db'}")
    with web.state.sessions.begin() as session:
        rounds.create_round(session, "r1", fake_splits(tmp_path / "splits"), submission_window_s=3600)
        rounds.set_status(session, "r1", "open")
        alpha, beta = rounds.add_team(session, "alpha"), rounds.add_team(session, "beta")
        members = {"tom": ["team_member"], "bea": ["team_member"], "olga": ["organiser"]}
        teams = {"tom": alpha, "bea": beta, "olga": None}
        tokens = {
            name: accounts.create_api_token(
                session,
                accounts.create_user(session, name, "correct horse battery", roles, team=teams[name]),
                "ci",
            )
            for name, roles in members.items()
        }
    clients = {name: TestClient(web, headers={"Authorization": f"Bearer {t}"}) for name, t in tokens.items()}
    archive = Path(shutil.make_archive(str(tmp_path / "x"), "gztar", tmp_path, detector(tmp_path / "x").name))
    url = "/api/v1/leaderboard/rounds/r1/submissions"
    made = {
        name: clients[name].post(url, files={"archive": ("x.tar.gz", archive.read_bytes())})
        for name in ("tom", "bea")
    }
    assert [r.status_code for r in made.values()] == [201, 201]
    bea = made["bea"].json()
    # a test job says only that it was submitted (issue 44): not even "queued"
    assert bea["status"] == "submitted" and bea["duplicate_of"] is None and bea["job"] is not None
    assert clients["bea"].get(f"/api/v1/leaderboard/submissions/{bea['id']}").json()["duplicate_of"] is None
    original = f'href="/leaderboard/submissions/{made["tom"].json()["id"]}"'
    page = clients["bea"].get(f"/leaderboard/submissions/{bea['id']}").text
    assert original not in page and "same files" not in page.lower()
    seen = clients["olga"].get(f"/api/v1/leaderboard/submissions/{bea['id']}").json()
    assert seen["duplicate_of"] == made["tom"].json()["id"]
    assert original in clients["olga"].get(f"/leaderboard/submissions/{bea['id']}").text


# --- links ---------------------------------------------------------------------------------------------


def test_links_in_a_folder_or_an_archive_are_refused(lab, tmp_path: Path) -> None:
    make, artifacts = lab
    sessions = make()
    truth = tmp_path / "ground_truth.csv"
    truth.write_text("1\n")
    linked = detector(tmp_path / "linked")
    (linked / "learned_parameters" / "truth.csv").symlink_to(truth)
    with pytest.raises(UserError) as info:
        submit(sessions, artifacts, "alpha", linked)
    message = str(info.value)
    assert f"holds a link, learned_parameters/truth.csv -> {truth}" in message and "\n" not in message
    (linked / "learned_parameters" / "truth.csv").unlink()
    (linked / "round").symlink_to(tmp_path / "splits", target_is_directory=True)
    with pytest.raises(UserError, match="holds a link, round ->"):
        submit(sessions, artifacts, "alpha", linked)

    zipped = tmp_path / "linked.zip"
    with zipfile.ZipFile(zipped, "w") as archive:
        for path in CONSTANT.rglob("*"):
            if path.is_file():
                archive.write(path, path.relative_to(CONSTANT).as_posix())
        link = zipfile.ZipInfo("learned_parameters/truth.csv")
        link.external_attr = 0o120777 << 16  # S_IFLNK
        archive.writestr(link, str(truth))
    with pytest.raises(UserError, match=r"'learned_parameters/truth\.csv' is a link"):
        submit(sessions, artifacts, "alpha", zipped)

    tarred = tmp_path / "linked.tar"
    with tarfile.open(tarred, "w") as archive:
        archive.add(CONSTANT, arcname="det")
        hard = tarfile.TarInfo("det/copy.py")
        hard.type, hard.linkname = tarfile.LNKTYPE, "det/entrypoint.py"
        archive.addfile(hard, io.BytesIO(b""))
    with pytest.raises(UserError, match="hard link"):
        submit(sessions, artifacts, "alpha", tarred)

    with sessions() as session:
        assert session.scalars(select(Submission)).all() == []
    assert stored(artifacts) == set() and disk_bytes(artifacts) == 0
