"""assay.stats: pure statistical functions over numpy arrays and Python numbers (no I/O, no globals).

``tails``: exact binomial and Poisson-binomial upper tails in log space, and their Chernoff bounds,
for DyePack false-positive rates. ``detection``: the leaderboard's scores of detector probabilities
(cross entropy with NIST's clipping and confidence intervals, Brier score, ROC-AUC and curve, confusion
table, TPR at a fixed FPR, expected calibration error, and all scalars at once, overall or per group).
"""

from assay.stats.detection import (
    ConfusionTable,
    brier_score,
    confusion_table,
    cross_entropy,
    cross_entropy_ci,
    cross_entropy_terms,
    detection_metrics,
    expected_calibration_error,
    grouped_metrics,
    roc_auc,
    roc_curve,
    tpr_at_fpr,
)
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
    "ConfusionTable",
    "binomial_sf",
    "brier_score",
    "chernoff_bound",
    "confusion_table",
    "cross_entropy",
    "cross_entropy_ci",
    "cross_entropy_terms",
    "detection_metrics",
    "expected_calibration_error",
    "grouped_metrics",
    "kl_bernoulli",
    "log_binomial_sf",
    "log_chernoff_bound",
    "log_poisson_binomial_chernoff_bound",
    "log_poisson_binomial_sf",
    "poisson_binomial_chernoff_bound",
    "poisson_binomial_sf",
    "roc_auc",
    "roc_curve",
    "tpr_at_fpr",
]
