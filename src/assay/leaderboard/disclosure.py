"""What a test score may say while its round is open: the disclosure rule, in one place.

The test split's labels are sealed, yet a team learns from every number it is shown about its test
submission: given its own answers, an exact cross entropy can single out the label vector (issue 25: 16 of
16 bits from one submission). So while a round is open, everyone but the organisers sees a test submission's
score only in the form the round chose (``Round.disclosure``, in the audit trail):

- ``refined`` (default): the grid's cell at b - 1 bits narrowed by the answer-weighted bin at b - 1 bits
  (``assay.stats.disclosure.refined``): fewer than 2^b showings fixed before the labels are read (at most b
  bits on average), never wider than the grid's cell (0.01 of cross entropy up to 1 at 8 bits), and as
  narrow as the belief bins where a detector's answers expect its score; additive metrics (others: ``grid``).
- ``grid``: the cell of a fixed grid of at most 2^``leak_bits`` cells on the metric's scale
  (``assay.stats.disclosure.grid_edges``: 0.005 wide on cross entropy up to 1 at 8 bits). The grid is fixed
  by the round before any label is read, so a showing is one of at most 2^b values: at most b bits on
  average whatever the attacker believes. Any ranking metric can be shown this way.
- ``bins``: the worst-case bins of label vectors (every outcome leaves >= 2^(n - b) of them); additive
  metrics only, others withheld until the close. Intervals are wide exactly where good detectors compete.
- ``belief``: the same bins with each label vector weighted by the probability the detector's own answers
  give it (each bin >= 2^-b of it): a team that believes its answers learns at most b bits from any
  outcome, a probe answering about 0.5 gets ``bins``, and a confident detector is shown narrowly where its
  answers expect its score (widely if they were wrong). Additive metrics only.
- ``exact``: NIST's board: the test scores as they are (the round accepts the risk).

Those numbers are computed once, when the job is scored, and stored beside the exact metrics under the
``shown_`` prefix; every face reads them through ``public_metrics``, and public standings rank by the shown
interval (``better``), rows whose intervals overlap being ties. Per-model facts of a sealed split (models
done, run times, order) are hidden in every mode while the labels are secret (``labels_secret``).
Holdout results (published at the close) and everything after the close are unrestricted; organisers always
see everything.
"""

from __future__ import annotations

import math

import numpy as np

from assay.stats.disclosure import ADDITIVE, BOUNDED, disclose, grid_cell, grid_edges, refined
from assay.store.enums import RoundStatus
from assay.store.models import Round

PREFIX = "shown_"
SEALED_STATUSES = (RoundStatus.DRAFT, RoundStatus.OPEN)
MODES = ("refined", "grid", "belief", "bins", "exact")
DEFAULT_MODE = "refined"
GRID_METRICS = ("cross_entropy", *BOUNDED)


def labels_secret(round_: Round, split: str) -> bool:
    """Whether the split's labels are still secret: the test split of a round not yet closed."""
    return split == "test" and round_.status in SEALED_STATUSES


def is_sealed(round_: Round, split: str) -> bool:
    """Whether non-organisers see only the disclosed score of this split's submissions."""
    return labels_secret(round_, split) and round_.disclosure != "exact"


def disclosed_metrics(
    predictions: dict[str, float],
    truth: dict[str, int],
    metric: str,
    bits: float,
    mode: str = DEFAULT_MODE,
    value: float | None = None,
) -> dict[str, float]:
    """The ``shown_`` numbers of one scored test job (empty when the mode cannot show ``metric``).

    ``predictions`` are the values scored, missing models already filled in as the scorer fills them;
    ``value`` is the exact score of ``metric`` (the grid shows its cell).
    """
    if mode == "refined" and metric in ADDITIVE and truth:
        models = sorted(truth)
        shown = refined(
            np.array([predictions[m] for m in models]), np.array([truth[m] for m in models]), metric, bits
        )
        return {
            f"{PREFIX}low": shown.low,
            f"{PREFIX}high": shown.high,
            f"{PREFIX}cells": float(shown.cell.cells),
            f"{PREFIX}showings": float(shown.showings),
        }
    if mode in ("grid", "refined"):  # refined shows a non-additive metric on the grid alone
        if metric not in GRID_METRICS or value is None or not math.isfinite(value):
            return {}
        cell = grid_cell(value, grid_edges(metric, bits))
        return {
            f"{PREFIX}low": cell.low,
            f"{PREFIX}high": cell.high,
            f"{PREFIX}cell": float(cell.cell),
            f"{PREFIX}cells": float(cell.cells),
        }
    if mode not in ("bins", "belief") or metric not in ADDITIVE or not truth:
        return {}
    models = sorted(truth)
    shown = disclose(
        np.array([predictions[m] for m in models]),
        np.array([truth[m] for m in models]),
        metric,
        bits,
        believed_by_answers=mode == "belief",
    )
    return {
        f"{PREFIX}low": shown.low,
        f"{PREFIX}high": shown.high,
        f"{PREFIX}bin": float(shown.bin),
        f"{PREFIX}bins": float(shown.bins),
        f"{PREFIX}share": shown.share,
        f"{PREFIX}{'belief_bits' if mode == 'belief' else 'bits'}": shown.bits,
    }


def public_metrics(metrics: dict[str, float | None], sealed: bool) -> dict[str, float | None]:
    """A standings row's overall metrics: the disclosed ones alone while sealed, else the exact ones alone
    (the organiser's rows too), so a row carries one kind of score."""
    if not sealed:
        return {name: value for name, value in metrics.items() if not name.startswith(PREFIX)}
    return {name: value for name, value in metrics.items() if name.startswith(PREFIX)}


Interval = tuple[float, float]


def interval(metrics: dict[str, float | None], metric: str, sealed: bool) -> Interval | None:
    """Where a row's score lies as its viewer is shown it: the disclosed interval, or the exact value."""
    if sealed:
        low, high = metrics.get(f"{PREFIX}low"), metrics.get(f"{PREFIX}high")
        return None if low is None or high is None else (low, high)
    value = metrics.get(metric)
    return None if value is None else (value, value)


def better(a: Interval | None, b: Interval | None, lower: bool) -> bool:
    """Whether ``a`` lies wholly better than ``b`` (``lower``: lower is better); a missing score is worst.

    Grid cells are half-open, so adjacent cells are ordered; equal intervals, and intervals that overlap,
    are neither better nor worse: a tie.
    """
    if a is None:
        return False
    if b is None:
        return True
    if a == b:
        return False
    return a[1] <= b[0] if lower else a[0] >= b[1]


def reveals_all(models: int, bits: float, mode: str) -> bool:
    """Whether the budget covers every label vector of a split of ``models`` (2^n <= 2^bits)."""
    return mode != "exact" and models <= bits


def small_split_warning(models: int, bits: float, mode: str) -> str | None:
    """The organiser's warning for a test split the budget reveals whole; None when it does not."""
    if not reveals_all(models, bits, mode):
        return None
    return (
        f"warning: the test split has {models} models and the disclosure budget is {bits:g} bits: a probe "
        f"could learn every test label (2^{models} label vectors); use a larger test split or --leak-bits "
        f"below {models}"
    )


METRIC_WORDS = {
    "cross_entropy": "CE",
    "roc_auc": "ROC-AUC",
    "brier": "Brier score",
    "ece": "ECE",
    "tpr_at_5_fpr": "TPR at 5% FPR",
}


def bound_decimals(width: float, least: int = 3) -> int:
    """The decimals an interval ``width`` wide needs for its two ends to print apart (``least`` at least,
    8 at most): down to the width's first significant digit, where ends a width apart round to different
    numbers, so "0.6931 / 0.6931" never shows for ends 7e-7 apart (issue 47)."""
    if width <= 0:
        return max(least, 4)
    return min(max(least, math.ceil(-math.log10(width) - 1e-9)), 8)


COUNT_METRICS = (
    "n",
    "positives",
    *(f"{PREFIX}{name}" for name in ("cell", "cells", "bin", "bins", "showings")),
)


def metric_digits(metrics: dict[str, float | None]) -> dict[str, int]:
    """The decimals each of a job's metrics prints with, the one rule every face follows: counts (models,
    cells, showings) as integers, a disclosed interval's ends with the digits that tell them apart, every
    other score with 4."""
    low, high = metrics.get(f"{PREFIX}low"), metrics.get(f"{PREFIX}high")
    ends = 4 if low is None or high is None else bound_decimals(high - low, least=4)
    digits = dict.fromkeys(metrics, 4)
    digits |= {name: 0 for name in COUNT_METRICS if name in metrics}
    digits |= {name: ends for name in (f"{PREFIX}low", f"{PREFIX}high") if name in metrics}
    return digits


def _number(value: float, width: float) -> str:
    """A bound printed to the decimals its cell's width needs (three at least)."""
    return f"{value:.{bound_decimals(width)}f}"


def in_words(shown: Interval | None, metric: str, rank: int, total: int, tied_with: list[str]) -> str:
    """A sealed row in plain words, the same on every face: "test CE between 0.215 and 0.220; rank 2 of 9
    (tied with team-x); exact score when the round closes"."""
    name = METRIC_WORDS.get(metric, metric)
    if shown is None:
        return f"test {name} not shown until the round closes"
    low, high = shown
    width = high - low
    where = (
        f"{_number(low, width)}"
        if width <= 0
        else f"between {_number(low, width)} and {_number(high, width)}"
    )
    ties = f" (tied with {', '.join(tied_with)})" if tied_with else ""
    return f"test {name} {where}; rank {rank} of {total}{ties}; exact score when the round closes"


def sealed_note(metrics: dict[str, float | None]) -> str:
    """What the shown interval guarantees, in words, for the submission page."""
    cells, bits = metrics.get(f"{PREFIX}cells"), metrics.get(f"{PREFIX}bits")
    showings = metrics.get(f"{PREFIX}showings")
    if cells is not None and showings is not None:
        return (
            f"a cell of the round's grid of {int(cells)}, narrowed to the scores your own answers make "
            f"likely; one of {int(showings)} showings your answers allow, fixed before the labels were "
            f"read: at most {math.log2(2 * cells):.0f} bits about the test labels on average"
        )
    if cells is not None:
        return (
            f"one of {int(cells)} cells of the round's grid, fixed before the labels were read: at most "
            f"{math.log2(cells):.0f} bits about the test labels on average"
        )
    if bits is not None:
        return (
            f"the bin of label vectors that score like yours: at most {bits:.2f} bits about the test labels"
        )
    believed = metrics.get(f"{PREFIX}belief_bits")
    if believed is not None:
        return (
            f"the bin of label vectors that score like yours, weighted by your own answers: {believed:.2f} "
            f"bits about the test labels to a team that believes its answers"
        )
    return "not shown for this metric until the round closes"
