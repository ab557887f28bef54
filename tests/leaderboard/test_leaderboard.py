"""The leaderboard end to end on a real zoo round, a real SQLite file and real sandboxed detector processes:
submissions (validation, duplicates, window), workers, NIST flags, scoring, round close on holdout,
publishing, and a worker killed with SIGKILL in the middle of a job."""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import select

from assay.errors import UserError
from assay.leaderboard import publish, rounds, submissions
from assay.leaderboard.harness import MISSING_FLAG, PARSE_FLAG, TIMEOUT_FLAG
from assay.leaderboard.scoring import read_truth
from assay.leaderboard.worker import work
from assay.runner import LocalExecutor
from assay.stats import cross_entropy
from assay.store import Job, ModelResult, Submission, open_store
from assay.store.models import utcnow

PROJECT = Path(__file__).resolve().parents[2]
BASELINES = ("constant", "meta_classifier", "neural_cleanse")


def fake_detector(folder: Path, body: str, technique: str = "fake") -> Path:
    """A detector folder whose infer step runs ``body`` (Python) with ``args`` parsed from the TrojAI CLI."""
    shutil.copytree(PROJECT / "detectors" / "constant", folder)
    meta = json.loads((folder / "metaparameters.json").read_text())
    (folder / "metaparameters.json").write_text(json.dumps({**meta, "technique": "constant"}))
    (folder / "entrypoint.py").write_text(
        "import argparse, hashlib, os, sys, time\n"
        "p = argparse.ArgumentParser()\n"
        "p.add_argument('mode', nargs='?')  # NIST's harness leaves the word out\n"
        "for name in ('model_filepath', 'result_filepath', 'scratch_dirpath', 'examples_dirpath',\n"
        "             'round_training_dataset_dirpath', 'metaparameters_filepath', 'schema_filepath',\n"
        "             'learned_parameters_dirpath', 'source_dataset_dirpath'):\n"
        "    p.add_argument('--' + name)\n"
        "args = p.parse_args()\n"
        f"# {technique}\n" + body + "\n"
    )
    return folder


def model_value(model_pt: Path) -> float:
    """What the deterministic fake detector answers for a model: fixed by its file's bytes."""
    return int(hashlib.sha256(model_pt.read_bytes()).hexdigest()[:4], 16) / 65535


def deterministic(sleep_s: float = 0.0) -> str:
    """A detector body answering ``model_value`` after ``sleep_s`` seconds.

    The pause is written into the body: the sandbox builds the detector's environment from scratch, so
    a variable set for the worker never reaches the detector.
    """
    return (
        "assert len(os.listdir(args.examples_dirpath)) == 21  # 20 clean examples and labels.csv\n"
        "data = open(args.model_filepath, 'rb').read()  # nothing names the model; its bytes identify it\n"
        f"time.sleep({sleep_s!r})\n"
        "value = int(hashlib.sha256(data).hexdigest()[:4], 16) / 65535\n"
        "open(args.result_filepath, 'w').write(repr(value))\n"
    )


DETERMINISTIC = deterministic()


@pytest.fixture
def board(small_round: Path, db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """An open round with four teams, on SQLite and on PostgreSQL (conftest's ``db_url``)."""
    url = db_url
    monkeypatch.setenv("ASSAY_DB_URL", url)
    sessions = open_store(url)
    with sessions.begin() as session:
        rounds.create_round(
            session, "r1", small_round / "splits", submission_window_s=3600, per_model_timeout_s=60
        )
        rounds.set_status(session, "r1", "open")
        for team in ("alpha", "beta", "gamma", "delta"):
            rounds.add_team(session, team)
    return sessions, tmp_path / "artifacts"


def _submit(sessions, artifacts, team, artifact, split="test", now=None) -> Submission:
    with sessions.begin() as session:
        made = submissions.submit(session, artifacts, team, "r1", split, artifact, now=now)
        session.expunge(made)
        return made


def lifecycle_detectors(db_url: str, tmp_path: Path) -> list[Path]:
    """The three baselines on SQLite, Neural Cleanse with 10 optimisation steps instead of 200 (its own
    metaparameter, as a performer would set it; its skill is tested in tests/detectors). On PostgreSQL,
    which this test runs for the queue, the standings and the close, not for the detectors: the constant
    baseline and two quick fakes (two minutes less)."""
    if db_url.startswith("sqlite"):
        quick = tmp_path / "neural_cleanse"
        shutil.copytree(PROJECT / "detectors" / "neural_cleanse", quick)
        meta = json.loads((quick / "metaparameters.json").read_text())
        (quick / "metaparameters.json").write_text(json.dumps({**meta, "steps": 10}))
        return [PROJECT / "detectors" / name for name in BASELINES[:2]] + [quick]
    confident = "open(args.result_filepath, 'w').write('0.9')"
    return [
        PROJECT / "detectors" / "constant",
        fake_detector(tmp_path / "by-bytes", DETERMINISTIC),
        fake_detector(tmp_path / "confident", confident),
    ]


def test_round_lifecycle_with_the_three_baselines(
    board, small_round: Path, tmp_path: Path, db_url: str
) -> None:
    sessions, artifacts = board
    made = [
        _submit(sessions, artifacts, team, detector)
        for team, detector in zip(
            ("alpha", "beta", "gamma"), lifecycle_detectors(db_url, tmp_path), strict=True
        )
    ]
    assert [m.status for m in made] == ["queued"] * 3
    assert work(sessions, LocalExecutor(2), once=True) == 3

    truth = read_truth(small_round / "splits" / "test")
    with sessions() as session:
        jobs = session.scalars(select(Job).order_by(Job.id)).all()
        assert [j.status for j in jobs] == ["done"] * 3
        for job in jobs:
            assert sorted(r.model_name for r in job.results) == sorted(truth)
            assert all(r.flags == "" and 0 <= r.value <= 1 for r in job.results), [
                r.stderr for r in job.results
            ]
            assert "isolation: " in job.log
            overall = {m.name: m.value for m in job.metrics if not m.group_column}
            names = sorted(truth)
            values = {r.model_name: r.value for r in job.results}
            expected = cross_entropy([truth[n] for n in names], [values[n] for n in names])
            assert overall["cross_entropy"] == pytest.approx(expected, abs=1e-12)
            assert any(m.group_column == "architecture" for m in job.metrics)
        constant = next(j for j in jobs if j.submission.team.name == "alpha")
        assert {m.name: m.value for m in constant.metrics if not m.group_column}[
            "cross_entropy"
        ] == pytest.approx(math.log(2), abs=1e-12)
        table = publish.standings(session, "r1", "test")
        assert sorted(r.team for r in table) == ["alpha", "beta", "gamma"]
        assert [r.rank for r in table] == [1, 2, 3]
        ces = [r.metrics["cross_entropy"] for r in table]
        assert ces == sorted(ces)
        assert publish.standings(session, "r1", "holdout") == []  # hidden until the round closes

    with sessions.begin() as session:
        queued = submissions.close_round(session, "r1")
        assert sorted(s.team.name for s in queued) == ["alpha", "beta", "gamma"]
    with pytest.raises(UserError, match="closed"):
        _submit(sessions, artifacts, "delta", PROJECT / "detectors" / "constant")
    assert work(sessions, LocalExecutor(2), once=True) == 3
    with sessions() as session:
        holdout = publish.standings(session, "r1", "holdout")
        assert sorted(r.team for r in holdout) == ["alpha", "beta", "gamma"]
        page = publish.to_html(session, "r1")
    assert "holdout split" in page and page.count("<svg") >= 4 and "<script" not in page


def test_rejections_duplicates_and_the_window(board, tmp_path: Path) -> None:
    sessions, artifacts = board
    constant = PROJECT / "detectors" / "constant"
    first = _submit(sessions, artifacts, "alpha", constant)
    assert first.status == "queued"
    # the same artifact as an archive, from another team: run for that team, linked for the organiser
    archive = shutil.make_archive(str(tmp_path / "constant"), "gztar", constant.parent, constant.name)
    again = _submit(sessions, artifacts, "beta", Path(archive))
    assert again.status == "queued" and again.duplicate_of_id == first.id
    # a schema naming no technique is rejected, says why, and does not use up the window
    bad = fake_detector(tmp_path / "bad", "pass")
    schema = json.loads((bad / "metaparameters_schema.json").read_text())
    schema["required"].remove("technique")
    (bad / "metaparameters_schema.json").write_text(json.dumps(schema))
    rejected = _submit(sessions, artifacts, "gamma", bad)
    assert rejected.status == "rejected" and "no technique" in rejected.validation_errors
    # an unbounded parameter is accepted, as NIST's harness does, with a warning on the job's log
    fine = fake_detector(tmp_path / "fine", DETERMINISTIC)
    schema = json.loads((fine / "metaparameters_schema.json").read_text())
    schema["properties"]["probability"].pop("maximum")
    (fine / "metaparameters_schema.json").write_text(json.dumps(schema))
    warned = _submit(sessions, artifacts, "gamma", fine)
    assert warned.status == "queued"
    with sessions() as session:
        log = session.scalar(select(Job.log).where(Job.submission_id == warned.id))
        assert log.startswith("warning: metaparameters_schema.json: numeric property 'probability' needs")
    # a second different detector from alpha inside its window is refused; after the window it is accepted
    other = fake_detector(tmp_path / "other", DETERMINISTIC, technique="other")
    refused = _submit(sessions, artifacts, "alpha", other)
    assert refused.status == "rejected" and "window" in refused.validation_errors
    later = _submit(sessions, artifacts, "alpha", other, now=utcnow() + timedelta(hours=2))
    assert later.status == "queued"
    # the same artifact from the same team on the same split: a duplicate, not run again
    twice = _submit(sessions, artifacts, "alpha", constant, now=utcnow() + timedelta(hours=4))
    assert twice.status == "duplicate" and twice.duplicate_of_id == first.id
    # train and smoke have no window
    assert _submit(sessions, artifacts, "alpha", constant, split="smoke").status == "queued"
    with sessions() as session:
        assert session.scalar(select(Job).where(Job.submission_id == twice.id)) is None
        assert session.scalar(select(Job).where(Job.submission_id == again.id)) is not None


@pytest.mark.parametrize(
    ("body", "flag"),
    [
        ("open(args.result_filepath, 'w').write('nan')", PARSE_FLAG),
        ("open(args.result_filepath, 'w').write('2.0')", PARSE_FLAG),
        ("open(args.result_filepath, 'w').write('very likely')", PARSE_FLAG),
        ("sys.exit(3)", MISSING_FLAG),
        ("time.sleep(600)", TIMEOUT_FLAG),
    ],
)
def test_bad_outputs_score_half_with_nist_flags(board, tmp_path: Path, body: str, flag: str) -> None:
    sessions, artifacts = board
    with sessions.begin() as session:
        rounds.get_round(session, "r1").per_model_timeout_s = 3
    _submit(sessions, artifacts, "alpha", fake_detector(tmp_path / "d", body), split="smoke")
    start = time.monotonic()
    assert work(sessions, LocalExecutor(2), once=True) == 1
    assert time.monotonic() - start < 120
    with sessions() as session:
        results = session.scalars(select(ModelResult)).all()
        assert len(results) == 4  # the smoke split
        assert {(r.value, r.flags) for r in results} == {(0.5, flag)}


def test_hidden_ground_truth_cannot_be_read(board, small_round: Path, tmp_path: Path) -> None:
    sessions, artifacts = board
    target = next((small_round / "splits" / "test" / "models").iterdir()) / "ground_truth.csv"
    body = (
        f"try:\n    text = open({str(target)!r}).read().strip()\n"
        "except OSError as exc:\n    text = 'unreadable'\n"
        "print('read:', text)\n"
        "open(args.result_filepath, 'w').write('0.25')"
    )
    _submit(sessions, artifacts, "alpha", fake_detector(tmp_path / "peek", body), split="smoke")
    work(sessions, LocalExecutor(1), once=True)
    with sessions() as session:
        job = session.scalars(select(Job)).one()
        if not job.log.startswith("isolation: bwrap"):
            pytest.skip(f"paths are hidden only with bubblewrap; this machine has {job.log.strip()}")
        assert {r.stdout.strip() for r in job.results} == {"read: unreadable"}


def test_killed_worker_resumes_without_duplicates(board, small_round: Path, tmp_path: Path) -> None:
    sessions, artifacts = board
    made = _submit(
        sessions, artifacts, "alpha", fake_detector(tmp_path / "slow", deterministic(1.5)), split="train"
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    worker = subprocess.Popen(
        [sys.executable, "-m", "assay", "leaderboard", "worker", "--once"], env=env, start_new_session=True
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        with sessions() as session:
            if len(session.scalars(select(ModelResult)).all()) >= 2:
                break
        time.sleep(0.3)
    os.killpg(worker.pid, signal.SIGKILL)
    worker.wait()
    with sessions() as session:
        job = session.scalars(select(Job)).one()
        assert job.status == "running" and 2 <= len(job.results) < 10
    assert work(sessions, LocalExecutor(2), once=True, stale_after_s=0) == 1
    with sessions() as session:
        job = session.scalars(select(Job).where(Job.submission_id == made.id)).one()
        assert job.status == "done" and job.attempts == 2
        values = {r.model_name: r.value for r in job.results}
        assert len(job.results) == len(values) == 10
        models = small_round / "splits" / "train" / "models"
        assert values == {
            name: pytest.approx(model_value(models / name / "model.pt"), abs=1e-15) for name in values
        }


def test_cli_round_trip(small_round: Path, tmp_path: Path) -> None:
    env = {**os.environ, "ASSAY_DB_URL": f"sqlite:///{tmp_path / 'cli.db'}", "OMP_NUM_THREADS": "1"}

    def lb(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "assay", "leaderboard", *args], capture_output=True, text=True, env=env
        )

    for args in (
        ("init",),
        ("round", "create", "r", "--dataset", str(small_round / "splits"), "--publish-every", "1"),
        ("round", "open", "r"),
        ("team", "add", "alpha"),
    ):
        done = lb(*args)
        assert done.returncode == 0, done.stderr
    done = lb("submit", str(PROJECT / "detectors" / "constant"), "--team", "alpha", "--round", "r", "--json")
    assert json.loads(done.stdout)["status"] == "queued"
    assert lb("worker", "--once").returncode == 0
    shown = json.loads(lb("show", "r", "--json").stdout)
    assert shown[0]["team"] == "alpha" and shown[0]["metrics"]["cross_entropy"] == pytest.approx(math.log(2))
    done = lb("results", "1", "--json")
    assert done.returncode == 0, done.stderr
    record = json.loads(done.stdout)  # the organiser sees every answer and log
    assert record["detail"] == "full" and len(record["models"]) == 5
    assert {r["answer"] for r in record["models"]} == {0.5}
    assert all(r["stderr"] is not None for r in record["models"])
    as_alpha = json.loads(lb("results", "1", "--as-team", "alpha", "--json").stdout)
    assert as_alpha["detail"] == "errors"  # test split: the team sees flags, not answers or output
    assert all(r["answer"] is None and r["stderr"] is None for r in as_alpha["models"])
    status = json.loads(lb("status", "--json").stdout)
    assert status["jobs"] == {"done": 1} and status["rounds"][0]["submissions"] == 1
    assert lb("export", "r", "--out", str(tmp_path / "site")).returncode == 0
    assert (tmp_path / "site" / "index.html").read_text().count("alpha") >= 1
    assert (tmp_path / "site" / "test-best.csv").read_text().splitlines()[1].startswith("1,alpha,")
    bad = lb("round", "open", "nope")
    assert (
        bad.returncode == 2
        and "no round named 'nope'" in bad.stderr
        and len(bad.stderr.strip().splitlines()) == 1
    )


def test_unsafe_archives_and_containers_are_refused(board, tmp_path: Path) -> None:
    import tarfile
    import zipfile

    sessions, artifacts = board
    evil_tar = tmp_path / "evil.tar.gz"
    with tarfile.open(evil_tar, "w:gz") as archive:
        archive.add(PROJECT / "detectors" / "constant" / "entrypoint.py", arcname="../../escape.py")
    with pytest.raises(UserError, match=r"member '\.\./\.\./escape\.py' would be written outside the folder"):
        _submit(sessions, artifacts, "alpha", evil_tar)
    evil_zip = tmp_path / "evil.zip"
    with zipfile.ZipFile(evil_zip, "w") as archive:
        archive.writestr("../escape.py", "print('x')")
    with pytest.raises(UserError, match="outside the folder"):
        _submit(sessions, artifacts, "alpha", evil_zip)
    image = tmp_path / "detector.sif"
    image.write_bytes(b"\0" * 64)  # read by assay's own SIF reader now, refused for what it is
    with pytest.raises(UserError, match=r"detector\.sif: not a SIF image \(64 bytes; a SIF header is 128\)"):
        _submit(sessions, artifacts, "alpha", image)
    assert not (tmp_path / "escape.py").exists() and not (tmp_path.parent / "escape.py").exists()
    with sessions() as session:
        assert session.scalars(select(Submission)).all() == []
