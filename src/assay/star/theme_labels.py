"""Theme labels: two reviewers name each cluster of the thematic map, a third settles where they differ, and
the agreed names go into the report's map and table (STAR, Weidinger et al. 2024, labelled its clusters so).

The rules, in one place for the web pages, the JSON API and the command line:

- Who: organisers, and annotators or arbitrators who act as a pool member of the campaign, may label; a
  cluster takes the labels of two different people, each final once given. Organisers and the campaign's
  arbitrators may settle, but never a cluster they labelled themselves.
- What is seen: the cluster's terms and typical dialogues; another person's label only once both are in
  (nobody else can label it then), so the second reviewer is not led by the first.
- Agreement: the two labels are the same after ``normalise`` (case, spacing, Unicode forms, end
  punctuation), and the first reviewer's spelling is kept. Otherwise the cluster waits for a settler, who
  picks either label or writes a better one.
- Which cluster: a label is keyed by the cluster's dialogues (``themes.cluster_key``), not its number, so
  the same data mapped again keeps its labels. When the map changed (new dialogues, another embedder, or
  UMAP drawing a small pilot differently), a label carries over to the new cluster sharing more than half of
  its dialogues (Jaccard > ``MIN_OVERLAP``; over disjoint clusters at most one can), and says so with the
  overlap; a label no cluster carries is listed as not shown, never dropped silently.

Labels travel as CSV or JSON (``read_labels`` / ``labels_csv`` / ``labels_json``): the web page offers them
for download, ``assay star report --theme-labels FILE`` reads them, and the report's
``tables/themes_clusters.csv`` is itself such a file. The store functions take a ``Session`` and flush, never
commit; ``board`` only reads.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field
from sqlalchemy import select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from assay.errors import UserError
from assay.star import live
from assay.star.access import NotAllowed
from assay.star.analysis.labels import (  # the pure half, re-exported: faces and files reach it from here
    FILE_COLUMNS,
    MAX_LABEL,
    MIN_OVERLAP,
    AppliedLabel,
    Decision,
    LabelMatch,
    ThemeLabel,
    apply_labels,
    check_label,
    file_rows,
    for_report,
    labels_csv,
    labels_json,
    match_summary,
    normalise,
    read_labels,
)
from assay.store.enums import Role
from assay.store.models import as_utc, utcnow
from assay.store.star_models import StarCampaign, StarDialogue
from assay.store.star_web_models import StarThemeCluster, StarThemeReview

__all__ = [
    "FILE_COLUMNS",
    "MAX_LABEL",
    "MIN_OVERLAP",
    "AppliedLabel",
    "Decision",
    "LabelMatch",
    "ThemeLabel",
    "apply_labels",
    "check_label",
    "file_rows",
    "for_report",
    "labels_csv",
    "labels_json",
    "match_summary",
    "normalise",
    "read_labels",
]
REVIEWERS = 2
Status = Literal["labelling", "agreed", "disagreement", "settled"]


# --- who may do what ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Reviewer:
    """Who asks: the account, whether it organises, its web roles, and the campaigns it is a pool member
    of (a face fills this in; the rules below decide)."""

    user_id: int
    organiser: bool
    roles: frozenset[str]
    campaign_ids: frozenset[int]

    def _in(self, campaign: StarCampaign, *roles: Role) -> bool:
        return campaign.id in self.campaign_ids and any(role in self.roles for role in roles)


def may_label(reviewer: Reviewer, campaign: StarCampaign) -> bool:
    """Organisers, and the campaign's annotators and arbitrators."""
    return reviewer.organiser or reviewer._in(campaign, Role.ANNOTATOR, Role.ARBITRATOR)


def may_settle(reviewer: Reviewer, campaign: StarCampaign) -> bool:
    """Organisers and the campaign's arbitrators (never on a cluster they labelled: see ``settle``)."""
    return reviewer.organiser or reviewer._in(campaign, Role.ARBITRATOR)


def _check_may(allowed: bool, what: str) -> None:
    if not allowed:
        raise NotAllowed(f"only organisers and this campaign's {what} may do this")


# --- the board: the current map's clusters and where each one stands ---------------------------------------


class SampleDialogue(BaseModel):
    dialogue_id: str
    turns: list[tuple[str, str]] = Field(description="(role, text): user is the red teamer")


class ClusterView(BaseModel):
    """One cluster as this reviewer may see it."""

    cluster: int
    key: str
    n: int
    terms: list[str]
    samples: list[SampleDialogue]
    status: Status
    n_labels: int
    mine: str | None = Field(description="your label, if you gave one")
    labels: list[str] = Field(description="both labels, once both are in")
    label: str | None = Field(description="the agreed or settled label")
    carried: AppliedLabel | None = Field(description="a label from an earlier map's overlapping cluster")
    can_label: bool
    can_settle: bool


class ThemeBoard(BaseModel):
    campaign: str
    report_at: datetime | None
    embedder: str | None
    reason: str = Field(description="why no clusters are shown; empty when they are")
    clusters: list[ClusterView]
    unmatched: list[ThemeLabel] = Field(description="decided labels no cluster of the current map carries")
    decided_since_report: int = Field(description="labels decided after the report was built")
    may_settle: bool


@dataclass(frozen=True)
class _Map:
    """The clusters of the campaign's latest web report."""

    report_at: datetime
    embedder: str
    clusters: list[dict[str, Any]]
    terms: dict[str, list[str]]


def _current_map(session: Session, campaign: StarCampaign) -> tuple[_Map | None, str]:
    """The latest web report's clusters, or None and why not."""
    row = live.latest_report(session, campaign)
    if row is None:
        return None, "no report yet: an organiser builds one (with a thematic map) on the campaign page"
    themes = (row.summary or {}).get("themes", {})
    if "skipped" in themes:
        return None, f"the latest report has no thematic map ({themes['skipped']}): rebuild it with one"
    if "clusters" not in themes:
        return None, "the latest report was built before theme labelling existed: rebuild it"
    terms = {c: [t for t, _ in pairs] for c, pairs in themes.get("terms", {}).items()}
    embedder = themes.get("parameters", {}).get("embedder", "")
    return _Map(as_utc(row.created_at), embedder, themes["clusters"], terms), ""


def _stored(session: Session, campaign: StarCampaign) -> dict[str, StarThemeCluster]:
    rows = session.scalars(select(StarThemeCluster).where(StarThemeCluster.campaign_id == campaign.id))
    return {row.key: row for row in rows}


def _label_of(row: StarThemeCluster) -> ThemeLabel:
    return ThemeLabel(key=row.key, label=row.label or "", decision=row.decision, members=row.members)  # type: ignore[arg-type]


def agreed_labels(session: Session, campaign: StarCampaign) -> list[ThemeLabel]:
    """Every decided label of the campaign, oldest decision first (so a newer one wins a tie)."""
    rows = session.scalars(
        select(StarThemeCluster)
        .where(StarThemeCluster.campaign_id == campaign.id, StarThemeCluster.decision.is_not(None))
        .order_by(StarThemeCluster.decided_at, StarThemeCluster.id)
    )
    return [_label_of(row) for row in rows]


def decided_labels(session: Session, campaign: StarCampaign, reviewer: Reviewer) -> list[ThemeLabel]:
    """``agreed_labels`` for someone who may see the labelling page (the download and the API)."""
    _check_may(may_label(reviewer, campaign), "annotators and arbitrators")
    return agreed_labels(session, campaign)


def _status(row: StarThemeCluster | None) -> Status:
    if row is None or (row.decision is None and len(row.reviews) < REVIEWERS):
        return "labelling"
    return row.decision or "disagreement"  # type: ignore[return-value]


def _samples(session: Session, campaign: StarCampaign, ids: Sequence[str]) -> list[SampleDialogue]:
    """The campaign's own dialogues among ``ids`` (map ids are ``SOURCE:ID``), with their turns."""
    own = {}
    for map_id in ids:
        source, _, number = map_id.rpartition(":")
        if source == campaign.name and number.isdigit():
            own[int(number)] = map_id
    rows = session.scalars(
        select(StarDialogue).where(StarDialogue.campaign_id == campaign.id, StarDialogue.id.in_(own))
    )
    found = {row.id: row for row in rows}
    return [
        SampleDialogue(dialogue_id=own[i], turns=[(t.role, t.text) for t in found[i].turns])
        for i in own
        if i in found
    ]


def _view(
    session: Session,
    campaign: StarCampaign,
    reviewer: Reviewer,
    cluster: Mapping[str, Any],
    terms: list[str],
    row: StarThemeCluster | None,
    carried: AppliedLabel | None,
) -> ClusterView:
    reviews = row.reviews if row is not None else []
    by = {r.user_id: r.label for r in reviews}
    status = _status(row)
    full = len(reviews) >= REVIEWERS
    return ClusterView(
        cluster=int(cluster["cluster"]),
        key=str(cluster["key"]),
        n=int(cluster["n"]),
        terms=terms,
        samples=_samples(session, campaign, cluster.get("samples", [])),
        status=status,
        n_labels=len(reviews),
        mine=by.get(reviewer.user_id),
        labels=[r.label for r in reviews] if full else [],
        label=row.label if row is not None else None,
        carried=carried,
        can_label=status == "labelling" and reviewer.user_id not in by and may_label(reviewer, campaign),
        can_settle=status == "disagreement" and reviewer.user_id not in by and may_settle(reviewer, campaign),
    )


def board(session: Session, campaign: StarCampaign, reviewer: Reviewer) -> ThemeBoard:
    """The latest map's clusters as ``reviewer`` may see them; reads only. ``NotAllowed`` for people who
    may neither label nor settle."""
    _check_may(may_label(reviewer, campaign), "annotators and arbitrators")
    current, reason = _current_map(session, campaign)
    stored = _stored(session, campaign)
    decided = agreed_labels(session, campaign)
    if current is None:
        return ThemeBoard(
            campaign=campaign.name,
            report_at=None,
            embedder=None,
            reason=reason,
            clusters=[],
            unmatched=decided,
            decided_since_report=0,
            may_settle=may_settle(reviewer, campaign),
        )
    match = apply_labels(current.clusters, decided)
    views = []
    for cluster in current.clusters:
        key, number = str(cluster["key"]), int(cluster["cluster"])
        applied = match.applied.get(number)
        carried = applied if applied is not None and applied.carried else None
        terms = current.terms.get(str(number), [])
        views.append(_view(session, campaign, reviewer, cluster, terms, stored.get(key), carried))
    since = sum(1 for r in stored.values() if r.decided_at and as_utc(r.decided_at) > current.report_at)
    return ThemeBoard(
        campaign=campaign.name,
        report_at=current.report_at,
        embedder=current.embedder,
        reason="",
        clusters=views,
        unmatched=match.unmatched,
        decided_since_report=since,
        may_settle=may_settle(reviewer, campaign),
    )


# --- state changes ----------------------------------------------------------------------------------------


def _find(session: Session, campaign: StarCampaign, key: str) -> StarThemeCluster | None:
    where = (StarThemeCluster.campaign_id == campaign.id, StarThemeCluster.key == key)
    return session.scalar(select(StarThemeCluster).where(*where))


def _cluster_row(session: Session, campaign: StarCampaign, key: str) -> StarThemeCluster:
    """The stored cluster for a key of the current map, created with its members and terms on first use."""
    current, reason = _current_map(session, campaign)
    if current is None:
        raise UserError(reason)
    found = next((c for c in current.clusters if c["key"] == key), None)
    if found is None:
        raise UserError(f"cluster {key!r} is not on the current map (was the report rebuilt?): reload")
    row = _find(session, campaign, key)
    if row is not None:
        return row
    terms = current.terms.get(str(found["cluster"]), [])
    row = StarThemeCluster(campaign_id=campaign.id, key=key, members=list(found["members"]), terms=terms)
    try:
        with session.begin_nested():
            session.add(row)
    except IntegrityError:  # a second reviewer created it at the same moment
        return _find(session, campaign, key)  # type: ignore[return-value]
    return row


def review(session: Session, campaign: StarCampaign, reviewer: Reviewer, key: str, label: str) -> Status:
    """``reviewer`` labels the cluster ``key``; the second label decides agreement. Final once given. The
    cluster's status afterwards."""
    _check_may(may_label(reviewer, campaign), "annotators and arbitrators")
    text = check_label(label)
    row = _cluster_row(session, campaign, key)
    if any(r.user_id == reviewer.user_id for r in row.reviews):
        raise UserError("you have labelled this cluster already (labels are final)")
    if row.decision is not None or len(row.reviews) >= REVIEWERS:
        raise UserError("two reviewers have labelled this cluster already")
    slot = len(row.reviews) + 1
    try:
        with session.begin_nested():
            session.add(StarThemeReview(cluster_id=row.id, slot=slot, user_id=reviewer.user_id, label=text))
    except IntegrityError:
        raise UserError("another reviewer labelled this cluster at the same moment: reload") from None
    session.refresh(row, ["reviews"])
    if slot == REVIEWERS and normalise(row.reviews[0].label) == normalise(text):
        row.label, row.decision, row.decided_at = row.reviews[0].label, "agreed", utcnow()
    session.flush()
    return _status(row)


def settle(session: Session, campaign: StarCampaign, reviewer: Reviewer, key: str, label: str) -> None:
    """A third person decides a cluster the two reviewers named differently: either label, or a new one."""
    _check_may(may_settle(reviewer, campaign), "arbitrators")
    text = check_label(label)
    row = _find(session, campaign, key)
    if row is None or _status(row) != "disagreement":
        raise UserError("this cluster has no disagreement to settle")
    if any(r.user_id == reviewer.user_id for r in row.reviews):
        raise UserError("you labelled this cluster: a third reviewer settles it")
    done = session.execute(
        update(StarThemeCluster)
        .where(StarThemeCluster.id == row.id, StarThemeCluster.decision.is_(None))
        .values(label=text, decision="settled", decided_by=reviewer.user_id, decided_at=utcnow())
        .execution_options(synchronize_session="fetch")
    )
    if done.rowcount != 1:  # type: ignore[attr-defined]
        raise UserError("someone settled this cluster at the same moment: reload the page")
    session.flush()
