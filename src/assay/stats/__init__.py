"""assay.stats: pure statistical functions over numpy arrays and Python numbers (no I/O, no globals).

``tails``: exact binomial and Poisson-binomial upper tails in log space, and their Chernoff bounds,
for DyePack false-positive rates. ``detection``: the leaderboard's scores of detector probabilities
(cross entropy with NIST's clipping and confidence intervals, Brier score, ROC-AUC and curve, confusion
table, TPR at a fixed FPR, expected calibration error, and all scalars at once, overall or per group).
``agreement``: Krippendorff's alpha (via the ``krippendorff`` package), its unit bootstrap interval, and
percent agreement. ``proportions``: two-proportion z-test, Wilson/normal intervals, odds ratio with Woolf
interval. ``lrtest``: likelihood-ratio tests, including nested logistic fits with statsmodels.

Names are loaded on first use (PEP 562), so a caller that needs only the tails (``assay dyepack fpr``) does
not import scipy.stats, krippendorff or statsmodels.
"""

from __future__ import annotations

from assay.lazy import lazy_attributes

_HOME = {
    "AlphaInterval": "agreement",
    "bootstrap_alpha_ci": "agreement",
    "krippendorff_alpha": "agreement",
    "percent_agreement": "agreement",
    "ConfusionTable": "detection",
    "brier_score": "detection",
    "confusion_table": "detection",
    "cross_entropy": "detection",
    "cross_entropy_ci": "detection",
    "cross_entropy_terms": "detection",
    "detection_metrics": "detection",
    "expected_calibration_error": "detection",
    "grouped_metrics": "detection",
    "roc_auc": "detection",
    "roc_curve": "detection",
    "tpr_at_fpr": "detection",
    "LRTestResult": "lrtest",
    "likelihood_ratio_test": "lrtest",
    "nested_logit_lrtest": "lrtest",
    "OddsRatio": "proportions",
    "odds_ratio_ci": "proportions",
    "proportion_ci": "proportions",
    "two_proportion_ztest": "proportions",
    "binomial_sf": "tails",
    "chernoff_bound": "tails",
    "kl_bernoulli": "tails",
    "log_binomial_sf": "tails",
    "log_chernoff_bound": "tails",
    "log_poisson_binomial_chernoff_bound": "tails",
    "log_poisson_binomial_sf": "tails",
    "poisson_binomial_chernoff_bound": "tails",
    "poisson_binomial_sf": "tails",
}
__all__ = sorted(_HOME)
__getattr__ = lazy_attributes(__name__, _HOME)
