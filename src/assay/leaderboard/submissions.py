"""Taking in a detector submission: unpack it safely, validate it, dedupe it, enforce the submission window.

A submission is a folder or an archive (.tar, .tar.gz, .tgz, .zip) holding ``entrypoint.py`` (the TrojAI
detector command line), ``metaparameters.json`` and ``metaparameters_schema.json`` (every parameter bounded,
see ``assay.trojai.check_schema``), and optionally ``learned_parameters/``. Accepted artifacts are stored
content-addressed under ``ARTIFACTS/<sha256>/``: the digest covers every file's path and bytes, so the
same detector sent as a folder or as an archive is the same artifact. A team sending an artifact it already
ran on a split again gets ``duplicate`` (not run twice); the same bytes from another team are run and scored
for that team, with ``duplicate_of_id`` set so the organiser (only) sees the match. A submission holds
regular files and folders only: links are refused, ``__pycache__`` and ``__MACOSX`` dropped.

A container image is a submission too, as NIST takes them: an image archive (``podman save`` or ``docker
save``: a docker-archive or oci-archive ``.tar``), ``podman:REF`` (an image of this host's podman storage,
exported to such an archive on submission), or a Singularity ``.sif`` (read by ``assay.runner.sif``, no
apptainer needed). It is stored as sent, ``ARTIFACTS/<sha256>/image.tar`` (or ``image.sif``), its digest
over that one file. An archive must hold one image with an entrypoint or command, unpack within the size
limit, and carry ``/metaparameters.json`` and ``/metaparameters_schema.json`` at its root, where NIST's
harness reads them; both are read out of its layers and checked as a folder's are. A ``.sif`` must have an
unencrypted SquashFS primary partition built for this machine's architecture (else refused in one line),
unpack within the same limit with no device node or link out of its root, and carry the same two files and
a ``/.singularity.d/runscript``; its signatures, if any, are noted in the job's log, not verified.

Rejected submissions are recorded with their reasons and do not use up the team's window. Only the test
split has a window (``Round.submission_window_s``); train and smoke runs are for the team's own checks.
The team's storage quota is checked before unpacking (declared sizes) and after (exact); older practice
artifacts are released after each train or smoke submission (``assay.leaderboard.storage``).
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import stat
import tarfile
import tempfile
import zipfile
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from pathlib import Path, PurePosixPath

from sqlalchemy import select
from sqlalchemy.orm import Session

from assay.errors import UserError
from assay.leaderboard import storage
from assay.leaderboard.rounds import get_round, get_split, get_team
from assay.leaderboard.runnable import refusal
from assay.runner.container import PODMAN_PREFIX, save_local
from assay.runner.images import archive_format, read_archive
from assay.runner.sif import RUNSCRIPT, check_arch, read_contents, read_sif, signature_notes, system_partition
from assay.runner.squashfs import unsquashfs_missing
from assay.store.enums import JobStatus, RoundStatus, SubmissionStatus
from assay.store.models import Job, Round, Split, Submission, Team, utcnow
from assay.trojai import check_metaparameters, check_schema, read_json, technique_of

MAX_ARTIFACT_BYTES = 512 * 2**20
MAX_ARTIFACT_FILES = 10_000
REQUIRED_FILES = ("entrypoint.py", "metaparameters.json", "metaparameters_schema.json")
COUNTED = (SubmissionStatus.QUEUED, SubmissionStatus.RUNNING, SubmissionStatus.DONE, SubmissionStatus.FAILED)
WINDOWED_SPLITS = ("test",)
SUBMITTABLE_SPLITS = ("train", "test", "smoke")
CONTAINER_SUFFIXES = (".sif", ".simg")
IMAGE_ARCHIVE = "image.tar"  # a stored container artifact: the archive as submitted
SIF_IMAGE = "image.sif"
IMAGE_FILES = ("metaparameters.json", "metaparameters_schema.json")  # at the image's root, as NIST has them
IMAGE_KINDS = {"image": IMAGE_ARCHIVE, "sif": SIF_IMAGE}  # Submission.kind -> the file stored for it
KIND_FILES = {**IMAGE_KINDS, "folder": "entrypoint.py", "archive": "entrypoint.py"}  # what each kind runs
JUNK = frozenset({"__pycache__", "__MACOSX"})  # folders dropped on unpacking


class Refused(Exception):
    """A reason to record the submission as rejected (kept on record), unlike a ``UserError``."""


def _no_check(size: int) -> None:
    """The default ``unpack`` size check: none beyond the fixed limits."""


def _check_sizes(sizes: list[int], source: Path, limit: int = MAX_ARTIFACT_BYTES) -> None:
    if len(sizes) > MAX_ARTIFACT_FILES:
        raise UserError(f"{source}: holds at least {len(sizes)} files; the limit is {MAX_ARTIFACT_FILES}")
    if sum(sizes) > limit:
        raise UserError(f"{source}: unpacks to at least {sum(sizes)} bytes; the limit is {limit}")


def _kept_bytes(files: list[tuple[str, int]]) -> int:
    """Bytes of the declared files that would be kept once unpacked (``JUNK`` folders are dropped).

    Equal to ``tree_bytes`` of the unpacked artifact for a well-formed archive, so a team re-sending an
    artifact it holds is recognised by size before unpacking (``storage.check_quota``).
    """
    return sum(size for name, size in files if not JUNK.intersection(PurePosixPath(name).parts))


def _links(folder: Path, hard: bool) -> list[Path]:
    """Symbolic links under ``folder`` (not followed), and with ``hard`` files linked more than once."""
    found = []
    for parent, dirs, files in os.walk(folder):
        for name in dirs + files:
            path = Path(parent) / name
            info = path.lstat()
            if stat.S_ISLNK(info.st_mode) or (hard and stat.S_ISREG(info.st_mode) and info.st_nlink > 1):
                found.append(path)
    return found


def _refuse_links(folder: Path, source: Path, hard: bool = True) -> None:
    """A symbolic link could carry files from outside into the artifact (a folder's link to a round's
    ground truth), and a tar's hard links are sized 0 in its headers, so the limits checked before
    extracting never saw their bytes; a submission holds regular files and folders only."""
    links = _links(folder, hard)
    if links:
        shown = links[0].relative_to(folder).as_posix()
        target = f" -> {os.readlink(links[0])}" if links[0].is_symlink() else " (a hard link)"
        raise UserError(f"{source}: holds a link, {shown}{target}; submit regular files only")


def _copy_folder(artifact: Path, dest: Path, check: Callable[[int], None]) -> None:
    """Copy a detector folder, links refused before and after the copy (which copies links as links)."""
    _refuse_links(artifact, artifact, hard=False)  # a folder's own hard links are plain files to copy
    files = [
        (p.relative_to(artifact).as_posix(), p.stat().st_size) for p in artifact.rglob("*") if p.is_file()
    ]
    _check_sizes([size for _, size in files], artifact)
    check(_kept_bytes(files))
    shutil.copytree(artifact, dest, dirs_exist_ok=True, symlinks=True)


def _extract_zip(artifact: Path, dest: Path, check: Callable[[int], None]) -> None:
    with zipfile.ZipFile(artifact) as archive:
        members = archive.infolist()
        storage.check_zip_members(members, artifact)  # absolute, '..', links, a path twice or under a file
        _check_sizes([m.file_size for m in members], artifact)
        check(_kept_bytes([(m.filename, m.file_size) for m in members if not m.is_dir()]))
        archive.extractall(dest)


def _tar_members(archive: tarfile.TarFile, artifact: Path) -> list[tarfile.TarInfo]:
    """The archive's members, header by header, refused at the first header that takes the count or the
    declared total past a limit: a small .tar.gz declaring a 3 GiB member is refused before any of that
    member is decompressed (``getmembers`` would inflate every member to find the next header)."""
    members, total = [], 0
    for member in archive:
        members.append(member)
        total += member.size
        if len(members) > MAX_ARTIFACT_FILES or total > MAX_ARTIFACT_BYTES:
            _check_sizes([m.size for m in members], artifact)
    return members


def _extract_tar(artifact: Path, dest: Path, check: Callable[[int], None]) -> None:
    with tarfile.open(artifact) as archive:
        members = _tar_members(archive, artifact)
        storage.check_tar_members(members, artifact)  # as for zip: every member before anything is written
        check(_kept_bytes([(m.name, m.size) for m in members if m.isfile()]))
        try:
            archive.extractall(dest, members=members, filter="data")
        except tarfile.FilterError as exc:
            raise UserError(f"{artifact}: unsafe archive member ({exc})") from None


def _take_image(artifact: Path, dest: Path, check: Callable[[int], None], name: str, limit: int) -> Path:
    """Keep a container image as sent (``dest/image.tar`` or ``dest/image.sif``) once it is known to be one
    image with something to run, within the round's image limit and ``check``; ``validate`` reads its
    layers. Everything streams: an image of several GiB never sits in memory."""
    if name == SIF_IMAGE:
        if reason := unsquashfs_missing():  # this machine's fault, not the team's: nothing recorded
            raise UserError(f"{artifact}: a .sif image cannot be read here: {reason}")
        image = read_sif(artifact)  # each a one-line refusal: bad magic, no system partition, encrypted...
        check_arch(image, system_partition(image))
    size = artifact.stat().st_size
    _check_sizes([size], artifact, limit)
    check(size)
    if name == IMAGE_ARCHIVE and not read_archive(artifact).command:
        raise UserError(
            f"{artifact}: the image has neither an ENTRYPOINT nor a CMD; NIST runs its entrypoint"
        )
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(artifact, dest / name)
    return dest


def artifact_kind(artifact: Path | str) -> str:
    """What a team sent, as its submission records it (``Submission.kind``): ``folder``, ``archive`` (a
    detector folder in a .tar(.gz) or .zip), ``image`` (an image archive, or ``podman:REF`` exported to
    one) or ``sif``; the one reading of a form that ``unpack`` also dispatches on. "" when it is none."""
    path = Path(artifact)
    if str(artifact).startswith(PODMAN_PREFIX) and not path.exists():
        return "image"
    if path.suffix in CONTAINER_SUFFIXES:
        return "sif"
    if path.is_file() and archive_format(path) is not None:
        return "image"
    if path.is_dir():
        return "folder"
    if path.is_file() and (zipfile.is_zipfile(path) or tarfile.is_tarfile(path)):
        return "archive"
    return ""


class ArtifactFault(Exception):
    """A stored artifact is not what its submission's record says (a file its kind needs is missing, or
    the files' digest differs): the platform's storage failed, not the team, so the worker requeues the
    job and never runs or scores it (``worker.is_platform_fault``)."""


def recorded_image(kind: str, artifact: Path) -> str | None:
    """The container image a submission of ``kind`` runs in (``Task.image``), None for a folder detector:
    from the record alone, no file looked at (the worker's pre-flight). A row from before the kind was
    recorded ("") is read from its files."""
    if kind in IMAGE_KINDS:
        return str(artifact / IMAGE_KINDS[kind])
    return stored_image(artifact) if kind == "" else None


def checked_artifact(kind: str, artifact: Path, sha: str) -> str | None:
    """``recorded_image`` once the stored files are what the submission's record says: the file its kind
    runs (``image.tar``, ``image.sif``, ``entrypoint.py``) is there and the digest over every file is
    ``sha``. Otherwise an ``ArtifactFault`` naming what differs: a missing ``image.tar`` once ran as an
    empty folder detector and scored 0.5 for every model (issue 49)."""
    needed = artifact / KIND_FILES.get(kind, "entrypoint.py") if kind else artifact
    if not needed.exists():
        raise ArtifactFault(f"the stored artifact's {needed} is missing (its record says {kind or 'folder'})")
    if _stored_digest(artifact) != sha:
        raise ArtifactFault(
            f"the stored artifact {artifact} does not match its record (sha256 {sha[:12]}...)"
        )
    return recorded_image(kind, artifact)


def _stored_digest(artifact: Path) -> str:
    """``digest`` of a stored artifact, remembered while no file's size, time or inode changes: an image of
    several GiB is hashed once per worker, not once per job."""
    files = sorted(p for p in artifact.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    stamps = tuple((str(p), p.stat().st_size, p.stat().st_mtime_ns, p.stat().st_ino) for p in files)
    return _digest_of(artifact, stamps)


@functools.lru_cache(maxsize=64)
def _digest_of(artifact: Path, stamps: tuple) -> str:
    return digest(artifact)


def stored_image(artifact: Path) -> str | None:
    """The container image of unpacked files (for ``validate`` at submission, and rows from before the
    kind was recorded), None for a folder."""
    if (artifact / "entrypoint.py").exists():
        return None
    for name in (IMAGE_ARCHIVE, SIF_IMAGE):
        if (artifact / name).is_file():
            return str(artifact / name)
    return None


def _drop_junk(root: Path) -> None:
    """Remove ``__pycache__`` and ``__MACOSX`` folders: never needed to run, left out of the digest, and
    not to be stored uncounted."""
    for junk in [p for p in root.rglob("*") if p.name in JUNK and p.is_dir()]:
        if junk.exists():  # not inside one removed already
            shutil.rmtree(junk)


def unpack(
    artifact: Path,
    dest: Path,
    check: Callable[[int], None] = _no_check,
    image_limit: int = MAX_ARTIFACT_BYTES,
) -> Path:
    """Copy or extract ``artifact`` into the empty folder ``dest``; return the detector's root folder.

    Archives are checked before anything is written: no absolute paths, no ``..``, no links or devices
    (zip link members refused, tar's ``data`` filter), within the size and file-count limits; then
    ``check`` gets the bytes that would be kept and may refuse (the storage quota). A folder holding any
    link is refused. An archive with one top folder is entered. A container image (an image archive or a
    ``.sif``) is kept whole as ``dest/image.tar`` or ``dest/image.sif``, up to ``image_limit`` bytes.
    """
    if artifact.suffix in CONTAINER_SUFFIXES:
        return _take_image(artifact, dest, check, SIF_IMAGE, image_limit)
    if artifact.is_file() and archive_format(artifact) is not None:
        return _take_image(artifact, dest, check, IMAGE_ARCHIVE, image_limit)
    if artifact.is_dir():
        _copy_folder(artifact, dest, check)
    elif zipfile.is_zipfile(artifact):
        _extract_zip(artifact, dest, check)
    elif artifact.is_file() and tarfile.is_tarfile(artifact):
        _extract_tar(artifact, dest, check)
    else:
        raise UserError(f"{artifact}: not a folder, .tar(.gz) or .zip detector artifact")
    _refuse_links(dest, artifact)
    entries = [p for p in dest.iterdir() if p.name not in ("__MACOSX",)]
    root = entries[0] if len(entries) == 1 and entries[0].is_dir() else dest
    _drop_junk(root)
    return root


def digest(root: Path) -> str:
    """SHA-256 over every file's relative path and bytes, in sorted order."""
    hasher = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        hasher.update(path.relative_to(root).as_posix().encode() + b"\0")
        with path.open("rb") as handle:  # in chunks: a container image may be several GiB
            for chunk in iter(lambda: handle.read(2**20), b""):
                hasher.update(chunk)
        hasher.update(b"\0")
    return hasher.hexdigest()


def validate(root: Path, image_limit: int = MAX_ARTIFACT_BYTES) -> tuple[list[str], str, list[str]]:
    """Every problem with the detector at ``root`` (one line each), its technique name, and warnings (rules
    of ours that NIST's harness does not enforce; written to the job's log); a container image may unpack
    to ``image_limit`` bytes."""
    image = stored_image(root)
    if image is not None:
        return _validate_image(Path(image), image_limit)
    missing = [name for name in REQUIRED_FILES if not (root / name).is_file()]
    if missing:
        return [f"{name}: missing from the submission" for name in missing], "", []
    return _check_metaparameters(root)


def _image_files(image: Path, limit: int) -> tuple[dict[str, bytes | None] | None, list[str], list[str]]:
    """The metaparameter files at the root of a stored image (None when the image itself is refused: a
    device node, a link out of its root, too big unpacked), what is wrong with the image, and notes for the
    job's log (a ``.sif``'s signatures, shown but not verified)."""
    try:
        if image.name != SIF_IMAGE:
            return read_archive(image, IMAGE_FILES, limit).root_files, [], []
        contents = read_contents(image, IMAGE_FILES, limit)
    except UserError as exc:
        return None, [str(exc).replace(f"{image}: ", "")], []
    errors = [] if contents.runscript else [f"{RUNSCRIPT}: missing from the image (singularity run runs it)"]
    return contents.root_files, errors, signature_notes(contents.image)


def _validate_image(image: Path, limit: int) -> tuple[list[str], str, list[str]]:
    """``validate`` for a container image: its ``/metaparameters.json`` and schema, checked as a folder's.
    An image refused as a whole says only why: its files were not read, so none is called missing."""
    files, errors, notes = _image_files(image, limit)
    if files is None:
        return errors, "", []
    for name in IMAGE_FILES:
        if name not in files:
            errors.append(f"/{name}: missing from the image (NIST's harness reads it there)")
        elif files[name] is None:
            errors.append(f"/{name}: not a regular file of at most 1 MiB in the image")
    if errors:
        return errors, "", []
    with tempfile.TemporaryDirectory(prefix="assay-image-") as folder:
        for name in IMAGE_FILES:
            (Path(folder) / name).write_bytes(files[name] or b"")
        errors, technique, warnings = _check_metaparameters(Path(folder))
    return ["/" + error for error in errors], technique, [*warnings, *notes]  # paths inside the image


def _check_metaparameters(root: Path) -> tuple[list[str], str, list[str]]:
    """The metaparameter checks of ``validate`` on the two files in ``root``."""
    try:
        schema = read_json(root / "metaparameters_schema.json", "metaparameter schema")
        warnings = check_schema(schema, "metaparameters_schema.json")
        values = read_json(root / "metaparameters.json", "metaparameters")
        check_metaparameters(values, schema, "metaparameters.json")
    except UserError as exc:
        return [str(exc).replace(str(root) + "/", "")], "", []
    return [], technique_of(schema, values), warnings


def window_reopens_at(
    session: Session, team_id: int, split_id: int, window_s: int, now: datetime
) -> datetime | None:
    """When the team may next submit to the split, or None when it may submit ``now``.

    Only submissions that ran or will run (``COUNTED``) start a window; the web shows this to the team.
    """
    last = session.scalar(
        select(Submission.submitted_at)
        .where(Submission.team_id == team_id, Submission.split_id == split_id, Submission.status.in_(COUNTED))
        .order_by(Submission.submitted_at.desc())
        .limit(1)
    )
    if last is None:
        return None
    last = last if last.tzinfo else last.replace(tzinfo=now.tzinfo)
    opens = last + timedelta(seconds=window_s)
    return opens if now < opens else None


def _window_error(session: Session, team_id: int, split_id: int, window_s: int, now: datetime) -> str | None:
    opens = window_reopens_at(session, team_id, split_id, window_s, now)
    if opens is None:
        return None
    return f"the team's submission window for this split reopens at {opens.isoformat(timespec='seconds')}"


def _target(session: Session, team_name: str, round_name: str, split_name: str) -> tuple[Team, Round, Split]:
    """The team, open round and submittable split named, or a ``UserError`` saying which is wrong."""
    team = get_team(session, team_name)
    round_ = get_round(session, round_name)
    split = get_split(round_, split_name)
    if team.disabled:
        raise UserError(f"team {team_name!r} is disabled")
    if round_.status != RoundStatus.OPEN:
        raise UserError(f"round {round_name!r} is {round_.status}; submissions need an open round")
    if split_name not in SUBMITTABLE_SPLITS:
        raise UserError(f"split {split_name!r} is run by the organiser when the round closes; submit to test")
    return team, round_, split


def _quota_check(session: Session, team: Team, round_: Round) -> Callable[[int], None]:
    """``unpack``'s check: refuse before writing anything when the declared size alone breaks the quota."""

    def check(size: int) -> None:
        reason = storage.check_quota(session, team, round_, size)
        if reason:
            raise Refused(reason)

    return check


def _admission_errors(
    session: Session, team: Team, round_: Round, split: Split, sha: str, size: int, now: datetime
) -> list[str]:
    """Why a valid artifact may not be kept now: the test window, then the storage quota.

    The team's row is locked first (PostgreSQL), so two submissions of one team take turns here and
    cannot both fit into the last of a window or a quota.
    """
    session.execute(select(Team.id).where(Team.id == team.id).with_for_update())
    if split.name in WINDOWED_SPLITS:
        window = _window_error(session, team.id, split.id, round_.submission_window_s, now)
        if window:
            return [window]
    reason = storage.check_quota(session, team, round_, size, sha)
    return [reason] if reason else []


def _original(session: Session, team: Team, split: Split, sha: str) -> tuple[Submission | None, bool]:
    """The first submission of the same files on the split that ran or will run, and whether it is the
    team's own. The team's own makes this one a duplicate, not run again; another team's does not (each
    team is scored on what it sent), and only the organiser is shown the link."""
    found = session.scalars(
        select(Submission)
        .where(
            Submission.split_id == split.id, Submission.artifact_sha256 == sha, Submission.status.in_(COUNTED)
        )
        .order_by(Submission.id)
    ).all()
    own = next((s for s in found if s.team_id == team.id), None)
    return (own, True) if own is not None else (found[0] if found else None, False)


def _store(root: Path, artifacts_dir: Path, sha: str) -> Path:
    """Move the unpacked artifact to ``ARTIFACTS/<sha>/`` unless the same files are there already; either
    way stamp its time, so garbage collection sees it as fresh while this submission is uncommitted."""
    target = artifacts_dir / sha
    if not target.exists():
        shutil.move(str(root), target)
    os.utime(target)
    return target


def submit(
    session: Session,
    artifacts_dir: Path,
    team_name: str,
    round_name: str,
    split_name: str,
    artifact: Path,
    now: datetime | None = None,
) -> Submission:
    """Record a submission; accepted ones are stored and queued as a job, others say why in their status.

    Nothing is kept for a rejected submission: its unpacked files go with the temp folder. A kind that no
    live worker serving the split can run (an image where none has podman: ``runnable.refusal``) is a
    ``UserError`` before anything is read or stored, since it would wait in the queue for ever; with no
    live worker at all it is accepted and queued, as workers may come later.
    """
    now = now or utcnow()
    team, round_, split = _target(session, team_name, round_name, split_name)
    local = str(artifact).startswith(PODMAN_PREFIX) and not Path(artifact).exists()
    artifact = Path(artifact)
    if not artifact.exists() and not local:
        raise UserError(f"{artifact}: no such file or folder")
    if why := refusal(session, round_.name, split.name, artifact_kind(artifact), now):
        raise UserError(why)
    artifacts_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=artifacts_dir, prefix=".incoming-") as scratch:
        if local:  # podman:REF: the image as an archive, stored and judged as if it had been sent as one
            ref = str(artifact).removeprefix(PODMAN_PREFIX)
            artifact = Path(scratch) / IMAGE_ARCHIVE
            save_local(ref, artifact, round_.image_bytes)
        kind = artifact_kind(artifact)  # the record says how it runs; the stored files never decide
        try:
            check = _quota_check(session, team, round_)
            root = unpack(artifact, Path(scratch) / "artifact", check, image_limit=round_.image_bytes)
        except Refused as exc:
            refused = Submission(team=team, split=split, artifact_sha256="", kind=kind)
            return _record(session, refused, now, [str(exc)])
        sha, size = digest(root), storage.tree_bytes(root)
        errors, technique, warnings = validate(root, round_.image_bytes)
        errors = errors or _admission_errors(session, team, round_, split, sha, size, now)
        made = Submission(
            team=team, split=split, artifact_sha256=sha, artifact_bytes=size, technique=technique, kind=kind
        )
        if errors:
            return _record(session, made, now, errors)
        original, own = _original(session, team, split, sha)
        made.artifact_path = str(_store(root, artifacts_dir, sha))
        made.duplicate_of_id = original.id if original is not None else None
        made = _record(
            session, made, now, [], SubmissionStatus.DUPLICATE if own else SubmissionStatus.QUEUED, warnings
        )
    if split.name in storage.PRACTICE_SPLITS:
        storage.prune_practice(session, artifacts_dir, team.id, round_.id, now)
    return made


def _record(
    session: Session,
    made: Submission,
    now: datetime,
    errors: list[str],
    status: SubmissionStatus = SubmissionStatus.REJECTED,
    warnings: Sequence[str] = (),
) -> Submission:
    """Add the submission with its time, status and reasons (a queued one with its job, whose log starts
    with the validation warnings), and flush."""
    made.submitted_at = now
    made.validation_errors = "\n".join(errors)
    made.status = status
    if not made.artifact_path:
        made.artifact_path = ""
    session.add(made)
    if status == SubmissionStatus.QUEUED:
        session.add(
            Job(submission=made, status=JobStatus.QUEUED, log="".join(f"warning: {w}\n" for w in warnings))
        )
    session.flush()
    return made


def close_round(session: Session, round_name: str) -> list[Submission]:
    """Stop submissions and queue each team's best test submission on the holdout split. A re-run keeps
    the test submission's ``submitted_at``: the team's own act it stands for, which its holdout row shows
    (issue 47: the row said when the close queued it)."""
    from assay.leaderboard.publish import standings
    from assay.leaderboard.rounds import set_status

    round_ = set_status(session, round_name, RoundStatus.CLOSED)
    holdout = get_split(round_, "holdout")
    queued = []
    for row in standings(session, round_name, "test", best_per_team=True):
        best = session.get(Submission, row.submission_id)
        assert best is not None
        rerun = Submission(
            team=best.team,
            split=holdout,
            artifact_path=best.artifact_path,
            artifact_sha256=best.artifact_sha256,
            artifact_bytes=best.artifact_bytes,
            kind=best.kind,
            technique=best.technique,
            submitted_at=best.submitted_at,
            status=SubmissionStatus.QUEUED,
        )
        session.add(rerun)
        session.add(Job(submission=rerun, status=JobStatus.QUEUED))
        queued.append(rerun)
    session.flush()
    return queued
