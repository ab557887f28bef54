"""assay.stats: pure statistical functions over numpy arrays and Python numbers (no I/O, no globals).

``tails``: exact binomial and Poisson-binomial upper tails in log space, and their Chernoff bounds,
for DyePack false-positive rates.
"""

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
    "chernoff_bound",
    "kl_bernoulli",
    "log_binomial_sf",
    "log_chernoff_bound",
    "log_poisson_binomial_chernoff_bound",
    "log_poisson_binomial_sf",
    "poisson_binomial_chernoff_bound",
    "poisson_binomial_sf",
]
