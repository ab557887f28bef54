"""Sealed means silent: the one decision of what anyone but an organiser observes of a sealed job.

A sealed job is a test job while its round's labels are secret (holdout jobs no team sees before the
close, and none takes a place in another team's queue count). Its detector chooses
everything it does on sequestered models, so every fact that changes while it runs (its status, a log line,
a flag count, its place in the queue, the moment it finishes) can carry facts about those models out to its
team (issue 44: the isolation line, the trailing-line warning and the running -> done flip each told about
10 bits per submission). So from submission until publication a team sees one frozen record ("submitted",
and when: its own act); at publication it sees one showing (the disclosed score and whether the job
scored), and logs and flag counts wait for the close.

Publication runs on the round's clock, never on the job's: results are published at the ticks of
``Round.publish_every_s`` (every hour on the hour by default; the organiser's setting, in the audit trail),
the first tick at or after the job finished. The slot a job is published in is the one residual timing
channel: log2 of the slots a job can finish in (``slot_bits``), stated in docs/leaderboard.md.

Every face asks ``phase``; ``views`` (records, jobs, logs, a team's list) and ``publish.standings`` (the
public rows, exports) render what it says, and ``fleet.queue_place`` leaves sealed jobs out of the places it
tells non-organisers.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from typing import Literal

from assay.leaderboard.disclosure import labels_secret
from assay.store.enums import FINISHED_JOBS, JobStatus
from assay.store.models import Job, Round, as_utc

SEALED_SPLITS = ("test", "holdout")  # their ground truth is the organiser's
DEFAULT_PUBLISH_EVERY_S = 3600  # every hour on the hour
MAX_PUBLISH_EVERY_S = 7 * 86_400
SILENT_STATUS = "submitted"  # all a sealed job says of itself before its publication
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

Phase = Literal["open", "silent", "shown"]
# open: no sealing (organisers, practice splits, test after the close); silent: the frozen record;
# shown: published while the labels are secret: the showing alone


def publication_time(every_s: int, finished_at: datetime) -> datetime:
    """The first tick of the round's clock (multiples of ``every_s`` seconds since the epoch, UTC) at or
    after ``finished_at``: when a job that finished then is published."""
    since = (as_utc(finished_at) - EPOCH).total_seconds()
    return EPOCH + timedelta(seconds=math.ceil(since / every_s) * every_s)


def published_at(round_: Round, job: Job | None) -> datetime | None:
    """When ``job`` is (or was) published; None while it has not finished."""
    if job is None or job.status not in FINISHED_JOBS or job.finished_at is None:
        return None
    return publication_time(round_.publish_every_s, job.finished_at)


def phase(round_: Round, split: str, job: Job | None, now: datetime, organiser: bool) -> Phase:
    """What a viewer may observe of a job on ``split`` at ``now``: the one rule every face asks.

    A submission with no job (refused at upload, a duplicate) was decided before any label was read: open.
    Once the round has closed, results are unrestricted: test jobs are open, and holdout jobs (which no team
    sees before the close, ``views.holdout_hidden``) too. While it is open, a test job is silent until it is
    published on the round's clock, and shown after.
    """
    if organiser or job is None or not labels_secret(round_, split):
        return "open"
    published = published_at(round_, job)
    if published is None or as_utc(now) < published:
        return "silent"
    return "shown"


def shown_status(status: str) -> str:
    """A published sealed job's status: scored or not. Timing out is the detector's choice, so it shows as
    done (its flags wait for the close); a failure and a platform error stay apart (the latter is not the
    team's fault and the page says so)."""
    return JobStatus.DONE if status == JobStatus.TIMED_OUT else status


def slot_bits(every_s: int, total_timeout_s: float) -> float:
    """Bits the publication slot can carry: log2 of the ticks a job may finish before (its total time limit
    over the clock's period, plus the tick it started in)."""
    return math.log2(math.ceil(total_timeout_s / every_s) + 1)


def schedule_words(every_s: int) -> str:
    """The round's clock in words, for pages and the CLI: "every hour on the hour"."""
    if every_s == 3600:
        return "every hour on the hour"
    if every_s % 86_400 == 0:
        days = every_s // 86_400
        return "every day at 00:00 UTC" if days == 1 else f"every {days} days at 00:00 UTC"
    if every_s % 3600 == 0:
        return f"every {every_s // 3600} hours on the hour"
    if every_s % 60 == 0:
        return f"every {every_s // 60} minutes"
    return f"every {every_s} s"
