"""How much a shown score reveals about hidden labels, and two ways to coarsen it: a fixed grid and bins.

Two mechanisms, for two guarantees (docs/leaderboard.md defends both):

- ``grid_cell`` (the default): the score is shown as its cell of a fixed grid of at most 2^bits cells on
  the metric's own scale, fixed by the metric and ``bits`` before any label is read. A showing is then one
  of at most 2^bits values, so on average (over the labels, whatever the attacker believes) it reveals at
  most ``bits`` bits, and the Ladder's bound on adaptive overfitting holds. Single outcomes may reveal
  more: ``grid_information`` counts them exactly. Cross entropy gets cells 1/200 of [0, 1] wide for 8 bits
  (0.005) and geometric cells above 1; bounded metrics equal cells on [0, 1].
- ``partition``/``disclose`` (worst case, "bins"), below.
- ``refined`` ("refined", the leaderboard's default): the grid at ``bits - 1`` narrowed by the
  answer-weighted bins at ``bits - 1``: two partitions of one line into at most 2^(bits-1) intervals each
  have at most 2^bits - 1 intervals in common, so the showing is still one of fewer than 2^bits values fixed
  before any label is read, never wider than the grid's cell (0.01 of cross entropy up to 1 at 8 bits),
  and as narrow as the belief bins where a detector's answers expect its score.
- ``partition(..., believed_by_answers=True)`` ("belief"): the same bins, each label vector weighted by the
  probability the detector's own answers give it (model i trojaned with probability p_i, independently),
  each bin holding at least 2^-bits of that probability. A team that believes its answers then learns at
  most ``bits`` bits from any outcome; a probe answering about 0.5 believes every vector equally and gets
  the counting bins above; a confident detector's bins are narrow where its answers expect its score.

A detector's score on sequestered models is a function of its own answers ``p`` (which its team knows) and
the hidden labels ``y``. Shown exactly, one cross entropy can single out ``y`` among all 2^n label vectors:
a probe whose answers make every label vector score differently reads the whole answer key from one number.
The measure used here is the attacker's own: given ``p``, how many label vectors agree with what is shown.
Showing something consistent with at least 2^(n - bits) of them reveals at most ``bits`` bits.

The mechanism: sort all 2^n label vectors by the score they would give ``p`` and cut that order into
consecutive bins of at least 2^(n - bits) vectors each (about 2^bits bins). The cut depends on ``p`` alone,
never on ``y``; what is shown is ``y``'s bin: an interval that holds the true score, the bin's place, and
the share of random label vectors that would score as well or better (a permutation-test p-value rounded up
to its bin). Every outcome, not just the average one, then leaves at least 2^(n - bits) label vectors
possible, whatever ``p`` the attacker picked.

The scores are additive over models (cross entropy with NIST's clipping, Brier), so the distribution over all
2^n vectors is a subset-sum count. To count exactly in linear time, each model's two possible losses are
floored to a lattice of ``unit`` (at most ``MAX_LATTICE`` steps in all): the bins partition the lattice sum
exactly, and the true score lies within ``unit`` above the lattice value, which the interval includes.
Counts are float64: exact below 2^53 label vectors, relative error ~1e-15 above, against which a 1e-12
margin guards the minimum.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

EPSILON = 1e-12  # NIST's clipping of probabilities in the log score (assay.stats.detection)
MAX_LATTICE = 2**22  # lattice points over the whole score range: about 32 MiB of counts at most
ADDITIVE = ("cross_entropy", "brier")  # scores that are a mean of per-model losses
_MARGIN = 1.0 + 1e-12


CE_MAX = -math.log(EPSILON)  # the largest cross entropy NIST's clipping allows (27.63)
FINE_SHARE = 200 / 256  # of the grid's cells, the share that covers cross entropy 0..1 evenly
MAX_CELLS = 2**24  # a grid finer than this shows nothing an organiser could use, and costs memory
BOUNDED = ("brier", "roc_auc", "ece", "tpr_at_5_fpr")  # metrics on [0, 1]: an even grid


def grid_edges(metric: str, bits: float) -> np.ndarray:
    """The cell edges of the grid for ``metric`` at ``bits``: at most 2^bits cells, fixed before any label.

    Cross entropy: ``round(2^bits * 200/256)`` equal cells on [0, 1] (0.005 wide at 8 bits), the rest
    geometric from 1 to ``CE_MAX``; bounded metrics: equal cells on [0, 1].
    """
    cells = int(min(MAX_CELLS, max(2.0, math.floor(2.0**bits))))
    if metric in BOUNDED:
        return np.linspace(0.0, 1.0, cells + 1)
    if metric != "cross_entropy":
        raise ValueError(f"no grid for {metric!r}: cross_entropy or one of {', '.join(BOUNDED)}")
    fine = min(cells - 1, max(1, round(cells * FINE_SHARE)))
    coarse = np.geomspace(1.0, CE_MAX, cells - fine + 1)
    return np.concatenate((np.linspace(0.0, 1.0, fine + 1), coarse[1:]))


@dataclass(frozen=True)
class Cell:
    """One grid cell: the score lies in [low, high]; ``cell`` counts from the lowest score (1-based)."""

    low: float
    high: float
    cell: int
    cells: int


def grid_cell(value: float, edges: np.ndarray) -> Cell:
    """The cell of ``edges`` holding ``value`` (a value on an edge belongs to the cell above it)."""
    index = int(np.clip(np.searchsorted(edges, value, side="right") - 1, 0, len(edges) - 2))
    return Cell(float(edges[index]), float(edges[index + 1]), index + 1, len(edges) - 1)


@dataclass(frozen=True)
class GridInformation:
    """What the grid reveals about uniformly random labels, given a detector's answers (exact enumeration)."""

    mean_bits: float  # the entropy of the shown cell: <= log2(cells) <= bits
    bits: np.ndarray  # per label vector, n - log2(vectors showing the same cell)


def grid_information(
    predictions: np.ndarray, metric: str, bits: float, max_models: int = 22
) -> GridInformation:
    """Enumerate all 2^n label vectors (n <= ``max_models``) and count, for each, the vectors in its cell.

    An additive metric only; exact (no lattice). The test suite and the docs' figures use it.
    """
    zero, one = loss_pair(predictions, metric)
    n = len(zero)
    if n > max_models:
        raise ValueError(f"{n} models: enumerating 2^{n} label vectors is too much (at most {max_models})")
    labels = (np.arange(2**n)[:, None] >> np.arange(n)[None, :]) & 1
    scores = (zero.sum() + labels @ (one - zero)) / n
    edges = grid_edges(metric, bits)
    cells = np.clip(np.searchsorted(edges, scores, side="right") - 1, 0, len(edges) - 2)
    counts = np.bincount(cells, minlength=len(edges) - 1)
    per_vector = n - np.log2(counts[cells])
    return GridInformation(mean_bits=float(per_vector.mean()), bits=per_vector)


def loss_pair(predictions: np.ndarray, metric: str) -> tuple[np.ndarray, np.ndarray]:
    """Each model's loss if its label is 0 and if it is 1, as ``assay.stats.detection`` scores them."""
    p = np.asarray(predictions, dtype=np.float64)
    if p.ndim != 1 or len(p) == 0 or not (np.isfinite(p).all() and (p >= 0).all() and (p <= 1).all()):
        raise ValueError("predictions must be a non-empty 1-D array of probabilities in [0, 1]")
    if metric == "cross_entropy":
        clipped = np.clip(p, EPSILON, 1.0 - EPSILON)
        return -np.log1p(-clipped), -np.log(clipped)
    if metric == "brier":
        return p**2, (1.0 - p) ** 2
    raise ValueError(f"no disclosure for {metric!r}: only additive scores ({', '.join(ADDITIVE)})")


@dataclass(frozen=True)
class Shown:
    """What may be shown of one score: every field is a function of the bin, so none adds information."""

    low: float  # the true score lies in [low, high]
    high: float
    bin: int  # 1 = the best-scoring bin
    bins: int
    share: float  # share of all label vectors scoring in this bin or better (lower); believed: probability
    vectors: float  # label vectors consistent with what is shown (believed: their probability)
    bits: float  # n - log2(vectors): what this showing reveals (believed: -log2 of the bin's probability)


@dataclass(frozen=True)
class Partition:
    """The bins of one detector's answers, built from ``p`` alone; then asked which bin a labelling is in."""

    n: int
    unit: float
    base: int  # lattice sum when every model takes its smaller loss
    steps: np.ndarray  # per model, lattice steps added when it takes its larger loss
    larger: np.ndarray  # per model, the label (0/1) that gives the larger loss
    ends: np.ndarray  # lattice offset (inclusive) where each bin ends, increasing
    starts: np.ndarray  # first occupied lattice offset of each bin
    last: np.ndarray  # last occupied lattice offset of each bin
    counts: np.ndarray  # label vectors in each bin (their believed probability, when ``believed``)
    total: float  # 2^n (1, when ``believed``)
    believed: bool = False  # bins of the answers' own probability rather than of counts
    occupied: np.ndarray | None = None  # lattice offsets some label vector reaches

    def offsets(self, labels: np.ndarray) -> np.ndarray:
        """Lattice offsets of label vectors (rows of ``labels``, or one vector)."""
        y = np.asarray(labels, dtype=np.int64)
        return (y == self.larger).astype(np.int64) @ self.steps

    def bin_of(self, labels: np.ndarray) -> np.ndarray:
        """0-based bin index of each label vector."""
        return np.searchsorted(self.ends, self.offsets(labels), side="left")

    def shown(self, labels: np.ndarray) -> Shown:
        """What is shown for the true labels ``labels``."""
        k = int(self.bin_of(labels))
        vectors = float(self.counts[k])
        bits = -math.log2(vectors) if self.believed else self.n - math.log2(vectors)
        return Shown(
            low=(self.base + int(self.starts[k])) * self.unit / self.n,
            high=(self.base + int(self.last[k])) * self.unit / self.n + self.unit,
            bin=k + 1,
            bins=len(self.ends),
            share=float(self.counts[: k + 1].sum()) / self.total,
            vectors=vectors,
            bits=bits,
        )


def _lattice(zero: np.ndarray, one: np.ndarray) -> tuple[float, int, np.ndarray, np.ndarray]:
    """The unit, the base sum, each model's extra steps and which label is the larger loss."""
    small, large = np.minimum(zero, one), np.maximum(zero, one)
    unit = max(float(large.sum()) / MAX_LATTICE, 1e-12)
    floor_small, floor_large = np.floor(small / unit), np.floor(large / unit)
    return (
        unit,
        int(floor_small.sum()),
        (floor_large - floor_small).astype(np.int64),
        (one > zero).astype(int),
    )


def subset_sum_counts(steps: np.ndarray, chances: np.ndarray | None = None) -> np.ndarray:
    """``counts[s]``: how many of the 2^n choices (take ``steps[i]`` or not) sum to ``s``.

    With ``chances`` (the probability of taking each step, independently): the probability that the sum
    is ``s`` instead of a count.
    """
    counts = np.zeros(int(steps.sum()) + 1)
    counts[0] = 1.0
    top = 0
    for i, step in enumerate(int(s) for s in steps):
        if chances is None:
            if step:
                counts[step : step + top + 1] += counts[: top + 1].copy()
            else:
                counts[: top + 1] *= 2.0
        elif step:
            taken = float(chances[i])
            moved = counts[: top + 1] * taken
            counts[: top + 1] *= 1.0 - taken
            counts[step : step + top + 1] += moved
        top += step
    return counts


def _cut(counts: np.ndarray, weights: np.ndarray, minimum: float, exact: bool) -> np.ndarray:
    """Inclusive end offsets of consecutive bins of at least ``minimum`` weight (the last one merged).

    ``counts`` says which lattice points hold a label vector (a believed probability may underflow to 0
    where a vector still lies); ``weights`` are what each bin must gather (counts or probabilities);
    ``exact``: the weights are integers below 2^53, so no margin is needed.
    """
    occupied = np.flatnonzero(counts)
    running = np.cumsum(weights[occupied])
    total = running[-1]
    if minimum <= 0.0 or (exact and minimum <= 1.0):
        return occupied
    ends: list[int] = []
    taken = 0.0
    need = minimum if exact else minimum * _MARGIN
    while total - taken >= need:
        i = int(np.searchsorted(running, taken + need, side="left"))
        if i >= len(running):
            break
        ends.append(int(occupied[i]))
        taken = float(running[i])
    if not ends:
        return occupied[-1:]
    if taken < total:  # a remainder smaller than a bin joins the last bin
        ends[-1] = int(occupied[-1])
    return np.array(ends, dtype=np.int64)


def believed(predictions: np.ndarray, larger: np.ndarray) -> np.ndarray:
    """Per model, the probability the answers give to its larger loss (clipped as the log score clips)."""
    p = np.clip(np.asarray(predictions, dtype=np.float64), EPSILON, 1.0 - EPSILON)
    return np.where(larger == 1, p, 1.0 - p)


def partition(
    predictions: np.ndarray, metric: str, bits: float, believed_by_answers: bool = False
) -> Partition:
    """Bins of the 2^n label vectors by the score ``predictions`` would get, each of >= 2^(n - bits).

    ``believed_by_answers``: each bin holds at least 2^-bits of the probability the answers themselves give
    the label vectors (models independent, model i trojaned with probability p_i), and ``counts``, ``total``
    and what ``shown`` reports as ``share`` are that probability (total 1) instead of counts.
    """
    zero, one = loss_pair(predictions, metric)
    n = len(zero)
    unit, base, steps, larger = _lattice(zero, one)
    counts = subset_sum_counts(steps)
    if believed_by_answers:
        weights = subset_sum_counts(steps, believed(predictions, larger))
        ends = _cut(counts, weights, 2.0**-bits, exact=False)
    else:
        weights = counts
        ends = _cut(counts, counts, 2.0 ** (n - bits), exact=float(counts.sum()) < 2.0**53)
    occupied = np.flatnonzero(counts)
    first = np.searchsorted(occupied, np.concatenate(([0], ends[:-1] + 1)), side="left")
    per_bin = np.add.reduceat(weights[occupied], first)
    last = occupied[np.searchsorted(occupied, ends, side="right") - 1]
    return Partition(
        n=n,
        unit=unit,
        base=base,
        steps=steps,
        larger=larger,
        ends=ends,
        starts=occupied[first],
        last=last,
        counts=per_bin,
        total=float(weights.sum()),
        believed=believed_by_answers,
        occupied=occupied,
    )


def disclose(
    predictions: np.ndarray,
    labels: np.ndarray,
    metric: str,
    bits: float,
    believed_by_answers: bool = False,
) -> Shown:
    """What may be shown of ``metric`` for ``predictions`` against ``labels`` at a budget of ``bits``."""
    return partition(predictions, metric, bits, believed_by_answers).shown(np.asarray(labels))


@dataclass(frozen=True)
class Refined:
    """A grid cell narrowed by an answer-weighted bin: the score lies in [low, high]."""

    low: float
    high: float
    cell: Cell  # the grid's cell at bits - 1
    bin: int  # the answer-weighted bin at bits - 1 (1 = the best-scoring)
    bins: int
    showings: int  # how many (cell, bin) pairs these answers can show: at most 2^bits - 1


def refined(predictions: np.ndarray, labels: np.ndarray, metric: str, bits: float) -> Refined:
    """The grid cell at ``bits - 1`` intersected with the answer-weighted bin at ``bits - 1``.

    Both are taken of the lattice score (the one the bins are cut on), so both are monotone in one number
    and their common refinement has at most ``cells + bins - 1`` members; the true score lies within one
    lattice unit above it, which the upper end allows.
    """
    half = bits - 1.0
    table = partition(predictions, metric, half, believed_by_answers=True)
    offset = int(table.offsets(np.asarray(labels)))
    lattice = (table.base + offset) * table.unit / table.n
    edges = grid_edges(metric, half)
    cell = grid_cell(lattice, edges)
    shown = table.shown(labels)
    return Refined(
        low=max(cell.low, shown.low),
        high=min(cell.high + table.unit, shown.high),
        cell=cell,
        bin=shown.bin,
        bins=shown.bins,
        showings=_showings(table, edges),
    )


def _showings(table: Partition, edges: np.ndarray) -> int:
    """Distinct (cell, bin) pairs over every occupied lattice point: what these answers can show at all."""
    offsets = table.occupied
    assert offsets is not None  # ``partition`` records them
    scores = (table.base + offsets) * table.unit / table.n
    cells = np.clip(np.searchsorted(edges, scores, side="right") - 1, 0, len(edges) - 2)
    bins = np.searchsorted(table.ends, offsets, side="left")
    return len(np.unique(cells.astype(np.int64) * (len(table.ends) + 1) + bins))
