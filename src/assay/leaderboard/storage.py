"""Disk used by detector artifacts: per-team quotas, retention of practice artifacts, garbage collection.

Accepted artifacts live in content-addressed folders ``ARTIFACTS/<sha256>/`` that every submission with the
same files shares, whichever team sent it. A submission *holds* its artifact while ``artifact_path`` is set
and ``artifact_removed_at`` is empty. Test and holdout submissions always hold theirs (the best test
submission is re-run on holdout when the round closes), as does any submission whose job is queued or
running; a team's train and smoke ("practice") submissions hold theirs only for the latest
``Round.keep_practice`` distinct artifacts. A folder is deleted only when no submission holds it.

What an archive may write is checked member by member before anything is unpacked (``check_members``, which
``submissions.unpack`` calls for every zip and tar): relative names inside the folder, regular files and
folders only, each name once.

Quotas count what a team holds in a round, unpacked: ``Round.quota_bytes`` over the distinct artifacts and
``Round.quota_artifacts`` of them. Files shared with another team count for each team that holds them, so a
team's quota never depends on (or tells of) what other teams sent.
"""

from __future__ import annotations

import os
import re
import shutil
import tarfile
import zipfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path, PurePosixPath
from typing import Any

from sqlalchemy import Select, select
from sqlalchemy.orm import Session, selectinload

from assay.errors import UserError
from assay.store.enums import ACTIVE_JOBS, SubmissionStatus
from assay.store.models import Round, Split, Submission, Team, utcnow

PRACTICE_SPLITS = ("train", "smoke")
TEMP_PREFIXES = (".incoming-", ".upload-")  # submissions.submit and the web's upload spool
GRACE = timedelta(hours=1)  # a folder younger than this may belong to a submission not yet committed
ARTIFACT_NAME = re.compile(r"[0-9a-f]{64}")


@dataclass
class GcReport:
    """What ``collect_garbage`` released and removed (or would, with ``dry_run``)."""

    dry_run: bool
    released: list[int] = field(default_factory=list)  # submissions that stopped holding their artifact
    removed: list[str] = field(default_factory=list)  # folder names under the artifacts folder
    bytes_freed: int = 0


def _mib(size: int) -> str:
    return f"{size / 2**20:.1f} MiB"


def tree_bytes(folder: Path) -> int:
    """Bytes of the regular files under ``folder``, links not followed: what the folder costs on disk."""
    total = 0
    for parent, _, names in os.walk(folder):
        total += sum(os.lstat(os.path.join(parent, name)).st_size for name in names)
    return total


# --- archive members ---------------------------------------------------------------------------------------


def member_problem(name: str, kind: str, seen: dict[PurePosixPath, str], link: str = "") -> str | None:
    """Why the archive member ``name`` (``kind``: file, dir, link, hard link or other) may not be unpacked,
    or None.

    ``seen`` maps the names met so far to their kinds, and is updated. tar's ``data`` filter would strip an
    absolute name's ``/`` and store it (zip refused it); a second member of one name overwrites, or writes
    through a link the first made, or fails inside ``tarfile`` (IsADirectoryError, FileExistsError).
    """
    path = PurePosixPath(name)
    if path.is_absolute():
        return "is an absolute path; members must be relative to the archive's top"
    if ".." in path.parts:
        return "would be written outside the folder (its path holds '..')"
    if kind in ("link", "hard link"):
        return f"is a {kind}{f' to {link!r}' if link else ''}; submit regular files only"
    if kind == "other":
        return "is a device, pipe or socket; submit regular files only"
    under = next((p for p in path.parents if seen.get(p) == "file"), None)
    if under is not None:
        return f"lies under {str(under)!r}, which is a file"
    if path in seen and (kind, seen[path]) != ("dir", "dir") and path != PurePosixPath("."):
        return f"appears twice in the archive (as a {seen[path]} first); each path may be stored once"
    seen[path] = kind
    return None


def check_members(members: Iterable[tuple[str, str, str]], source: object) -> None:
    """Refuse, with a ``UserError`` naming the member and the reason, the first of ``members`` (name, kind,
    link target) that ``member_problem`` finds fault with."""
    seen: dict[PurePosixPath, str] = {}
    for name, kind, link in members:
        problem = member_problem(name, kind, seen, link)
        if problem:
            raise UserError(f"{source}: member {name!r} {problem}")


def _tar_kind(member: tarfile.TarInfo) -> str:
    if member.issym() or member.islnk():
        return "hard link" if member.islnk() else "link"
    return "dir" if member.isdir() else "file" if member.isfile() else "other"


def _zip_kind(member: zipfile.ZipInfo) -> str:
    if (member.external_attr >> 16) & 0o170000 == 0o120000:  # S_IFLNK in the Unix mode bits
        return "link"
    return "dir" if member.is_dir() else "file"


def check_tar_members(members: Iterable[tarfile.TarInfo], source: object) -> None:
    """``check_members`` over a tar's headers (for an unpacker that has read them already)."""
    check_members(((m.name, _tar_kind(m), m.linkname) for m in members), source)


def check_zip_members(members: Iterable[zipfile.ZipInfo], source: object) -> None:
    """``check_members`` over a zip's entries (for an unpacker that has read them already)."""
    check_members(((m.filename, _zip_kind(m), "") for m in members), source)


# --- quotas and retention ----------------------------------------------------------------------------------


def _holding(query: Select[Any]) -> Select[Any]:
    """Narrow a Submission query to the submissions that still hold an artifact."""
    return query.where(Submission.artifact_path != "", Submission.artifact_removed_at.is_(None))


def held_by(session: Session, team_id: int, round_id: int) -> dict[str, int]:
    """sha256 -> unpacked bytes of each distinct artifact the team holds in the round (a submission the
    platform failed is kept on disk, for the organiser, but never counted against the team)."""
    rows = session.execute(
        _holding(select(Submission.artifact_sha256, Submission.artifact_bytes))
        .join(Split, Submission.split_id == Split.id)
        .where(Submission.team_id == team_id, Split.round_id == round_id)
        .where(Submission.status != SubmissionStatus.PLATFORM_ERROR)
    ).all()
    held: dict[str, int] = {}
    for sha, size in rows:
        held[sha] = max(size, held.get(sha, 0))
    return held


def usage(session: Session, team_id: int, round_id: int) -> tuple[int, int]:
    """The team's stored bytes and distinct artifacts in the round, as the quota counts them."""
    held = held_by(session, team_id, round_id)
    return sum(held.values()), len(held)


def check_quota(session: Session, team: Team, round_: Round, size: int, sha: str | None = None) -> str | None:
    """Why keeping ``size`` more bytes would break the team's quota in the round (one line), or None.

    An artifact the team already holds costs nothing. Before unpacking there is no digest yet (``sha`` is
    None) and ``size`` is what the archive declares; an artifact of exactly a size the team holds might be
    that very one, so it passes here and is checked exactly once unpacked.
    """
    held = held_by(session, team.id, round_.id)
    if (sha in held) if sha is not None else (size in held.values()):
        return None
    used, count = sum(held.values()), len(held)
    stores = f"team {team.name!r} stores {count} artifact(s) ({_mib(used)}) in round {round_.name!r}"
    if count + 1 > round_.quota_artifacts:
        return f"artifact quota: {stores}; the limit is {round_.quota_artifacts} artifact(s)"
    if used + size > round_.quota_bytes:
        return f"storage quota: {stores}; this one ({_mib(size)}) would exceed {_mib(round_.quota_bytes)}"
    return None


def _practice(session: Session, team_id: int, round_id: int) -> list[Submission]:
    """The team's train/smoke submissions in the round that still hold an artifact, newest first."""
    return list(
        session.scalars(
            _holding(select(Submission))
            .join(Split, Submission.split_id == Split.id)
            .where(
                Submission.team_id == team_id,
                Split.round_id == round_id,
                Split.name.in_(PRACTICE_SPLITS),
            )
            .options(selectinload(Submission.job))
            .order_by(Submission.submitted_at.desc(), Submission.id.desc())
        )
    )


def _beyond_keep(practice: list[Submission], keep: int) -> list[Submission]:
    """Practice submissions past the latest ``keep`` distinct artifacts; a queued or running job's are
    spared, since the worker still reads its files (a later prune releases them)."""
    kept: list[str] = []
    for submission in practice:
        if submission.artifact_sha256 not in kept and len(kept) < keep:
            kept.append(submission.artifact_sha256)
    return [
        s
        for s in practice
        if s.artifact_sha256 not in kept and (s.job is None or s.job.status not in ACTIVE_JOBS)
    ]


def _release(session: Session, submissions: Iterable[Submission], now: datetime) -> set[str]:
    """Mark the submissions as no longer holding their artifact; the digests they held."""
    released = set()
    for submission in submissions:
        submission.artifact_removed_at = now
        released.add(submission.artifact_sha256)
    session.flush()
    return released


def is_held(session: Session, sha: str, ignoring: Iterable[int] = ()) -> bool:
    """Whether any submission, of any team in any round, still holds the artifact ``sha``."""
    query = _holding(select(Submission.id)).where(Submission.artifact_sha256 == sha)
    ignored = list(ignoring)
    if ignored:
        query = query.where(Submission.id.not_in(ignored))
    return session.scalar(query.limit(1)) is not None


def _remove(folder: Path, dry_run: bool) -> int:
    """Delete ``folder`` (unless ``dry_run``); the bytes it held."""
    size = tree_bytes(folder)
    if not dry_run:
        shutil.rmtree(folder)
    return size


def prune_practice(
    session: Session, artifacts_dir: Path, team_id: int, round_id: int, now: datetime | None = None
) -> list[str]:
    """Release the team's practice artifacts in the round beyond the latest ``keep_practice``, and delete
    the folders no submission holds any more; the digests whose folders went.

    The release is flushed before any file goes: should the transaction fail later, the store still says
    those submissions hold folders that are gone, which only overstates the team's usage.
    """
    round_ = session.get(Round, round_id)
    assert round_ is not None
    stale = _beyond_keep(_practice(session, team_id, round_id), round_.keep_practice)
    released = _release(session, stale, now or utcnow())
    gone = [sha for sha in sorted(released) if not is_held(session, sha) and (artifacts_dir / sha).is_dir()]
    for sha in gone:
        _remove(artifacts_dir / sha, dry_run=False)
    return gone


def _practice_owners(session: Session) -> list[tuple[int, int]]:
    """Every (team, round) pair with practice submissions that still hold an artifact."""
    rows = session.execute(
        _holding(select(Submission.team_id, Split.round_id))
        .join(Split, Submission.split_id == Split.id)
        .where(Split.name.in_(PRACTICE_SPLITS))
        .distinct()
    ).all()
    return [(team_id, round_id) for team_id, round_id in rows]


def _old(path: Path, now: datetime) -> bool:
    """Older than ``GRACE`` by modification time (a temp or unknown folder may be a submit in progress)."""
    return datetime.fromtimestamp(path.stat().st_mtime, now.tzinfo) < now - GRACE


def _doomed(session: Session, folder: Path, released: list[int], now: datetime) -> bool:
    """Whether garbage collection deletes this entry of the artifacts folder.

    An artifact folder goes when no submission holds it; one the store has never heard of only once it is
    old (a submit may be between moving it in and committing). Temp folders go once old. Anything else
    (files, links, other names) is not ours to touch.
    """
    if folder.is_symlink() or not folder.is_dir():
        return False
    if folder.name.startswith(TEMP_PREFIXES):
        return _old(folder, now)
    if not ARTIFACT_NAME.fullmatch(folder.name) or is_held(session, folder.name, released):
        return False
    known = session.scalar(select(Submission.id).where(Submission.artifact_sha256 == folder.name).limit(1))
    return known is not None or _old(folder, now)


def collect_garbage(
    session: Session, artifacts_dir: Path, dry_run: bool = False, now: datetime | None = None
) -> GcReport:
    """Apply practice retention to every team and round, then delete what nothing needs: artifact folders
    no submission holds and ``.incoming-``/``.upload-`` folders left by a crashed submit over an hour ago.

    With ``dry_run`` nothing is marked or deleted; the report says what would be.
    """
    now = now or utcnow()
    report = GcReport(dry_run=dry_run)
    for team_id, round_id in _practice_owners(session):
        round_ = session.get(Round, round_id)
        assert round_ is not None
        stale = _beyond_keep(_practice(session, team_id, round_id), round_.keep_practice)
        report.released += [s.id for s in stale]
        if not dry_run:
            _release(session, stale, now)
    if not artifacts_dir.is_dir():
        return report
    ignoring = report.released if dry_run else []
    for folder in sorted(artifacts_dir.iterdir()):
        if _doomed(session, folder, ignoring, now):
            report.bytes_freed += _remove(folder, dry_run)
            report.removed.append(folder.name)
    return report
