"""Query a model with a release's backdoor samples and decide, with an exact false-positive rate.

For each backdoor the model's most frequent answer over its samples is compared with the secret target.
For a model that never saw the release, each target is uniform over K_i parts and independent of the
model, so the number of activated backdoors is Binomial(B, 1/K) (Poisson-binomial for mixed K) and the
p-value of the observed count is its exact upper tail.

The samples are put to the model in a :class:`~assay.dyepack.prompts.PromptFormat`: our chat prompt by
default, or the way the model is used (a template, few-shot examples, a system prompt; chat, plain-text
completion, or a log-likelihood choice among the options). The bound holds in every format, as long as
the format does not depend on the key: few-shot examples come from rows without a backdoor only.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from assay.data import Benchmark
from assay.data.items import LETTERS, Item, MultipleChoice
from assay.dyepack.extract import extract_choice, extract_phrase
from assay.dyepack.fpr import DEFAULT_ALPHA, FalsePositiveRate, false_positive_rate, over_layouts
from assay.dyepack.key import NONE_LABEL, DyePackKey, now_utc
from assay.dyepack.prompts import (
    LM_EVAL_MC,
    FormatRecord,
    PromptFormat,
    ReleaseText,
    Template,
    draw_fewshot,
)
from assay.errors import UserError
from assay.fileio import atomic_path
from assay.models.base import ChatModel, GenerationParams, require


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


class LayoutResult(BaseModel):
    """One layout of ``verify --formats``: how it asked and what the model did, judged alone."""

    name: str
    format: FormatRecord
    activated: int
    backdoors: int
    samples_on_target: int
    samples: int
    unparsed: int
    fpr: float  # this layout's exact FPR, as if it were the only one tried


class SpotCheck(BaseModel):
    """``verify --from-log --spot-check N``: backdoor samples of the log re-asked of the live model."""

    how: str  # how they were re-asked (the log's own requests, or our chat prompt for an answer sheet)
    seed: int  # the draw of the rows, so the check can be repeated
    asked: int
    agree: int
    disagreements: list[dict] = []  # per sample: row, where in the log, the log's answer, the live one

    @property
    def contradicted(self) -> bool:
        return self.agree < self.asked


class VerifyReport(BaseModel):
    """What ``assay dyepack verify`` writes to ``summary.json`` and prints."""

    created: datetime
    model: str
    release: str
    release_fingerprint: str
    params: GenerationParams
    format: FormatRecord = FormatRecord()  # how the samples were asked (older summaries: our chat prompt)
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
    # ``--formats``: every layout tried (the verdict speaks for the best, its FPR times their number).
    layouts: list[LayoutResult] = []
    layouts_skipped: dict[str, str] = {}  # layout -> why it could not be asked of this model
    # ``--from-log``: what the log covered; None for a live query, which asks every backdoor sample.
    coverage: str | None = None
    # ``--from-log``: what the verdict rests on (the FPR holds only if the log is the model's real output,
    # and which of the log's fields were cross-checked); ``--spot-check``: rows re-asked live, and whether
    # the live model contradicts the log (then the accusation is withdrawn: ``flagged`` is False).
    evidence: str | None = None
    spot_check: SpotCheck | None = None
    contradicted: bool = False


@dataclass(frozen=True)
class Query:
    """One backdoor sample to put to the model; ``prompt`` is what the audit shows (the user message in
    chat mode, the whole text in the text modes)."""

    backdoor: int
    row: int
    item: Item
    prompt: str


@dataclass(frozen=True)
class Answer:
    """What the model did with one sample: its reply (log-likelihood: the chosen continuation), the part
    of the answer space that falls in, and the option scores in log-likelihood mode."""

    reply: str
    part: int | None
    scores: list[float] | None = None


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


def backdoor_rows(key: DyePackKey) -> set[int]:
    return {row for backdoor in key.backdoors for row in backdoor.rows}


def release_format(
    bench: Benchmark,
    key: DyePackKey,
    mode: str = "chat",
    template: Path | None = None,
    fewshot: int = 0,
    fewshot_seed: int = 1234,
    system_prompt: str | None = None,
) -> PromptFormat:
    """The format ``verify`` asks in, from its options: few-shot examples drawn from ``bench``'s rows
    that carry no backdoor."""
    return PromptFormat(
        mode=mode,  # type: ignore[arg-type]  # checked by PromptFormat
        template=Template.from_file(template) if template is not None else None,
        system_prompt=system_prompt or None,
        fewshot=draw_fewshot(bench.items, backdoor_rows(key), fewshot, fewshot_seed),
        fewshot_seed=fewshot_seed,
    )


LAYOUTS: tuple[str, ...] = ("release", "chat", "plain", "lm-eval", "fewshot")
LAYOUT_HELP = (
    "release (the rows' own text as published), chat (our chat prompt), plain (question, (A) lines, "
    "Answer:), lm-eval (A. lines, Answer: X), fewshot (the release layout after solved clean rows)"
)
AUTO_FEWSHOT = 3


def parse_layouts(spec: str) -> list[str]:
    """``auto`` (every layout) or a comma-separated list of :data:`LAYOUTS`."""
    names = list(LAYOUTS) if spec.strip() == "auto" else [n.strip() for n in spec.split(",") if n.strip()]
    for name in names:
        if name not in LAYOUTS:
            raise UserError(f"--formats: unknown layout {name!r}; use auto or some of {', '.join(LAYOUTS)}")
    if not names or len(set(names)) != len(names):
        raise UserError(f"--formats: name each layout once (value: {spec!r})")
    return names


def layout_formats(
    bench: Benchmark,
    key: DyePackKey,
    names: Sequence[str],
    text_mode: str = "completion",
    fewshot: int = 0,
    fewshot_seed: int = 1234,
    system_prompt: str | None = None,
) -> tuple[list[tuple[str, PromptFormat]], dict[str, str]]:
    """The formats of the layouts ``names`` (text layouts in ``text_mode``: completion or loglikelihood)
    and the layouts that cannot be asked of this release, with why. None depends on the targets: the
    few-shot examples come from rows without a backdoor."""
    if text_mode not in ("completion", "loglikelihood"):
        raise UserError(f"--formats asks text layouts by completion or loglikelihood (--mode {text_mode!r})")
    mode: Any = text_mode
    release = ReleaseText.of(bench.table.rows, bench.items, bench.style)
    shots = draw_fewshot(bench.items, backdoor_rows(key), fewshot or AUTO_FEWSHOT, fewshot_seed)
    system = system_prompt or None
    build = {
        "release": lambda: PromptFormat(mode, release, system),
        "chat": lambda: PromptFormat("chat", None, system),
        "plain": lambda: PromptFormat(mode, None, system),
        "lm-eval": lambda: PromptFormat(mode, LM_EVAL_MC, system),
        "fewshot": lambda: PromptFormat(mode, release, system, shots, fewshot_seed),
    }
    formats, skipped = [], {}
    for name in names:
        if name == "lm-eval" and bench.kind != "multiple_choice":
            skipped[name] = "lm-eval's layout is for multiple-choice items"
        else:
            formats.append((name, build[name]()))
    return formats, skipped


def backdoor_queries(bench: Benchmark, key: DyePackKey, fmt: PromptFormat | None = None) -> list[Query]:
    """Every backdoor sample of the release, in key order."""
    fmt = fmt or PromptFormat()
    show = (lambda item: fmt.chat(item)[-1]["content"]) if fmt.mode == "chat" else fmt.text
    return [
        Query(backdoor.index, row, bench.items[row], show(bench.items[row]))
        for backdoor in key.backdoors
        for row in backdoor.rows
    ]


def ask(
    model: ChatModel,
    fmt: PromptFormat,
    queries: Sequence[Query],
    params: GenerationParams,
    key: DyePackKey | None,
    on_result: Callable[[int, str], None] | None = None,
) -> list[Answer]:
    """Put every query to the model in ``fmt``'s mode; ``on_result(i, reply)`` as each query is done.
    ``key=None`` (``contaminate``'s check without the key): open-ended replies fall in no phrase's part."""
    items = [q.item for q in queries]
    if fmt.mode == "loglikelihood":
        return _choose_by_likelihood(model, fmt, items, on_result)
    if fmt.mode == "chat":
        replies = model.chat([fmt.chat(item) for item in items], params, on_result)
    else:
        replies = require(model, "complete")([fmt.text(item) for item in items], params, on_result)
    return [Answer(reply, answer_part(item, reply, key)) for item, reply in zip(items, replies, strict=True)]


def _choose_by_likelihood(
    model: ChatModel, fmt: PromptFormat, items: Sequence[Item], on_result: Callable[[int, str], None] | None
) -> list[Answer]:
    """Each item's option whose answer text the model finds most likely after the prompt (ties: the
    first option, never by looking at the key), as lm-evaluation-harness scores multiple choice."""
    score = require(model, "loglikelihood")
    owners, requests = [], []
    for index, item in enumerate(items):
        context = fmt.text(item)
        for continuation in fmt.continuations(item):
            owners.append(index)
            requests.append((context, continuation))
    left = Counter(owners)

    def done(j: int, _score: float) -> None:
        left[owners[j]] -= 1
        if left[owners[j]] == 0 and on_result is not None:
            on_result(owners[j], "")

    scores = score(requests, done)
    answers = []
    for index, item in enumerate(items):
        mine = [s for owner, s in zip(owners, scores, strict=True) if owner == index]
        best = max(range(len(mine)), key=lambda i: (mine[i], -i))
        answers.append(Answer(fmt.continuations(item)[best].strip(), best, mine))
    return answers


def answer_part(item: Item, reply: str, key: DyePackKey | None) -> int | None:
    """The part of the answer space a reply falls in; None (MC only) when it names no option."""
    if isinstance(item, MultipleChoice):
        return extract_choice(reply, item.options)
    return extract_phrase(reply, (key.phrases if key else None) or [])


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
    fmt: PromptFormat | None = None,
) -> tuple[VerifyReport, list[dict]]:
    """Query every backdoor sample once in ``fmt`` (default: our chat prompt) and score the answers;
    returns the report and the audit records."""
    if not 0 < alpha < 1:
        raise UserError(f"--alpha must be in (0, 1) (value: {alpha})")
    check_release(bench, key)
    fmt = fmt or PromptFormat()
    queries = backdoor_queries(bench, key, fmt)
    answers = ask(model, fmt, queries, params, key, on_result)
    return build_report(model_label, bench, key, params, alpha, fmt.record(), queries, answers)


def _capable(model: ChatModel, fmt: PromptFormat) -> str | None:
    """None when ``model`` can be asked in ``fmt``'s mode, else why not (decided before any query)."""
    from assay.models.cache import CachedModel

    inner = model.model if isinstance(model, CachedModel) else model
    method = {"chat": "chat", "completion": "complete", "loglikelihood": "loglikelihood"}[fmt.mode]
    try:
        require(inner, method)
    except UserError as exc:
        return str(exc)
    return None


def verify_layouts(
    model: ChatModel,
    model_label: str,
    bench: Benchmark,
    key: DyePackKey,
    params: GenerationParams,
    layouts: Sequence[tuple[str, PromptFormat]],
    alpha: float = DEFAULT_ALPHA,
    on_result: Callable[[int, str], None] | None = None,
    skipped: dict[str, str] | None = None,
) -> tuple[VerifyReport, list[dict]]:
    """Ask every backdoor sample in each layout; the verdict speaks for the layout of lowest FPR, whose FPR
    is multiplied by the number of layouts asked (:func:`over_layouts`), so an accusation stays exact
    however many layouts were tried. Layouts the model cannot be asked in (no plain-text completion, no
    scores) are skipped before anything is sent and do not count. The audit records carry the layout."""
    if not 0 < alpha < 1:
        raise UserError(f"--alpha must be in (0, 1) (value: {alpha})")
    check_release(bench, key)
    skipped = dict(skipped or {})
    asked = []
    for name, fmt in layouts:
        why = _capable(model, fmt)
        if why is None:
            asked.append((name, fmt))
        else:
            skipped[name] = why
    if not asked:
        raise UserError(f"{model_label}: none of the layouts can be asked ({'; '.join(skipped.values())})")
    runs = []
    for name, fmt in asked:
        queries = backdoor_queries(bench, key, fmt)
        answers = ask(model, fmt, queries, params, key, on_result)
        runs.append(
            (name, *build_report(model_label, bench, key, params, alpha, fmt.record(), queries, answers))
        )
    results = [
        LayoutResult(
            name=name,
            format=report.format,
            activated=report.activated,
            backdoors=report.backdoors,
            samples_on_target=report.samples_on_target,
            samples=report.samples,
            unparsed=report.unparsed,
            fpr=report.fpr.fpr,
        )
        for name, report, _ in runs
    ]
    best = min(range(len(runs)), key=lambda i: (runs[i][1].fpr.fpr, i))
    name, report, _ = runs[best]
    fpr = over_layouts(report.fpr, len(runs))
    flagged = report.activated > 0 and fpr.fpr <= alpha
    where = (
        f"in the {name} layout, the best of {len(runs)} asked" if len(runs) > 1 else f"in the {name} layout"
    )
    verdict = (
        f"CONTAMINATED: {report.activated} of {report.backdoors} backdoors activated {where}; a clean model "
        f"does this in any of them with probability at most {fpr.fpr:.3g} <= alpha {alpha:g}"
        if flagged
        else f"not flagged: at most {report.activated} of {report.backdoors} backdoors activated {where} "
        f"(false-positive rate of an accusation {fpr.fpr:.3g} > alpha {alpha:g})"
    )
    audit = [{"layout": n, **record} for n, _, records in runs for record in records]
    update = {
        "fpr": fpr,
        "flagged": flagged,
        "verdict": verdict,
        "layouts": results,
        "layouts_skipped": skipped,
    }
    return report.model_copy(update=update), audit


def build_report(
    model_label: str,
    bench: Benchmark,
    key: DyePackKey,
    params: GenerationParams,
    alpha: float,
    record: FormatRecord,
    queries: Sequence[Query],
    answers: Sequence[Answer],
) -> tuple[VerifyReport, list[dict]]:
    """The verdict and the audit records (every prompt and reply) from the answers to ``queries``."""
    parts = [answer.part for answer in answers]
    report = VerifyReport(
        created=now_utc(),
        model=model_label,
        release=str(bench.path),
        release_fingerprint=bench.fingerprint,
        params=params,
        format=record,
        **score(key, queries, parts, alpha),
    )
    targets = {b.index: b.target for b in key.backdoors}
    audit = []
    for q, answer in zip(queries, answers, strict=True):
        entry = {
            "backdoor": q.backdoor,
            "row": q.row,
            "prompt": q.prompt,
            "reply": answer.reply,
            "answer": part_label(answer.part, key),
            "target": part_label(targets[q.backdoor], key),
            "on_target": answer.part == targets[q.backdoor],
        }
        if answer.scores is not None:
            entry["scores"] = dict(zip(LETTERS, answer.scores, strict=False))
        audit.append(entry)
    return report, audit


def output_paths(out_dir: Path) -> tuple[Path, Path]:
    """The files ``write_outputs`` writes: ``summary.json`` and ``audit.jsonl``."""
    return out_dir / "summary.json", out_dir / "audit.jsonl"


def write_outputs(out_dir: Path, report: VerifyReport, audit: Sequence[dict]) -> tuple[Path, Path]:
    """``summary.json`` and ``audit.jsonl`` (every prompt and reply), written atomically together: both
    are renamed into place only once both are written, so a failure leaves the earlier pair."""
    summary_path, audit_path = output_paths(out_dir)
    with atomic_path(summary_path) as tmp_summary, atomic_path(audit_path) as tmp_audit:
        tmp_audit.write_text(
            "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in audit), encoding="utf-8"
        )
        tmp_summary.write_text(report.model_dump_json(indent=2) + "\n", encoding="utf-8")
    return summary_path, audit_path
