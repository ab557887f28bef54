"""assay.stats.tails against independent oracles: closed forms, scipy, mpmath, rationals, brute force."""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import mpmath
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.special import betaln, logsumexp, xlog1py, xlogy
from scipy.stats import binom

from assay.stats import (
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


def rel_err(got: float, want: float) -> float:
    """Relative error of ``got``; absolute where ``want`` is 0 (a log-probability of 0 is probability 1)."""
    if got == want:
        return 0.0
    return abs(got - want) / abs(want) if want != 0 else abs(got)


def mp_log_binomial_sf(n: int, p: float, tau: int, dps: int = 120) -> float:
    """log P[X >= tau] with mpmath at ``dps`` digits, for the same double p the function receives."""
    with mpmath.workdps(dps):
        P = mpmath.mpf(p)
        Q = 1 - P
        term = mpmath.binomial(n, tau) * P**tau * Q ** (n - tau)
        total = mpmath.mpf(0)
        for j in range(tau, n + 1):
            total += term
            term = term * (n - j) / (j + 1) * P / Q
        return float(mpmath.log(total))


def fraction_poisson_binomial_pmf(ps: list[Fraction]) -> list[Fraction]:
    pmf = [Fraction(1)]
    for p in ps:
        nxt = [Fraction(0)] * (len(pmf) + 1)
        for k, f in enumerate(pmf):
            nxt[k] += f * (1 - p)
            nxt[k + 1] += f * p
        pmf = nxt
    return pmf


# --- DyePack paper ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("B", "K", "closed_form", "paper_percent"),
    [
        (2, 10, 0.19, "19"),
        (4, 10, 0.3439, "34.4"),
        (8, 10, 0.56953279, "57.0"),
        (6, 7, 1 - (6 / 7) ** 6, "60.3"),
    ],
)
def test_dyepack_paper_false_positive_rates(B: int, K: int, closed_form: float, paper_percent: str) -> None:
    p = 1 / K
    assert math.isclose(1 - (1 - p) ** B, closed_form, rel_tol=1e-12)
    got = binomial_sf(B, p, 1)
    assert rel_err(got, closed_form) < 1e-12
    assert rel_err(poisson_binomial_sf([p] * B, 1), closed_form) < 1e-12
    decimals = len(paper_percent.split(".")[1]) if "." in paper_percent else 0
    assert f"{100 * got:.{decimals}f}" == paper_percent


def test_dyepack_mixed_choices_poisson_binomial() -> None:
    # one backdoor with 7 choices, one with 10: P[X >= 1] = 1 - (6/7)(9/10)
    assert rel_err(poisson_binomial_sf([1 / 7, 1 / 10], 1), 1 - (6 / 7) * (9 / 10)) < 1e-12
    assert rel_err(poisson_binomial_sf([1 / 7, 1 / 10], 2), 1 / 70) < 1e-12


# --- binomial against scipy and mpmath -------------------------------------------------------------

SCIPY_NS = [1, 2, 3, 10, 37, 100, 1000, 5000]
SCIPY_PS = [1e-3, 0.01, 0.1, 1 / 7, 0.25, 0.5, 0.9, 0.999]


@pytest.mark.parametrize("n", SCIPY_NS)
@pytest.mark.parametrize("p", SCIPY_PS)
def test_binomial_sf_matches_scipy(n: int, p: float) -> None:
    taus = sorted({*range(min(n, 12) + 1), *np.linspace(0, n, 41).astype(int).tolist(), n})
    checked = 0
    for tau in taus:
        want = float(binom.sf(tau - 1, n, p))
        if want <= 1e-250:  # below this scipy's double result nears the subnormal range
            continue
        assert rel_err(binomial_sf(n, p, tau), want) < 1e-9, (n, p, tau)
        # near 1, log(sf) rounds away the information; the small lower tail keeps it: log1p(-cdf)
        log_want = math.log(want) if want < 0.5 else math.log1p(-float(binom.cdf(tau - 1, n, p)))
        assert rel_err(log_binomial_sf(n, p, tau), log_want) < 1e-9, (n, p, tau)
        checked += 1
    assert checked >= 1


@pytest.mark.parametrize(
    ("n", "p", "tau"),
    [
        (10_000, 0.25, 9_000),
        (10_000, 0.25, 10_000),
        (10_000, 0.25, 5_000),
        (10_000, 0.1, 3_000),
        (10_000, 1 / 7, 9_999),
        (10_000, 0.5, 9_500),
        (5_000, 1e-3, 300),
        (2_000, 1 / 3, 1_900),
    ],
)
def test_extreme_tails_match_mpmath(n: int, p: float, tau: int) -> None:
    want = mp_log_binomial_sf(n, p, tau)
    assert want < math.log(1e-300)  # the float tail underflows: only the log is representable
    got = log_binomial_sf(n, p, tau)
    assert math.isfinite(got)
    assert rel_err(got, want) < 1e-9
    assert binomial_sf(n, p, tau) == 0.0


def scipy_log_binomial_sf(n: int, p: float, tau: int) -> float:
    """The former implementation: log C(n, j) by scipy's ``betaln``, the sums by its ``logsumexp``."""
    j = np.arange(n + 1, dtype=float)
    log_pmf = -math.log(n + 1) - betaln(n - j + 1.0, j + 1.0) + j * math.log(p) + (n - j) * math.log1p(-p)
    upper = float(logsumexp(log_pmf[tau:]))
    if upper <= -math.log(2.0):
        return min(upper, 0.0)
    return math.log1p(-math.exp(float(logsumexp(log_pmf[:tau]))))


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8, 10, 37, 100, 257, 1000])
def test_tails_without_scipy_agree_with_scipy_to_1e_12(n: int) -> None:
    """``assay dyepack fpr`` imports no scipy now: its tails equal scipy's to 1e-12 over DyePack's range."""
    for p in SCIPY_PS:
        for tau in sorted({*range(1, min(n, 12) + 1), *np.linspace(1, n, 21).astype(int).tolist()}):
            want = scipy_log_binomial_sf(n, p, tau)
            assert rel_err(log_binomial_sf(n, p, tau), want) < 1e-12, (n, p, tau)
    for a, q in itertools.product([0.0, 1e-9, 0.3, 0.5, 1.0], [0.0, 1e-9, 0.25, 0.5, 1.0]):
        want = float(xlogy(a, a) - xlogy(a, q) + xlog1py(1.0 - a, -a) - xlog1py(1.0 - a, -q))
        assert kl_bernoulli(a, q) == want or rel_err(kl_bernoulli(a, q), want) < 1e-12, (a, q)


@pytest.mark.parametrize(
    ("n", "p", "tau"), [(10_000, 0.9, 8_571), (5_000, 0.5, 2_500), (10_000, 1 / 7, 4_000)]
)
def test_exact_binomial_coefficients_beat_betaln_against_mpmath(n: int, p: float, tau: int) -> None:
    """Past a few thousand trials scipy's ``betaln`` drifts (1e-11 here); exact integers stay within 1e-12."""
    want = mp_log_binomial_sf(n, p, tau)
    assert rel_err(log_binomial_sf(n, p, tau), want) < 1e-12
    assert rel_err(log_binomial_sf(n, p, tau), want) <= rel_err(scipy_log_binomial_sf(n, p, tau), want)


@pytest.mark.parametrize(("n", "p", "tau"), [(1_000, 0.5, 400), (10_000, 0.25, 2_250), (50, 0.9, 30)])
def test_tail_near_one_keeps_log_accuracy(n: int, p: float, tau: int) -> None:
    # log P is a tiny negative number here; summing the upper tail directly would round it to ~1e-16 noise
    want = mp_log_binomial_sf(n, p, tau)
    assert -1e-6 < want < 0
    assert rel_err(log_binomial_sf(n, p, tau), want) < 1e-9


@pytest.mark.parametrize(("n", "p"), [(1, 0.3), (7, 1 / 7), (100, 0.01), (500, 0.5), (300, 0.999)])
def test_binomial_sf_monotone_with_exact_ends(n: int, p: float) -> None:
    logs = np.array([log_binomial_sf(n, p, tau) for tau in range(-2, n + 3)])
    assert np.all(logs[1:] <= logs[:-1])
    assert binomial_sf(n, p, 0) == 1.0
    assert binomial_sf(n, p, -5) == 1.0
    assert binomial_sf(n, p, n + 1) == 0.0
    assert log_binomial_sf(n, p, n + 1) == -math.inf


def test_binomial_degenerate_p() -> None:
    assert log_binomial_sf(10, 0.0, 0) == 0.0
    assert log_binomial_sf(10, 0.0, 1) == -math.inf
    assert log_binomial_sf(10, 1.0, 10) == 0.0
    assert log_binomial_sf(10, 1.0, 11) == -math.inf
    assert log_binomial_sf(0, 0.3, 0) == 0.0
    assert log_binomial_sf(0, 0.3, 1) == -math.inf


def test_numpy_integer_arguments_accepted() -> None:
    assert log_binomial_sf(np.int64(10), np.float32(0.5), np.int32(3)) == log_binomial_sf(10, 0.5, 3)


# --- KL divergence and Chernoff bounds -------------------------------------------------------------


def test_kl_bernoulli_values() -> None:
    assert kl_bernoulli(0.3, 0.3) == 0.0
    assert kl_bernoulli(0.0, 0.0) == 0.0
    assert kl_bernoulli(1.0, 1.0) == 0.0
    assert rel_err(kl_bernoulli(1.0, 0.25), math.log(4)) < 1e-15
    assert rel_err(kl_bernoulli(0.0, 0.25), -math.log(0.75)) < 1e-15
    want = 0.5 * math.log(0.5 / 0.25) + 0.5 * math.log(0.5 / 0.75)
    assert rel_err(kl_bernoulli(0.5, 0.25), want) < 1e-14
    assert kl_bernoulli(0.5, 0.0) == math.inf
    assert kl_bernoulli(0.5, 1.0) == math.inf


def test_chernoff_bound_values() -> None:
    assert chernoff_bound(10, 0.5, 5) == 1.0  # at the mean the bound is trivial
    assert chernoff_bound(10, 0.5, 2) == 1.0
    assert chernoff_bound(10, 0.5, 0) == 1.0
    assert chernoff_bound(10, 0.5, 11) == 0.0
    assert rel_err(chernoff_bound(10, 0.1, 10), 0.1**10) < 1e-12  # tight at tau = n
    assert log_chernoff_bound(10, 0.0, 1) == -math.inf
    want = -8 * (0.75 * math.log(0.75 / 0.25) + 0.25 * math.log(0.25 / 0.75))
    assert rel_err(log_chernoff_bound(8, 0.25, 6), want) < 1e-14


def bound_holds(log_bound: float, log_exact: float) -> bool:
    """log_bound >= log_exact, up to rounding (the two are mathematically equal at tau = n)."""
    if log_exact == -math.inf:
        return True
    return log_bound >= log_exact - 1e-12 * max(1.0, abs(log_exact))


@settings(max_examples=300, deadline=None)
@given(
    n=st.integers(0, 400),
    p=st.floats(0.0, 1.0, allow_nan=False),
    frac=st.floats(0.0, 1.0, allow_nan=False),
)
def test_chernoff_bound_dominates_exact_tail(n: int, p: float, frac: float) -> None:
    tau = round(frac * (n + 1))
    exact = log_binomial_sf(n, p, tau)
    bound = log_chernoff_bound(n, p, tau)
    assert bound <= 0.0
    assert bound_holds(bound, exact), (n, p, tau, bound, exact)


@settings(max_examples=200, deadline=None)
@given(
    ps=st.lists(st.floats(0.0, 1.0, allow_nan=False), min_size=1, max_size=60),
    frac=st.floats(0.0, 1.0, allow_nan=False),
)
def test_poisson_binomial_chernoff_bound_dominates_exact_tail(ps: list[float], frac: float) -> None:
    tau = round(frac * (len(ps) + 1))
    exact = log_poisson_binomial_sf(ps, tau)
    bound = log_poisson_binomial_chernoff_bound(ps, tau)
    assert bound_holds(bound, exact), (ps, tau, bound, exact)
    assert poisson_binomial_chernoff_bound(ps, tau) >= poisson_binomial_sf(ps, tau) * (1 - 1e-12)


@settings(max_examples=150, deadline=None)
@given(ps=st.lists(st.floats(0.0, 1.0, allow_nan=False), min_size=1, max_size=40))
def test_poisson_binomial_monotone_in_tau(ps: list[float]) -> None:
    logs = np.array([log_poisson_binomial_sf(ps, tau) for tau in range(-1, len(ps) + 3)])
    assert np.all(logs[1:] <= logs[:-1])
    assert logs[0] == logs[1] == 0.0  # tau = -1, 0
    assert logs[-1] == logs[-2] == -math.inf  # tau = n + 2, n + 1


# --- Poisson-binomial against exact oracles --------------------------------------------------------


def test_poisson_binomial_matches_exact_fractions() -> None:
    rng = np.random.default_rng(20250101)
    ks = rng.integers(2, 11, size=30).tolist()
    pmf = fraction_poisson_binomial_pmf([Fraction(1, k) for k in ks])
    ps = [1 / k for k in ks]
    for tau in range(0, 32):
        want = sum(pmf[tau:], Fraction(0))
        got = poisson_binomial_sf(ps, tau)
        if want == 0:
            assert got == 0.0
        else:
            assert rel_err(got, float(want)) < 1e-12, tau
            assert rel_err(log_poisson_binomial_sf(ps, tau), math.log(want)) < 1e-12


@pytest.mark.parametrize("n", [1, 2, 5, 9, 12])
def test_poisson_binomial_matches_brute_force(n: int) -> None:
    rng = np.random.default_rng(n)
    ps = rng.uniform(size=n)
    if n >= 5:
        ps[1], ps[3] = 0.0, 1.0  # exact zeros and ones take the log(0) = -inf path
    fr = [Fraction(float(p)) for p in ps]
    tails = [Fraction(0)] * (n + 2)
    for outcome in itertools.product((0, 1), repeat=n):
        prob = math.prod((f if hit else 1 - f for f, hit in zip(fr, outcome, strict=True)), start=Fraction(1))
        for tau in range(sum(outcome) + 1):
            tails[tau] += prob
    for tau in range(n + 2):
        want = tails[tau]
        got = poisson_binomial_sf(ps, tau)
        if want == 0:
            assert got == 0.0
        else:
            assert rel_err(got, float(want)) < 1e-12, (tau, got, float(want))


@pytest.mark.parametrize(("n", "p"), [(1, 0.3), (20, 0.1), (80, 1 / 7), (300, 0.5), (300, 0.98)])
def test_poisson_binomial_equal_ps_is_binomial(n: int, p: float) -> None:
    for tau in range(n + 2):
        want = log_binomial_sf(n, p, tau)
        got = log_poisson_binomial_sf(np.full(n, p), tau)
        assert got == want or rel_err(got, want) < 1e-11, (n, p, tau)


def test_poisson_binomial_degenerate_ps() -> None:
    assert poisson_binomial_sf([0.0, 0.0], 1) == 0.0
    assert poisson_binomial_sf([1.0, 1.0, 0.0], 2) == 1.0
    assert poisson_binomial_sf([1.0, 1.0, 0.0], 3) == 0.0
    assert log_poisson_binomial_sf((0.5,), 1) == math.log(0.5)


def test_poisson_binomial_n_10000() -> None:
    # O(n^2) dynamic programme: about a second per call at n = 10,000
    ps = np.full(10_000, 0.25)
    for tau in (2_600, 9_000):
        want = log_binomial_sf(10_000, 0.25, tau)
        assert rel_err(log_poisson_binomial_sf(ps, tau), want) < 1e-9
    assert rel_err(log_binomial_sf(10_000, 0.25, 9_000), mp_log_binomial_sf(10_000, 0.25, 9_000)) < 1e-9


# --- argument validation ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: log_binomial_sf(-1, 0.5, 1), "n must be >= 0"),
        (lambda: log_binomial_sf(10.0, 0.5, 1), "n must be an integer"),
        (lambda: log_binomial_sf(10, 1.5, 1), r"p must be in \[0, 1\]"),
        (lambda: log_binomial_sf(10, -0.1, 1), r"p must be in \[0, 1\]"),
        (lambda: log_binomial_sf(10, math.nan, 1), r"p must be in \[0, 1\]"),
        (lambda: log_binomial_sf(10, "0.5", 1), "p must be a real number"),
        (lambda: log_binomial_sf(10, 0.5, 2.5), "tau must be an integer"),
        (lambda: log_binomial_sf(10, 0.5, 2.0), "tau must be an integer"),
        (lambda: log_binomial_sf(10, 0.5, True), "tau must be an integer"),
        (lambda: binomial_sf(10, 2.0, 1), r"p must be in \[0, 1\]"),
        (lambda: kl_bernoulli(1.2, 0.5), r"a must be in \[0, 1\]"),
        (lambda: kl_bernoulli(0.5, -1.0), r"p must be in \[0, 1\]"),
        (lambda: log_chernoff_bound(-3, 0.5, 1), "n must be >= 0"),
        (lambda: chernoff_bound(10, 0.5, "3"), "tau must be an integer"),
        (lambda: log_poisson_binomial_sf([], 1), "empty"),
        (lambda: log_poisson_binomial_sf([0.5, 1.1], 1), r"ps\[1\] = 1.1"),
        (lambda: log_poisson_binomial_sf([0.5, math.nan], 1), r"ps\[1\]"),
        (lambda: log_poisson_binomial_sf([[0.5, 0.5]], 1), "one-dimensional"),
        (lambda: log_poisson_binomial_sf(["a"], 1), "one-dimensional sequence"),
        (lambda: log_poisson_binomial_sf([0.5], 0.5), "tau must be an integer"),
        (lambda: poisson_binomial_sf([0.5], None), "tau must be an integer"),
        (lambda: log_poisson_binomial_chernoff_bound([], 1), "empty"),
        (lambda: poisson_binomial_chernoff_bound([-0.5], 1), r"ps\[0\]"),
    ],
)
def test_invalid_arguments_raise_value_error(call, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        call()
