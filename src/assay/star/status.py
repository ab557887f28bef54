"""How far a campaign has got: tasks by kind and status, dialogues and annotations (human and machine apart),
and the arbitration rate (arbitrations per dialogue with all its primary ratings in)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from assay.store.star_models import StarAnnotation, StarCampaign, StarDialogue, StarTask


def dialogue_counts(session: Session, campaign: StarCampaign) -> dict[bool, int]:
    """Dialogues by their ``machine`` flag: {False: made by people, True: machine-made}."""
    rows = session.execute(
        select(StarDialogue.machine, func.count())
        .where(StarDialogue.campaign_id == campaign.id)
        .group_by(StarDialogue.machine)
    )
    return {bool(machine): int(count) for machine, count in rows}


def campaign_status(session: Session, campaign: StarCampaign) -> dict[str, Any]:
    """Counts for the organiser; machine-made work is counted separately, never mixed in."""
    tasks: dict[str, dict[str, int]] = {}
    rows = session.execute(
        select(StarTask.kind, StarTask.status, func.count())
        .where(StarTask.campaign_id == campaign.id)
        .group_by(StarTask.kind, StarTask.status)
    )
    for kind, status, count in rows:
        tasks.setdefault(kind, {})[status] = count
    dialogues = dialogue_counts(session, campaign)
    annotations = dict(
        session.execute(
            select(StarAnnotation.machine, func.count())
            .join(StarDialogue, StarDialogue.id == StarAnnotation.dialogue_id)
            .where(StarDialogue.campaign_id == campaign.id)
            .group_by(StarAnnotation.machine)
        ).all()
    )
    total_dialogues = sum(dialogues.values())
    arbitrations = sum(tasks.get("arbitrate", {}).values())
    return {
        "campaign": campaign.name,
        "tasks": tasks,
        "dialogues": total_dialogues,
        "dialogues_by_origin": {"human": dialogues.get(False, 0), "machine": dialogues.get(True, 0)},
        "annotations": sum(annotations.values()),
        "annotations_by_origin": {"human": annotations.get(False, 0), "machine": annotations.get(True, 0)},
        "arbitration_rate": arbitrations / total_dialogues if total_dialogues else 0.0,
    }
