"""assay.stats: pure statistical functions over numpy arrays and Python numbers (no I/O, no globals).

``tails``: exact binomial and Poisson-binomial upper tails in log space, and their Chernoff bounds,
for DyePack false-positive rates. ``detection``: the leaderboard's scores of detector probabilities
(cross entropy with NIST's clipping and confidence intervals, Brier score, ROC-AUC).
"""

from assay.stats.detection import brier_score, cross_entropy, cross_entropy_ci, cross_entropy_terms, roc_auc
from assay.stats.tails import (
    binomial_sf,
    chernoff_bound,
    kl_bernoulli,
    log_binomial_sf,
    log_chernoff_bound,
    log_poisson_binomial_chernoff_bound,
    log_poisson_binomial_sf,
    poisson_binomial_chernoff_bound,
    poisson_binomial_sf,
)

__all__ = [
    "binomial_sf",
    "brier_score",
    "chernoff_bound",
    "cross_entropy",
    "cross_entropy_ci",
    "cross_entropy_terms",
    "kl_bernoulli",
    "log_binomial_sf",
    "log_chernoff_bound",
    "log_poisson_binomial_chernoff_bound",
    "log_poisson_binomial_sf",
    "poisson_binomial_chernoff_bound",
    "poisson_binomial_sf",
    "roc_auc",
]
