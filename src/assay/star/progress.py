"""A campaign's progress for organisers, as one pydantic model (the web dashboard and the organiser overview
show it; scripts get it as JSON): tasks per design cell (rule x target group) and per group, the matching
shortfalls, agreement so far and the arbitration rate.

Agreement is Krippendorff's alpha over completed first rounds only (dialogues with all their primary human
ratings in), computed by the same analysis code as the final report, so the dashboard never shows a figure
the report would contradict.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime

import pandas as pd
from pydantic import BaseModel
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from assay.star.analysis.reliability import (
    AlphaEstimate,
    Arbitration,
    alpha_estimate,
    arbitration_summary,
    primary_annotations,
    reliability_matrix,
)
from assay.star.assign import campaign_spec, list_annotations, shortfalls
from assay.star.spec import CampaignSpec
from assay.star.status import dialogue_counts
from assay.store.models import utcnow
from assay.store.star_models import StarCampaign, StarTask

KINDS = ("red_team", "annotate", "arbitrate")


class Counts(BaseModel):
    """Tasks of one kind: how many exist so far and how many are done (annotate and arbitrate tasks only
    exist once a dialogue, or a disagreement, has made them)."""

    total: int = 0
    done: int = 0


class CellProgress(BaseModel):
    """One design cell: a rule and a target group (``group_label`` "" when the rule targets none)."""

    rule_id: str
    group_label: str
    red_team: Counts
    annotate: Counts
    arbitrate: Counts


class GroupProgress(BaseModel):
    group_label: str
    red_team: Counts
    annotate: Counts
    arbitrate: Counts


class ShortfallRow(BaseModel):
    """Open tasks nobody in the pool may take (``assign.shortfalls``)."""

    kind: str
    group_label: str
    requirement: str
    tasks: int


class CampaignProgress(BaseModel):
    campaign: str
    generated_at: datetime
    tasks: dict[str, dict[str, int]]  # kind -> status -> count
    dialogues: int  # human-made
    machine_dialogues: int
    complete_first_rounds: int  # dialogues with all their primary human ratings
    cells: list[CellProgress]
    groups: list[GroupProgress]
    shortfalls: list[ShortfallRow]
    agreement: AlphaEstimate  # ordinal alpha on the Likert points
    agreement_broken: AlphaEstimate  # nominal alpha on broken / not broken
    arbitration: Arbitration


def _cells(session: Session, campaign: StarCampaign) -> tuple[list[CellProgress], dict[str, dict[str, int]]]:
    """Task counts per (rule, group, kind), and per kind and status."""
    rows = session.execute(
        select(StarTask.rule_id, StarTask.group_label, StarTask.kind, StarTask.status, func.count())
        .where(StarTask.campaign_id == campaign.id)
        .group_by(StarTask.rule_id, StarTask.group_label, StarTask.kind, StarTask.status)
    ).all()
    counts: dict[tuple[str, str], dict[str, Counts]] = defaultdict(lambda: {k: Counts() for k in KINDS})
    by_status: dict[str, dict[str, int]] = {}
    for rule_id, label, kind, status, n in rows:
        cell = counts[rule_id, label][kind]
        cell.total += n
        cell.done += n if status == "done" else 0
        by_status.setdefault(kind, {})[status] = by_status.get(kind, {}).get(status, 0) + n
    cells = [CellProgress(rule_id=r, group_label=g, **kinds) for (r, g), kinds in sorted(counts.items())]
    return cells, by_status


def _groups(cells: list[CellProgress]) -> list[GroupProgress]:
    """The cells summed over rules, per target group."""
    sums: dict[str, dict[str, Counts]] = defaultdict(lambda: {k: Counts() for k in KINDS})
    for cell in cells:
        for kind in KINDS:
            total = sums[cell.group_label][kind]
            total.total += getattr(cell, kind).total
            total.done += getattr(cell, kind).done
    return [GroupProgress(group_label=label, **kinds) for label, kinds in sorted(sums.items())]


def _ratings(session: Session, campaign: StarCampaign) -> pd.DataFrame:
    """Human ratings (primary and arbitration, no ablation) in the export's column names."""
    columns = ["annotation_id", "dialogue_id", "kind", "ablation", "rating", "created_at"]
    rows = [
        [a.id, a.dialogue_id, a.kind, a.ablation, a.rating, a.created_at]
        for a in list_annotations(session, campaign)
    ]
    return pd.DataFrame(rows, columns=columns)


def _agreement(
    ratings: pd.DataFrame, spec: CampaignSpec, n_boot: int
) -> tuple[int, AlphaEstimate, AlphaEstimate]:
    """Alpha over the dialogues whose first round is complete: a half-rated dialogue says nothing yet."""
    primary = primary_annotations(ratings)
    sizes = primary.groupby("dialogue_id")["rating"].size()
    complete = primary[primary["dialogue_id"].isin(sizes[sizes >= spec.annotators_per_dialogue].index)]
    complete = complete.assign(broken01=[float(spec.is_broken(int(r))) for r in complete["rating"]])
    ordinal = alpha_estimate(reliability_matrix(complete, "rating"), "ordinal", n_boot)
    nominal = alpha_estimate(reliability_matrix(complete, "broken01"), "nominal", n_boot)
    return int(complete["dialogue_id"].nunique()), ordinal, nominal


def campaign_progress(session: Session, campaign: StarCampaign, n_boot: int = 1000) -> CampaignProgress:
    """Everything the campaign dashboard shows. Re-checks shortfalls, which marks waiting tasks (flushes)."""
    spec = campaign_spec(campaign)
    missing = shortfalls(session, campaign)  # first: it moves tasks between open and waiting
    cells, by_status = _cells(session, campaign)
    dialogues = dialogue_counts(session, campaign)
    ratings = _ratings(session, campaign)
    complete, ordinal, nominal = _agreement(ratings, spec, n_boot)
    return CampaignProgress(
        campaign=campaign.name,
        generated_at=utcnow(),
        tasks=by_status,
        dialogues=dialogues.get(False, 0),
        machine_dialogues=dialogues.get(True, 0),
        complete_first_rounds=complete,
        cells=cells,
        groups=_groups(cells),
        shortfalls=[ShortfallRow(**row._asdict()) for row in missing],
        agreement=ordinal,
        agreement_broken=nominal,
        arbitration=arbitration_summary(ratings, spec),
    )
