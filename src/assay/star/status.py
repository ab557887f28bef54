"""How far a campaign has got: the one read model behind ``assay star status``, the campaign pages, their API
and the organisers' dashboard, so no two places count a campaign differently.

``campaign_status`` gives tasks by kind and status and per design cell (rule x target group) and group,
dialogues and annotations (human and machine-made apart, never mixed), the matching shortfalls, agreement
so far and the arbitration rate. ``campaign_summaries`` is the short form the dashboard lists.

It only reads. Shortfalls are the tasks marked ``waiting`` by the last shortfall check (``assign.shortfalls``,
run by ``assay star assign`` and by every ``workflow.sweep``), grouped as that check groups them. Agreement
is Krippendorff's alpha over completed first rounds only (dialogues with all their primary human ratings
in), computed by the same analysis code as the final report, so the dashboard never shows a figure the
report would contradict; below ``reliability.MIN_ALPHA_DIALOGUES`` such dialogues both say "too few
dialogues (n = 2, needs >= 10)" instead of a number.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from datetime import datetime

import pandas as pd
from pydantic import BaseModel
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from assay.star import live
from assay.star.analysis.reliability import (
    AlphaEstimate,
    Arbitration,
    alpha_estimate,
    arbitration_summary,
    primary_annotations,
    reliability_matrix,
)
from assay.star.assign import REQUIREMENT, campaign_spec, list_annotations
from assay.star.spec import CampaignSpec
from assay.store.enums import TaskKind, TaskStatus
from assay.store.models import utcnow
from assay.store.star_models import StarAnnotation, StarCampaign, StarDialogue, StarTask


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
    """Open tasks nobody in the pool may take, as of the last shortfall check (``assign.shortfalls``)."""

    kind: str
    group_label: str
    requirement: str
    tasks: int


class CampaignStatus(BaseModel):
    """A campaign's state for organisers and scripts; human and machine-made work counted apart."""

    campaign: str
    generated_at: datetime
    tasks: dict[str, dict[str, int]]  # kind -> status -> count
    dialogues: int  # human-made
    machine_dialogues: int
    annotations: int  # human-made, arbitrations included
    machine_annotations: int
    complete_first_rounds: int  # dialogues with all their primary human ratings
    cells: list[CellProgress]
    groups: list[GroupProgress]
    shortfalls: list[ShortfallRow]
    agreement: AlphaEstimate  # ordinal alpha on the Likert points
    agreement_broken: AlphaEstimate  # nominal alpha on broken / not broken
    arbitration: Arbitration


class CampaignSummary(BaseModel):
    """One campaign at a glance (the dashboard); ``alpha`` is ordinal alpha over complete first rounds."""

    name: str
    tasks: dict[str, dict[str, int]]
    dialogues: int
    machine_dialogues: int
    complete_first_rounds: int
    shortfall_tasks: int
    alpha: float | None
    alpha_units: int
    alpha_reason: str = ""  # why alpha is missing (too few dialogues, no variation); "" when there is one
    arbitration_rate: float | None
    report_at: datetime | None


def _cells(session: Session, campaign: StarCampaign) -> tuple[list[CellProgress], dict[str, dict[str, int]]]:
    """Task counts per (rule, group, kind), and per kind and status."""
    rows = session.execute(
        select(StarTask.rule_id, StarTask.group_label, StarTask.kind, StarTask.status, func.count())
        .where(StarTask.campaign_id == campaign.id)
        .group_by(StarTask.rule_id, StarTask.group_label, StarTask.kind, StarTask.status)
    ).all()
    counts: dict[tuple[str, str], dict[str, Counts]] = defaultdict(lambda: {k: Counts() for k in TaskKind})
    by_status: dict[str, dict[str, int]] = {}
    for rule_id, label, kind, status, n in rows:
        cell = counts[rule_id, label][kind]
        cell.total += n
        cell.done += n if status == TaskStatus.DONE else 0
        by_status.setdefault(kind, {})[status] = by_status.get(kind, {}).get(status, 0) + n
    cells = [CellProgress(rule_id=r, group_label=g, **kinds) for (r, g), kinds in sorted(counts.items())]
    return cells, by_status


def _groups(cells: list[CellProgress]) -> list[GroupProgress]:
    """The cells summed over rules, per target group."""
    sums: dict[str, dict[str, Counts]] = defaultdict(lambda: {k: Counts() for k in TaskKind})
    for cell in cells:
        for kind in TaskKind:
            total = sums[cell.group_label][kind]
            total.total += getattr(cell, kind).total
            total.done += getattr(cell, kind).done
    return [GroupProgress(group_label=label, **kinds) for label, kinds in sorted(sums.items())]


def _by_origin(session: Session, column: object, campaign: StarCampaign, join: bool) -> dict[bool, int]:
    """Dialogues (or annotations, ``join``) by their ``machine`` flag."""
    query = select(column, func.count())
    if join:
        query = query.join(StarDialogue, StarDialogue.id == StarAnnotation.dialogue_id)
    rows = session.execute(query.where(StarDialogue.campaign_id == campaign.id).group_by(column))
    return {bool(machine): int(count) for machine, count in rows}


def _requirement(spec: CampaignSpec, task: StarTask) -> str:
    """How a shortfall row describes what a task needs (as ``assign.shortfalls`` words it)."""
    text = REQUIREMENT[task.in_group]
    expertise = spec.rule(task.rule_id).expertise
    return text + (
        f"; expertise: {', '.join(expertise)}" if task.kind != TaskKind.RED_TEAM and expertise else ""
    )


def waiting_shortfalls(session: Session, campaign: StarCampaign) -> list[ShortfallRow]:
    """The tasks the last shortfall check marked waiting, by kind, group and requirement."""
    spec = campaign_spec(campaign)
    query = select(StarTask).where(StarTask.campaign_id == campaign.id, StarTask.status == TaskStatus.WAITING)
    missing = Counter((t.kind, t.group_label, _requirement(spec, t)) for t in session.scalars(query))
    return [
        ShortfallRow(kind=k, group_label=g, requirement=r, tasks=n)
        for (k, g, r), n in sorted(missing.items())
    ]


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


def campaign_status(session: Session, campaign: StarCampaign, n_boot: int = 1000) -> CampaignStatus:
    """Everything the campaign page, its API and ``assay star status`` show (``n_boot`` 0: no CI)."""
    spec = campaign_spec(campaign)
    cells, by_status = _cells(session, campaign)
    dialogues = _by_origin(session, StarDialogue.machine, campaign, join=False)
    annotations = _by_origin(session, StarAnnotation.machine, campaign, join=True)
    ratings = _ratings(session, campaign)
    complete, ordinal, nominal = _agreement(ratings, spec, n_boot)
    return CampaignStatus(
        campaign=campaign.name,
        generated_at=utcnow(),
        tasks=by_status,
        dialogues=dialogues.get(False, 0),
        machine_dialogues=dialogues.get(True, 0),
        annotations=annotations.get(False, 0),
        machine_annotations=annotations.get(True, 0),
        complete_first_rounds=complete,
        cells=cells,
        groups=_groups(cells),
        shortfalls=waiting_shortfalls(session, campaign),
        agreement=ordinal,
        agreement_broken=nominal,
        arbitration=arbitration_summary(ratings, spec),
    )


def find_campaign(session: Session, name: str) -> StarCampaign | None:
    """A campaign by name, or None (a face answers 404)."""
    return session.scalar(select(StarCampaign).where(StarCampaign.name == name))


def list_campaigns(session: Session) -> list[StarCampaign]:
    """Every campaign, by name."""
    return list(session.scalars(select(StarCampaign).order_by(StarCampaign.name)))


def campaign_summary(session: Session, campaign: StarCampaign) -> CampaignSummary:
    """The dashboard's line for a campaign: ``campaign_status`` without bootstrap, so the page stays fast."""
    status = campaign_status(session, campaign, n_boot=0)
    report = live.latest_report(session, campaign)
    return CampaignSummary(
        name=campaign.name,
        tasks=status.tasks,
        dialogues=status.dialogues,
        machine_dialogues=status.machine_dialogues,
        complete_first_rounds=status.complete_first_rounds,
        shortfall_tasks=sum(s.tasks for s in status.shortfalls),
        alpha=status.agreement.alpha,
        alpha_units=status.agreement.n_units,
        alpha_reason="" if status.agreement.alpha is not None else status.agreement.reason,
        arbitration_rate=status.arbitration.rate,
        report_at=report.created_at if report else None,
    )


def campaign_summaries(session: Session) -> list[CampaignSummary]:
    """Every campaign at a glance, by name (the organisers' dashboard)."""
    return [campaign_summary(session, c) for c in list_campaigns(session)]
