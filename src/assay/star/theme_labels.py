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

import csv
import io
import json
import unicodedata
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError
from sqlalchemy import select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from assay.errors import UserError, input_error, validation_error
from assay.star import live
from assay.star.workflow import NotAllowed
from assay.store.enums import Role
from assay.store.models import as_utc, utcnow
from assay.store.star_models import StarCampaign, StarDialogue
from assay.store.star_web_models import StarThemeCluster, StarThemeReview

MAX_LABEL = 120
MIN_OVERLAP = 0.5  # a label carries over to a new cluster sharing strictly more of its dialogues than this
REVIEWERS = 2
FILE_COLUMNS = ["key", "label", "decision", "n", "members"]
Decision = Literal["agreed", "settled", "given"]  # given: read from a file, decided elsewhere
Status = Literal["labelling", "agreed", "disagreement", "settled"]


# --- labels and clusters, without a database ------------------------------------------------------------


def normalise(label: str) -> str:
    """The form two labels are compared in: NFKC, case-folded, runs of spaces as one, no end punctuation."""
    folded = " ".join(unicodedata.normalize("NFKC", label).casefold().split())
    return folded.strip(" .,;:!?-")


def check_label(label: str, where: str = "label") -> str:
    """A label as given (trimmed), or a one-line ``UserError``: one line, 1 to ``MAX_LABEL`` characters."""
    text = " ".join(label.split())
    if not normalise(text):
        raise UserError(f"{where}: a label needs at least one letter or digit (value: {label!r})")
    if len(text) > MAX_LABEL:
        raise UserError(f"{where}: a label is at most {MAX_LABEL} characters (it has {len(text)})")
    return text


class ThemeLabel(BaseModel):
    """One decided label as stored, exported and imported: the cluster's key, the label, how it was
    decided, and the cluster's dialogue ids (optional in a file; without them a label applies only to the
    very same cluster)."""

    key: str = Field(min_length=1, max_length=64)
    label: str = Field(min_length=1, max_length=MAX_LABEL)
    decision: Decision = "given"
    members: list[str] = Field(default_factory=list)


class AppliedLabel(BaseModel):
    """A label on a cluster of the current map: ``overlap`` 1.0 when it was given to this very cluster,
    else the Jaccard overlap with the earlier cluster ``source_key`` it was given to."""

    cluster: int
    key: str
    label: str
    decision: Decision
    overlap: float
    source_key: str

    @property
    def carried(self) -> bool:
        return self.key != self.source_key


class LabelMatch(BaseModel):
    """Labels on the clusters of a map (by cluster number) and the labels no cluster carries."""

    applied: dict[int, AppliedLabel]
    unmatched: list[ThemeLabel]


def _jaccard(a: set[str], b: set[str]) -> float:
    return len(a & b) / len(a | b) if a or b else 0.0


def apply_labels(clusters: Sequence[Mapping[str, Any]], labels: Sequence[ThemeLabel]) -> LabelMatch:
    """Put ``labels`` (later ones win) on ``clusters`` (``themes.cluster_summary`` rows: cluster, key,
    members): by key first, else by the best overlap above ``MIN_OVERLAP`` (ties: the later label)."""
    by_key = {label.key: label for label in labels}
    applied: dict[int, AppliedLabel] = {}
    for row in clusters:
        cluster, key, members = int(row["cluster"]), str(row["key"]), set(row["members"])
        found, overlap = by_key.get(key), 1.0
        if found is None:
            scored = [(_jaccard(members, set(lab.members)), i) for i, lab in enumerate(labels) if lab.members]
            best = max(scored, default=(0.0, -1))
            found, overlap = (labels[best[1]], best[0]) if best[0] > MIN_OVERLAP else (None, 0.0)
        if found is not None:
            applied[cluster] = AppliedLabel(
                cluster=cluster,
                key=key,
                label=found.label,
                decision=found.decision,
                overlap=overlap,
                source_key=found.key,
            )
    used = {a.source_key for a in applied.values()}
    return LabelMatch(applied=applied, unmatched=[lab for lab in by_key.values() if lab.key not in used])


def match_summary(match: LabelMatch) -> dict[str, Any]:
    """The labels part of a report's summary: by cluster number, and those no cluster of this map carries."""
    return {
        "labels": {str(c): a.model_dump() for c, a in sorted(match.applied.items())},
        "labels_unmatched": [lab.model_dump(exclude={"members"}) for lab in match.unmatched],
        "labels_rule": (
            f"two reviewers, a third settles; a label carries over to a changed cluster sharing more than "
            f"{MIN_OVERLAP:.0%} of its dialogues (Jaccard)"
        ),
    }


# --- files ------------------------------------------------------------------------------------------------


def read_labels(path: Path) -> list[ThemeLabel]:
    """Labels from a CSV (columns ``key`` and ``label``; ``decision``, and ``members`` as space-separated
    ids, optional) or JSON / JSONL file (a list of such objects, or ``{"labels": [...]}``). Rows with an
    empty label are skipped, so a report's ``themes_clusters.csv`` with labels filled in reads back."""
    from assay.data.tables import read_table

    table = read_table(path)
    if table.file_format not in ("csv", "json", "jsonl"):
        raise UserError(f"{path}: theme labels are read from .csv, .json or .jsonl (not {table.file_format})")
    labels = []
    for row, where in zip(table.rows, table.locations, strict=True):
        for column in ("key", "label"):
            if column not in row:
                raise input_error(path, where, column, None, "is missing")
        if not str(row["label"] or "").strip():
            continue
        members = row.get("members") or []
        fields = {
            "key": str(row["key"]).strip(),
            "label": check_label(str(row["label"]), f"{path}:{where}: field 'label'"),
            "decision": row.get("decision") or "given",
            "members": members.split() if isinstance(members, str) else members,
        }
        try:
            labels.append(ThemeLabel.model_validate(fields))
        except ValidationError as err:
            raise validation_error(err, f"{path}:{where}") from None
    return labels


def file_rows(labels: Sequence[ThemeLabel]) -> list[dict[str, Any]]:
    """Labels as flat rows with ``FILE_COLUMNS`` (members space-separated), for CSV files and tables."""
    return [lab.model_dump() | {"n": len(lab.members), "members": " ".join(lab.members)} for lab in labels]


def labels_csv(labels: Sequence[ThemeLabel]) -> str:
    """``file_rows`` as CSV, what ``read_labels`` reads back."""
    out = io.StringIO()
    writer = csv.DictWriter(out, FILE_COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(file_rows(labels))
    return out.getvalue()


def labels_json(labels: Sequence[ThemeLabel]) -> str:
    """``{"labels": [...]}``, what ``read_labels`` reads back."""
    return json.dumps({"labels": [lab.model_dump() for lab in labels]}, indent=2) + "\n"


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


# --- into a report ----------------------------------------------------------------------------------------


def for_report(
    clusters: Sequence[Mapping[str, Any]], labels: Sequence[ThemeLabel]
) -> tuple[dict[str, Any], dict[int, str], list[ThemeLabel]]:
    """What a report needs of the labels on its map: the summary part (``match_summary``), the name of
    each labelled cluster for the map and table, and the labels re-keyed to this map's clusters with their
    members (``tables/themes_labels.csv``, which ``read_labels`` reads back for the next build)."""
    match = apply_labels(clusters, labels)
    members = {int(c["cluster"]): list(c["members"]) for c in clusters}
    rekeyed = [
        ThemeLabel(key=a.key, label=a.label, decision=a.decision, members=members[c])
        for c, a in sorted(match.applied.items())
    ]
    return match_summary(match), {c: a.label for c, a in match.applied.items()}, rekeyed
