"""The STAR thematic map: which themes the dialogues of each dataset fall into, and how the datasets differ.

The STAR recipe (Weidinger et al. 2024): embed each dialogue, reduce the embeddings to a 2-D map with UMAP
(cosine, 5 neighbours), cut the map into 20 clusters with Ward agglomerative clustering, and describe each
cluster by its most distinctive terms (class-based TF-IDF, as in BERTopic). Every dataset is first downsampled
to the same size, so a big dataset cannot claim clusters by volume alone; the cluster x dataset table then
shows where each dataset concentrates, and a chi-square test says whether clusters and datasets are related
at all.
"""

from __future__ import annotations

import hashlib
import warnings
from collections.abc import Hashable, Iterable
from typing import TypeVar

import numpy as np
import pandas as pd
from pydantic import BaseModel, ConfigDict
from scipy import stats

from assay.errors import UserError
from assay.star.analysis.embed import Embedder, EmbeddingCache, dialogue_text, embed_texts

Label = TypeVar("Label", bound=Hashable)

CTFIDF = "class-based TF-IDF (BERTopic): tf L1-normalised per cluster x log(1 + mean words per cluster / f_t)"
INDEPENDENCE_TEST = (
    "Pearson chi-square test of independence, cluster x source counts "
    "(scipy.stats.chi2_contingency, no continuity correction)"
)
WORD_PATTERN = r"(?u)\b[^\W\d_]{3,}\b"  # words of 3+ letters: no numbers, no "ok", no "'s"


def class_tfidf_terms(
    docs_by_class: dict[Label, list[str]], top: int = 8
) -> dict[Label, list[tuple[str, float]]]:
    """The ``top`` most distinctive terms of each class, heaviest first (ties alphabetical).

    Each class's documents are joined into one; W(t, c) = tf(t, c) / words(c) x log(1 + A / f(t)), with A the
    mean number of words per class and f(t) the count of t over all classes. BERTopic truncates A to an
    integer; we keep it exact, which changes weights slightly and rankings almost never.
    """
    from sklearn.feature_extraction.text import CountVectorizer

    labels = list(docs_by_class)
    if not labels:
        return {}
    joined = [" ".join(docs_by_class[label]) for label in labels]
    vectorizer = CountVectorizer(stop_words="english", token_pattern=WORD_PATTERN, lowercase=True)
    try:
        counts = vectorizer.fit_transform(joined).toarray().astype(float)
    except ValueError:  # no class has a single word that is not a stop word
        return {label: [] for label in labels}
    vocabulary = vectorizer.get_feature_names_out()
    words = counts.sum(axis=1, keepdims=True)
    tf = counts / np.maximum(words, 1.0)
    idf = np.log(1.0 + counts.sum() / len(labels) / counts.sum(axis=0))
    weights = tf * idf
    found = {}
    for row, label in enumerate(labels):
        present = np.flatnonzero(counts[row])
        ranked = sorted(
            ((str(vocabulary[j]), float(weights[row, j])) for j in present), key=lambda p: (-p[1], p[0])
        )
        found[label] = ranked[:top]
    return found


class ThemePoint(BaseModel):
    """One dialogue on the map."""

    model_config = ConfigDict(frozen=True)
    dialogue_id: str
    source: str
    x: float
    y: float
    cluster: int


class ClusterRow(BaseModel):
    """One cluster: dialogues per source, and each source's share of its own sample that landed here."""

    model_config = ConfigDict(frozen=True)
    cluster: int
    n: int
    counts: dict[str, int]
    shares: dict[str, float]


class SourceSize(BaseModel):
    """Dialogues of a source before and after downsampling."""

    model_config = ConfigDict(frozen=True)
    original: int
    sampled: int


class IndependenceTest(BaseModel):
    """Are cluster and source independent? A small p says the sources spread over the themes differently."""

    model_config = ConfigDict(frozen=True)
    chi2: float
    df: int
    p_value: float
    n: int
    test: str = INDEPENDENCE_TEST


class ThemeMap(BaseModel):
    """Everything the thematic map found, with the parameters that produced it (clusters numbered by size,
    0 the largest). ``independence`` is None with ``reason`` when the test cannot run."""

    model_config = ConfigDict(frozen=True)
    embedder: str
    n_neighbors: int
    metric: str
    seed: int
    n_clusters: int
    per_source: int
    n: int
    points: list[ThemePoint]
    table: list[ClusterRow]
    terms: dict[int, list[tuple[str, float]]]
    n_by_source: dict[str, SourceSize]
    independence: IndependenceTest | None
    reason: str = ""
    method: str = (
        "embed, UMAP to 2-D, Ward agglomerative clustering on the map, "
        "terms by class-based TF-IDF (STAR, Weidinger et al. 2024)"
    )
    terms_method: str = CTFIDF


def _check_columns(dialogues: pd.DataFrame) -> None:
    missing = [c for c in ("dialogue_id", "source", "turns") if c not in dialogues.columns]
    if missing:
        raise UserError(
            f"dialogues need the column(s) {', '.join(missing)} (have: {', '.join(dialogues.columns)})"
        )


def downsample(
    dialogues: pd.DataFrame, per_source: int | None, seed: int
) -> tuple[pd.DataFrame, int, dict[str, SourceSize]]:
    """Each source cut to ``per_source`` rows (default: the smallest source's size), drawn without
    replacement.

    Rows are sorted by dialogue id first and sources visited in sorted order, so the same input in any row
    order gives the same sample. A source smaller than ``per_source`` keeps all its rows.
    """
    frame = dialogues.assign(
        source=dialogues["source"].astype(str), dialogue_id=dialogues["dialogue_id"].astype(str)
    )
    frame = frame.sort_values(["source", "dialogue_id"], kind="stable").reset_index(drop=True)
    sizes = frame.groupby("source", sort=True).size()
    if sizes.empty:
        raise UserError("no dialogues to map")
    target = int(sizes.min()) if per_source is None else per_source
    if target < 1:
        raise UserError(f"per_source must be at least 1 (value: {per_source})")
    rng = np.random.default_rng(seed)
    keep, n_by_source = [], {}
    for source, size in sizes.items():
        rows = np.flatnonzero(frame["source"].to_numpy() == source)
        take = min(target, int(size))
        keep.append(np.sort(rng.choice(rows, size=take, replace=False)) if take < size else rows)
        n_by_source[str(source)] = SourceSize(original=int(size), sampled=take)
    return frame.iloc[np.concatenate(keep)].reset_index(drop=True), target, n_by_source


def _umap_coordinates(vectors: np.ndarray, n_neighbors: int, seed: int) -> np.ndarray:
    """2-D UMAP of the embeddings (cosine) from a start of our own; with a random_state UMAP runs
    single-threaded and then repeats exactly."""
    import umap

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*n_jobs.*overridden.*")
        warnings.filterwarnings("ignore", message=".*(spectral|disconnected|connected components).*")
        reducer = umap.UMAP(
            n_neighbors=n_neighbors,
            metric="cosine",
            random_state=seed,
            n_components=2,
            init=_pca_start(vectors, seed),
        )
        return np.asarray(reducer.fit_transform(vectors), dtype=float)


def _pca_start(vectors: np.ndarray, seed: int) -> np.ndarray:
    """The first two principal components scaled to UMAP's usual +-10, plus a little seeded jitter.

    UMAP's default spectral start does not repeat when a small pilot's neighbour graph falls apart into
    pieces and fails outright on three points; its own "pca" start divides by zero (NaN) when the
    dialogues embed alike. This one is defined for any input.
    """
    centred = vectors - vectors.mean(axis=0)
    _, _, components = np.linalg.svd(centred, full_matrices=False)
    start = np.zeros((len(vectors), 2))
    projected = centred @ components[:2].T
    start[:, : projected.shape[1]] = projected
    spread = np.abs(start).max()
    start = start * (10.0 / spread) if spread > 1e-12 else start
    return start + np.random.default_rng(seed).normal(scale=1e-4, size=start.shape)


def _clusters(coordinates: np.ndarray, n_clusters: int) -> np.ndarray:
    """Ward clusters of the map, renumbered by descending size (ties: first row first) so that labels are
    stable."""
    from sklearn.cluster import AgglomerativeClustering

    if n_clusters == 1:
        return np.zeros(len(coordinates), dtype=int)
    raw = AgglomerativeClustering(n_clusters=n_clusters, linkage="ward").fit_predict(coordinates)
    labels, first, sizes = np.unique(raw, return_index=True, return_counts=True)
    order = sorted(range(len(labels)), key=lambda k: (-sizes[k], first[k]))
    mapping = {int(labels[k]): new for new, k in enumerate(order)}
    return np.array([mapping[int(label)] for label in raw], dtype=int)


def _table(clusters: np.ndarray, sources: np.ndarray, n_by_source: dict[str, SourceSize]) -> list[ClusterRow]:
    rows = []
    for cluster in range(int(clusters.max()) + 1):
        here = sources[clusters == cluster]
        counts = {s: int((here == s).sum()) for s in n_by_source}
        shares = {s: counts[s] / n_by_source[s].sampled for s in n_by_source}
        rows.append(ClusterRow(cluster=cluster, n=len(here), counts=counts, shares=shares))
    return rows


def _independence(table: list[ClusterRow], sources: list[str]) -> tuple[IndependenceTest | None, str]:
    """Chi-square over the cluster x source table, or None and why not."""
    if len(sources) < 2:
        return None, "fewer than 2 sources: nothing to compare"
    if len(table) < 2:
        return None, "fewer than 2 clusters: nothing to compare"
    observed = np.array([[row.counts[s] for s in sources] for row in table], dtype=float)
    chi2, p, df, _ = stats.chi2_contingency(observed, correction=False)
    return IndependenceTest(chi2=float(chi2), df=int(df), p_value=float(p), n=int(observed.sum())), ""


def thematic_map(
    dialogues: pd.DataFrame,
    embedder: Embedder,
    cache: EmbeddingCache | None = None,
    n_clusters: int = 20,
    n_neighbors: int = 5,
    seed: int = 0,
    per_source: int | None = None,
    top_terms: int = 8,
) -> ThemeMap:
    """Downsample, embed, UMAP, Ward-cluster, tabulate and describe; see the module docstring.

    ``n_neighbors`` is clamped to n - 1 and ``n_clusters`` to n (n: dialogues after downsampling), so a small
    pilot still maps; fewer than 3 dialogues is refused, as UMAP needs a neighbourhood.
    """
    _check_columns(dialogues)
    if n_clusters < 1:
        raise UserError(f"n_clusters must be at least 1 (value: {n_clusters})")
    if n_neighbors < 2:
        raise UserError(f"n_neighbors must be at least 2 (value: {n_neighbors})")
    sample, target, n_by_source = downsample(dialogues, per_source, seed)
    n = len(sample)
    if n < 3:
        raise UserError(f"a thematic map needs at least 3 dialogues after downsampling (have {n})")
    texts = [dialogue_text(turns) for turns in sample["turns"]]
    vectors = embed_texts(texts, embedder, cache)
    neighbours, k = min(n_neighbors, n - 1), min(n_clusters, n)
    coordinates = _umap_coordinates(vectors, neighbours, seed)
    clusters = _clusters(coordinates, k)
    sources = sample["source"].to_numpy()
    table = _table(clusters, sources, n_by_source)
    by_cluster: dict[int, list[str]] = {c: [] for c in range(len(table))}
    for turns, cluster in zip(sample["turns"], clusters, strict=True):
        by_cluster[int(cluster)].append(dialogue_text(turns, roles=False))
    independence, reason = _independence(table, list(n_by_source))
    points = [
        ThemePoint(dialogue_id=d, source=s, x=float(x), y=float(y), cluster=int(c))
        for d, s, (x, y), c in zip(sample["dialogue_id"], sources, coordinates, clusters, strict=True)
    ]
    return ThemeMap(
        embedder=embedder.name,
        n_neighbors=neighbours,
        metric="cosine",
        seed=seed,
        n_clusters=k,
        per_source=target,
        n=n,
        points=points,
        table=table,
        terms=class_tfidf_terms(by_cluster, top=top_terms),
        n_by_source=n_by_source,
        independence=independence,
        reason=reason,
    )


def points_frame(theme: ThemeMap) -> pd.DataFrame:
    """One row per mapped dialogue: dialogue_id, source, x, y, cluster."""
    columns = ["dialogue_id", "source", "x", "y", "cluster"]
    return pd.DataFrame([p.model_dump() for p in theme.points], columns=columns)


def table_frame(theme: ThemeMap, labels: dict[int, str] | None = None) -> pd.DataFrame:
    """One row per cluster: n, ``count_<source>`` and ``share_<source>`` columns, and the top terms; with
    ``labels`` (cluster -> label), also each cluster's ``key`` (``cluster_key``) and ``label`` ("" for
    none), so the table is itself a labels file ``assay star report --theme-labels`` reads back."""
    keys = {c: cluster_key(members) for c, members in cluster_members(theme).items()}
    rows = []
    for row in theme.table:
        flat: dict[str, object] = {"cluster": row.cluster, "n": row.n}
        flat |= {f"count_{s}": v for s, v in row.counts.items()}
        flat |= {f"share_{s}": v for s, v in row.shares.items()}
        flat["terms"] = " ".join(term for term, _ in theme.terms.get(row.cluster, []))
        if labels is not None:
            flat["key"], flat["label"] = keys[row.cluster], labels.get(row.cluster, "")
        rows.append(flat)
    return pd.DataFrame(rows)


# --- what theme labels hold on to ------------------------------------------------------------------------


def cluster_key(members: Iterable[str]) -> str:
    """A cluster's fingerprint: the first 16 hex digits of SHA-256 over its sorted dialogue ids.

    Cluster numbers follow size and move whenever anything changes; a label has to stay with the dialogues
    it describes, so it is keyed by them. The same data mapped again gives the same key; a map where the
    cluster gained or lost a single dialogue gives another (labels then carry over by overlap, see
    ``assay.star.theme_labels``)."""
    text = "\n".join(sorted(set(members)))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def cluster_members(theme: ThemeMap) -> dict[int, list[str]]:
    """Each cluster's dialogue ids, sorted."""
    found: dict[int, list[str]] = {row.cluster: [] for row in theme.table}
    for point in theme.points:
        found[point.cluster].append(point.dialogue_id)
    return {c: sorted(ids) for c, ids in found.items()}


def typical_members(theme: ThemeMap, k: int = 3) -> dict[int, list[str]]:
    """Each cluster's ``k`` dialogues nearest its median point on the map (ties by id): the ones a person
    labelling the cluster reads first."""
    frame = points_frame(theme)
    found = {}
    for cluster, part in frame.groupby("cluster", sort=True):
        centre = part[["x", "y"]].median().to_numpy()
        distance = np.hypot(part["x"].to_numpy() - centre[0], part["y"].to_numpy() - centre[1])
        order = sorted(zip(distance, part["dialogue_id"], strict=True))
        found[int(cluster)] = [str(d) for _, d in order[:k]]
    return found


def cluster_summary(theme: ThemeMap, samples: int = 3) -> list[dict[str, object]]:
    """Per cluster, what labelling needs and a report keeps: number, key, size, member ids, samples."""
    members, typical = cluster_members(theme), typical_members(theme, samples)
    return [
        {
            "cluster": c,
            "key": cluster_key(ids),
            "n": len(ids),
            "members": ids,
            "samples": typical.get(c, []),
        }
        for c, ids in members.items()
    ]
