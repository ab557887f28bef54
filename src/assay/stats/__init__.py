"""assay.stats: pure statistical functions over numpy arrays and Python numbers (no I/O, no globals).

``tails``: exact binomial and Poisson-binomial upper tails in log space, and their Chernoff bounds,
for DyePack false-positive rates. ``detection``: the leaderboard's scores of detector probabilities
(cross entropy with NIST's clipping and confidence intervals, Brier score, ROC-AUC and curve, confusion
table, TPR at a fixed FPR, expected calibration error, and all scalars at once, overall or per group).
``agreement``: Krippendorff's alpha (via the ``krippendorff`` package), its unit bootstrap interval, and
percent agreement. ``proportions``: two-proportion z-test, Wilson/normal intervals, odds ratio with Woolf
interval. ``lrtest``: likelihood-ratio tests, including nested logistic fits with statsmodels.
"""

from assay.stats.agreement import AlphaInterval, bootstrap_alpha_ci, krippendorff_alpha, percent_agreement
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
from assay.stats.lrtest import LRTestResult, likelihood_ratio_test, nested_logit_lrtest
from assay.stats.proportions import OddsRatio, odds_ratio_ci, proportion_ci, two_proportion_ztest
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
    "AlphaInterval",
    "ConfusionTable",
    "LRTestResult",
    "OddsRatio",
    "binomial_sf",
    "bootstrap_alpha_ci",
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
    "krippendorff_alpha",
    "likelihood_ratio_test",
    "log_binomial_sf",
    "log_chernoff_bound",
    "log_poisson_binomial_chernoff_bound",
    "log_poisson_binomial_sf",
    "nested_logit_lrtest",
    "odds_ratio_ci",
    "percent_agreement",
    "poisson_binomial_chernoff_bound",
    "poisson_binomial_sf",
    "proportion_ci",
    "roc_auc",
    "roc_curve",
    "tpr_at_fpr",
    "two_proportion_ztest",
]
