"""Upper-tail probabilities of binomial and Poisson-binomial counts, exact and bounded.

DyePack (Cheng et al. 2025) hides B backdoors in a test set, each with a target drawn uniformly from K_i
choices. A clean model hits backdoor i by chance with probability at most 1/K_i, so the number of
backdoors it activates is (dominated by) X ~ Binomial(B, 1/K), or Poisson-binomial with p_i = 1/K_i when
the K_i differ. Flagging a model when X >= tau has false-positive rate P[X >= tau]; these functions give
that rate exactly, and the Chernoff/KL bounds that are often quoted instead.

Everything is computed in log space, because the rates worth reporting are often far below the smallest
double (1e-308): ``log_*`` functions return the natural log of the probability and stay finite where the
probability itself underflows to 0.0. The plain functions are ``exp`` of the log ones.

No scipy: log C(n, j) comes from exact integers and the sums from ``math.fsum`` (``assay dyepack fpr`` need
not import scipy.special, a quarter of a second); a test holds them to 1e-12 of scipy's ``betaln`` and
``logsumexp``. Past ``EXACT_N`` trials the integers grow slow and scipy's ``betaln`` is used. numpy is
imported only by the functions over arrays (the Poisson-binomial ones): one K needs none of it (0.15 s).

Edge cases, shared by all functions: ``tau <= 0`` gives probability 1 (log 0.0); ``tau > n`` gives
probability 0 (log ``-inf``); p = 0 and p = 1 are handled exactly.
"""

from __future__ import annotations

import functools
import math
import operator
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np

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

_LOG_HALF = -math.log(2.0)
EXACT_N = 10_000  # up to here log C(n, j) from exact integers (0.1 s at the top, quiet); beyond, scipy


# --- argument checks -------------------------------------------------------------------------------


def _numpy_instance(value: object, *names: str) -> bool:
    """Whether ``value`` is one of numpy's ``names`` types; without importing numpy: a program that has
    not imported it holds no numpy value."""
    numpy = sys.modules.get("numpy")
    return numpy is not None and isinstance(value, tuple(getattr(numpy, name) for name in names))


def _as_int(value: object, name: str) -> int:
    """Return ``value`` as a Python int; counts must be integers, not floats that happen to be whole."""
    if isinstance(value, bool) or _numpy_instance(value, "bool_"):
        raise ValueError(f"{name} must be an integer, got bool {value!r}")
    try:
        return operator.index(value)  # int, numpy integers; rejects floats and strings
    except TypeError:
        raise ValueError(f"{name} must be an integer, got {type(value).__name__} {value!r}") from None


def _check_n(n: object) -> int:
    n = _as_int(n, "n")
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    return n


def _check_prob(p: object, name: str = "p") -> float:
    number = isinstance(p, int | float) or _numpy_instance(p, "integer", "floating")
    if isinstance(p, bool) or _numpy_instance(p, "bool_") or not number:
        raise ValueError(f"{name} must be a real number in [0, 1], got {type(p).__name__} {p!r}")
    value = float(p)
    if not 0.0 <= value <= 1.0:  # also rejects NaN
        raise ValueError(f"{name} must be in [0, 1], got {value!r}")
    return value


def _check_ps(ps: Sequence[float] | np.ndarray) -> np.ndarray:
    import numpy as np

    try:
        arr = np.asarray(ps, dtype=float)
    except (TypeError, ValueError):
        raise ValueError("ps must be a one-dimensional sequence of probabilities in [0, 1]") from None
    if arr.ndim != 1:
        raise ValueError(f"ps must be one-dimensional, got an array of shape {arr.shape}")
    if arr.size == 0:
        raise ValueError("ps must contain at least one probability, got an empty sequence")
    bad = ~((arr >= 0.0) & (arr <= 1.0))  # NaN fails both comparisons
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(f"ps must hold probabilities in [0, 1], but ps[{i}] = {float(arr[i])!r}")
    return arr


def _trivial_tail(n: int, tau: int) -> float | None:
    """log P[X >= tau] when it does not depend on the probabilities (X is always in 0..n), else None."""
    if tau <= 0:
        return 0.0
    if tau > n:
        return -math.inf
    return None


def _binomial_args(n: object, p: object, tau: object) -> tuple[int, float, int, float | None]:
    """``n``, ``p`` and ``tau`` checked, with ``_trivial_tail(n, tau)``."""
    n, p, tau = _check_n(n), _check_prob(p), _as_int(tau, "tau")
    return n, p, tau, _trivial_tail(n, tau)


def logsumexp(values: Sequence[float] | np.ndarray) -> float:
    """log(sum(exp(values))), shifted by the largest value and summed exactly (``math.fsum``)."""
    top = max(values, default=-math.inf)
    if top == -math.inf or top == math.inf:
        return float(top)
    return top + math.log(math.fsum(math.exp(v - top) for v in values))


def _log_tail_from_log_pmf(log_pmf: Sequence[float] | np.ndarray, tau: int) -> float:
    """log of sum(pmf[tau:]) from a full log-pmf over 0..n, for 1 <= tau <= n.

    Sums whichever side is the smaller probability: a tail near 1 is ``log1p(-lower tail)``, so its log
    keeps full relative accuracy instead of being a rounded sum of many terms close to 1.
    """
    upper = float(logsumexp(log_pmf[tau:]))
    if upper <= _LOG_HALF:
        return min(upper, 0.0)
    lower = float(logsumexp(log_pmf[:tau]))
    return math.log1p(-math.exp(lower)) if lower < 0.0 else -math.inf


@functools.lru_cache(maxsize=8)
def log_comb(n: int) -> tuple[float, ...]:
    """log C(n, j) for j = 0..n, each the correctly rounded log of the exact integer (``EXACT_N`` at most);
    the last few n are kept, since a caller scanning thresholds asks for the same n again and again."""
    logs, count = [0.0], 1
    for j in range(n):
        count = count * (n - j) // (j + 1)
        logs.append(math.log(count))
    return tuple(logs)


def _log_comb_scipy(n: int) -> Sequence[float]:
    """log C(n, j) as ``-log(n + 1) - betaln(n - j + 1, j + 1)``: full relative accuracy for any n."""
    import numpy as np
    from scipy.special import betaln

    j = np.arange(n + 1, dtype=float)
    return (-math.log(n + 1) - betaln(n - j + 1.0, j + 1.0)).tolist()


# --- binomial --------------------------------------------------------------------------------------


def log_binomial_sf(n: int, p: float, tau: int) -> float:
    """log P[X >= tau] for X ~ Binomial(n, p), exactly, in log space.

    The log-pmf uses ``log C(n, j)`` from the exact integer (``log_comb``), which keeps full relative
    accuracy for large n (differences of ``lgamma`` lose digits), and the terms are summed in log space,
    so tails far below 1e-300 come back as finite logs. Cost is O(n) (with n-bit integers up to
    ``EXACT_N``).
    """
    n, p, tau, trivial = _binomial_args(n, p, tau)
    if trivial is not None:
        return trivial
    if p == 0.0:  # X == 0 surely, and tau >= 1 here
        return -math.inf
    if p == 1.0:  # X == n surely, and tau <= n here
        return 0.0
    combs = log_comb(n) if n <= EXACT_N else _log_comb_scipy(n)
    log_p, log_q = math.log(p), math.log1p(-p)
    log_pmf = [c + j * log_p + (n - j) * log_q for j, c in enumerate(combs)]
    return _log_tail_from_log_pmf(log_pmf, tau)


def binomial_sf(n: int, p: float, tau: int) -> float:
    """P[X >= tau] for X ~ Binomial(n, p); underflows to 0.0 below ~1e-308 (use ``log_binomial_sf`` there)."""
    return math.exp(log_binomial_sf(n, p, tau))


def kl_bernoulli(a: float, p: float) -> float:
    """D(a || p) = a log(a/p) + (1-a) log((1-a)/(1-p)) in nats, with 0 log 0 = 0.

    The exponent of the Chernoff bound. It is +inf where a puts mass that p does not (a > 0 = p, a < 1 = p).
    """
    a = _check_prob(a, "a")
    p = _check_prob(p, "p")
    return _xlogy(a, a) - _xlogy(a, p) + _xlog1py(1.0 - a, -a) - _xlog1py(1.0 - a, -p)


def _xlogy(x: float, y: float) -> float:
    """x log y with 0 log y = 0 (y = 0 included), as scipy's ``xlogy``."""
    if x == 0.0:
        return 0.0
    return x * math.log(y) if y > 0.0 else -math.inf * x


def _xlog1py(x: float, y: float) -> float:
    """x log(1 + y) with 0 log(1 + y) = 0, as scipy's ``xlog1py``."""
    if x == 0.0:
        return 0.0
    return x * math.log1p(y) if y > -1.0 else -math.inf * x


def log_chernoff_bound(n: int, p: float, tau: int) -> float:
    """log of the Chernoff/KL bound P[X >= tau] <= exp(-n D(tau/n || p)), X ~ Binomial(n, p).

    The bound is only informative above the mean: for tau/n <= p it is the trivial bound 1 (log 0.0).
    It is tight to within a polynomial factor in n, and exact at tau = n (where it equals p**n).
    """
    n, p, tau, trivial = _binomial_args(n, p, tau)
    if trivial is not None:
        return trivial
    a = tau / n
    if a <= p:
        return 0.0
    return -n * kl_bernoulli(a, p)


def chernoff_bound(n: int, p: float, tau: int) -> float:
    """exp(-n D(tau/n || p)), an upper bound on P[X >= tau] for X ~ Binomial(n, p) (1.0 when tau/n <= p)."""
    return math.exp(log_chernoff_bound(n, p, tau))


# --- Poisson-binomial ------------------------------------------------------------------------------


def log_poisson_binomial_sf(ps: Sequence[float] | np.ndarray, tau: int) -> float:
    """log P[S >= tau] for S = sum of independent Bernoulli(ps[i]), exactly, in log space.

    DyePack with a different number of target choices K_i per backdoor gives p_i = 1/K_i. Dynamic
    programming over the count distribution, one vectorised ``logaddexp`` step per trial: O(n^2) time,
    O(n) memory (n = 10,000 takes about a second).
    """
    import numpy as np

    arr = _check_ps(ps)
    tau = _as_int(tau, "tau")
    n = arr.size
    trivial = _trivial_tail(n, tau)
    if trivial is not None:
        return trivial
    with np.errstate(divide="ignore"):  # log(0) = -inf is the right value for p_i in {0, 1}
        log_p = np.log(arr)
        log_q = np.log1p(-arr)
    log_pmf = np.full(n + 1, -np.inf)
    log_pmf[0] = 0.0
    for i in range(n):
        # after trial i the count is in 0..i+1: f'[k] = f[k] q_i + f[k-1] p_i, updated in place; the
        # right-hand sides are fresh temporaries, so no entry is read after it is overwritten.
        log_pmf[i + 1] = log_pmf[i] + log_p[i]
        np.logaddexp(log_pmf[1 : i + 1] + log_q[i], log_pmf[:i] + log_p[i], out=log_pmf[1 : i + 1])
        log_pmf[0] += log_q[i]
    return _log_tail_from_log_pmf(log_pmf, tau)


def poisson_binomial_sf(ps: Sequence[float] | np.ndarray, tau: int) -> float:
    """P[S >= tau] for a sum of independent Bernoulli(ps[i]); ``exp`` of ``log_poisson_binomial_sf``."""
    return math.exp(log_poisson_binomial_sf(ps, tau))


def log_poisson_binomial_chernoff_bound(ps: Sequence[float] | np.ndarray, tau: int) -> float:
    """log of the Chernoff-Hoeffding bound exp(-n D(tau/n || mean(ps))) on P[S >= tau].

    Hoeffding (1963, Theorem 1 and section 4) shows the KL bound with the mean probability p̄ = mean(ps)
    holds for any sum of independent Bernoulli(p_i), not just equal p_i: the Poisson-binomial tail above
    the mean is at most the binomial(n, p̄) Chernoff bound. Trivial (log 0.0) when tau/n <= p̄.
    """
    arr = _check_ps(ps)
    tau = _as_int(tau, "tau")
    p_bar = min(max(float(arr.mean()), 0.0), 1.0)  # mean can round a hair outside [0, 1]
    return log_chernoff_bound(arr.size, p_bar, tau)


def poisson_binomial_chernoff_bound(ps: Sequence[float] | np.ndarray, tau: int) -> float:
    """exp(-n D(tau/n || mean(ps))), an upper bound on P[S >= tau] for a Poisson-binomial sum S."""
    return math.exp(log_poisson_binomial_chernoff_bound(ps, tau))
