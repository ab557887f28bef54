"""What a detector prints or writes never loses its job, and where nothing isolates it, nothing runs.

Real detectors through the real worker, on the small fake round (empty model files: these detectors never
load them), on SQLite and on a throwaway PostgreSQL server (conftest's ``db_url``).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import select
from test_leaderboard import fake_detector

from assay.leaderboard import harness, rounds, submissions
from assay.leaderboard.harness import PARSE_FLAG
from assay.leaderboard.worker import CannotWork, work
from assay.runner import LocalExecutor, isolation
from assay.store import Job, open_store
from fake_board import TRUTH, fake_splits

HOSTILE_TEXT = (
    "import sys\n"
    "sys.stdout.write('before\\x00after \\x1b[31m red \\x07')\n"
    "sys.stderr.buffer.write(b'bad utf-8 \\xff\\xfe \\x00 nul\\n')\n"
)


def run_one(db_url: str, tmp_path: Path, body: str, split: str = "test", **settings: object) -> Job:
    """Submit ``body`` as a detector to a fresh open round and run its job to the end."""
    sessions = open_store(db_url)
    with sessions.begin() as session:
        rounds.create_round(
            session, "r1", fake_splits(tmp_path / "splits"), submission_window_s=0, **settings
        )
        rounds.set_status(session, "r1", "open")
        rounds.add_team(session, "mallory")
    with sessions.begin() as session:
        submissions.submit(
            session, tmp_path / "artifacts", "mallory", "r1", split, fake_detector(tmp_path / "d", body)
        )
    work(sessions, LocalExecutor(2), once=True)
    with sessions() as session:
        job = session.scalars(select(Job)).one()
        job.results  # noqa: B018 (loaded before the session closes)
        session.expunge_all()
        return job


@pytest.mark.skipif(isolation.isolation_available() != "bwrap", reason="sealed jobs need bubblewrap")
def test_nul_bytes_and_bad_text_keep_every_answer(db_url: str, tmp_path: Path) -> None:
    """Was: on PostgreSQL the job failed with a database error and its valid answers were lost (2 of 2)."""
    job = run_one(db_url, tmp_path, HOSTILE_TEXT + "open(args.result_filepath, 'w').write('0.25\\x00')\n")
    assert job.status == "done", job.log
    assert len(job.results) == len(TRUTH)
    for result in job.results:
        assert "before\ufffdafter" in result.stdout and "\x1b[31m" in result.stdout
        assert "\ufffd nul" in result.stderr and "bad utf-8 \ufffd\ufffd" in result.stderr
        # NIST reads the first line: '0.25<NUL>' is not a number, flagged, not lost
        assert result.flags == PARSE_FLAG and result.raw_output == "0.25\ufffd"


@pytest.mark.skipif(isolation.isolation_available() != "bwrap", reason="sealed jobs need bubblewrap")
def test_result_files_are_read_as_nist_reads_them(tmp_path: Path) -> None:
    """A value followed by more lines scores, as in NIST's harness; the job log warns about the rest."""
    job = run_one(
        f"sqlite:///{tmp_path / 'lb.db'}",
        tmp_path,
        "open(args.result_filepath, 'w').write('0.9\\ntrailing line')",
    )
    assert {r.value for r in job.results} == {0.9} and {r.flags for r in job.results} == {""}
    assert "warning: a result file had lines after the first; scored its first line" in job.log


@pytest.fixture
def no_bwrap(monkeypatch: pytest.MonkeyPatch):
    """This machine as one without bubblewrap: the probe says bwrap does not work here."""
    real = isolation._probe.__wrapped__
    monkeypatch.setattr(isolation, "_probe", lambda level: level != "bwrap" and real(level))


def queued_job(tmp_path: Path) -> Job:
    """The one job of ``run_one``'s round, read after a worker refused to claim it."""
    sessions = open_store(f"sqlite:///{tmp_path / 'lb.db'}")
    with sessions() as session:
        job = session.scalars(select(Job)).one()
        job.results  # noqa: B018 (loaded before the session closes)
        session.expunge_all()
        return job


def peek(tmp_path: Path) -> str:
    """A detector that reports whether it can read the sealed test split's ground truth on the host."""
    truth = tmp_path / "splits" / "test" / "models" / "id-00000000" / "ground_truth.csv"
    return f"import os\nprint('truth readable:', os.path.exists({str(truth)!r}))\n" + (
        "open(args.result_filepath, 'w').write('0.5')\n"
    )


@pytest.mark.parametrize("split", ["train", "smoke", "test"])
def test_without_bubblewrap_no_job_runs(no_bwrap, split: str, tmp_path: Path) -> None:
    """Was: practice jobs ran in the open and read the test and holdout ground truth (shown as stderr);
    then: the job was claimed and failed. Now no worker without bubblewrap claims it: it stays queued."""
    with pytest.raises(CannotWork, match="needs bwrap isolation"):
        run_one(f"sqlite:///{tmp_path / 'lb.db'}", tmp_path, peek(tmp_path), split=split)
    job = queued_job(tmp_path)
    assert job.status == "queued" and job.results == [] and job.attempts == 0


@pytest.mark.parametrize("split", ["train", "test"])
def test_the_unisolated_override_is_for_practice_only_and_logged(
    no_bwrap, split: str, tmp_path: Path
) -> None:
    url = f"sqlite:///{tmp_path / 'lb.db'}"
    if split == "test":  # never taken by a worker without bubblewrap, whatever the round allows
        with pytest.raises(CannotWork, match="needs bwrap isolation"):
            run_one(url, tmp_path, peek(tmp_path), split=split, allow_unisolated=True)
        job = queued_job(tmp_path)
        assert job.status == "queued" and job.results == []
        return
    job = run_one(url, tmp_path, peek(tmp_path), split=split, allow_unisolated=True)
    assert job.status == "done" and len(job.results) == len(TRUTH)
    # why test and holdout never take the override: in the open, the sealed truth is there to read
    assert {r.stdout.strip() for r in job.results} == {"truth readable: True"}
    assert "override: the round allows unisolated practice runs" in job.log
    assert "its detector could read this machine's files" in job.log


def test_holdout_jobs_are_sealed_whatever_the_round_allows() -> None:
    """Holdout runs only at the close, so the rule is checked where it is made."""
    for split, allowed in (("holdout", True), ("test", True), ("smoke", False), ("train", False)):
        context = {"split": split, "allow_unisolated": allowed}
        assert harness._sealing(context, None, 0) is True  # type: ignore[arg-type]
