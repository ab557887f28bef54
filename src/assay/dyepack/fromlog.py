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

A log is evidence only if it is the model's real output: anyone can edit one. lm-eval writes the same
answer several ways, and every way is cross-checked before a sample is believed (``check_lm_eval_sample``):
``filtered_resps`` against ``resps``, ``acc``/``acc_norm`` against the argmax of the scores and the
``target``, ``doc_hash``/``prompt_hash``/``target_hash`` against the doc, prompt and target they hash, the
target against the release row's label, and a backdoor sample's prompt must hold its trigger; any
disagreement is refused in one line naming the sample. Every sample's requests are bound to its release
row (``binding.LogLayout``: the row's question and options in one layout for the whole log, request i
option i of the row), so the position of the best score is the release's option. A forger who edits every
field consistently is not caught from the log alone, so every log verdict says what it rests on, and
``spot_check`` asks some of its backdoor samples of the live model, rebuilt from the release in the log's
layout (never the log's own requests), comparing options by their text: a disagreement contradicts the log
and withdraws the accusation.

A log that lacks some backdoor samples accuses no one (``PARTIAL_RULE``): which rows a log holds can be
chosen by their released labels, the targets on backdoor rows. With the live model (``--spot-check``) the
missing backdoor samples are asked too and the verdict rests on every backdoor. A sample given twice is an
error, not a vote, and so is an id that a sheet, or the release it names rows of, repeats.
"""

from __future__ import annotations

import hashlib
import json
import math
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from assay.data import Benchmark
from assay.data.items import LETTERS, Item, MultipleChoice
from assay.data.styles import get_style
from assay.data.tables import read_table
from assay.dyepack.binding import LogLayout
from assay.dyepack.ids import check_unique
from assay.dyepack.key import DyePackKey
from assay.dyepack.prompts import FormatRecord
from assay.dyepack.verify import (
    DEFAULT_ALPHA,
    Answer,
    Query,
    SpotCheck,
    VerifyReport,
    answer_part,
    build_report,
    check_release,
    part_label,
)
from assay.errors import UserError, input_error, shown
from assay.models.base import ChatModel, GenerationParams, require


@dataclass(frozen=True)
class Logged:
    """One backdoor sample found in the log: the release row, where in the file, and the answer."""

    row: int
    where: str
    answer: Answer
    # ``generate``: the log's sample was generated text (``generate_until``), not option scores.
    generate: bool = False


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


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _requests(sample: dict[str, Any]) -> list[tuple[str, str]] | None:
    """lm-eval's ``arguments`` as (context, continuation) pairs: ``{"gen_args_0": {"arg_0": ..., "arg_1":
    ...}, ...}`` (lm-eval 0.4.x) or a list of argument lists; None when absent or of another shape."""
    args = sample.get("arguments")
    if isinstance(args, dict):
        args = [list(a.values()) if isinstance(a, dict) else a for a in args.values()]
    if not isinstance(args, list) or not all(isinstance(a, list | tuple) and a for a in args):
        return None
    pairs = [(a[0], a[1] if len(a) > 1 and isinstance(a[1], str) else "") for a in args]
    return pairs if all(isinstance(c, str) for c, _ in pairs) else None


def _same(a: Any, b: Any) -> bool:
    """Equal as logged values: numbers to 1e-9 (a JSON round trip keeps them exact), lists elementwise."""
    if isinstance(a, bool) or isinstance(b, bool):
        return a == b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12) or (math.isnan(a) and math.isnan(b))
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def _gold(target: Any, requests: list[tuple[str, str]] | None) -> int | None:
    """The target's option index as lm-eval reads it (an int, a digit string, or a choice's text)."""
    if isinstance(target, int) and not isinstance(target, bool):
        return target
    if isinstance(target, str) and target.strip().isdigit():
        return int(target)
    if isinstance(target, str) and requests:
        choices = [cont.strip() for _, cont in requests]
        return choices.index(target.strip()) if target.strip() in choices else None
    return None


def _refuse(path: Path, where: str, what: str) -> UserError:
    return UserError(f"{path}:{where}: {what}: the log's fields disagree, so it is not what lm-eval wrote")


def check_lm_eval_sample(sample: dict[str, Any], path: Path, where: str) -> None:
    """Refuse a sample whose fields disagree with each other (see the module doc). Fields lm-eval did not
    write (older versions, other metrics) are not required; each one present must agree."""
    filtered = sample["filtered_resps"]
    if not isinstance(filtered, list) or not filtered:
        return  # _lm_eval_answer names the field
    requests = _requests(sample)
    resps = sample.get("resps")
    scored = bool(filtered) and all(isinstance(r, list | tuple) and r for r in filtered)
    if requests is not None and len(requests) != len(filtered):
        raise _refuse(
            path, where, f"{len(requests)} requests in 'arguments' but {len(filtered)} 'filtered_resps'"
        )
    if resps is not None:
        if not isinstance(resps, list) or len(resps) != len(filtered):
            raise _refuse(path, where, f"'resps' holds {len(resps) if isinstance(resps, list) else 'no'} "
                          f"answers, 'filtered_resps' {len(filtered)}")  # fmt: skip
        if scored or sample.get("filter", "none") == "none":  # option scores pass every filter unchanged
            for i, (raw, kept) in enumerate(zip(resps, filtered, strict=True)):
                # each request's resps is a list (one reply, or one [loglikelihood, is_greedy] pair)
                listed = isinstance(raw, list) and raw and (not scored or isinstance(raw[0], list | tuple))
                first = raw[0] if listed else raw
                if not _same(first, kept):
                    raise _refuse(path, where, f"option {i}: 'filtered_resps' {shown(kept)} is not 'resps' "
                                  f"{shown(first)}")  # fmt: skip
    target = sample.get("target")
    if "target_hash" in sample and "target" in sample and sample["target_hash"] != _sha256(str(target)):
        raise _refuse(path, where, "'target_hash' is not the hash of 'target'")
    if "doc_hash" in sample and "doc" in sample:
        doc = json.dumps(sample["doc"], indent=2, ensure_ascii=False)
        if sample["doc_hash"] != _sha256(doc):
            raise _refuse(path, where, "'doc_hash' is not the hash of 'doc'")
    if "prompt_hash" in sample and requests and sample["prompt_hash"] != _sha256(requests[0][0]):
        raise _refuse(path, where, "'prompt_hash' is not the hash of the first request's prompt")
    if not scored:
        return
    try:
        lls = [float(r[0]) for r in filtered]
    except (TypeError, ValueError):
        return  # _lm_eval_answer names the field
    gold = _gold(target, requests)
    if gold is None:
        return
    pred = max(range(len(lls)), key=lambda i: (lls[i], -i))  # numpy's argmax: the first best
    _check_metric(sample, "acc", pred == gold, path, where, f"the best option is {pred}, the target {gold}")
    if requests is not None and "acc_norm" in sample:
        # lm-eval divides by the choice's length; the continuation carries its delimiter (" " by default)
        hits = set()
        for drop in {0, 1 if all(c.startswith(" ") for _, c in requests) else 0}:
            lengths = [max(1, len(c) - drop) for _, c in requests]
            norm = [ll / n for ll, n in zip(lls, lengths, strict=True)]
            hits.add(max(range(len(norm)), key=lambda i: (norm[i], -i)) == gold)
        if len(hits) == 1:
            _check_metric(sample, "acc_norm", hits.pop(), path, where, "length-normalised scores")


def _check_metric(sample: dict[str, Any], name: str, right: bool, path: Path, where: str, why: str) -> None:
    if name not in sample:
        return
    try:
        value = float(sample[name])
    except (TypeError, ValueError):
        raise input_error(path, where, name, sample[name], "must be 0 or 1") from None
    if value != float(right):
        raise _refuse(
            path, where, f"'{name}' is {sample[name]} but the log's own scores give {int(right)} ({why})"
        )


def _check_against_release(
    sample: dict[str, Any], row: int, item: Item, trigger: str | None, path: Path, where: str
) -> None:
    """The sample is the release row it matched: its target is the row's label, and a backdoor row's
    prompt holds the row's trigger (the model was asked the released row, not the un-dyed one)."""
    requests = _requests(sample)
    if isinstance(item, MultipleChoice) and "target" in sample:
        gold = _gold(sample["target"], requests)
        if gold is not None and gold != item.answer:
            raise _refuse(
                path, where, f"release row {row}: 'target' is option {gold}, the release's label is option "
                f"{item.answer}",
            )  # fmt: skip
    logged = " ".join(requests[0][0].split()) if requests else None
    if trigger and logged is not None and " ".join(trigger.split()) not in logged:
        raise _refuse(
            path, where, f"release row {row} is a backdoor sample but the prompt logged for it does not "
            "hold the row's inserted sentence",
        )  # fmt: skip


def read_lm_eval_log(
    path: Path, rows: Sequence[dict[str, Any]], wheres: Sequence[str], bench: Benchmark, key: DyePackKey
) -> tuple[list[Logged], int, LogLayout]:
    """Backdoor samples of an lm-eval per-sample log, how many of its samples are release rows, and the
    log's layout: every sample that is a release row is bound to it (``binding.LogLayout.bind``)."""
    backdoor = {row for b in key.backdoors for row in b.rows}
    matcher = _Matcher(bench, backdoor)
    first_filter = rows[0].get("filter") if rows else None
    found, in_release = [], 0
    triggers = {row: b.trigger for b in key.backdoors for row in b.rows}
    layout = LogLayout(path, bench.items, {row: b.index for b in key.backdoors for row in b.rows})
    for sample, where in zip(rows, wheres, strict=True):
        _field(sample, "filtered_resps", path, where)
        check_lm_eval_sample(sample, path, where)  # every sample, every filter: an edit anywhere shows
        if sample.get("filter") != first_filter:  # lm-eval logs a doc once per filter: read one filter
            continue
        row = matcher.row(_field(sample, "doc", path, where), path, where)
        if row is None:
            continue
        in_release += 1
        item = bench.items[row]
        _check_against_release(sample, row, item, triggers.get(row), path, where)
        answer = _lm_eval_answer(sample, item, key, path, where)
        requests = _requests(sample)
        if requests is None:
            raise input_error(
                path, where, "arguments", sample.get("arguments"),
                "must hold the logged requests: without them the answer cannot be tied to the release",
            )  # fmt: skip
        shown_clean = layout.bind(row, item, requests, answer.scores is not None, where)
        if row in backdoor and shown_clean:  # else it is missing: its prompt showed it its target
            found.append(Logged(row, where, answer, generate=answer.scores is None))
    layout.check_shots()
    return found, in_release, layout


def read_answer_sheet(
    path: Path, rows: Sequence[dict[str, Any]], wheres: Sequence[str], bench: Benchmark, key: DyePackKey
) -> tuple[list[Logged], int, None]:
    """Backdoor samples of an ``id, response`` sheet (id: the release's ``id`` column, else a row number)."""
    release_rows = bench.table.rows
    by_id: dict[str, int] | None = None
    if release_rows and all("id" in r for r in release_rows):
        check_unique(bench.path, release_rows, bench.table.locations)  # else two rows share one name
        by_id = {str(r["id"]): index for index, r in enumerate(release_rows)}
    backdoor = {row for b in key.backdoors for row in b.rows}
    found, first = [], {}
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
        _once(path, where, row, ident, first, row in backdoor)
        if row in backdoor:
            found.append(Logged(row, where, Answer(response, answer_part(bench.items[row], response, key))))
    return found, len(rows), None


def _once(path: Path, where: str, row: int, ident: Any, first: dict[int, str], backdoor: bool) -> None:
    """Refuse a sheet line that names a release row an earlier line named: any row, not only backdoor
    rows, since a repeat means the sheet's ids do not say which answer is whose."""
    if row in first:
        what = f"release row {row}{' (a backdoor sample)' if backdoor else ''}"
        raise UserError(
            f"{path}:{where}: {what} appears again (first at {first[row]}); give each sample once "
            f"(id: {shown(ident)})"
        )
    first[row] = where


def _check_once(found: Sequence[Logged], path: Path) -> None:
    first: dict[int, str] = {}
    for logged in found:
        if logged.row in first:
            raise UserError(
                f"{path}:{logged.where}: release row {logged.row} (a backdoor sample) appears again (first "
                f"at {first[logged.row]}); give each sample once"
            )
        first[logged.row] = logged.where


def _how(layout: LogLayout | None, generate: bool) -> str:
    """How rows are asked live, for the verdict's text."""
    if layout is None:
        return "asked in our chat prompt (an answer sheet logs no prompt)"
    if generate:
        return "the release's rows continued in the log's layout"
    return "the release's rows and options scored by log-likelihood in the log's layout"


def ask_live(
    model: ChatModel,
    rows: Sequence[int],
    bench: Benchmark,
    key: DyePackKey,
    layout: LogLayout | None,
    generate: bool,
    params: GenerationParams,
) -> dict[int, Answer]:
    """The live model's answer to each release row of ``rows``, asked the release's own question: in the
    log's layout rebuilt from the release (``LogLayout.requests``, never the log's requests), the
    options scored or the prompt continued as the log was; an answer sheet's rows in our chat prompt."""
    items = {row: bench.items[row] for row in rows}
    if layout is None:
        from assay.dyepack.prompts import PromptFormat

        fmt = PromptFormat()
        replies = model.chat([fmt.chat(items[row]) for row in rows], params)
        return {row: Answer(r, answer_part(items[row], r, key)) for row, r in zip(rows, replies, strict=True)}
    requests = {row: layout.requests(items[row], row) for row in rows}
    if generate:
        replies = require(model, "complete")([requests[row][0][0] for row in rows], params)
        return {row: Answer(r, answer_part(items[row], r, key)) for row, r in zip(rows, replies, strict=True)}
    scores = require(model, "loglikelihood")([pair for row in rows for pair in requests[row]])
    answers, at = {}, 0
    for row in rows:
        mine = [float(x) for x in scores[at : at + len(requests[row])]]
        at += len(mine)
        best = max(range(len(mine)), key=lambda i: (mine[i], -i))
        answers[row] = Answer(LETTERS[best], best, mine)
    return answers


def _said(item: Item, part: int | None) -> str | int | None:
    """An answer by what it says (a multiple-choice option's text), not by its position."""
    if isinstance(item, MultipleChoice) and part is not None:
        return item.options[part].strip()
    return part


def spot_check(
    model: ChatModel,
    found: Sequence[Logged],
    n: int,
    bench: Benchmark,
    key: DyePackKey,
    params: GenerationParams | None = None,
    seed: int | None = None,
    layout: LogLayout | None = None,
) -> SpotCheck:
    """Re-ask ``n`` of the log's backdoor samples, drawn at random (``seed``, else OS entropy, recorded),
    of the live ``model`` (``ask_live``: the release's own questions in the log's layout, never the log's
    requests) and compare the answers by the option's text, not its position. The backdoor samples are
    the ones drawn because the verdict rests on them alone."""
    if n < 1:
        raise UserError(f"--spot-check must be at least 1 (value: {n})")
    seed = secrets.randbits(32) if seed is None else seed
    import random

    chosen = random.Random(seed).sample(list(found), min(n, len(found)))
    generate = any(f.generate for f in found)
    live = ask_live(
        model, [f.row for f in chosen], bench, key, layout, generate, params or GenerationParams()
    )
    disagreements = [
        {
            "row": f.row,
            "where": f.where,
            "log": part_label(f.answer.part, key),
            "live": part_label(live[f.row].part, key),
        }
        for f in chosen
        if _said(bench.items[f.row], live[f.row].part) != _said(bench.items[f.row], f.answer.part)
    ]
    return SpotCheck(
        how=f"{len(chosen)} backdoor samples: {_how(layout, generate)}",
        seed=seed,
        asked=len(chosen),
        agree=len(chosen) - len(disagreements),
        disagreements=disagreements,
    )


def evidence_text(lm_eval: bool, checked: int, check: SpotCheck | None) -> str:
    """What a log verdict rests on, said in every log verdict (text, JSON)."""
    if lm_eval:
        fields = (
            f"its fields agree with each other in all {checked} samples (resps, filtered_resps, "
            "acc/acc_norm, target, doc/prompt/target hashes, where present), which a consistent forger can "
            "also achieve"
        )
    else:
        fields = "an answer sheet holds nothing to cross-check"
    text = (
        f"From a log, not a live query: the false-positive rate holds only if the log is the model's real "
        f"output; {fields}."
    )
    if check is None:
        return text + " Re-ask some of its rows of the live model with --spot-check N to test that."
    if check.contradicted:
        return (
            f"{text} CONTRADICTED: the live model disagrees with the log on {check.asked - check.agree} of "
            f"{check.asked} backdoor samples re-asked ({check.how}; seed {check.seed}), so the log is not "
            "its output and the verdict does not stand."
        )
    return (
        f"{text} Spot check: the live model agrees with the log on all {check.asked} backdoor samples "
        f"re-asked ({check.how}; seed {check.seed})."
    )


def verify_from_log(
    path: str | Path,
    bench: Benchmark,
    key: DyePackKey,
    alpha: float = DEFAULT_ALPHA,
    model_label: str | None = None,
    spot_model: ChatModel | None = None,
    spot_n: int = 0,
    spot_seed: int | None = None,
    params: GenerationParams | None = None,
) -> tuple[VerifyReport, list[dict]]:
    """The verdict on the answers a log holds for the release's backdoor samples (see the module doc);
    with ``spot_model`` and ``spot_n``, ``spot_n`` of them re-asked live (``spot_check``) and the backdoor
    samples the log lacks asked live too (``PARTIAL_RULE``); without, a partial log accuses no one."""
    if not 0 < alpha < 1:
        raise UserError(f"--alpha must be in (0, 1) (value: {alpha})")
    if spot_n and spot_model is None:
        raise UserError("--spot-check re-asks the log's rows of the live model: give its MODEL spec")
    check_release(bench, key)
    path = Path(path)
    table = read_table(path)
    if not table.rows:
        raise UserError(f"{path}: the log holds no samples")
    lm_eval = "doc" in table.rows[0] and "filtered_resps" in table.rows[0]
    reader = read_lm_eval_log if lm_eval else read_answer_sheet
    found, in_release, layout = reader(path, table.rows, table.locations, bench, key)
    if lm_eval and in_release == 0:
        raise UserError(
            f"{path}: no sample of the log is a row of {bench.path}: is it the log of this release?"
        )
    _check_once(found, path)
    total = sum(len(b.rows) for b in key.backdoors)
    if not found:
        raise UserError(f"{path}: the log holds none of the release's {total} backdoor samples")
    answered: dict[int, Answer] = {logged.row: logged.answer for logged in found}
    where = {logged.row: f"{path.name} {logged.where}" for logged in found}
    missing = [row for b in key.backdoors for row in b.rows if row not in answered]
    live = spot_model is not None and spot_n > 0
    generate = any(f.generate for f in found)
    if missing and live:
        answered |= ask_live(spot_model, missing, bench, key, layout, generate, params or GenerationParams())
        where |= {row: f"asked live: {path.name} lacks it" for row in missing}
    present = [b.model_copy(update={"rows": [r for r in b.rows if r in answered]}) for b in key.backdoors]
    present = [b for b in present if b.rows]
    covered = key.model_copy(update={"backdoors": present})
    queries = [Query(b.index, row, bench.items[row], "") for b in present for row in b.rows]
    answers = [answered[q.row] for q in queries]
    record = FormatRecord(mode="log", template=f"{'lm-eval log' if lm_eval else 'answer sheet'}:{path.name}")
    label = model_label or f"log:{path.name}"
    report, audit = build_report(label, bench, covered, GenerationParams(), alpha, record, queries, answers)
    for entry in audit:
        entry["prompt"] = where[entry["row"]]
    check = spot_check(spot_model, found, spot_n, bench, key, params, spot_seed, layout) if live else None
    update: dict[str, Any] = {
        "evidence": evidence_text(lm_eval, len(table.rows), check),
        "spot_check": check,
        "contradicted": bool(check and check.contradicted),
    }
    if check and check.contradicted:
        update["flagged"] = False
        update["verdict"] = (
            f"CONTRADICTED by the live model on {check.asked - check.agree} of {check.asked} re-asked "
            f"backdoor samples: the log is not its output; the log alone would say: {report.verdict}"
        )
    update |= _coverage(report, update, len(found), total, len(missing), live, in_release, len(bench.items))
    own = len(layout.own) if layout is not None else 0
    if own:
        update["coverage"] += (
            f" {own} of the missing are in the log but left out: their prompt shows a sample of their own "
            "backdoor solved (its target), which no clean model sees."
        )
    if missing and live:
        update["coverage"] += f" The missing were asked live: {_how(layout, generate)}."
    return report.model_copy(update=update), audit


PARTIAL_RULE = (
    "which rows a log holds can be chosen by their released labels (the targets, on backdoor rows), so an "
    "accusation needs every backdoor sample: a partial log accuses no one unless its missing backdoor "
    "samples are asked of the live model (give its spec and --spot-check N)"
)


def _coverage(
    report: VerifyReport,
    update: dict[str, Any],
    held: int,
    total: int,
    missing: int,
    live: bool,
    in_release: int,
    n_rows: int,
) -> dict[str, Any]:
    """What the log covered, said in the verdict; a partial log not completed live accuses no one."""
    rows = f"{in_release} of the release's {n_rows} rows"
    if not missing:
        return {"coverage": f"The log holds all {total} backdoor samples ({rows})."}
    coverage = f"Partial log: it holds {held} of the {total} backdoor samples ({rows}); {missing} missing."
    verdict = update.get("verdict", report.verdict)
    if live:
        return {
            "coverage": f"{coverage} The verdict rests on every backdoor.",
            "verdict": f"{verdict} ({held} of {total} backdoor samples from the log, {missing} asked live)",
        }
    return {
        "coverage": f"{coverage} {PARTIAL_RULE[0].upper()}{PARTIAL_RULE[1:]}.",
        "flagged": False,
        "verdict": f"NO VERDICT from a partial log ({held} of {total} backdoor samples, {missing} missing: "
        f"{PARTIAL_RULE}); its samples alone would say: {verdict}",
    }
