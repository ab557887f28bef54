"""Rounds, their splits, and teams: what an organiser sets up before performers submit.

A round is made from the folder ``assay zoo split`` writes: ``train/`` (full models, shown to performers),
``test/`` and ``holdout/`` (ground truth and METADATA.csv, organiser only) with their ``*-sequestered/``
views (what detectors see). The smoke split is the first few training models, for a quick check that a
detector runs before it spends a test-split submission. Lifecycle: draft -> open -> closed -> archived;
several rounds may be open at once. A round may require GPUs (``gpus``: each detector run holds that many;
``set_gpus``). A round is private unless an organiser makes it public (``set_public``):
then visitors who are not signed in read its standings as a member of no team does (``views.may_see_round``).
"""

from __future__ import annotations

import math
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session

from assay.errors import UserError
from assay.leaderboard.disclosure import DEFAULT_MODE, MODES, small_split_warning
from assay.leaderboard.sealing import DEFAULT_PUBLISH_EVERY_S, MAX_PUBLISH_EVERY_S
from assay.names import check_name
from assay.store.enums import RoundStatus
from assay.store.models import Round, Split, Team, utcnow
from assay.store.web_models import WebAuditEvent

# Which splits show detector output (stdout/stderr) to the team: only those whose ground truth they have.
SHOW_LOGS = {"train": True, "smoke": True, "test": False, "holdout": False}
SMOKE_MODELS = 4
MAX_GPUS = 64  # GPUs one detector run may hold: more than any node has, so a typo is caught
# Metrics a round may rank by (computed for every job by assay.leaderboard.scoring); the first is the default.
RANKING_METRICS = ("cross_entropy", "roc_auc", "brier", "ece", "tpr_at_5_fpr")
TRANSITIONS = {
    RoundStatus.DRAFT: (RoundStatus.OPEN,),
    RoundStatus.OPEN: (RoundStatus.CLOSED,),
    RoundStatus.CLOSED: (RoundStatus.ARCHIVED,),
    RoundStatus.ARCHIVED: (),
}


ROUND_SETTINGS = "round.settings"  # the audit trail's action for a changed round setting
ROUND_CREATE = "round.create"  # ... and for a new round, with how it discloses test scores
ROUND_PUBLIC = "round.public"  # ... and for a round whose standings were opened to, or closed from, visitors


def get_round(session: Session, name: str) -> Round:
    """The round called ``name``, or a ``UserError`` listing the rounds there are."""
    found = session.scalar(select(Round).where(Round.name == name))
    if found is None:
        names = ", ".join(session.scalars(select(Round.name).order_by(Round.id))) or "none yet"
        raise UserError(f"no round named {name!r} (rounds: {names})")
    return found


def get_split(round_: Round, name: str) -> Split:
    """The round's split ``name``; a ``UserError`` names the splits it has."""
    for split in round_.splits:
        if split.name == name:
            return split
    raise UserError(
        f"round {round_.name!r} has no split {name!r} (splits: {', '.join(s.name for s in round_.splits)})"
    )


def get_team(session: Session, name: str) -> Team:
    """The team called ``name``, or a ``UserError``."""
    found = session.scalar(select(Team).where(Team.name == name))
    if found is None:
        raise UserError(f"no team named {name!r}; add it with 'assay leaderboard team add {name}'")
    return found


def _model_names(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if (p / "model.pt").is_file()) if folder.is_dir() else []


def _splits_of(dataset: Path) -> list[Split]:
    """The splits found in an ``assay zoo split`` folder, with their sequestered views."""
    if not (dataset / "split.json").is_file():
        raise UserError(f"{dataset}: no split.json; make the round with 'assay zoo split ROUND_DIR'")
    splits = []
    for name in ("train", "test", "holdout"):
        truth = dataset / name
        view = dataset / f"{name}-sequestered" if name != "train" else truth
        if not _model_names(view / "models"):
            raise UserError(f"{view / 'models'}: holds no models for the {name} split")
        splits.append(
            Split(
                name=name, models_path=str(view / "models"), truth_path=str(truth), show_logs=SHOW_LOGS[name]
            )
        )
    smoke = _model_names(dataset / "train" / "models")[:SMOKE_MODELS]
    splits.append(
        Split(
            name="smoke",
            models_path=str(dataset / "train" / "models"),
            truth_path=str(dataset / "train"),
            show_logs=True,
            model_names=",".join(smoke),
        )
    )
    return splits


def create_round(session: Session, name: str, dataset: str | Path, **settings: object) -> Round:
    """Register a draft round over ``dataset`` (an ``assay zoo split`` folder); ``settings``: its limits."""
    if session.scalar(select(Round.id).where(Round.name == name)) is not None:
        raise UserError(f"a round named {name!r} already exists")
    dataset = Path(dataset).resolve()
    unknown = [key for key in settings if key not in Round.__table__.columns]
    if unknown:
        raise UserError(f"unknown round setting {unknown[0]!r}")
    metric = settings.get("metric", "cross_entropy")
    if metric not in RANKING_METRICS:
        raise UserError(f"--metric: {metric!r} is not one of {', '.join(RANKING_METRICS)}")
    disclosure = settings.get("disclosure", DEFAULT_MODE)
    if disclosure not in MODES:
        raise UserError(f"--disclosure: {disclosure!r} is not one of {', '.join(MODES)}")
    _check_gpus(settings.get("gpus", 0))
    _check_publish_every(settings.get("publish_every_s", DEFAULT_PUBLISH_EVERY_S))
    if settings.get("source_dataset") is not None:
        source = Path(str(settings["source_dataset"])).resolve()
        if not source.is_dir():
            raise UserError(f"--source-dataset: {source} is not a folder")
        settings["source_dataset"] = str(source)
    round_ = Round(
        name=name, dataset=str(dataset), status=RoundStatus.DRAFT, splits=_splits_of(dataset), **settings
    )
    session.add(round_)
    session.flush()
    detail = f"disclosure {round_.disclosure}, leak_bits {round_.leak_bits:g}, metric {round_.metric}"
    detail += f", publish_every_s {round_.publish_every_s}"
    detail += f", gpus {round_.gpus}" if round_.gpus else ""
    session.add(WebAuditEvent(action=ROUND_CREATE, target=f"round {name}", detail=detail))
    return round_


def disclosure_warning(round_: Round) -> str | None:
    """The organiser's warning when the round's disclosure budget would reveal its whole test split."""
    tests = [split for split in round_.splits if split.name == "test"]
    if not tests:
        return None
    return small_split_warning(len(split_models(tests[0])), round_.leak_bits, round_.disclosure)


def set_status(session: Session, name: str, status: str) -> Round:
    """Move a round along draft -> open -> closed -> archived (closing is ``close_round``'s job)."""
    round_ = get_round(session, name)
    if status not in TRANSITIONS[round_.status]:
        allowed = ", ".join(TRANSITIONS[round_.status]) or "nothing"
        raise UserError(f"round {name!r} is {round_.status}; it can move to {allowed}, not {status}")
    round_.status = status
    if status == RoundStatus.OPEN:
        round_.opened_at = utcnow()
    elif status == RoundStatus.CLOSED:
        round_.closed_at = utcnow()
    return round_


def split_models(split: Split) -> list[str]:
    """The model names a job on ``split`` runs."""
    every = _model_names(Path(split.models_path))
    if not split.model_names:
        return every
    chosen = split.model_names.split(",")
    return [name for name in every if name in chosen]


def add_team(session: Session, name: str, contact: str = "", kind: str = "performer") -> Team:
    """Register a team; names are unique."""
    name = check_name("team name", name)
    if session.scalar(select(Team.id).where(Team.name == name)) is not None:
        raise UserError(f"a team named {name!r} already exists")
    team = Team(name=name, contact=contact, kind=kind)
    session.add(team)
    session.flush()
    return team


def set_plateau(
    session: Session, name: str, delta: float | None, days: float | None, actor_id: int | None = None
) -> list[str]:
    """Change a round's plateau rule (the best test score improved by less than ``delta`` over ``days``):
    the organiser's call, from the command line or the web alike. Each change goes to the audit trail with
    its old and new value (``actor_id`` None: the shell); the changes are returned, one line each."""
    if delta is not None and not (math.isfinite(delta) and delta >= 0):
        raise UserError(f"--plateau-delta: {delta!r} must be a finite number >= 0")
    if days is not None and not (math.isfinite(days) and days > 0):
        raise UserError(f"--plateau-days: {days!r} must be a finite number of days > 0")
    round_ = get_round(session, name)
    changes = []
    for field, value in (("plateau_delta", delta), ("plateau_days", days)):
        old = getattr(round_, field)
        if value is not None and value != old:
            setattr(round_, field, value)
            changes.append(f"{field} {old:g} -> {value:g}")
    if changes:
        detail = "; ".join(changes)
        session.add(
            WebAuditEvent(actor_id=actor_id, action=ROUND_SETTINGS, target=f"round {name}", detail=detail)
        )
    return changes


def _check_gpus(gpus: object) -> int:
    """A round's GPU count: a whole number, 0 (a CPU round) or more."""
    if isinstance(gpus, bool) or not isinstance(gpus, int) or not 0 <= gpus <= MAX_GPUS:
        raise UserError(f"--gpus: {gpus!r} must be a whole number of GPUs from 0 to {MAX_GPUS}")
    return gpus


def set_gpus(session: Session, name: str, gpus: int, actor_id: int | None = None) -> list[str]:
    """Change how many NVIDIA GPUs each detector run of the round holds (0: a CPU round): the organiser's
    call. Jobs queued already run with the new count; a worker without that many GPUs takes none of them
    (``preflight``). The change goes to the audit trail (``actor_id`` None: the shell); returned as one
    line, or nothing when the round already had that count."""
    return _set(session, name, "gpus", _check_gpus(gpus), actor_id)


def _set(session: Session, name: str, field: str, value: int, actor_id: int | None) -> list[str]:
    """Set one whole-number setting of the round, with its audit event; the change in one line, or none."""
    round_ = get_round(session, name)
    old = getattr(round_, field)
    if old == value:
        return []
    change = f"{field} {old} -> {value}"
    setattr(round_, field, value)
    session.add(
        WebAuditEvent(actor_id=actor_id, action=ROUND_SETTINGS, target=f"round {name}", detail=change)
    )
    return [change]


def _check_publish_every(every_s: object) -> int:
    """The round's clock: a whole number of seconds from 1 to a week."""
    if isinstance(every_s, bool) or not isinstance(every_s, int) or not 1 <= every_s <= MAX_PUBLISH_EVERY_S:
        raise UserError(
            f"--publish-every: {every_s!r} must be a whole number of seconds from 1 to {MAX_PUBLISH_EVERY_S}"
        )
    return every_s


def set_publication(session: Session, name: str, every_s: int, actor_id: int | None = None) -> list[str]:
    """Change the round's publication clock (``sealing``: sealed results are shown at multiples of
    ``every_s`` seconds since the epoch): the organiser's call, in the audit trail (``actor_id`` None: the
    shell). A job already finished is published at the first tick of the new clock after it finished.
    Returned as one line, or nothing when the round already had that period."""
    return _set(session, name, "publish_every_s", _check_publish_every(every_s), actor_id)


def set_public(session: Session, name: str, public: bool, actor_id: int | None = None) -> bool:
    """Open a round's standings to visitors who are not signed in, or close them again: the organiser's call,
    from the command line or the web alike. What a visitor then sees is ``views``' rule (a member of no
    team's view: no submission, holdout after the close). A change goes to the audit trail (``actor_id``
    None: the shell); True if it changed anything, False if the round already was so."""
    round_ = get_round(session, name)
    if round_.public == public:
        return False
    yes_no = {True: "yes", False: "no"}
    detail = f"public {yes_no[round_.public]} -> {yes_no[public]}"
    round_.public = public
    session.add(WebAuditEvent(actor_id=actor_id, action=ROUND_PUBLIC, target=f"round {name}", detail=detail))
    return True
