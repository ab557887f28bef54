"""Issue 44, the last timing channel: a practice job that waits behind a sealed job on one host.

The attack: a team submits a test job whose detector takes as long as it likes (a detector that sleeps by
each model's hash slot encodes labels in its duration) and a practice job right behind it. The practice
job's start, as the team sees it (the claim time in ``results --as-team --json``, and its own detector's
clock, written to stderr, which a team reads for practice runs), minus the test job's submission time used
to track the test job's duration to the second. Now a host that ran a sealed job takes no practice run
until that job's publication tick (``leaderboard.hostquiet``, ``runner.hostlease``): the practice job
starts at the tick, which the team learns anyway when the test job is shown.

Before the fix (one worker, a 5 s clock, both jobs submitted just after a tick so the sealed job ends
mid-slot): the practice job was claimed 0.02 s after the sealed job finished (+2.53 and +2.28 s after the
submission) and its detector read its clock 0.22 s later, both well before the tick (+4.95 s); now it is
claimed at the tick and its detector reads +5.13 to +5.18 s, whatever the sealed job took.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from datetime import datetime
from pathlib import Path

import pytest
from sqlalchemy import select
from test_leaderboard import fake_detector
from typer.testing import CliRunner

from assay.leaderboard import sealing, submissions
from assay.leaderboard.cli import app as leaderboard_cli
from assay.leaderboard.worker import work
from assay.runner import LocalExecutor, Task, TaskResult, isolation
from assay.runner.executors import _run_leased
from assay.runner.hostlease import host_lease, quiet_until
from assay.store import Job, open_store
from assay.store.models import as_utc
from fake_board import open_round

CLOCK_S = 5  # the round's clock: fast, yet longer than a sealed job of 4 models (2-3 s), which ends mid-slot
CLOCK_READER = (
    "import sys\nprint(f'started {time.time()}', file=sys.stderr)\n"
    "open(args.result_filepath, 'w').write('0.5')\n"
)
needs_bwrap = pytest.mark.skipif(
    isolation.isolation_available() != "bwrap", reason="sealed jobs need bubblewrap"
)


def _seconds(moment: datetime | str | None) -> float:
    assert moment is not None
    parsed = datetime.fromisoformat(moment) if isinstance(moment, str) else moment
    return as_utc(parsed).timestamp()


def _after_a_tick(every_s: int) -> None:
    """Sleep until just after a tick, so a sealed job of a second or two ends in the middle of a slot."""
    time.sleep(every_s - time.time() % every_s + 0.05)


def _team_sees(url: str, job_id: int, monkeypatch: pytest.MonkeyPatch) -> dict:
    """The practice job as its team reads it: ``assay leaderboard results ID --as-team alpha --json``."""
    monkeypatch.setenv("ASSAY_DB_URL", url)
    result = CliRunner().invoke(leaderboard_cli, ["results", str(job_id), "--as-team", "alpha", "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


@needs_bwrap
@pytest.mark.parametrize("sleep_s", [0.1, 0.5])
def test_a_practice_job_behind_a_sealed_one_starts_at_its_publication_tick(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sleep_s: float
) -> None:
    url = f"sqlite:///{tmp_path / 'lb.db'}"
    open_round(url, tmp_path / "splits", publish_every_s=CLOCK_S)
    sessions = open_store(url)
    sealed = fake_detector(
        tmp_path / "s", f"time.sleep({sleep_s})\nopen(args.result_filepath, 'w').write('0.5')"
    )
    practice = fake_detector(tmp_path / "p", CLOCK_READER)
    _after_a_tick(CLOCK_S)  # the sealed job, right behind it the practice job, then one worker
    with sessions.begin() as session:
        submitted = submissions.submit(session, tmp_path / "artifacts", "alpha", "r1", "test", sealed)
        sealed_id, submitted_at = submitted.job.id, _seconds(submitted.submitted_at)
    with sessions.begin() as session:
        practice_id = submissions.submit(
            session, tmp_path / "artifacts", "alpha", "r1", "train", practice
        ).job.id
    assert work(sessions, LocalExecutor(2), once=True, poll_s=0.2) == 2
    with sessions() as session:
        finished_at = session.get(Job, sealed_id).finished_at
        clocks = [
            float(result.stderr.split()[1]) for result in session.get(Job, practice_id).results
        ]  # fmt: skip
    finished, tick = _seconds(finished_at), sealing.publication_time(CLOCK_S, finished_at).timestamp()
    seen = _team_sees(url, practice_id, monkeypatch)
    claimed = _seconds(seen["job"]["claimed_at"])
    print(
        f"\nsealed detector slept {sleep_s} s a model: finished {finished - submitted_at:.2f} s after its "
        f"submission; the practice job was claimed at +{claimed - submitted_at:.2f} s and its detector "
        f"read its clock at +{min(clocks) - submitted_at:.2f} s; the publication tick: "
        f"+{tick - submitted_at:.2f} s"
    )
    assert len(clocks) == 4
    assert tick <= claimed < tick + 1.5, "the practice job turned running before the tick"
    assert all(tick <= clock < tick + 5 for clock in clocks), "a practice run started before the tick"


def test_a_shared_lease_waits_out_the_quiet_a_sealed_holder_left(tmp_path: Path) -> None:
    """The lease's half: a practice run claimed while a sealed run held the host (by another worker) starts
    at the quiet's end, not when the sealed run lets go; a later sealed run need not wait for it."""
    path, started = tmp_path / "host.lease", []
    assert quiet_until(path) == 0.0
    with host_lease(True, path) as lease:
        waiter = threading.Thread(target=lambda: started.append(_shared_start(path)))
        waiter.start()
        time.sleep(0.2)
        released = time.time()
        lease.quiet_until = released + 0.8
    assert quiet_until(path) == pytest.approx(released + 0.8, abs=1e-5)
    began = time.time()
    with host_lease(True, path) as again:  # sealed runs may follow each other through the quiet
        assert time.time() - began < 0.3
        again.quiet_until = released + 0.1  # an earlier quiet never shortens the recorded one
    waiter.join(timeout=10)
    assert started and started[0] >= released + 0.8
    assert quiet_until(path) == pytest.approx(released + 0.8, abs=1e-5)


def _shared_start(path: Path) -> float:
    with host_lease(False, path):
        return time.time()


@needs_bwrap
def test_separate_pools_on_separate_hosts_never_wait_for_the_quiet(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The organiser's lever: ``worker --splits test,holdout`` on one machine, ``--splits train,smoke`` on
    another; on an hourly clock the practice pool runs at once, and the sealed pool's ``--once`` ends."""
    url = f"sqlite:///{tmp_path / 'lb.db'}"
    open_round(url, tmp_path / "splits")  # the default clock: hourly; any wait for it would hang the test
    sessions = open_store(url)
    answer = "open(args.result_filepath, 'w').write('0.5')"
    for split in ("test", "train"):
        with sessions.begin() as session:
            detector = fake_detector(tmp_path / split, answer)
            submissions.submit(session, tmp_path / "artifacts", "alpha", "r1", split, detector)
    monkeypatch.setenv("ASSAY_HOST_LEASE", str(tmp_path / "sealed-host.lease"))
    began = time.time()
    assert work(sessions, LocalExecutor(2), once=True, splits=["test", "holdout"]) == 1
    assert quiet_until() > time.time()  # the sealed pool's host is quiet now, and nothing waits for it
    monkeypatch.setenv("ASSAY_HOST_LEASE", str(tmp_path / "practice-host.lease"))
    assert work(sessions, LocalExecutor(2), once=True, splits=["train", "smoke"]) == 1
    assert time.time() - began < 60
    with sessions() as session:
        assert {job.status for job in session.scalars(select(Job))} == {"done"}


@pytest.mark.parametrize("where", ["local executor", "ray node"])
def test_a_sealed_task_leaves_its_host_quiet_until_its_clock_ticks(where: str) -> None:
    """Below the worker: each exclusive run (a chunk on the local executor, a task on a Ray node, whichever
    worker or driver sent it) leaves its host quiet until the next tick of ``Task.quiet_every_s``, so a
    practice task that lands there next starts at that tick, not when the sealed one ended."""
    run = (lambda task: LocalExecutor(1).map([task])[0]) if where == "local executor" else _on_a_node
    sealed = Task("sealed", [sys.executable, "-c", "pass"], exclusive=True, quiet_every_s=2)
    practice = Task("practice", [sys.executable, "-c", "import time; print(time.time())"])
    assert run(sealed).ok
    ended, quiet = time.time(), quiet_until()
    assert quiet % 2 == 0 and quiet - 2 < ended <= quiet + 0.5  # the first tick at or after the run's end
    result = run(practice)
    assert result.ok and quiet <= float(result.stdout) < quiet + 1.5


def _on_a_node(task: Task) -> TaskResult:
    return _run_leased(task, None, None)
