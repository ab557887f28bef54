"""The choices every STAR group test shares: how many dialogues a cell needs before it is tested, which
clusters a test respects, and when a logistic fit switches to Firth's penalised likelihood.

Ratings are not independent units: a dialogue gets two or three, an annotator gives many, a red teamer writes
many dialogues. The default tests therefore cluster by dialogue, and also by annotator (or red teamer) once
there are ``MIN_CLUSTERS`` of them, below which a cluster-robust variance over so few clusters is itself too
noisy to trust. The naive tests (every rating its own unit, as in the paper) are kept next to them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import stats

from assay.stats.clustered import (
    cluster_robust_cov,
    clustered_difference,
    design_effects,
    rao_scott_lrtest,
)
from assay.stats.lrtest import logit_lrtest

DEFAULT_MIN_N = 5  # dialogues a cell needs before it gets a share test, an odds ratio or a model term
MIN_CLUSTERS = 20  # a second clustering dimension (annotators, red teamers) is used from this many clusters
FEW_EVENTS = (
    5  # a cell with fewer broken (or fewer not-broken) ratings gets Firth's fit even if the MLE exists
)
NAMES = {"dialogue_id": "dialogue", "annotator": "annotator", "red_teamer": "red teamer"}


def not_enough_data(n: int, detail: str) -> str:
    """The one wording of a refusal, so readers (and scripts) can find every test that was not run."""
    return f"not enough data (n = {n}): {detail}"


@dataclass(frozen=True)
class Clusters:
    """Cluster labels for a test's rows (one or two columns) and how to name them."""

    labels: np.ndarray
    columns: tuple[str, ...]

    def describe(self, counts: tuple[int, ...]) -> str:
        return " and ".join(f"{NAMES.get(c, c)} ({n})" for c, n in zip(self.columns, counts, strict=True))


def cluster_options(rows: pd.DataFrame, second: str) -> list[Clusters]:
    """Clusterings to try, best first: dialogue and ``second`` (annotator or red teamer) when every row names
    one and there are at least ``MIN_CLUSTERS`` of them, then dialogue alone. Two-way variances can come out
    non-positive, which is why the caller falls back down the list."""
    dialogue = pd.factorize(rows["dialogue_id"])[0]
    options = []
    if second in rows.columns and rows[second].notna().all() and rows[second].nunique() >= MIN_CLUSTERS:
        both = np.column_stack([dialogue, pd.factorize(rows[second])[0]])
        options.append(Clusters(both, ("dialogue_id", second)))
    options.append(Clusters(dialogue[:, np.newaxis], ("dialogue_id",)))
    return options


@dataclass(frozen=True)
class RateTest:
    """A default test of two shares: difference, statistic, df, p-value and the method that produced them."""

    difference: float | None
    statistic: float | None
    df: int | None
    p_value: float
    method: str
    n_clusters: tuple[int, ...] = ()


def rate_test(flags: np.ndarray, indicator: np.ndarray, options: list[Clusters]) -> RateTest:
    """Difference in shares with a cluster-robust SE (first clustering that gives a positive variance); when
    every rating within each relation agrees there is no variance to estimate, and Fisher's exact test on the
    ratings says what the counts alone can."""
    for option in options:
        try:
            test = clustered_difference(flags, indicator, option.labels)
        except ValueError:
            continue
        method = (
            f"difference in shares, cluster-robust SE (CR1) by {option.describe(test.n_clusters)}, "
            f"two-sided t on {test.df} df"
        )
        return RateTest(test.difference, test.statistic, test.df, test.p_value, method, test.n_clusters)
    table = [
        [int(flags[indicator == g].sum()), int((indicator == g).sum() - flags[indicator == g].sum())]
        for g in (1, 0)
    ]
    p = float(stats.fisher_exact(table).pvalue)
    difference = float(flags[indicator == 1].mean() - flags[indicator == 0].mean())
    method = "Fisher's exact test on ratings (no variation within either relation, so no robust SE)"
    return RateTest(difference, None, None, p, method)


@dataclass(frozen=True)
class ModelTest:
    """A nested logistic test: the (penalised) LR and its naive p, and the clustered default."""

    method: str
    lr: float
    df: int
    naive_p: float
    statistic: float
    df1: float
    df2: int
    p_value: float
    design_effect: float
    n_clusters: tuple[int, ...]


def model_test(
    y: np.ndarray, restricted: np.ndarray, full: np.ndarray, options: list[Clusters], firth: bool
) -> ModelTest:
    """LR test by maximum likelihood, or Firth's penalised likelihood where the MLE does not exist or
    ``firth`` asks for it, corrected for clustering by its design effects (Rao-Scott). ValueError when
    neither fit nor any clustering gives a usable test."""
    test = logit_lrtest(y, restricted, full, firth=firth or None)
    for option in options:
        try:
            robust = cluster_robust_cov(test.cov, test.scores, option.labels)
            effects = design_effects(test.cov, robust.cov, test.tested)
            corrected = rao_scott_lrtest(test.lr, effects, min(robust.n_clusters))
        except (ValueError, np.linalg.LinAlgError):
            continue
        method = (
            f"LR test by {test.method}, Rao-Scott corrected for clustering by "
            f"{option.describe(robust.n_clusters)}: F on {corrected.df1:.2f} and {corrected.df2} df"
        )
        return ModelTest(
            method=method,
            lr=test.lr,
            df=test.df,
            naive_p=test.p_value,
            statistic=corrected.statistic,
            df1=corrected.df1,
            df2=corrected.df2,
            p_value=corrected.p_value,
            design_effect=float(np.mean(effects)),
            n_clusters=robust.n_clusters,
        )
    raise ValueError("the clustered variance of the tested terms is not positive under any clustering")
