"""Inter-annotator reliability of a STAR campaign's primary ratings.

Krippendorff's alpha wants a coders x units table. STAR annotators are drawn per dialogue, so "coder" here
is the annotation's *position* within its dialogue (first, second, ...), not the person: alpha only needs to
know which values were paired within a unit, and position-coding keeps the table dense (2 rows for the usual 2
annotators per dialogue) instead of one mostly-empty row per annotator in the pool.

Below ``MIN_ALPHA_DIALOGUES`` pairable dialogues alpha is not estimated at all: the estimate says "too few
dialogues (n = 2, needs >= 10)" instead of a number. The campaign's read model (``assay.star.status``: the
dashboard, its API, ``assay star status --json``) and the report both take alpha from here, so neither
shows a number below the minimum, and the pages show the line instead.
Why 10: it is where the 95% percentile bootstrap interval stops being plainly broken. With two ratings per
dialogue and a true alpha of .36 to .51 (STAR's paper reports about .5), it covers the true alpha in at
most 20% of samples at 2 dialogues, at most 57% at 3, 61-86% at 5, and 90-92% at 10 (92-94% at 20);
intervals of no width (one resampled value, "-0.500 to -0.500") fall from a third of samples at 2
dialogues to 0.5-6.5% at 10. It is a floor, not a promise: near the top of the scale (alpha .72) the
percentile interval covers only 78-81% at 10 dialogues and 92-93% at 40.
``benchmarks/bench_star_alpha_min_n.py`` prints the tables (docs/star-analysis.md). Krippendorff's (2011)
binary worked example, 10 units, still computes here.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from pydantic import BaseModel, ConfigDict

from assay.star.spec import CampaignSpec
from assay.stats.agreement import Level, bootstrap_alpha_ci, krippendorff_alpha, percent_agreement
from assay.store.enums import TaskKind

ALPHA_TEST = "Krippendorff's alpha, percentile bootstrap over dialogues"
NO_INTERVAL = "no interval: bootstrap replicates set to 0"
MIN_ALPHA_DIALOGUES = 10  # fewest pairable dialogues alpha is estimated from (see the module docstring)


def too_few(n_units: int, needs: int = MIN_ALPHA_DIALOGUES) -> str:
    """What every face says instead of alpha below its minimum."""
    return f"too few dialogues (n = {n_units}, needs >= {needs})"


class AlphaEstimate(BaseModel):
    """Alpha, its interval and the sample behind it; ``reason`` says why alpha (None when undefined) or its
    interval (None when no bootstrap was asked for) is missing."""

    model_config = ConfigDict(frozen=True)
    level: str
    alpha: float | None
    low: float | None
    high: float | None
    n_units: int
    n_ratings: int
    n_boot: int
    confidence: float
    test: str = ALPHA_TEST
    reason: str = ""


class Agreement(BaseModel):
    """Pooled pairwise percent agreement; None with ``reason`` when no dialogue has two ratings."""

    model_config = ConfigDict(frozen=True)
    scale: str
    agreement: float | None
    n_units: int
    test: str = "pairwise percent agreement (pooled over coder pairs)"
    reason: str = ""


class Arbitration(BaseModel):
    """How often dialogues go to arbitration and whom the arbitrator sided with.

    ``rate`` is ``n_sent / n_complete``: a dialogue counts from the moment its ratings send it
    (``CampaignSpec.needs_arbitration``), decided (``n_arbitrated``) or still waiting (``n_waiting``), so the
    rate does not read 0% while the only dialogue waits for its arbitrator.

    ``more_broken``: the arbitrator's rating equals the lowest (most broken) primary rating; ``less_broken``:
    equals the highest; ``neither``: strictly in between, outside the primary range, or the primaries agreed.
    """

    model_config = ConfigDict(frozen=True)
    n_complete: int
    n_sent: int
    n_arbitrated: int
    n_waiting: int
    rate: float | None
    more_broken: int
    less_broken: int
    neither: int
    test: str = "share of fully rated dialogues sent to arbitration (decided or waiting)"


class ReliabilityReport(BaseModel):
    """Everything in section 1 of the analysis."""

    model_config = ConfigDict(frozen=True)
    ordinal: AlphaEstimate
    nominal: AlphaEstimate
    by_area: dict[str, dict[str, AlphaEstimate]]
    percent_agreement: list[Agreement]
    arbitration: Arbitration


def primary_annotations(annotations: pd.DataFrame) -> pd.DataFrame:
    """The ratings reliability is about: first-round annotations, not arbitration nor the ablation."""
    ablation = annotations["ablation"].eq(True)  # None/NaN (imports without the column's value) is primary
    return annotations[(annotations["kind"] == TaskKind.ANNOTATE) & ~ablation]


def _ordered(annotations: pd.DataFrame) -> pd.DataFrame:
    """Rows in a stable order so 'first' and 'second' coder mean the same thing on every run."""
    keys = [k for k in ("dialogue_id", "created_at", "annotation_id") if k in annotations.columns]
    return annotations.sort_values(keys, kind="stable")


def reliability_matrix(annotations: pd.DataFrame, column: str = "rating") -> np.ndarray:
    """Coders x units float array (NaN where a dialogue has fewer ratings); coder = position in dialogue."""
    rows = _ordered(annotations)
    if rows.empty:
        return np.empty((0, 0))
    coder = rows.groupby("dialogue_id", sort=False).cumcount()
    table = pd.DataFrame({"coder": coder.to_numpy(), "unit": rows["dialogue_id"].to_numpy()})
    table["value"] = rows[column].astype(float).to_numpy()
    wide = table.pivot(index="coder", columns="unit", values="value")
    return wide.to_numpy(dtype=float)


def _binary(annotations: pd.DataFrame, spec: CampaignSpec) -> pd.DataFrame:
    """Add ``broken01`` from the rating via the spec, so nominal alpha cannot disagree with the threshold."""
    out = annotations.copy()
    out["broken01"] = [float(spec.is_broken(int(r))) for r in out["rating"]]
    return out


def alpha_estimate(
    data: np.ndarray, level: Level, n_boot: int = 1000, confidence: float = 0.95, seed: int = 0
) -> AlphaEstimate:
    """Alpha and its bootstrap interval; undefined cases (1 coder, one value) and samples under
    ``MIN_ALPHA_DIALOGUES`` pairable dialogues become a reason, not an error or a number, because a per-area
    breakdown routinely has areas too small or too unanimous for alpha."""
    n_units = int((np.sum(~np.isnan(data), axis=0) >= 2).sum()) if data.size else 0
    n_ratings = int(np.sum(~np.isnan(data))) if data.size else 0
    base = dict(level=level, n_units=n_units, n_ratings=n_ratings, confidence=confidence)
    if n_units < MIN_ALPHA_DIALOGUES:
        return AlphaEstimate(alpha=None, low=None, high=None, n_boot=0, reason=too_few(n_units), **base)
    try:
        if n_boot == 0:  # asked for no interval: the point estimate still stands on its own
            alpha = krippendorff_alpha(data, level)
            if not math.isfinite(alpha):
                raise ValueError("alpha is undefined for these ratings")
            return AlphaEstimate(alpha=alpha, low=None, high=None, n_boot=0, reason=NO_INTERVAL, **base)
        est = bootstrap_alpha_ci(data, level, n_boot=n_boot, confidence=confidence, seed=seed)
    except ValueError as exc:
        return AlphaEstimate(alpha=None, low=None, high=None, n_boot=0, reason=str(exc), **base)
    alpha = est.alpha if np.isfinite(est.alpha) else None
    return AlphaEstimate(alpha=alpha, low=est.low, high=est.high, n_boot=est.n_boot, **base)


def _agreement(data: np.ndarray, scale: str) -> Agreement:
    """Percent agreement next to alpha: the raw number readers expect, which alpha then chance-corrects."""
    n_units = int((np.sum(~np.isnan(data), axis=0) >= 2).sum()) if data.size else 0
    try:
        return Agreement(scale=scale, agreement=percent_agreement(data), n_units=n_units)
    except ValueError as exc:
        return Agreement(scale=scale, agreement=None, n_units=n_units, reason=str(exc))


def _alphas(rows: pd.DataFrame, n_boot: int, seed: int) -> dict[str, AlphaEstimate]:
    """Both scales: ordinal uses the full Likert information, nominal is the label decisions rest on."""
    return {
        "ordinal": alpha_estimate(reliability_matrix(rows, "rating"), "ordinal", n_boot, seed=seed),
        "nominal": alpha_estimate(reliability_matrix(rows, "broken01"), "nominal", n_boot, seed=seed),
    }


def _side(arbiter: int, low: int, high: int) -> str:
    """Rating 0 is 'definitely broken', so the lower primary rating is the more-broken one."""
    if low == high:
        return "neither"
    if arbiter == low:
        return "more_broken"
    if arbiter == high:
        return "less_broken"
    return "neither"


def arbitration_summary(annotations: pd.DataFrame, spec: CampaignSpec) -> Arbitration:
    """Arbitration rate over dialogues that have all ``spec.annotators_per_dialogue`` primary ratings (only
    those can have been sent to arbitration), pending ones included, and the side each arbitrator took."""
    primary = primary_annotations(annotations)
    sizes = primary.groupby("dialogue_id")["rating"].agg(["size", "min", "max"])
    complete = sizes[sizes["size"] >= spec.annotators_per_dialogue]
    arbiters = (
        _ordered(annotations[annotations["kind"] == TaskKind.ARBITRATE])
        .groupby("dialogue_id")["rating"]
        .last()
    )
    arbiters = arbiters[arbiters.index.isin(complete.index)]
    sides = {"more_broken": 0, "less_broken": 0, "neither": 0}
    for dialogue_id, rating in arbiters.items():
        row = complete.loc[dialogue_id]
        sides[_side(int(rating), int(row["min"]), int(row["max"]))] += 1
    sent = {d for d, row in complete.iterrows() if spec.needs_arbitration([int(row["min"]), int(row["max"])])}
    sent |= set(arbiters.index)  # an imported arbitration counts even where this gap would not
    n = len(complete)
    return Arbitration(
        n_complete=n,
        n_sent=len(sent),
        n_arbitrated=len(arbiters),
        n_waiting=len(sent) - len(arbiters),
        rate=len(sent) / n if n else None,
        **sides,
    )


def reliability(
    annotations: pd.DataFrame, dialogues: pd.DataFrame, spec: CampaignSpec, n_boot: int = 1000, seed: int = 0
) -> ReliabilityReport:
    """Section 1: alpha (ordinal on the Likert scale, nominal on broken/not) overall and per policy area,
    percent agreement on both scales, and arbitration."""
    primary = _binary(primary_annotations(annotations), spec)
    overall = _alphas(primary, n_boot, seed)
    area_of = {r.id: r.area for r in spec.rules}
    areas = dialogues.set_index("dialogue_id")["rule_id"].map(area_of)
    primary = primary.assign(area=primary["dialogue_id"].map(areas))
    by_area = {str(a): _alphas(rows, n_boot, seed) for a, rows in primary.groupby("area", sort=True)}
    agreement = [
        _agreement(reliability_matrix(primary, "rating"), "likert"),
        _agreement(reliability_matrix(primary, "broken01"), "broken"),
    ]
    return ReliabilityReport(
        ordinal=overall["ordinal"],
        nominal=overall["nominal"],
        by_area=by_area,
        percent_agreement=agreement,
        arbitration=arbitration_summary(annotations, spec),
    )
