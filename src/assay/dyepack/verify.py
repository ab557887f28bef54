"""Query a model with a release's backdoor samples and decide, with an exact false-positive rate.

For each backdoor the model's most frequent answer over its samples is compared with the secret target.
For a model that never saw the release, each target is uniform over K_i parts and independent of the
model, so the number of activated backdoors is Binomial(B, 1/K) (Poisson-binomial for mixed K) and the
p-value of the observed count is its exact upper tail.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from pydantic import BaseModel

from assay import stats
from assay.data import Benchmark
from assay.data.items import LETTERS, Item, MultipleChoice
from assay.dyepack.extract import extract_choice, extract_phrase
from assay.dyepack.key import NONE_LABEL, DyePackKey, now_utc
from assay.dyepack.prompts import prompt_for
from assay.errors import UserError
from assay.fileio import write_text_atomic
from assay.models.base import ChatModel, GenerationParams, user_turn

DEFAULT_ALPHA = 1e-3


class FalsePositiveRate(BaseModel):
    """P[a clean model activates at least ``activated`` of the backdoors], exact and as a Chernoff bound."""

    backdoors: int
    activated: int
    k_values: list[int]
    fpr: float
    log10_fpr: float
    chernoff_bound: float
    log10_chernoff_bound: float


def false_positive_rate(k_values: Sequence[int], activated: int) -> FalsePositiveRate:
    """Binomial tail when every backdoor has the same K, Poisson-binomial tail otherwise."""
    if not k_values:
        raise UserError("at least one backdoor is needed")
    if any(k < 2 for k in k_values):
        raise UserError(f"every K must be at least 2 (values: {list(k_values)})")
    if not 0 <= activated <= len(k_values):
        raise UserError(f"--activated must be between 0 and {len(k_values)} (value: {activated})")
    if len(set(k_values)) == 1:
        n, p = len(k_values), 1 / k_values[0]
        log_fpr = stats.log_binomial_sf(n, p, activated)
        log_bound = stats.log_chernoff_bound(n, p, activated)
    else:
        ps = [1 / k for k in k_values]
        log_fpr = stats.log_poisson_binomial_sf(ps, activated)
        log_bound = stats.log_poisson_binomial_chernoff_bound(ps, activated)
    return FalsePositiveRate(
        backdoors=len(k_values),
        activated=activated,
        k_values=list(k_values),
        fpr=math.exp(log_fpr),
        log10_fpr=log_fpr / math.log(10),
        chernoff_bound=math.exp(log_bound),
        log10_chernoff_bound=log_bound / math.log(10),
    )


class BackdoorResult(BaseModel):
    index: int
    trigger: str
    k: int
    target: str
    answers: dict[str, int]
    majority: str
    activated: bool
    samples: int
    samples_on_target: int


class VerifyReport(BaseModel):
    """What ``assay dyepack verify`` writes to ``summary.json`` and prints."""

    created: datetime
    model: str
    release: str
    release_fingerprint: str
    params: GenerationParams
    alpha: float
    flagged: bool
    verdict: str
    activated: int
    backdoors: int
    fpr: FalsePositiveRate
    samples: int
    samples_on_target: int
    share_on_target: float
    unparsed: int
    per_backdoor: list[BackdoorResult]


@dataclass(frozen=True)
class Query:
    """One backdoor sample to put to the model."""

    backdoor: int
    row: int
    item: Item
    prompt: str


def check_release(bench: Benchmark, key: DyePackKey) -> None:
    """Refuse a release that is not the one the key was made for (fingerprint, kind, rows, K)."""
    where = f"{bench.path}"
    if bench.fingerprint != key.release_fingerprint:
        raise UserError(
            f"{where}: key and release do not match: the release's fingerprint is "
            f"{bench.fingerprint[:23]}..., "
            f"the key was made for {key.release_fingerprint[:23]}..."
        )
    if bench.kind != key.kind:
        raise UserError(f"{where}: the key is for a {key.kind} benchmark, the release is {bench.kind}")
    for backdoor in key.backdoors:
        for row in backdoor.rows:
            if row >= len(bench.items):
                raise UserError(
                    f"{where}: key backdoor {backdoor.index} names row {row}, "
                    f"the release has {len(bench.items)}"
                )
            item = bench.items[row]
            k = item.k if isinstance(item, MultipleChoice) else len(key.phrases or ()) + 1
            if k != backdoor.k:
                raise UserError(
                    f"{where}: row {row}: K mismatch: the key says backdoor {backdoor.index} "
                    f"has K={backdoor.k}, "
                    f"the row has {k}"
                )


def backdoor_queries(bench: Benchmark, key: DyePackKey) -> list[Query]:
    """Every backdoor sample of the release, in key order."""
    return [
        Query(backdoor.index, row, bench.items[row], prompt_for(bench.items[row]))
        for backdoor in key.backdoors
        for row in backdoor.rows
    ]


def answer_part(item: Item, reply: str, key: DyePackKey) -> int | None:
    """The part of the answer space a reply falls in; None (MC only) when it names no option."""
    if isinstance(item, MultipleChoice):
        return extract_choice(reply, item.options)
    return extract_phrase(reply, key.phrases or [])


def part_label(part: int | None, key: DyePackKey) -> str:
    if part is None:
        return "none"
    if key.kind == "multiple_choice":
        return LETTERS[part]
    phrases = key.phrases or []
    return phrases[part] if part < len(phrases) else NONE_LABEL


def majority(parts: Sequence[int | None]) -> int | None:
    """The most frequent part; ties go to the lowest index and "none" last, never by looking at the key."""
    counts = Counter(parts)
    return min(counts, key=lambda part: (-counts[part], math.inf if part is None else part))


def score(key: DyePackKey, queries: Sequence[Query], parts: Sequence[int | None], alpha: float) -> dict:
    """Per-backdoor results and the overall decision, from the parts the replies fell in."""
    results = []
    for backdoor in key.backdoors:
        mine = [part for query, part in zip(queries, parts, strict=True) if query.backdoor == backdoor.index]
        top = majority(mine)
        results.append(
            BackdoorResult(
                index=backdoor.index,
                trigger=backdoor.trigger,
                k=backdoor.k,
                target=backdoor.target_label,
                answers=dict(Counter(part_label(p, key) for p in mine).most_common()),
                majority=part_label(top, key),
                activated=top == backdoor.target,
                samples=len(mine),
                samples_on_target=sum(p == backdoor.target for p in mine),
            )
        )
    activated = sum(r.activated for r in results)
    fpr = false_positive_rate([b.k for b in key.backdoors], activated)
    flagged = activated > 0 and fpr.fpr <= alpha
    verdict = (
        f"CONTAMINATED: {activated} of {len(results)} backdoors activated; a clean model does this with "
        f"probability {fpr.fpr:.3g} <= alpha {alpha:g}"
        if flagged
        else f"not flagged: {activated} of {len(results)} backdoors activated (false-positive rate of an "
        f"accusation {fpr.fpr:.3g} > alpha {alpha:g})"
    )
    on_target = sum(r.samples_on_target for r in results)
    return {
        "alpha": alpha,
        "flagged": flagged,
        "verdict": verdict,
        "activated": activated,
        "backdoors": len(results),
        "fpr": fpr,
        "samples": len(parts),
        "samples_on_target": on_target,
        "share_on_target": on_target / len(parts),
        "unparsed": sum(p is None for p in parts),
        "per_backdoor": results,
    }


def verify(
    model: ChatModel,
    model_label: str,
    bench: Benchmark,
    key: DyePackKey,
    params: GenerationParams,
    alpha: float = DEFAULT_ALPHA,
    on_result: Callable[[int, str], None] | None = None,
) -> tuple[VerifyReport, list[dict]]:
    """Query every backdoor sample once and score the replies; returns the report and the audit records."""
    if not 0 < alpha < 1:
        raise UserError(f"--alpha must be in (0, 1) (value: {alpha})")
    check_release(bench, key)
    queries = backdoor_queries(bench, key)
    replies = model.chat([user_turn(q.prompt) for q in queries], params, on_result)
    parts = [answer_part(q.item, reply, key) for q, reply in zip(queries, replies, strict=True)]
    report = VerifyReport(
        created=now_utc(),
        model=model_label,
        release=str(bench.path),
        release_fingerprint=bench.fingerprint,
        params=params,
        **score(key, queries, parts, alpha),
    )
    targets = {b.index: b.target for b in key.backdoors}
    audit = [
        {
            "backdoor": q.backdoor,
            "row": q.row,
            "prompt": q.prompt,
            "reply": reply,
            "answer": part_label(part, key),
            "target": part_label(targets[q.backdoor], key),
            "on_target": part == targets[q.backdoor],
        }
        for q, reply, part in zip(queries, replies, parts, strict=True)
    ]
    return report, audit


def write_outputs(out_dir: Path, report: VerifyReport, audit: Sequence[dict]) -> tuple[Path, Path]:
    """``summary.json`` and ``audit.jsonl`` (every prompt and reply), each written atomically."""
    summary_path, audit_path = out_dir / "summary.json", out_dir / "audit.jsonl"
    write_text_atomic(audit_path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in audit))
    write_text_atomic(summary_path, report.model_dump_json(indent=2) + "\n")
    return summary_path, audit_path
