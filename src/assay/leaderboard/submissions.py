"""Taking in a detector submission: unpack it safely, validate it, dedupe it, enforce the submission window.

A submission is a folder or an archive (.tar, .tar.gz, .tgz, .zip) holding ``entrypoint.py`` (the TrojAI
detector command line), ``metaparameters.json`` and ``metaparameters_schema.json`` (every parameter bounded,
see ``assay.trojai.check_schema``), and optionally ``learned_parameters/``. Accepted artifacts are stored
content-addressed under ``ARTIFACTS/<sha256>/``: the digest covers every file's path and bytes, so the
same detector sent as a folder or as an archive is the same artifact, and it is not run twice on a split.

Rejected submissions are recorded with their reasons and do not use up the team's window. Only the test
split has a window (``Round.submission_window_s``); train and smoke runs are for the team's own checks.
"""

from __future__ import annotations

import hashlib
import shutil
import tarfile
import tempfile
import zipfile
from datetime import datetime, timedelta
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session

from assay.errors import UserError
from assay.leaderboard.rounds import get_round, get_split, get_team
from assay.store.models import Job, Submission, utcnow
from assay.trojai import check_metaparameters, check_schema, read_json

MAX_ARTIFACT_BYTES = 512 * 2**20
MAX_ARTIFACT_FILES = 10_000
REQUIRED_FILES = ("entrypoint.py", "metaparameters.json", "metaparameters_schema.json")
COUNTED = ("queued", "running", "done", "failed")
WINDOWED_SPLITS = ("test",)
SUBMITTABLE_SPLITS = ("train", "test", "smoke")
CONTAINER_SUFFIXES = (".sif", ".simg")


def _check_sizes(sizes: list[int], source: Path) -> None:
    if len(sizes) > MAX_ARTIFACT_FILES:
        raise UserError(f"{source}: holds {len(sizes)} files; the limit is {MAX_ARTIFACT_FILES}")
    if sum(sizes) > MAX_ARTIFACT_BYTES:
        raise UserError(f"{source}: unpacks to {sum(sizes)} bytes; the limit is {MAX_ARTIFACT_BYTES}")


def unpack(artifact: Path, dest: Path) -> Path:
    """Copy or extract ``artifact`` into the empty folder ``dest``; return the detector's root folder.

    Archives are checked before anything is written: no absolute paths, no ``..``, no links or devices
    (tar's ``data`` filter), within the size and file-count limits. An archive with one top folder is
    entered.
    """
    if artifact.suffix in CONTAINER_SUFFIXES:
        engine = shutil.which("apptainer") or shutil.which("singularity")
        found = f"{engine} is installed, but" if engine else "no apptainer or singularity here, and"
        raise UserError(
            f"{artifact}: a container image; {found} this harness runs detector folders and archives only: "
            "submit the folder with entrypoint.py (or a .tar.gz of it)"
        )
    if artifact.is_dir():
        files = [p for p in artifact.rglob("*") if p.is_file()]
        _check_sizes([p.stat().st_size for p in files], artifact)
        shutil.copytree(artifact, dest, dirs_exist_ok=True, symlinks=False)
    elif zipfile.is_zipfile(artifact):
        with zipfile.ZipFile(artifact) as archive:
            members = archive.infolist()
            for member in members:
                name = Path(member.filename)
                if name.is_absolute() or ".." in name.parts:
                    raise UserError(
                        f"{artifact}: member {member.filename!r} would be written outside the folder"
                    )
            _check_sizes([m.file_size for m in members], artifact)
            archive.extractall(dest)
    elif artifact.is_file() and tarfile.is_tarfile(artifact):
        with tarfile.open(artifact) as archive:
            members = archive.getmembers()
            _check_sizes([m.size for m in members], artifact)
            try:
                archive.extractall(dest, filter="data")
            except tarfile.FilterError as exc:
                raise UserError(f"{artifact}: unsafe archive member ({exc})") from None
    else:
        raise UserError(f"{artifact}: not a folder, .tar(.gz) or .zip detector artifact")
    entries = [p for p in dest.iterdir() if p.name not in ("__MACOSX",)]
    return entries[0] if len(entries) == 1 and entries[0].is_dir() else dest


def digest(root: Path) -> str:
    """SHA-256 over every file's relative path and bytes, in sorted order."""
    hasher = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        hasher.update(path.relative_to(root).as_posix().encode() + b"\0")
        hasher.update(path.read_bytes())
        hasher.update(b"\0")
    return hasher.hexdigest()


def validate(root: Path) -> tuple[list[str], str]:
    """Every problem with the detector at ``root`` (one line each), and its technique name."""
    missing = [name for name in REQUIRED_FILES if not (root / name).is_file()]
    if missing:
        return [f"{name}: missing from the submission" for name in missing], ""
    try:
        schema = read_json(root / "metaparameters_schema.json", "metaparameter schema")
        check_schema(schema, "metaparameters_schema.json")
        values = read_json(root / "metaparameters.json", "metaparameters")
        check_metaparameters(values, schema, "metaparameters.json")
    except UserError as exc:
        return [str(exc).replace(str(root) + "/", "")], ""
    return [], str(values.get("technique", ""))[:200]


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


def submit(
    session: Session,
    artifacts_dir: Path,
    team_name: str,
    round_name: str,
    split_name: str,
    artifact: Path,
    now: datetime | None = None,
) -> Submission:
    """Record a submission; accepted ones are stored and queued as a job, others say why in their status."""
    now = now or utcnow()
    team = get_team(session, team_name)
    round_ = get_round(session, round_name)
    split = get_split(round_, split_name)
    if team.disabled:
        raise UserError(f"team {team_name!r} is disabled")
    if round_.status != "open":
        raise UserError(f"round {round_name!r} is {round_.status}; submissions need an open round")
    if split_name not in SUBMITTABLE_SPLITS:
        raise UserError(f"split {split_name!r} is run by the organiser when the round closes; submit to test")
    artifact = Path(artifact)
    if not artifact.exists():
        raise UserError(f"{artifact}: no such file or folder")
    artifacts_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=artifacts_dir, prefix=".incoming-") as scratch:
        root = unpack(artifact, Path(scratch) / "artifact")
        errors, technique = validate(root)
        sha = digest(root)
        if not errors and split.name in WINDOWED_SPLITS:
            window = _window_error(session, team.id, split.id, round_.submission_window_s, now)
            errors = [window] if window else []
        original = None
        if not errors:
            original = session.scalar(
                select(Submission)
                .where(
                    Submission.split_id == split.id,
                    Submission.artifact_sha256 == sha,
                    Submission.status.in_(COUNTED),
                )
                .order_by(Submission.id)
                .limit(1)
            )
            if not (artifacts_dir / sha).exists():
                shutil.move(str(root), artifacts_dir / sha)
        submission = Submission(
            team=team,
            split=split,
            artifact_path=str(artifacts_dir / sha) if not errors else "",
            artifact_sha256=sha,
            technique=technique,
            submitted_at=now,
            validation_errors="\n".join(errors),
            status="rejected" if errors else "duplicate" if original is not None else "queued",
            duplicate_of_id=original.id if original is not None else None,
        )
        session.add(submission)
        if submission.status == "queued":
            session.add(Job(submission=submission, status="queued"))
        session.flush()
        return submission


def close_round(session: Session, round_name: str) -> list[Submission]:
    """Stop submissions and queue each team's best test submission on the holdout split."""
    from assay.leaderboard.publish import standings
    from assay.leaderboard.rounds import set_status

    round_ = set_status(session, round_name, "closed")
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
            technique=best.technique,
            status="queued",
        )
        session.add(rerun)
        session.add(Job(submission=rerun, status="queued"))
        queued.append(rerun)
    session.flush()
    return queued
