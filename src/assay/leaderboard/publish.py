"""Standings, progress over time, and the exports: CSV, JSON and a self-contained static HTML page.

A row is one finished job (a submission run on a split). Standings rank by the round's metric in its own
direction (``LOWER_IS_BETTER``: lower cross entropy, higher ROC-AUC) as the viewer is shown it: a row's rank
is one more than the rows whose score lies wholly better (``disclosure.better``), so rows with equal scores,
or on a sealed split with overlapping shown intervals, share a rank and name each other in ``tied_with``
(listed by earlier submission first); "best per team" keeps each team's best row. Holdout standings exist
only once the round is closed. The plateau indicator follows NIST's "average CE over time" summary: the
round has plateaued when the best score improved (in the metric's direction) by less than
``plateau_delta`` over the last ``plateau_days``.
"""

from __future__ import annotations

import csv
import html
import io
import json
from datetime import datetime, timedelta

import numpy as np
from pydantic import BaseModel, model_serializer
from sqlalchemy import func, select
from sqlalchemy.orm import Session, selectinload

from assay.leaderboard.disclosure import (
    PREFIX,
    Interval,
    better,
    in_words,
    interval,
    is_sealed,
    public_metrics,
)
from assay.leaderboard.rounds import get_round, get_split
from assay.leaderboard.sealing import phase, shown_status
from assay.stats.detection import roc_curve
from assay.store.enums import JobStatus, RoundStatus
from assay.store.models import Job, MetricResult, ModelResult, Round, Submission, utcnow

HEADLINE = ("cross_entropy", "ce_ci_95", "roc_auc", "brier", "tpr_at_5_fpr", "ece")
SHOWN = tuple(f"{PREFIX}{name}" for name in ("low", "high"))  # a sealed row's numbers
LOWER_IS_BETTER = {
    "cross_entropy": True,
    "ce_ci_95": True,
    "brier": True,
    "ece": True,
    "roc_auc": False,
    "tpr_at_5_fpr": False,
}


def lower_is_better(metric: str) -> bool:
    """Which way ``metric`` ranks: the one answer standings, progress, the plateau and every page use."""
    return LOWER_IS_BETTER.get(metric, True)


def direction(metric: str) -> str:
    """``metric`` in words, for pages: "lower is better" or "higher is better"."""
    return "lower is better" if lower_is_better(metric) else "higher is better"


class Standing(BaseModel):
    """One scored submission on one split."""

    rank: int = 0
    team: str
    # None, and left out of the row's JSON (not even ``null``), for a viewer who may not open it: the numbers
    # count every round's submissions, so a visitor would learn of rounds they cannot see (issue 47, item 8)
    submission_id: int | None = None
    technique: str
    submitted_at: datetime
    status: str
    metrics: dict[str, float | None]
    flagged_models: int | None  # None on a sealed split's public rows: flags wait for the close
    tied_with: list[str] = []  # teams whose rows share this rank (their scores cannot be told apart)
    summary: str = ""  # a sealed row in plain words (``disclosure.in_words``), the same on every face

    @model_serializer(mode="wrap")
    def _drop_unnumbered(self, handler):  # type: ignore[no-untyped-def]
        """A row its viewer may not open says nothing of its submission's number, not even ``null``.
        Left unannotated on purpose: a return type would replace the fields in the API's schema."""
        data = handler(self)
        if data.get("submission_id", 0) is None:
            del data["submission_id"]
        return data

    def unnumbered(self) -> Standing:
        """This row without its submission number, for a viewer who may not open it."""
        return self.model_copy(update={"submission_id": None})


def rank_rows(rows: list[Standing], metric: str, sealed: bool) -> list[Standing]:
    """``rows`` ranked by the score each viewer is shown: a row's rank is 1 + the rows wholly better than
    it, so a row never ranks above one whose interval lies wholly better, and ties are named."""
    lower = lower_is_better(metric)
    shown = [interval(r.metrics, metric, sealed) for r in rows]
    ranks = [1 + sum(better(other, mine, lower) for other in shown) for mine in shown]
    order = sorted(range(len(rows)), key=lambda i: (ranks[i], _middle(shown[i], lower), rows[i].submitted_at))
    ranked = []
    for i in order:
        ties = [rows[j].team for j in order if j != i and _tied(shown[i], shown[j], lower)]
        ties = [team for team in dict.fromkeys(ties) if team != rows[i].team]
        words = in_words(shown[i], metric, ranks[i], len(rows), ties) if sealed else ""
        ranked.append(rows[i].model_copy(update={"rank": ranks[i], "tied_with": ties, "summary": words}))
    return ranked


def _tied(a: Interval | None, b: Interval | None, lower: bool) -> bool:
    """Neither score lies wholly better than the other: shown as a tie."""
    return not better(a, b, lower) and not better(b, a, lower)


def _middle(shown: Interval | None, lower: bool) -> float:
    """Within a rank, the better midpoint first (a missing score last)."""
    if shown is None:
        return float("inf")
    middle = (shown[0] + shown[1]) / 2
    return middle if lower else -middle


def standings(
    session: Session,
    round_name: str,
    split_name: str,
    best_per_team: bool = True,
    public: bool = False,
    now: datetime | None = None,
) -> list[Standing]:
    """Ranked rows of finished jobs on the split; holdout only once the round has closed.

    ``public``: the rows as anyone but the organisers sees them. A sealed job's row appears only once it is
    published on the round's clock (``sealing.phase`` at ``now``), never when the job happens to finish.
    On a sealed split (the test split of an open round) each row then carries only its disclosed score (no
    flag count, timing out shown as done), and rows are ranked, and each team's best chosen, by it alone,
    so neither the order nor the choice says more than the shown numbers. Everyone else (organisers, any
    split once the labels are out) gets the exact scores alone: a row carries one kind of score, so every
    face renders the table its rows are (issue 47: the organiser's rows once carried both, and got the
    sealed table with no words in it).
    """
    round_ = get_round(session, round_name)
    sealed = public and is_sealed(round_, split_name)
    split = get_split(round_, split_name)
    if split_name == "holdout" and round_.status not in (RoundStatus.CLOSED, RoundStatus.ARCHIVED):
        return []
    jobs = session.scalars(
        select(Job)
        .join(Submission)
        .where(Submission.split_id == split.id, Job.status.in_((JobStatus.DONE, JobStatus.TIMED_OUT)))
        .options(selectinload(Job.submission).joinedload(Submission.team))
    ).all()
    if public:
        now = now or utcnow()
        jobs = [job for job in jobs if phase(round_, split_name, job, now, organiser=False) != "silent"]
    flagged = _flagged_models(session, [job.id for job in jobs])
    overall = _overall_metrics(session, [job.id for job in jobs])
    rows = [
        Standing(
            team=job.submission.team.name,
            submission_id=job.submission.id,
            technique=job.submission.technique,
            submitted_at=job.submission.submitted_at,
            status=shown_status(job.status) if sealed else job.status,
            metrics=public_metrics(overall[job.id], sealed),
            flagged_models=None if sealed else flagged.get(job.id, 0),
        )
        for job in jobs
    ]
    rows = rank_rows(rows, round_.metric, sealed)
    return best_of(rows, round_.metric, sealed) if best_per_team else rows


def best_of(rows: list[Standing], metric: str, sealed: bool) -> list[Standing]:
    """Each team's first row of ranked ``rows`` (its best), ranked anew; ``rows`` are left as they are."""
    seen: set[str] = set()
    best = [r for r in rows if not (r.team in seen or seen.add(r.team))]  # type: ignore[func-returns-value]
    return rank_rows(best, metric, sealed)


def _flagged_models(session: Session, job_ids: list[int]) -> dict[int, int]:
    """Per job, how many of its models carry a NIST flag, counted by the database in one statement (a job
    holds a row per model: loading them all to count was most of the standings page's cost)."""
    if not job_ids:
        return {}
    counted = session.execute(
        select(ModelResult.job_id, func.count())
        .where(ModelResult.job_id.in_(job_ids), ModelResult.flags != "")
        .group_by(ModelResult.job_id)
    )
    return {job_id: count for job_id, count in counted.tuples()}


def _overall_metrics(session: Session, job_ids: list[int]) -> dict[int, dict[str, float | None]]:
    """Per job, its overall metrics (not the per-group ones, which are most of a job's metric rows), all
    for organisers; the caller keeps the public ones (``disclosure.public_metrics``) for everyone else."""
    overall: dict[int, dict[str, float | None]] = {job_id: {} for job_id in job_ids}
    if job_ids:
        rows = session.execute(
            select(MetricResult.job_id, MetricResult.name, MetricResult.value).where(
                MetricResult.job_id.in_(job_ids), MetricResult.group_column == ""
            )
        )
        for job_id, name, value in rows.tuples():
            overall[job_id][name] = value
    return overall


class Progress(BaseModel):
    """The best score over time, overall and per team, and whether it has plateaued."""

    metric: str
    overall: list[tuple[datetime, float]]
    teams: dict[str, list[tuple[datetime, float]]]
    plateaued: bool
    improvement_in_window: float | None
    final: bool = False  # the round is closed: the best is no longer "so far"
    state: str = ""  # in words, the same on every face: "still improving", "plateau reached", "final: ..."


def progress(
    session: Session,
    round_name: str,
    now: datetime | None = None,
    public: bool = False,
    every: list[Standing] | None = None,
) -> Progress:
    """Running best of the round's metric on the test split, as NIST's summary plots it.

    ``public`` (a sealed test split): the running best of the disclosed upper bound, the one number there.
    ``every``: the test split's rows (``standings(..., best_per_team=False)``) when the caller has them.
    """
    round_ = get_round(session, round_name)
    if every is None:
        every = standings(session, round_name, "test", best_per_team=False, public=public)
    rows = sorted(every, key=lambda r: r.submitted_at)
    metric = f"{PREFIX}high" if public and is_sealed(round_, "test") else round_.metric
    lower = lower_is_better(round_.metric)
    better = min if lower else max
    overall: list[tuple[datetime, float]] = []
    teams: dict[str, list[tuple[datetime, float]]] = {}
    for row in rows:
        value = row.metrics.get(metric)
        if value is None:
            continue
        for series in (overall, teams.setdefault(row.team, [])):
            series.append((row.submitted_at, better(value, series[-1][1]) if series else value))
    plateau = _plateau(round_, overall, lower, now)
    final = round_.status in (RoundStatus.CLOSED, RoundStatus.ARCHIVED)
    return Progress(
        metric=metric, overall=overall, teams=teams, final=final, state=_state(final, plateau), **plateau
    )


def _state(final: bool, plateau: dict) -> str:
    """Where the round's best stands, in words: a closed round's is final, never "still improving"."""
    if final:
        return "final: the round is closed"
    return "plateau reached" if plateau["plateaued"] else "still improving"


def _plateau(round_: Round, overall: list[tuple[datetime, float]], lower: bool, now: datetime | None) -> dict:
    if not overall:
        return {"plateaued": False, "improvement_in_window": None}
    now = now or overall[-1][0]
    start = now - timedelta(days=round_.plateau_days)
    if overall[0][0].replace(tzinfo=None) > start.replace(tzinfo=None):
        return {"plateaued": False, "improvement_in_window": None}  # the round is younger than the window
    before = [v for t, v in overall if t.replace(tzinfo=None) <= start.replace(tzinfo=None)][-1]
    best = overall[-1][1]
    gain = (before - best) if lower else (best - before)
    return {"plateaued": gain < round_.plateau_delta, "improvement_in_window": gain}


def roc_points(session: Session, submission_id: int) -> tuple[list[float], list[float]] | None:
    """The ROC curve of a submission's finished job (None when one class is absent)."""
    submission = session.get(Submission, submission_id)
    if submission is None or submission.job is None:
        return None
    from assay.leaderboard.scoring import read_truth

    truth = read_truth(submission.split.truth_path)
    results = [r for r in submission.job.results if r.model_name in truth]
    y = np.array([truth[r.model_name] for r in results])
    if len(set(y.tolist())) < 2:
        return None
    fpr, tpr, _ = roc_curve(y, np.array([r.value for r in results]))
    return fpr.tolist(), tpr.tolist()


def to_csv(rows: list[Standing]) -> str:
    """Standings as CSV, one column per headline metric; the submission numbers only where the rows carry
    them (never in a public export: ``Standing.submission_id``)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    columns = _columns(rows)
    numbered = any(r.submission_id is not None for r in rows)
    ids = ["submission_id"] if numbered else []
    writer.writerow(["rank", "team", *ids, "technique", "submitted_at", "status", *columns])
    for r in rows:
        values = [r.metrics.get(m) for m in columns]
        number = [r.submission_id] if numbered else []
        writer.writerow([r.rank, r.team, *number, r.technique, r.submitted_at.isoformat(), r.status, *values])
    return out.getvalue()


def _columns(rows: list[Standing]) -> tuple[str, ...]:
    """The metric columns of a table: the disclosed ones where the rows are sealed, the headline else."""
    return SHOWN if any(name in r.metrics for r in rows for name in SHOWN) else HEADLINE


def to_json(rows: list[Standing]) -> str:
    """Standings as a JSON array."""
    return json.dumps([r.model_dump(mode="json") for r in rows], indent=2) + "\n"


ROC_TICKS = (0.0, 0.25, 0.5, 0.75, 1.0)  # on both axes of a drawn ROC curve
ROC_MARGINS = (46, 12, 10, 40)  # left, right, top, bottom around the plot: room for tick labels and titles


def _svg_roc(points: tuple[list[float], list[float]] | None, size: int = 160) -> str:
    """The curve on a ``size``-pixel square with ticks and labels on both axes, as static SVG: presentation
    attributes only (no style element or attribute, no script), so it sits under the pages' CSP."""
    if points is None:
        return "<em>no ROC (one class)</em>"
    left, right, top, bottom = ROC_MARGINS
    width, height = left + size + right, top + size + bottom

    def x(rate: float) -> float:
        return left + rate * size

    def y(rate: float) -> float:
        return top + (1 - rate) * size

    fpr, tpr = points
    path = " ".join(f"{x(f):.1f},{y(t):.1f}" for f, t in zip(fpr, tpr, strict=True))
    base = top + size
    grid = "".join(
        f'<line x1="{x(t):.1f}" y1="{top}" x2="{x(t):.1f}" y2="{base}"/>'
        f'<line x1="{left}" y1="{y(t):.1f}" x2="{left + size}" y2="{y(t):.1f}"/>'
        for t in ROC_TICKS[1:-1]
    )
    marks = "".join(
        f'<line x1="{x(t):.1f}" y1="{base}" x2="{x(t):.1f}" y2="{base + 4}"/>'
        f'<line x1="{left - 4}" y1="{y(t):.1f}" x2="{left}" y2="{y(t):.1f}"/>'
        for t in ROC_TICKS
    )
    labels = "".join(
        f'<text x="{x(t):.1f}" y="{base + 15}" text-anchor="middle">{t:g}</text>'
        f'<text x="{left - 6}" y="{y(t) + 4:.1f}" text-anchor="end">{t:g}</text>'
        for t in ROC_TICKS
    )
    titles = (
        f'<text x="{left + size / 2:.1f}" y="{height - 6}" text-anchor="middle">false positive rate</text>'
        f'<text x="{-(top + size / 2):.1f}" y="12" transform="rotate(-90)" text-anchor="middle">'
        "true positive rate</text>"
    )
    return (
        f'<svg width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img" '
        'aria-label="ROC curve: true positive rate against false positive rate">'
        f'<rect x="{left}" y="{top}" width="{size}" height="{size}" fill="#fff"/>'
        f'<g stroke="#e4e4e4">{grid}</g>'
        f'<rect x="{left}" y="{top}" width="{size}" height="{size}" fill="none" stroke="#999"/>'
        f'<g stroke="#999">{marks}</g>'
        f'<g fill="#333" font-family="sans-serif" font-size="11">{labels}{titles}</g>'
        f'<line x1="{x(0)}" y1="{y(0)}" x2="{x(1)}" y2="{y(1)}" stroke="#bbb" stroke-dasharray="4"/>'
        f'<polyline points="{path}" fill="none" stroke="#1f5fa8" stroke-width="2"/></svg>'
    )


def roc_svg(session: Session, submission_id: int, size: int = 160) -> str:
    """A submission's ROC curve as inline SVG (numbers only, safe to embed), drawn as on the static page."""
    return _svg_roc(roc_points(session, submission_id), size)


def _table(title: str, rows: list[Standing], rocs: dict[int, str]) -> str:
    if not rows:  # said in words, not as an empty table
        return f"<h2>{html.escape(title)}</h2><p><em>No results yet.</em></p>"
    columns = _columns(rows)
    shown = ("test score (shown)",) if any(r.summary for r in rows) else columns
    plots = ("ROC",) if rocs else ()  # no column for a plot that is not drawn
    head = "".join(f"<th>{html.escape(h)}</th>" for h in ("rank", "team", "technique", *shown, *plots))
    body = []
    for r in rows:
        cells = [f"{r.rank}{'=' if r.tied_with else ''}", html.escape(r.team), html.escape(r.technique)]
        if r.summary:
            cells.append(html.escape(r.summary))
        else:
            cells += ["" if r.metrics.get(m) is None else f"{r.metrics[m]:.4f}" for m in columns]
        if rocs:
            cells.append(rocs.get(r.submission_id, ""))
        body.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    return f"<h2>{html.escape(title)}</h2><table><tr>{head}</tr>{''.join(body)}</table>"


def to_html(session: Session, round_name: str, public: bool = True) -> str:
    """A self-contained page (inline CSS and SVG, no scripts) with the round's test and holdout standings,
    as anyone may see them (``public``; no ROC curves of a sealed split) or as the organisers do."""
    round_ = get_round(session, round_name)
    sections = []
    for split in ("test", "holdout"):
        rows = standings(session, round_name, split, public=public)
        sealed = public and is_sealed(round_, split)
        rocs = (
            {} if sealed else {r.submission_id: _svg_roc(roc_points(session, r.submission_id)) for r in rows}
        )
        sections.append(_table(f"{split} split: best per team", rows, rocs))
    trend = progress(session, round_name, public=public)
    style = (
        "body{font-family:system-ui,sans-serif;margin:2em;color:#222}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}th{background:#f3f3f3}"
    )
    title = html.escape(f"assay leaderboard: {round_.name}")
    ranked = html.escape(f"{round_.metric} ({direction(round_.metric)})")
    return (
        f"<!doctype html><html lang='en'><head><meta charset='utf-8'><title>{title}</title>"
        f"<style>{style}</style></head><body><h1>{title}</h1>"
        f"<p>Status: {html.escape(round_.status)}. Ranked by {ranked}; "
        f"{len(trend.overall)} scored test submissions; {trend.state}.</p>{''.join(sections)}</body></html>\n"
    )
