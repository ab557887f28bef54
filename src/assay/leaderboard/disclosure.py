"""What a test score may say while its round is open: the disclosure budget, in one place.

The test split's labels are sealed, yet a team learns from every number it is shown about its test
submission. Given its own answers, an exact cross entropy, Brier score, ROC-AUC, confidence interval, ECE or
count of positives can single out the label vector (issue 25: 16 of 16 bits from one submission). So while a
round is open, a test submission's scores are shown to everyone but the organisers only as its *disclosed*
score (``assay.stats.disclosure``): the bin of the round's metric among the label vectors ranked for this
detector's answers, at most ``leak_bits`` bits (round setting, default 8). Those numbers are computed once,
when the job is scored, and stored beside the exact metrics under the ``shown_`` prefix; every face reads
them through ``public_metrics``, and public standings rank by them, so the ranking adds nothing either.

Metrics that are not a sum over models (ROC-AUC, ECE, TPR at 5% FPR) cannot be binned this way: a round
ranked by one of them shows no test score at all until it closes. Holdout results (published at the close)
and everything after the close are unrestricted; organisers always see everything.
"""

from __future__ import annotations

import numpy as np

from assay.stats.disclosure import ADDITIVE, disclose
from assay.store.enums import RoundStatus
from assay.store.models import Round

PREFIX = "shown_"
SEALED_STATUSES = (RoundStatus.DRAFT, RoundStatus.OPEN)


def is_sealed(round_: Round, split: str) -> bool:
    """Whether non-organisers see only the disclosed score of this split's submissions."""
    return split == "test" and round_.status in SEALED_STATUSES


def disclosed_metrics(
    predictions: dict[str, float], truth: dict[str, int], metric: str, bits: float
) -> dict[str, float]:
    """The ``shown_`` numbers of one scored test job (empty when ``metric`` cannot be binned).

    ``predictions`` are the values scored, missing models already filled in as the scorer fills them.
    """
    if metric not in ADDITIVE or not truth:
        return {}
    models = sorted(truth)
    shown = disclose(
        np.array([predictions[m] for m in models]), np.array([truth[m] for m in models]), metric, bits
    )
    return {
        f"{PREFIX}low": shown.low,
        f"{PREFIX}high": shown.high,
        f"{PREFIX}bin": float(shown.bin),
        f"{PREFIX}bins": float(shown.bins),
        f"{PREFIX}share": shown.share,
        f"{PREFIX}bits": shown.bits,
    }


def public_metrics(metrics: dict[str, float | None], sealed: bool) -> dict[str, float | None]:
    """What a non-organiser sees of a job's overall metrics: the disclosed ones alone while sealed."""
    if not sealed:
        return {name: value for name, value in metrics.items() if not name.startswith(PREFIX)}
    return {name: value for name, value in metrics.items() if name.startswith(PREFIX)}


def public_rank_key(metrics: dict[str, float | None]) -> tuple[float, float]:
    """Order of sealed rows: the smaller share of label vectors scoring as well first, then the bound."""
    share, high = metrics.get(f"{PREFIX}share"), metrics.get(f"{PREFIX}high")
    return (share if share is not None else 2.0, high if high is not None else float("inf"))
