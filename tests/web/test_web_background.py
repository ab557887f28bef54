"""The web app's background work (``assay.web.background``) and its sweeper (``assay.web.sweeper``), alone:
bounded lanes, named jobs and their states, failures recorded, one job per key where asked, reserved keys
held before a job starts, nothing a finished job held kept in memory, and a failed sweep recorded."""

from __future__ import annotations

import gc
import threading
import weakref
from datetime import UTC, datetime

import pytest

from assay.errors import UserError
from assay.web.background import BackgroundWork
from assay.web.sweeper import Sweeper


def gate() -> tuple[threading.Event, object]:
    """An event, and work that waits for it."""
    event = threading.Event()
    return event, lambda: event.wait(10) and "ok"


def test_lanes_are_bounded_and_their_load_is_shown() -> None:
    work = BackgroundWork({"slow": 2, "other": 1})
    release, waiting = gate()
    jobs = [work.submit("slow", f"job {n}", waiting) for n in range(3)]
    quick = work.submit("other", "quick", lambda: 42)  # another lane is not held up by a full one
    assert quick.wait(5) == 42
    status = work.status()
    slow = next(lane for lane in status.lanes if lane.name == "slow")
    assert (slow.workers, slow.running, slow.queued) == (2, 2, 1)
    assert [v.name for v in status.active] == ["job 0", "job 1", "job 2"]
    assert [t.name for t in threading.enumerate() if t.name.startswith("assay-slow-")] == [
        "assay-slow-1",
        "assay-slow-2",
    ]
    assert all(t.daemon for t in threading.enumerate() if t.name.startswith("assay-slow-"))
    release.set()
    assert [job.wait(5) for job in jobs] == ["ok"] * 3
    status = work.status()
    assert status.active == [] and [v.state for v in status.recent] == ["done"] * 4 and status.failed == 0


def test_failures_are_recorded_and_the_lane_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    work = BackgroundWork({"lane": 1})

    def broken() -> None:
        raise RuntimeError("disk full")

    def refused() -> None:
        raise UserError("the embedding model is not installed")

    failed, told = work.submit("lane", "broken", broken), work.submit("lane", "refused", refused)
    with pytest.raises(RuntimeError, match="disk full"):
        failed.wait(5)
    with pytest.raises(UserError):
        told.wait(5)
    assert work.submit("lane", "fine", lambda: 1).wait(5) == 1
    recent = {v.name: v for v in work.status().recent}
    assert recent["broken"].state == "failed" and recent["broken"].error == "RuntimeError: disk full"
    assert recent["refused"].error == "the embedding model is not installed"  # a UserError's own line
    assert recent["fine"].state == "done" and work.status().failed == 2
    assert "background job 'broken' failed" in caplog.text and "Traceback" in caplog.text


def test_one_job_per_key_when_unique_and_the_latest_by_key() -> None:
    work = BackgroundWork({"report": 1})
    release, waiting = gate()
    first = work.submit_unique("report", "report for demo", waiting, key=7)
    assert first is not None and work.submit_unique("report", "again", waiting, key=7) is None
    assert work.latest("report", 7).active  # type: ignore[union-attr]
    release.set()
    first.wait(5)
    assert work.latest("report", 7).state == "done"  # type: ignore[union-attr]
    assert work.submit_unique("report", "later", lambda: None, key=7) is not None
    assert work.latest("report", 8) is None


def test_a_reserved_key_is_held_before_the_job_starts() -> None:
    work = BackgroundWork({"dyepack": 1})
    held = work.holding("dyepack")
    ticket = work.reserve("dyepack", "DyePack run 5", key=5)
    assert 5 in held and 6 not in held
    work.cancel(ticket)
    assert 5 not in held
    ticket = work.reserve("dyepack", "DyePack run 6", key=6)
    release, waiting = gate()
    work.start(ticket, waiting)
    assert 6 in held
    release.set()
    ticket.wait(5)
    assert 6 not in held


def test_done_callbacks_run_once_even_when_added_late() -> None:
    work = BackgroundWork({"lane": 1})
    seen: list[str] = []
    job = work.submit("lane", "x", lambda: "result")
    job.wait(5)
    job.on_done(lambda j: seen.append(j.wait()))
    assert seen == ["result"]


def test_nothing_a_finished_job_held_stays_in_memory() -> None:
    """A DyePack key must not outlive its run: finished jobs are kept as plain records only."""

    class Key:
        pass

    work = BackgroundWork({"lane": 1})
    key = Key()
    gone = weakref.ref(key)
    job = work.submit("lane", "holds a key", lambda key=key: repr(key))
    job.wait(5)
    del key, job
    gc.collect()
    assert gone() is None
    assert work.status().recent[0].name == "holds a key"


def test_a_failed_sweep_is_recorded_and_the_next_tick_tries_again() -> None:
    class Broken:
        def __call__(self) -> None:
            raise RuntimeError("database is locked")

    sweeper = Sweeper(Broken(), every=3600)  # type: ignore[arg-type]
    outcome = sweeper.tick(datetime(2026, 1, 1, tzinfo=UTC))
    assert outcome.error == "RuntimeError: database is locked" and sweeper.status().last == outcome
