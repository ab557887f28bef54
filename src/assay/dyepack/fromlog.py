"""Verify from published answers instead of a model: an lm-eval ``--log_samples`` file or an answer sheet.

Why: a benchmark maintainer often holds a model's evaluation log, not the model. The verdict depends only
on which part of the answer space each backdoor sample's answer falls in, so the same answers read from a
log give the same verdict and the same exact FPR as a live query that got them.

Two layouts are read (JSONL or CSV, through :func:`assay.data.tables.read_table`):

* lm-evaluation-harness's per-sample log (``samples_TASK_DATE.jsonl``): each line's ``doc`` is matched to a
  release row by content (read with the release's row style, else by the row's question text inside the
  doc), and the answer is the option of highest log-likelihood (``multiple_choice``: lm-eval's ``acc``,
  ties to the first) or the generated text (``generate_until``), read as a live reply would be.
* an answer sheet: ``id`` (the release's ``id`` column when it has one, else the 0-based row number) and
  ``response`` (the reply's text).

A log that lacks some backdoor samples is judged on those it holds: which samples a log holds does not
depend on the secret targets, so the backdoors with at least one sample keep the exact bound; the verdict
says how much of the release the log covered. A sample given twice is an error, not a vote.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from assay.data import Benchmark
from assay.data.items import LETTERS, Item, MultipleChoice
from assay.data.styles import get_style
from assay.data.tables import read_table
from assay.dyepack.key import DyePackKey
from assay.dyepack.prompts import FormatRecord
from assay.dyepack.verify import (
    DEFAULT_ALPHA,
    Answer,
    Query,
    VerifyReport,
    answer_part,
    build_report,
    check_release,
)
from assay.errors import UserError, input_error
from assay.models.base import GenerationParams


@dataclass(frozen=True)
class Logged:
    """One backdoor sample found in the log: the release row, where in the file, and the answer."""

    row: int
    where: str
    answer: Answer


def _content(item: Item) -> tuple:
    if isinstance(item, MultipleChoice):
        return (item.question, item.options)
    return (item.instruction, item.input)


def _asked(item: Item) -> str:
    return item.question if isinstance(item, MultipleChoice) else item.instruction


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, list | tuple):
        return [s for v in value for s in _strings(v)]
    return []


class _Matcher:
    """Release rows by content: the doc read with the release's style, else a backdoor row's question
    (or instruction) found in the doc's text."""

    def __init__(self, bench: Benchmark, rows: set[int]) -> None:
        self.style = get_style(bench.style)
        self.by_content: dict[tuple, int] = {}
        for index, item in enumerate(bench.items):
            self.by_content.setdefault(_content(item), index)
        self.texts = [(index, _asked(bench.items[index])) for index in sorted(rows)]

    def row(self, doc: Any, path: Path, where: str) -> int | None:
        if isinstance(doc, dict):
            try:
                found = self.by_content.get(_content(self.style.parse(doc, where, path)))
            except UserError:
                found = None
            if found is not None:
                return found
        text = "\n".join(_strings(doc))
        hits = [index for index, question in self.texts if question.strip() and question.strip() in text]
        return hits[0] if len(hits) == 1 else None


def _field(row: dict[str, Any], name: str, path: Path, where: str) -> Any:
    if name not in row:
        raise UserError(f"{path}:{where}: field '{name}' is missing (fields: {', '.join(map(str, row))})")
    return row[name]


def _lm_eval_answer(sample: dict[str, Any], item: Item, key: DyePackKey, path: Path, where: str) -> Answer:
    """The option of highest log-likelihood (a multiple_choice log), or the generated text read as a reply."""
    responses = _field(sample, "filtered_resps", path, where)
    if not isinstance(responses, list) or not responses:
        raise input_error(path, where, "filtered_resps", responses, "must be a non-empty list")
    if all(isinstance(r, list | tuple) and r for r in responses):  # [[loglikelihood, is_greedy], ...]
        try:
            scores = [float(r[0]) for r in responses]
        except (TypeError, ValueError):
            raise input_error(path, where, "filtered_resps", responses, "holds no log-likelihoods") from None
        k = item.k if isinstance(item, MultipleChoice) else 0
        if len(scores) != k:
            raise input_error(
                path, where, "filtered_resps", responses,
                f"has {len(scores)} option scores; the release row has {k} options",
            )  # fmt: skip
        best = max(range(k), key=lambda i: (scores[i], -i))
        return Answer(LETTERS[best], best, scores)
    reply = responses[0] if isinstance(responses[0], str) else None
    if reply is None:
        raise input_error(path, where, "filtered_resps", responses, "is neither option scores nor a reply")
    return Answer(reply, answer_part(item, reply, key))


def read_lm_eval_log(
    path: Path, rows: Sequence[dict[str, Any]], wheres: Sequence[str], bench: Benchmark, key: DyePackKey
) -> tuple[list[Logged], int]:
    """Backdoor samples of an lm-eval per-sample log, and how many of its samples are release rows."""
    backdoor = {row for b in key.backdoors for row in b.rows}
    matcher = _Matcher(bench, backdoor)
    first_filter = rows[0].get("filter") if rows else None
    found, in_release = [], 0
    for sample, where in zip(rows, wheres, strict=True):
        if sample.get("filter") != first_filter:  # lm-eval logs a doc once per filter: read one filter
            continue
        row = matcher.row(_field(sample, "doc", path, where), path, where)
        if row is None:
            continue
        in_release += 1
        if row in backdoor:
            found.append(Logged(row, where, _lm_eval_answer(sample, bench.items[row], key, path, where)))
    return found, in_release


def read_answer_sheet(
    path: Path, rows: Sequence[dict[str, Any]], wheres: Sequence[str], bench: Benchmark, key: DyePackKey
) -> tuple[list[Logged], int]:
    """Backdoor samples of an ``id, response`` sheet (id: the release's ``id`` column, else a row number)."""
    release_rows = bench.table.rows
    by_id: dict[str, int] | None = None
    if release_rows and all("id" in r for r in release_rows):
        by_id = {}
        for index, r in enumerate(release_rows):
            by_id.setdefault(str(r["id"]), index)
    backdoor = {row for b in key.backdoors for row in b.rows}
    found = []
    for sample, where in zip(rows, wheres, strict=True):
        ident = _field(sample, "id", path, where)
        response = _field(sample, "response", path, where)
        if not isinstance(response, str):
            raise input_error(path, where, "response", response, "must be the reply's text")
        if by_id is not None:
            row = by_id.get(str(ident))
            if row is None:
                raise input_error(path, where, "id", ident, "is no id of the release's rows")
        else:
            try:
                row = int(ident)
            except (TypeError, ValueError):
                row = -1
            if not 0 <= row < len(release_rows) or isinstance(ident, bool):
                raise input_error(
                    path, where, "id", ident, f"is no row number of the release (0-{len(release_rows) - 1})"
                )
        if row in backdoor:
            found.append(Logged(row, where, Answer(response, answer_part(bench.items[row], response, key))))
    return found, len(rows)


def _check_once(found: Sequence[Logged], path: Path) -> None:
    first: dict[int, str] = {}
    for logged in found:
        if logged.row in first:
            raise UserError(
                f"{path}:{logged.where}: release row {logged.row} (a backdoor sample) appears again (first "
                f"at {first[logged.row]}); give each sample once"
            )
        first[logged.row] = logged.where


def verify_from_log(
    path: str | Path,
    bench: Benchmark,
    key: DyePackKey,
    alpha: float = DEFAULT_ALPHA,
    model_label: str | None = None,
) -> tuple[VerifyReport, list[dict]]:
    """The verdict on the answers a log holds for the release's backdoor samples (see the module doc)."""
    if not 0 < alpha < 1:
        raise UserError(f"--alpha must be in (0, 1) (value: {alpha})")
    check_release(bench, key)
    path = Path(path)
    table = read_table(path)
    if not table.rows:
        raise UserError(f"{path}: the log holds no samples")
    lm_eval = "doc" in table.rows[0] and "filtered_resps" in table.rows[0]
    reader = read_lm_eval_log if lm_eval else read_answer_sheet
    found, in_release = reader(path, table.rows, table.locations, bench, key)
    if lm_eval and in_release == 0:
        raise UserError(
            f"{path}: no sample of the log is a row of {bench.path}: is it the log of this release?"
        )
    _check_once(found, path)
    answered = {logged.row: logged.answer for logged in found}
    present = [b.model_copy(update={"rows": [r for r in b.rows if r in answered]}) for b in key.backdoors]
    present = [b for b in present if b.rows]
    total = sum(len(b.rows) for b in key.backdoors)
    if not present:
        raise UserError(f"{path}: the log holds none of the release's {total} backdoor samples")
    covered = key.model_copy(update={"backdoors": present})
    queries = [Query(b.index, row, bench.items[row], "") for b in present for row in b.rows]
    answers = [answered[q.row] for q in queries]
    record = FormatRecord(mode="log", template=f"{'lm-eval log' if lm_eval else 'answer sheet'}:{path.name}")
    label = model_label or f"log:{path.name}"
    report, audit = build_report(label, bench, covered, GenerationParams(), alpha, record, queries, answers)
    for entry, logged in zip(audit, [next(f for f in found if f.row == q.row) for q in queries], strict=True):
        entry["prompt"] = f"{path.name} {logged.where}"
    held = len(queries)
    if held == total:
        coverage = f"The log holds all {total} backdoor samples ({in_release} rows of the release in all)."
        return report.model_copy(update={"coverage": coverage}), audit
    coverage = (
        f"Partial log: it holds {held} of the {total} backdoor samples, from {len(present)} of the "
        f"{len(key.backdoors)} backdoors; the FPR counts those {len(present)} backdoors."
    )
    verdict = f"{report.verdict}; partial log: {held} of {total} backdoor samples"
    return report.model_copy(update={"coverage": coverage, "verdict": verdict}), audit
