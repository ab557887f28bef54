"""assay.stats: pure statistical functions over numpy arrays and Python numbers (no I/O, no globals).

``tails``: exact binomial and Poisson-binomial upper tails in log space, and their Chernoff bounds,
for DyePack false-positive rates. ``detection``: the leaderboard's scores of detector probabilities
(cross entropy with NIST's clipping and confidence intervals, Brier score, ROC-AUC and curve, confusion
table, TPR at a fixed FPR, expected calibration error, and all scalars at once, overall or per group).
``agreement``: Krippendorff's alpha (via the ``krippendorff`` package), its unit bootstrap interval, and
percent agreement. ``proportions``: two-proportion z-test, Wilson/normal intervals, odds ratio with Woolf
interval. ``lrtest``: likelihood-ratio tests, including nested logistic fits with statsmodels and the
automatic switch to ``firth`` (Firth's penalised logistic regression and its penalised LR test) where the MLE
does not exist. ``clustered``: cluster-robust (one- and two-way) covariances, the clustered difference of two
shares, and the Rao-Scott design-effect correction of LR tests. ``power``: power and sample size of the
two-proportion test (statsmodels, arcsine scale) with a design effect for clustered observations.
``disclosure``: a score coarsened to a fixed grid of at most 2^bits cells (at most ``bits`` bits on
average), or to bins of label vectors (at most ``bits`` in every outcome): the leaderboard's test budget.

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
    "ClusteredCov": "clustered",
    "DifferenceTest": "clustered",
    "RaoScottTest": "clustered",
    "cluster_robust_cov": "clustered",
    "clustered_difference": "clustered",
    "design_effects": "clustered",
    "rao_scott_lrtest": "clustered",
    "FirthFit": "firth",
    "PenalizedLRTest": "firth",
    "firth_logit": "firth",
    "firth_lrtest": "firth",
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
    "roc_auc_ci": "detection",
    "roc_curve": "detection",
    "tpr_at_fpr": "detection",
    "Cell": "disclosure",
    "GridInformation": "disclosure",
    "Partition": "disclosure",
    "Shown": "disclosure",
    "disclose": "disclosure",
    "grid_cell": "disclosure",
    "grid_edges": "disclosure",
    "grid_information": "disclosure",
    "partition": "disclosure",
    "LRTestResult": "lrtest",
    "LogitLRTest": "lrtest",
    "likelihood_ratio_test": "lrtest",
    "logit_lrtest": "lrtest",
    "nested_logit_lrtest": "lrtest",
    "Effect": "power",
    "design_effect": "power",
    "n_needed": "power",
    "planned_effect": "power",
    "power_at": "power",
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
