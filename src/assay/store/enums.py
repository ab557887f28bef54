"""The closed vocabularies stored in the tables: roles, task kinds and statuses, one ``StrEnum`` each.

They live here, at the bottom of the layers, because the store, every pillar and every face read and write
them; a misspelt member is an ``AttributeError`` at import time, where a misspelt string was a silent
never-true comparison. A ``StrEnum`` member *is* its string (``JobStatus.DONE == "done"``), so the database
columns stay plain strings, JSON and templates see the value, and rows written before the enums existed read
back unchanged.
"""

from __future__ import annotations

from enum import StrEnum


class Role(StrEnum):
    """What an account may do on the platform (a person often holds several)."""

    ORGANISER = "organiser"
    TEAM_MEMBER = "team_member"
    RED_TEAMER = "red_teamer"
    ANNOTATOR = "annotator"
    ARBITRATOR = "arbitrator"
    VIEWER = "viewer"


STAR_ROLES = (Role.RED_TEAMER, Role.ANNOTATOR, Role.ARBITRATOR)  # the roles a STAR pool member can hold


class TaskKind(StrEnum):
    """A STAR task: write a dialogue, rate one, or settle a disagreement."""

    RED_TEAM = "red_team"
    ANNOTATE = "annotate"
    ARBITRATE = "arbitrate"


TASK_ROLE = {
    TaskKind.RED_TEAM: Role.RED_TEAMER,
    TaskKind.ANNOTATE: Role.ANNOTATOR,
    TaskKind.ARBITRATE: Role.ARBITRATOR,
}


class TaskStatus(StrEnum):
    """A STAR task's state; ``waiting`` is an open task held back until its dialogue exists."""

    OPEN = "open"
    CLAIMED = "claimed"
    DONE = "done"
    WAITING = "waiting"


class RoundStatus(StrEnum):
    """A leaderboard round's life: prepared, taking submissions, closed on the holdout, archived."""

    DRAFT = "draft"
    OPEN = "open"
    CLOSED = "closed"
    ARCHIVED = "archived"


class SubmissionStatus(StrEnum):
    """A submission: refused at upload, the same files again, or following its job."""

    REJECTED = "rejected"
    DUPLICATE = "duplicate"
    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    PLATFORM_ERROR = "platform-error"  # the platform failed it, not the team: never counted against them


class JobStatus(StrEnum):
    """A harness job (one detector on one split), and a DyePack verification run (which never times out)."""

    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    TIMED_OUT = "timed-out"
    # given up after repeated faults of the platform (isolation, disk, database, a lost node): not the
    # team's failure (assay.leaderboard.worker)
    PLATFORM_ERROR = "platform-error"


FINISHED_JOBS = (JobStatus.DONE, JobStatus.FAILED, JobStatus.TIMED_OUT, JobStatus.PLATFORM_ERROR)
ACTIVE_JOBS = (JobStatus.QUEUED, JobStatus.RUNNING)


class ThrottleScope(StrEnum):
    """What a count of failed sign-ins is about (``assay.web.throttle``)."""

    CLIENT = "client"  # one client address, whatever names it tries
    CLIENT_ACCOUNT = "client_account"  # one address trying one name
    ACCOUNT = "account"  # one name, from every client that has not signed in to it before
    DEVICE = "device"  # one browser that has signed in to the account before
