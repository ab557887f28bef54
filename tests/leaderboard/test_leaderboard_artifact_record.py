"""The record decides, not the files: a submission's kind and its artifact's hash are read from its row.

Issue 49: with the stored ``image.tar`` missing, a job ran as an empty folder detector and finished
``done`` with ``:Missing Results:`` (0.5) for every model: a fault of the platform's storage charged to the
team. Now the kind (folder, archive, image, sif) is recorded at submission, and at run time anything missing
or different from the record (the file the kind names, the digest) is a platform fault: requeued, then
platform-error, never run and never scored. Hand-written archives: no podman needed.
"""

from __future__ import annotations

import shutil
import tarfile
from pathlib import Path

import pytest
from sqlalchemy import update
from test_leaderboard import fake_detector
from test_leaderboard_container import ENTRY, GOOD_FILES, fake_board, submit  # noqa: F401 (a fixture)

from assay.leaderboard import worker as worker_module
from assay.leaderboard.worker import work
from assay.runner import LocalExecutor
from assay.store import Job, Submission
from container_image import handmade_archive

ANSWER = "open(args.result_filepath, 'w').write('0.25')"


def image_archive(path: Path) -> Path:
    return handmade_archive(path, [{"bin": b"x"}, GOOD_FILES], ENTRY)


def job_state(sessions, submission_id: int) -> tuple[Job, Submission]:  # type: ignore[no-untyped-def]
    with sessions() as session:
        submission = session.get(Submission, submission_id)
        job = submission.job
        job.results, job.metrics  # noqa: B018 (loaded before the session closes)
        session.expunge_all()
        return job, submission


def test_the_kind_is_recorded_at_submission(fake_board, tmp_path: Path) -> None:  # noqa: F811
    sessions, artifacts = fake_board
    folder = fake_detector(tmp_path / "folder", ANSWER)
    archive = tmp_path / "folder.tar"
    with tarfile.open(archive, "w") as tar:
        tar.add(folder, arcname="detector")
    kinds = {
        "folder": submit(sessions, artifacts, "alpha", folder),
        "archive": submit(sessions, artifacts, "beta", archive),
        "image": submit(sessions, artifacts, "alpha", image_archive(tmp_path / "image.tar")),
    }
    for kind, made in kinds.items():
        assert made.status in ("queued", "duplicate"), made.validation_errors
        assert made.kind == kind


@pytest.mark.parametrize("damage", ["image gone", "image changed", "folder changed", "no kind"])
def test_a_stored_artifact_unlike_its_record_is_a_platform_fault(
    fake_board,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    damage: str,
) -> None:
    """Was (image gone): the job ran as an empty folder detector, ``done`` with 0.5 for every model."""
    monkeypatch.setattr(worker_module, "BACKOFF_S", 0.0)
    sessions, artifacts = fake_board
    if damage == "folder changed":
        made = submit(sessions, artifacts, "alpha", fake_detector(tmp_path / "folder", ANSWER))
        stored = Path(made.artifact_path) / "entrypoint.py"
        stored.write_text(stored.read_text() + "# edited on disk\n")
        expected = "does not match its record"
    else:
        made = submit(sessions, artifacts, "alpha", image_archive(tmp_path / "image.tar"))
        stored = Path(made.artifact_path) / "image.tar"
        if damage == "image gone":
            stored.unlink()
            expected = "image.tar is missing"
        elif damage == "image changed":
            shutil.copyfile(image_archive(tmp_path / "other.tar"), stored)
            stored.write_bytes(stored.read_bytes() + b"\0" * 512)  # another image's bytes, one more block
            expected = "does not match its record"
        else:  # a row from before the kind was recorded: its files are read, once they match the digest
            with sessions.begin() as session:
                session.execute(update(Submission).values(kind=""))
            stored.unlink()
            expected = "does not match its record"
    assert made.status == "queued", made.validation_errors
    assert work(sessions, LocalExecutor(1), once=True) == worker_module.PLATFORM_TRIES
    job, submission = job_state(sessions, made.id)
    assert (job.status, submission.status) == ("platform-error", "platform-error"), job.log
    assert job.results == [] and job.metrics == []  # never run, never scored
    assert job.log.count("platform fault") == worker_module.PLATFORM_TRIES
    assert expected in job.log, job.log


def test_a_row_from_before_the_kind_was_recorded_still_runs(fake_board, tmp_path: Path) -> None:  # noqa: F811
    sessions, artifacts = fake_board
    made = submit(sessions, artifacts, "alpha", fake_detector(tmp_path / "folder", ANSWER))
    with sessions.begin() as session:
        session.execute(update(Submission).values(kind=""))
    assert work(sessions, LocalExecutor(2), once=True) == 1
    job, _ = job_state(sessions, made.id)
    assert job.status == "done" and {r.value for r in job.results} == {0.25}, job.log
