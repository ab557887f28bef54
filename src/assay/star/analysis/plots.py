"""The report's figures as PNG data URIs, so the HTML report is one file that opens offline.

Each function takes the analysis results (not raw data) and returns ``data:image/png;base64,...``; PNG
rather than SVG because a thematic map of 10,000 points is megabytes as vector markup.
"""

from __future__ import annotations

import base64
import io
from collections.abc import Sequence

import numpy as np
import pandas as pd

from assay.star.analysis.groups import GroupOdds, LevelShare

RELATION_COLOURS = {"in-group": "#1b6ca8", "out-group": "#d1495b", "none": "#8d99ae"}


def _figure(width: float, height: float):  # type: ignore[no-untyped-def]
    """A figure on the non-interactive backend: reports are written by servers and CI without a display."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), dpi=110, layout="constrained")


def _data_uri(fig) -> str:  # type: ignore[no-untyped-def]
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def likert_plot(levels: Sequence[LevelShare]) -> str:
    """Share of each Likert level per annotator relation, with 95% Wilson intervals as error bars."""
    fig = _figure(7, 3.4)
    ax = fig.add_subplot()
    relations = [r for r in RELATION_COLOURS if any(x.relation == r and x.share.n for x in levels)]
    labels = list(dict.fromkeys(x.label for x in levels))
    width = 0.8 / max(len(relations), 1)
    for k, relation in enumerate(relations):
        rows = [x for x in levels if x.relation == relation]
        shares = np.array([x.share.share or 0.0 for x in rows])
        low = shares - np.array([x.share.low or 0.0 for x in rows])
        high = np.array([x.share.high or 0.0 for x in rows]) - shares
        n = rows[0].share.n
        xs = np.arange(len(rows)) + (k - (len(relations) - 1) / 2) * width
        ax.bar(xs, shares, width, yerr=[low, high], capsize=3, color=RELATION_COLOURS[relation])
        ax.bar([], [], color=RELATION_COLOURS[relation], label=f"{relation} (n={n})")
    ax.set_xticks(range(len(labels)), labels, fontsize=8)
    ax.set_ylabel("share of ratings")
    ax.set_ylim(0, 1)
    ax.legend(fontsize=8)
    ax.set_title("Ratings by annotator relation to the targeted group (95% Wilson intervals)", fontsize=9)
    return _data_uri(fig)


def odds_forest(odds: Sequence[GroupOdds]) -> str:
    """Forest plot of per-group odds ratios (log scale), one row per rule x group, reference line at 1."""
    fig = _figure(7, max(2.0, 0.28 * len(odds) + 1.0))
    ax = fig.add_subplot()
    ys = np.arange(len(odds))[::-1]
    ratios = np.array([o.odds_ratio for o in odds])
    ax.errorbar(
        ratios,
        ys,
        xerr=[ratios - [o.low for o in odds], [o.high for o in odds] - ratios],
        fmt="o",
        color="#1b6ca8",
        capsize=2,
    )
    ax.axvline(1.0, color="#888", linestyle="--", linewidth=1)
    ax.set_xscale("log")
    ax.set_yticks(ys, [f"{o.rule_id}: {o.group} (n={o.a + o.b})" for o in odds], fontsize=7)
    ax.set_xlabel("odds ratio of a rule break vs the rule's other groups (95% Woolf interval)")
    return _data_uri(fig)


def heatmap(table: pd.DataFrame, title: str, colourbar: str) -> str:
    """A labelled heatmap with each cell's value written in it (counts, so readers need no legend lookup)."""
    fig = _figure(max(4.0, 0.7 * table.shape[1] + 2.5), max(2.2, 0.35 * table.shape[0] + 1.2))
    ax = fig.add_subplot()
    values = table.to_numpy(dtype=float)
    image = ax.imshow(values, cmap="Blues", aspect="auto")
    ax.set_xticks(range(table.shape[1]), [str(c) for c in table.columns], rotation=35, ha="right", fontsize=7)
    ax.set_yticks(range(table.shape[0]), [str(i) for i in table.index], fontsize=7)
    top = np.nanmax(values) if values.size else 0
    for (i, j), value in np.ndenumerate(values):
        if np.isfinite(value):
            colour = "white" if value > 0.6 * top else "black"
            ax.text(j, i, f"{value:g}", ha="center", va="center", fontsize=7, color=colour)
    fig.colorbar(image, ax=ax, label=colourbar)
    ax.set_title(title, fontsize=9)
    return _data_uri(fig)


def theme_scatter(points: pd.DataFrame, labels: dict[int, str] | None = None) -> str:
    """The 2-D thematic map: colour = cluster (numbered at its centre, with its label when it has one),
    marker = data set."""
    labels = labels or {}
    fig = _figure(7.5, 6)
    ax = fig.add_subplot()
    markers = ["o", "^", "s", "D", "v", "P", "X"]
    cmap = _cluster_colours(int(points["cluster"].max()) + 1)
    for k, (source, part) in enumerate(points.groupby("source", sort=True)):
        ax.scatter(
            part["x"],
            part["y"],
            c=[cmap[c] for c in part["cluster"]],
            s=8,
            marker=markers[k % len(markers)],
            linewidths=0,
            alpha=0.75,
            label=f"{source} (n={len(part)})",
        )
    for cluster, part in points.groupby("cluster"):
        name = f"{cluster}: {labels[cluster]}" if cluster in labels else str(cluster)
        ax.annotate(name, (part["x"].median(), part["y"].median()), fontsize=8, weight="bold")
    ax.legend(fontsize=8, markerscale=2)
    ax.set_xticks([])
    ax.set_yticks([])
    named = "numbered and labelled" if labels else "numbered"
    ax.set_title(f"Thematic map: UMAP of dialogue embeddings, Ward clusters {named}", fontsize=9)
    return _data_uri(fig)


def _cluster_colours(n: int) -> list[tuple[float, ...]]:
    from matplotlib import colormaps

    palette = colormaps["tab20"]
    return [palette(i % 20) for i in range(n)]
