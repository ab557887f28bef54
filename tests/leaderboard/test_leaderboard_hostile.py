"""Hostile detectors through the real harness, judged from the outside.

Each test submits a detector written as a TrojAI performer would (the NIST command line, reading
``--model_filepath`` and friends), runs it with the real worker on a real zoo round, and then checks what it
got from the database, the host's process table, the host's files and a listener on the host's loopback: never
from the detector's own word alone. The sandbox claims are those of docs/leaderboard.md, "Threat model".
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import socket
import subprocess
import sys
import tarfile
import threading
import time
import uuid
from pathlib import Path

import pytest
from sqlalchemy import select
from test_leaderboard import fake_detector

from assay.errors import UserError
from assay.leaderboard import rounds, submissions
from assay.leaderboard.harness import MEMORY_FLAG, TIMEOUT_FLAG
from assay.leaderboard.worker import work
from assay.runner import LocalExecutor, isolation_available
from assay.store import Job, open_store
from assay.store.models import Round, Team, as_utc
from host_processes import processes_with

pytestmark = pytest.mark.skipif(
    isolation_available() != "bwrap", reason="the sealed sandbox needs bubblewrap (make install adds it)"
)

# Walks everything the detector can see and cheats with whatever answer key it finds: the label of this very
# model from any ground_truth.csv (by its folder name) or METADATA.csv row. Reports what it saw on stdout.
PROBE = r"""
import csv, json, os, re, socket
name = os.environ.get("ASSAY_MODEL_NAME", "")
labels, seen, secrets, names = {}, [], [], []
for root, dirs, files in os.walk("/", followlinks=False):
    if root.startswith(("/proc", "/usr", "/sys")):
        dirs[:] = []
        continue
    for file in files:
        path = os.path.join(root, file)
        lower = file.lower()
        answer_key = lower in ("ground_truth.csv", "metadata.csv", "split.json")
        if answer_key or lower.endswith((".db", ".sqlite", ".sqlite3")):
            seen.append(path)
        try:
            if lower == "ground_truth.csv":
                labels[os.path.basename(root)] = int(open(path).read().strip())
            elif lower == "metadata.csv":
                for row in csv.DictReader(open(path)):
                    labels[row.get("model_name", "")] = int(row.get("poisoned", "0") in ("1", "True", "true"))
        except (OSError, ValueError):
            pass
for pid in filter(str.isdigit, os.listdir("/proc")):
    for part in ("environ", "cmdline"):
        try:
            text = open(f"/proc/{pid}/{part}", "rb").read().decode(errors="replace")
        except OSError:
            continue
        secrets += re.findall(r"ASSAY_[A-Z_]+=[^\x00]*", text)  # the harness's own settings
        names += re.findall(r"id-[0-9]{8}", text)  # which model this is (no process may say)
names += re.findall(r"id-[0-9]{8}", open("/proc/self/mountinfo").read())
answer = labels.get(name, 0.5)
print(json.dumps({"labels": sorted(labels), "seen": seen, "secrets": secrets, "names": names,
                  "processes": sorted(filter(str.isdigit, os.listdir("/proc"))), "cheated": name in labels}))
open(args.result_filepath, "w").write(repr(float(answer)))
"""


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "assay", "leaderboard", *args]
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr
    return done


def test_probe_finds_no_answer_key_and_scores_ln2(small_round: Path, tmp_path: Path) -> None:
    """The README's recipe, the database outside ASSAY_HOME, another round's answer key on the same disk."""
    home, elsewhere, other = tmp_path / "home", tmp_path / "db-elsewhere", tmp_path / "other-round"
    elsewhere.mkdir()
    (other / "models" / "id-00000000").mkdir(parents=True)
    (other / "models" / "id-00000000" / "ground_truth.csv").write_text("1")
    db = elsewhere / "leaderboard.db"
    env = {**os.environ, "ASSAY_HOME": str(home), "ASSAY_DB_URL": f"sqlite:///{db}", "OMP_NUM_THREADS": "1"}
    _cli(env, "init")
    _cli(env, "round", "create", "r1", "--dataset", str(small_round / "splits"))
    _cli(env, "round", "open", "r1")
    _cli(env, "team", "add", "mallory")
    probe = fake_detector(tmp_path / "probe", PROBE)
    _cli(env, "submit", str(probe), "--team", "mallory", "--round", "r1")
    _cli(env, "worker", "--once")
    shown = json.loads(_cli(env, "show", "r1", "--json").stdout)
    assert shown[0]["metrics"]["cross_entropy"] == pytest.approx(math.log(2), abs=1e-12)
    sessions = open_store(f"sqlite:///{db}")
    test_ids = {p.name for p in (small_round / "splits" / "test" / "models").iterdir()}
    holdout_ids = {p.name for p in (small_round / "splits" / "holdout" / "models").iterdir()}
    train_ids = {p.name for p in (small_round / "splits" / "train" / "models").iterdir()}
    with sessions() as session:
        job = session.scalars(select(Job)).one()
        assert job.status == "done" and "empty read-only root" in job.log
        reports = [json.loads(r.stdout) for r in job.results]
    assert len(reports) == len(test_ids)
    for report in reports:
        assert not report["cheated"] and report["secrets"] == []
        assert not set(report["names"]) & (test_ids | holdout_ids)  # no process line or mount names the model
        # the public training split is the one answer key a detector may read (NIST hands it out too)
        assert set(report["labels"]) <= train_ids and not set(report["labels"]) & (test_ids | holdout_ids)
        # anything else it saw is the Python runtime's own files (a stdlib test fixture named split.json)
        allowed = ("/task/input/round-training-dataset/", f"{sys.base_prefix}/lib/", f"{sys.prefix}/lib/")
        assert [path for path in report["seen"] if not path.startswith(allowed)] == []
        assert len(report["processes"]) <= 4  # bwrap, the collector, the detector: no host process
    assert str(db) not in json.dumps(reports) and str(other) not in json.dumps(reports)


@pytest.fixture
def sealed(small_round: Path, tmp_path: Path):
    """A SQLite store with an open round whose limits each test sets; returns a submit-and-run helper."""
    sessions = open_store(f"sqlite:///{tmp_path / 'store.db'}")
    artifacts = tmp_path / "artifacts"

    def run(body: str, split: str = "test", workers: int = 1, **limits: object) -> Job:
        name = f"r{uuid.uuid4().hex[:6]}"
        with sessions.begin() as session:
            rounds.create_round(session, name, small_round / "splits", submission_window_s=0, **limits)
            rounds.set_status(session, name, "open")
            if session.scalar(select(Team).where(Team.name == "mallory")) is None:
                rounds.add_team(session, "mallory")
        with sessions.begin() as session:
            folder = fake_detector(tmp_path / f"detector-{name}", body)
            submissions.submit(session, artifacts, "mallory", name, split, folder)
        work(sessions, LocalExecutor(workers), once=True)
        with sessions() as session:
            job = session.scalars(select(Job).order_by(Job.id.desc())).first()
            assert job is not None
            session.expunge_all()
            return job

    def results(job: Job) -> list:
        with sessions() as session:
            return list(session.get(Job, job.id).results)

    run.results = results  # type: ignore[attr-defined]
    return run


def test_sleeper_is_stopped_at_the_total_deadline(sealed) -> None:
    job = sealed("time.sleep(3600)", per_model_timeout_s=5, total_timeout_s=8)
    results = sealed.results(job)
    overshoot = (as_utc(job.finished_at) - as_utc(job.started_at)).total_seconds() - 8
    print(f"job ran {overshoot:+.2f} s past its 8 s total limit")  # the resolving note quotes this
    assert job.status == "timed-out" and "total time limit of 8 s reached" in job.log
    assert overshoot < 3  # was +12.9 s when the limit was checked only between chunks of 4 models
    assert {r.flags for r in results} == {TIMEOUT_FLAG} and 1 <= len(results) <= 2


def test_memory_bomb_is_flagged_as_memory(sealed) -> None:
    job = sealed("data = bytearray(3 * 2**30)", memory_bytes=768 * 2**20)
    results = sealed.results(job)
    assert {r.flags for r in results} == {MEMORY_FLAG} and {r.value for r in results} == {0.5}
    assert all("[harness] stopped for memory: peak resident" in r.stderr for r in results)
    print(results[0].stderr.strip().splitlines()[-1])  # the resolving note quotes this


def test_forked_setsid_orphan_is_gone_after_the_job(sealed) -> None:
    token = f"assay-orphan-{uuid.uuid4().hex}"
    body = (
        "import subprocess\n"
        "orphan = 'import os, time; os.setsid(); time.sleep(3600)'\n"
        f"subprocess.Popen([sys.executable, '-c', orphan, {token!r}], start_new_session=True)\n"
        "open(args.result_filepath, 'w').write('0.5')\n"
    )
    job = sealed(body)
    assert job.status == "done" and {r.flags for r in sealed.results(job)} == {""}
    assert processes_with(token) == []


def test_network_reaches_nothing_not_even_host_loopback(sealed) -> None:
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.5)
    port = server.getsockname()[1]
    accepted: list[object] = []

    def accept() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                accepted.append(server.accept())
            except OSError:
                continue

    threading.Thread(target=accept, daemon=True).start()
    body = (
        "import socket\nout = []\n"
        f"targets = (('127.0.0.1', {port}), ('10.0.2.2', 80), ('8.8.8.8', 53), ('localhost', {port}))\n"
        "for host, port in targets:"
        "\n    try:\n        socket.create_connection((host, port), timeout=2).close()"
        "\n        out.append('connected')\n"
        "    except OSError as err:\n        out.append(type(err).__name__)\n"
        "print(out)\nopen(args.result_filepath, 'w').write('0.5')\n"
    )
    try:
        job = sealed(body)
    finally:
        server.close()
    outputs = {r.stdout for r in sealed.results(job)}
    assert all("connected" not in line for line in outputs) and outputs
    assert accepted == []


def test_floods_are_capped_and_garbage_is_flagged(sealed) -> None:
    body = (
        "sys.stdout.write('x' * (50 * 2**20))\n"
        "with open(os.path.join(args.scratch_dirpath, 'fill'), 'wb') as f:\n"
        "    try:\n        [f.write(b'y' * 2**20) for _ in range(4096)]\n"
        "    except OSError as err:\n        print('scratch:', err.errno, file=sys.stderr)\n"
        "os.remove(os.path.join(args.scratch_dirpath, 'fill'))\n"
        "open(args.result_filepath, 'w').write('1' * (20 * 2**20))\n"
    )
    job = sealed(body, scratch_bytes=64 * 2**20)
    for result in sealed.results(job):
        assert len(result.stdout) <= 64 * 1024 + 64 and result.flags == ":Missing Results:"
        assert "scratch: 28" in result.stderr  # ENOSPC at the 64 MiB scratch bound


def test_writes_into_the_model_round_and_database_are_refused(
    sealed, small_round: Path, tmp_path: Path
) -> None:
    models = small_round / "splits" / "test-sequestered" / "models"
    before = {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in models.rglob("*") if p.is_file()}
    body = (
        "out = []\n"
        f"for path in (args.model_filepath, {str(models)!r} + '/x', {str(tmp_path / 'store.db')!r},"
        " args.metaparameters_filepath, '/usr/lib/x', '/etc/x'):\n"
        "    try:\n        open(path, 'ab').write(b'tampered'); out.append('written')\n"
        "    except OSError as err:\n        out.append(type(err).__name__)\n"
        "print(out)\nopen(args.result_filepath, 'w').write('0.5')\n"
    )
    job = sealed(body)
    assert all("written" not in r.stdout for r in sealed.results(job))
    after = {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in models.rglob("*") if p.is_file()}
    assert after == before


def test_concurrent_models_cannot_read_each_others_scratch(sealed) -> None:
    body = (
        "name = hashlib.sha256(open(args.model_filepath, 'rb').read()).hexdigest()[:16]\n"
        "open(os.path.join(args.scratch_dirpath, 'marker-' + name), 'w').write(name)\n"
        "time.sleep(1)\n"
        "found = [f for r, d, fs in os.walk('/') if not r.startswith(('/proc', '/usr')) for f in fs"
        " if f.startswith('marker-')]\n"
        "print(sorted(found), 'marker-' + name)\nopen(args.result_filepath, 'w').write('0.5')\n"
    )
    job = sealed(body, workers=2)
    for result in sealed.results(job):
        found, mine = result.stdout.strip().rsplit(" ", 1)
        assert found == repr([mine])


def test_links_in_an_archive_are_refused(sealed, tmp_path: Path) -> None:
    sessions = open_store(f"sqlite:///{tmp_path / 'store.db'}")
    sealed("open(args.result_filepath, 'w').write('0.5')", split="smoke")  # makes the round and team
    with sessions() as session:
        name = session.scalars(select(Round.name)).first()
    folder = fake_detector(tmp_path / "linker", "pass")
    for target in ("/etc/passwd", "../../../../splits/test/METADATA.csv"):
        archive = tmp_path / f"link-{uuid.uuid4().hex[:6]}.tar.gz"
        with tarfile.open(archive, "w:gz") as tar:
            tar.add(folder, arcname="detector")
            info = tarfile.TarInfo("detector/learned_parameters/answers.csv")
            info.type, info.linkname = tarfile.SYMTYPE, target
            tar.addfile(info)
        with (
            pytest.raises(UserError, match=r"member 'detector/learned_parameters/answers\.csv' is a link"),
            sessions.begin() as session,
        ):
            submissions.submit(session, tmp_path / "artifacts", "mallory", name, "smoke", archive)
