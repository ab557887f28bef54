"""A small fake leaderboard round, shared by the web and the visibility tests: an ``assay zoo split``
folder of 4 empty models per split, and finished jobs scored by the harness's own ``score_job``."""

from __future__ import annotations

import hashlib
from datetime import timedelta
from pathlib import Path

from sqlalchemy.orm import Session, sessionmaker

from assay.leaderboard import rounds
from assay.leaderboard.harness import score_job
from assay.store import Job, ModelResult, Submission, open_store
from assay.store.models import utcnow

TRUTH = {"id-00000000": 0, "id-00000001": 1, "id-00000002": 0, "id-00000003": 1}
ANSWERS = {"id-00000000": 0.2, "id-00000001": 0.9, "id-00000002": 0.4, "id-00000003": 0.6}


def fake_splits(root: Path, truth_of: dict[str, int] = TRUTH) -> Path:
    """An ``assay zoo split`` folder: train, test, holdout (with sequestered views), 4 models each (or the
    models of ``truth_of``)."""
    root.mkdir(parents=True)
    (root / "split.json").write_text("{}")
    for split in ("train", "test", "holdout"):
        views = (split,) if split == "train" else (split, f"{split}-sequestered")
        for view in views:
            for name, truth in truth_of.items():
                model = root / view / "models" / name
                model.mkdir(parents=True)
                (model / "model.pt").write_bytes(b"")
                if view == split:
                    (model / "ground_truth.csv").write_text(f"{truth}\n")
        rows = [
            f"{name},{'cnn' if i < 2 else 'mlp'},{truth}" for i, (name, truth) in enumerate(truth_of.items())
        ]
        (root / split / "METADATA.csv").write_text("model_name,architecture,poisoned\n" + "\n".join(rows))
    return root


def open_round(url: str, root: Path, teams: tuple[str, ...] = ("alpha",), **settings: object) -> None:
    """An open round r1 over ``fake_splits(root)`` (no submission window) with ``teams``, in the store at
    ``url``; ``settings``: more of the round's (its clock, say)."""
    with open_store(url).begin() as session:
        rounds.create_round(session, "r1", fake_splits(root), submission_window_s=0, **settings)
        rounds.set_status(session, "r1", "open")
        for team in teams:
            rounds.add_team(session, team)


def scored(
    sessions: sessionmaker[Session],
    team: str,
    split: str,
    answers: dict[str, float],
    ago_h: float = 2,
    round_name: str = "r1",
) -> int:
    """A finished job for ``team`` on ``split`` of the round, scored by the harness's own ``score_job``."""
    with sessions.begin() as session:
        round_ = rounds.get_round(session, round_name)
        sub = Submission(
            team=rounds.get_team(session, team),
            split=rounds.get_split(round_, split),
            artifact_path="/nowhere",
            artifact_sha256=hashlib.sha256(f"{team}-{split}-{sorted(answers.items())}".encode()).hexdigest(),
            technique=f"{team}-technique",
            status="done",
            submitted_at=utcnow() - timedelta(hours=ago_h),
        )
        # finished an hour or more ago: published on the default hourly clock (``sealing``) by now
        finished = utcnow() - timedelta(hours=max(ago_h, 1))
        job = Job(submission=sub, status="done", finished_at=finished, log="isolation: bubblewrap\n")
        job.results = [
            ModelResult(
                model_name=name,
                value=value,
                raw_output=repr(value),
                flags="",
                exit_code=0,
                wall_seconds=0.25,
                stderr=f"stderr of {team} on {name}",
            )
            for name, value in answers.items()
        ]
        session.add(job)
        session.flush()
        job_id, sub_id = job.id, sub.id
    score_job(sessions, job_id)
    return sub_id
