"""``assay star report``: every analysis of a campaign in one place, as a self-contained HTML page, CSV tables
and a JSON summary, written together or not at all.

The inputs are the export tables (from the database or an export folder) plus, optionally, external dialogue
sets (HH-RLHF imports) to compare on the thematic map. Every number in the outputs sits next to its n and the
name of its test, because a reader of a red-teaming report has to know how much each figure can bear.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pandas as pd
from pydantic import BaseModel

from assay import __version__
from assay.star.agents import UNPARSED
from assay.star.analysis import groups, paper, plots
from assay.star.analysis.contract import SCHEMA_VERSION, conform
from assay.star.analysis.coverage import coverage
from assay.star.analysis.inference import DEFAULT_MIN_N
from assay.star.analysis.participants_summary import participants_summary, participants_table
from assay.star.analysis.reliability import MIN_ALPHA_DIALOGUES, reliability
from assay.star.spec import CampaignSpec
from assay.store.enums import TaskKind

TEMPLATE = Path(__file__).parent / "templates" / "report.html"


@dataclass
class ThemeOptions:
    """How to draw the thematic map; ``embedder`` None skips it (e.g. no model installed, or not wanted)."""

    embedder: Any = None
    cache: Any = None
    n_clusters: int = 20
    n_neighbors: int = 5
    per_source: int | None = None
    seed: int = 0
    labels: Any = None  # agreed theme labels (``analysis.labels.ThemeLabel``) to put on the clusters


def theme_options(embedder: str, cache: Path | None = None, **options: Any) -> ThemeOptions | None:
    """The map's options for an embedder name (``none`` skips the map), with vectors cached in ``cache``
    (default ``ASSAY_HOME/cache/embeddings.sqlite``) so a report built again embeds only new dialogues."""
    if embedder == "none":
        return None
    from assay.config import settings
    from assay.star.analysis.embed import EmbeddingCache, make_embedder

    path = cache or settings().home / "cache" / "embeddings.sqlite"
    return ThemeOptions(embedder=make_embedder(embedder), cache=EmbeddingCache(path), **options)


@dataclass
class Report:
    """The computed report: a JSON-ready summary, CSV tables by name and figures by name."""

    summary: dict[str, Any]
    tables: dict[str, pd.DataFrame] = field(default_factory=dict)
    figures: dict[str, str] = field(default_factory=dict)


def _dump(items: Any) -> Any:
    if isinstance(items, BaseModel):
        return items.model_dump(mode="json")
    if isinstance(items, list):
        return [_dump(i) for i in items]
    if isinstance(items, dict):
        return {k: _dump(v) for k, v in items.items()}
    return items


def _flat(items: list[BaseModel]) -> pd.DataFrame:
    """Nested result models as one flat CSV table (``in_group.share``, ...)."""
    return pd.json_normalize([i.model_dump(mode="json") for i in items]) if items else pd.DataFrame()


def _reliability_table(report: Any) -> pd.DataFrame:
    rows = [{"scope": "all", **report.ordinal.model_dump()}, {"scope": "all", **report.nominal.model_dump()}]
    for area, estimates in report.by_area.items():
        rows += [{"scope": f"area={area}", **e.model_dump()} for e in estimates.values()]
    return pd.DataFrame(rows)


def _coverage_table(tables: list[Any]) -> pd.DataFrame:
    rows = []
    for table in tables:
        for cell in table.cells:
            rows.append({"dimension": table.dimension, **cell.model_dump()})
    return pd.DataFrame(rows)


def _rule_group_heatmaps(instructions: pd.DataFrame, dialogues: pd.DataFrame, spec: CampaignSpec) -> dict:
    """Achieved dialogues per rule x targeted group, and per race x gender intersection when both exist."""
    figures = {}
    targeted = dialogues[dialogues["group_label"].fillna("").ne("")]
    if not targeted.empty:
        counts = pd.crosstab(targeted["group_label"], targeted["rule_id"])
        planned = instructions[instructions["group_label"].fillna("").ne("")]
        counts = counts.reindex(
            index=sorted(set(planned["group_label"]) | set(counts.index)), fill_value=0
        ).fillna(0)
        figures["coverage_rule_group"] = plots.heatmap(
            counts, f"Dialogues per targeted group and rule (n={len(targeted)})", "dialogues"
        )
    for (first, second), (left, right) in spec.demographics.pairs().items():
        if targeted.empty:
            break
        parsed = targeted["group_label"].map(groups.parse_group_label)
        both = parsed[parsed.map(lambda g, a=first, b=second: len(g) == 2 and a in g and b in g)]
        if not both.empty:  # the values the spec crosses: race x gender[female, male] draws no non-binary
            grid = pd.crosstab(both.map(lambda g, a=first: g[a]), both.map(lambda g, b=second: g[b]))
            grid = grid.reindex(index=left, columns=right, fill_value=0).fillna(0)
            figures.setdefault(
                "coverage_intersection",
                plots.heatmap(
                    grid, f"Dialogues per {first} x {second} intersection (n={len(both)})", "dialogues"
                ),
            )
    return figures


def _theme_summary(theme: Any) -> dict[str, Any]:
    """The map for summary.json and the page: parameters, sizes per source, the cluster x source counts,
    terms and the independence test (the per-dialogue points go to tables/themes_points.csv instead)."""
    sources = list(theme.n_by_source)
    return {
        "parameters": {
            k: getattr(theme, k)
            for k in ("embedder", "metric", "n_neighbors", "seed", "n_clusters", "per_source")
        },
        "method": theme.method,
        "terms_method": theme.terms_method,
        "n": theme.n,
        "sources": sources,
        "n_by_source": {
            "original": {s: theme.n_by_source[s].original for s in sources},
            "sampled": {s: theme.n_by_source[s].sampled for s in sources},
        },
        "table": [{"cluster": row.cluster, "n": row.n, **row.counts} for row in theme.table],
        "shares": [{"cluster": row.cluster, **row.shares} for row in theme.table],
        "terms": {str(c): [[t, w] for t, w in pairs] for c, pairs in theme.terms.items()},
        "independence": theme.independence.model_dump(mode="json") if theme.independence else None,
        "independence_reason": theme.reason,
    }


def _themes(
    dialogues: pd.DataFrame, compare: list[pd.DataFrame], campaign: str, options: ThemeOptions
) -> tuple[dict[str, Any], dict[str, pd.DataFrame], dict[str, str]]:
    """The thematic map of the campaign's dialogues next to each comparison set."""
    from assay.star.analysis import labels as theme_labels
    from assay.star.analysis.themes import cluster_summary, points_frame, table_frame, thematic_map

    own = dialogues.assign(source=campaign)
    frames = [own[["dialogue_id", "source", "turns"]]]
    frames += [c[["dialogue_id", "source", "turns"]] for c in compare]
    every = pd.concat(frames, ignore_index=True)
    every["dialogue_id"] = every["source"].astype(str) + ":" + every["dialogue_id"].astype(str)
    theme = thematic_map(
        every,
        options.embedder,
        options.cache,
        n_clusters=options.n_clusters,
        n_neighbors=options.n_neighbors,
        seed=options.seed,
        per_source=options.per_source,
    )
    points = points_frame(theme)
    clusters = cluster_summary(theme)
    labelled, names, rekeyed = theme_labels.for_report(clusters, options.labels or [])
    summary = _theme_summary(theme) | {"clusters": clusters} | labelled
    terms = pd.DataFrame(
        [
            {"cluster": c, "rank": r, "term": t, "weight": w}
            for c, pairs in theme.terms.items()
            for r, (t, w) in enumerate(pairs, start=1)
        ]
    )
    tables = {"themes_clusters": table_frame(theme, names), "themes_points": points, "themes_terms": terms}
    tables["themes_labels"] = pd.DataFrame(theme_labels.file_rows(rekeyed), columns=theme_labels.FILE_COLUMNS)
    return summary, tables, {"themes_map": plots.theme_scatter(points, names)}


def _without_unparsed(annotations: pd.DataFrame) -> tuple[pd.DataFrame, int]:
    """Drop machine ratings whose reply could not be read (they hold a placeholder point, not a judgement),
    and say how many went."""
    if annotations.empty or "reason" not in annotations:
        return annotations, 0
    machine = annotations.get("machine", pd.Series(False, index=annotations.index)).fillna(False).astype(bool)
    unparsed = machine & annotations["reason"].fillna("").astype(str).str.startswith(UNPARSED)
    return annotations[~unparsed].reset_index(drop=True), int(unparsed.sum())


def build_report(
    spec: CampaignSpec,
    frames: dict[str, pd.DataFrame],
    compare: list[pd.DataFrame] | None = None,
    themes: ThemeOptions | None = None,
    n_boot: int = 1000,
    seed: int = 0,
    min_n: int = DEFAULT_MIN_N,
    paper_tests: bool = False,
) -> Report:
    """Run every analysis on the export tables; the thematic map only when ``themes.embedder`` is set.
    No group test runs on a cell with fewer than ``min_n`` dialogues; ``paper_tests`` adds the seed paper's
    t-tests and ANOVAs (naive, for comparison)."""
    from assay.star.exchange import with_all_columns

    frames = with_all_columns(frames)
    instructions, dialogues, annotations = (frames[k] for k in ("instructions", "dialogues", "annotations"))
    annotations, unparsed = _without_unparsed(annotations)
    rel = reliability(annotations, dialogues, spec, n_boot=n_boot, seed=seed)
    in_group = groups.in_group_annotation(annotations, dialogues, spec, min_n=min_n)
    likert = groups.likert_distribution(annotations, spec)
    red_team = [
        r for m in groups.MEASURES for r in groups.red_team_success(dialogues, annotations, spec, m, min_n)
    ]
    odds = [
        o for m in groups.MEASURES for o in groups.group_odds_ratios(dialogues, annotations, spec, m, min_n)
    ]
    interactions = groups.interaction_tests(annotations, dialogues, spec, min_n=min_n)
    cover = coverage(instructions, dialogues)
    summary: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "campaign": spec.name,
        "generated_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "assay_version": __version__,
        "n": {
            "instructions": len(instructions),
            "dialogues": len(dialogues),
            "annotations": len(annotations),
            "arbitrations": int((annotations["kind"] == TaskKind.ARBITRATE).sum()) if len(annotations) else 0,
            "unparsed_machine_ratings_excluded": unparsed,
            "machine_dialogues": int(dialogues.get("machine", pd.Series(dtype=bool)).fillna(False).sum()),
        },
        "settings": {"min_n": min_n, "bootstrap": n_boot, "paper_tests": paper_tests},
        "reliability": _dump(rel),
        "in_group_annotation": _dump(in_group),
        "likert_distribution": _dump(likert),
        "red_team_success": _dump(red_team),
        "odds_ratios": _dump(odds),
        "interactions": _dump(interactions),
        "coverage": _dump(cover),
    }
    tables = {
        "reliability": _reliability_table(rel),
        "in_group_annotation": _flat(in_group),
        "likert_distribution": _flat(likert),
        "red_team_success": _flat(red_team),
        "odds_ratios": _flat(odds),
        "interactions": _flat(interactions),
        "coverage": _coverage_table(cover),
    }
    if "participants" in frames:  # counts only: exports before the participants table skip the section
        people = participants_summary(frames["participants"], spec)
        summary["participants"] = _dump(people)
        tables["participants"] = participants_table(people)
    if paper_tests:
        found = paper.paper_tests(annotations, dialogues, spec, min_n=min_n)
        summary["paper_tests"] = _dump(found)
        tables.update({f"paper_{name}": _flat(items) for name, items in found.items()})
    figures = _rule_group_heatmaps(instructions, dialogues, spec)
    if likert and any(x.share.n for x in likert):
        figures["likert"] = plots.likert_plot(likert)
    drawn = [o for o in odds if o.odds_ratio is not None and o.measure == "targeted" and not o.pooled]
    if drawn:
        figures["odds_ratios"] = plots.odds_forest(drawn)
    if themes is not None and themes.embedder is not None and len(dialogues) >= 3:
        theme_summary, theme_tables, theme_figures = _themes(dialogues, compare or [], spec.name, themes)
        summary["themes"] = theme_summary
        tables.update(theme_tables)
        figures.update(theme_figures)
    else:
        summary["themes"] = {"skipped": "no embedder chosen" if themes is None else "fewer than 3 dialogues"}
    return Report(summary=summary, tables=conform(tables), figures=figures)


def render_html(report: Report, spec: CampaignSpec) -> str:
    """The self-contained page: no script, no external link; figures are data URIs."""
    from jinja2 import Environment, FileSystemLoader, StrictUndefined, select_autoescape

    env = Environment(
        loader=FileSystemLoader(TEMPLATE.parent),
        autoescape=select_autoescape(["html"]),
        undefined=StrictUndefined,
    )
    env.filters["num"] = _num
    env.filters["pct"] = lambda v: "-" if v is None else f"{100 * v:.1f}%"
    return env.get_template(TEMPLATE.name).render(
        s=report.summary,
        figures=report.figures,
        spec=spec,
        tables=sorted(report.tables),
        min_alpha_dialogues=MIN_ALPHA_DIALOGUES,
    )


def _num(value: Any, digits: int = 3) -> str:
    """Numbers for people: 3 significant decimals, p-values in scientific notation when tiny, '-' for None."""
    if value is None:
        return "-"
    if isinstance(value, int):
        return str(value)
    if abs(value) < 1e-3 and value != 0:
        return f"{value:.2e}"
    return f"{value:.{digits}f}"


def write_report(report: Report, spec: CampaignSpec, out: Path) -> list[Path]:
    """Write report.html, summary.json and tables/*.csv into ``out`` atomically: all files are written to a
    sibling temporary folder that replaces ``out`` only when complete."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        (staging / "tables").mkdir()
        (staging / "report.html").write_text(render_html(report, spec), encoding="utf-8")
        (staging / "summary.json").write_text(json.dumps(report.summary, indent=2) + "\n", encoding="utf-8")
        for name, table in report.tables.items():
            table.to_csv(staging / "tables" / f"{name}.csv", index=False)
        if out.exists():
            shutil.rmtree(out)
        os.replace(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return sorted(p for p in out.rglob("*") if p.is_file())
