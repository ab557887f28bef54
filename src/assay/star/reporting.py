"""The campaign's latest analysis report as a face builds and keeps it: the data read from the store, the
theme labels agreed so far, the analysis run on them, the page stored.

This module sits on top of the rest, so the flow goes one way: the live state (``live``) and the labels
(``theme_labels``) are read here and handed to ``analysis.report``, which builds from what it is handed and
imports neither. The options are the command line's (``assay star report --min-n --paper-tests``), and the
stored summary records which were used (``summary["settings"]``), so a page can say so.
"""

from __future__ import annotations

from pydantic import BaseModel, Field
from sqlalchemy.orm import Session, sessionmaker

from assay.star import live
from assay.star.assign import campaign_spec
from assay.star.theme_labels import agreed_labels
from assay.store.models import utcnow
from assay.store.star_models import StarCampaign
from assay.store.star_web_models import StarWebReport

DEFAULT_MIN_N = 5  # analysis.inference.DEFAULT_MIN_N, written out so the web app starts without statsmodels


class ReportOptions(BaseModel):
    """What a web build takes of the command line's report options; bounded as the command line bounds
    them."""

    embedder: str = Field("none", description="A thematic-map embedder name, or none to skip the map.")
    min_n: int = Field(DEFAULT_MIN_N, ge=1, le=100_000, description="Fewest dialogues a tested cell needs.")
    paper_tests: bool = Field(False, description="Add the seed paper's t-tests and ANOVAs (naive).")


def build_latest_report(
    session: Session,
    campaign: StarCampaign,
    user_id: int | None,
    options: ReportOptions | None = None,
) -> StarWebReport:
    """Analyse the campaign's human-made data with ``options`` (the thematic map when its embedder is not
    ``none``, with the theme labels agreed so far) and keep the page as the campaign's latest report."""
    import pandas as pd

    from assay.star.analysis.report import build_report, render_html, theme_options
    from assay.star.exchange import campaign_tables

    options = options or ReportOptions()
    spec = campaign_spec(campaign)
    frames = {k: pd.DataFrame(rows) for k, rows in campaign_tables(session, campaign).items()}
    themes = theme_options(options.embedder)
    if themes is not None:
        themes.labels = agreed_labels(session, campaign)
    result = build_report(spec, frames, themes=themes, min_n=options.min_n, paper_tests=options.paper_tests)
    row = live.latest_report(session, campaign)
    if row is None:
        row = StarWebReport(campaign_id=campaign.id)
        session.add(row)
    row.html, row.summary, row.created_by = render_html(result, spec), result.summary, user_id
    row.created_at = utcnow()
    session.flush()
    return row


def build_report_job(
    sessions: sessionmaker[Session], campaign_id: int, user_id: int | None, options: ReportOptions
) -> None:
    """Build and store the latest report in its own transaction: with the thematic map a build takes
    minutes, so a face runs this in the background rather than inside a request."""
    with sessions.begin() as session:
        build_latest_report(session, session.get_one(StarCampaign, campaign_id), user_id, options)


def used_options(row: StarWebReport | None) -> dict[str, object] | None:
    """The options a stored report was built with, read back from its summary: ``min_n``, ``paper_tests``,
    ``bootstrap`` and the map's ``embedder`` (``none`` without a map). None when there is no report or it
    predates the record."""
    if row is None or not isinstance(row.summary, dict):
        return None
    settings, themes = row.summary.get("settings"), row.summary.get("themes") or {}
    if not isinstance(settings, dict):
        return None
    embedder = (themes.get("parameters") or {}).get("embedder") if isinstance(themes, dict) else None
    return dict(settings) | {"embedder": embedder or "none"}
