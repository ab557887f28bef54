"""Bind a log's requests to the release: every logged prompt and option is what the release produces.

Why (issue 46): an lm-eval log's answer is the position of the best option score, and a spot check that
re-scores the log's own (context, continuation) pairs agrees with any edit that keeps each pair's score.
Swap two options' continuations *and* their scores and every pair still carries the score the model gave
it, while the log's answer moves to another option: a clean model's log then reads CONTAMINATED (no key
needed), a contaminated one's "not flagged". Nothing tied request i to option i of the release.

The rule, one check every log path passes (``LogLayout.bind``):

* **the row.** A sample's prompt must hold its release row as the release writes it: the question (with
  its inserted sentence on a backdoor row), then each option's text in the release's order (required when
  the options are answered by letter; an option-text task may leave them out of the prompt).
* **one layout.** Cut at the row's fields, the prompt is a template: the text before the question
  (lm-eval's description), between the fields (``\\nA. ``) and after them (``\\nAnswer:``). Every sample
  of a log with the same shape (option count) must have the same template, the one its first sample
  has: a prompt edited on some rows (a hint, a changed letter, options in another order) is refused.
* **few-shot examples.** Text before the question that is not the log's head must be release rows in
  the same layout, each solved with its released label's continuation and followed by one separator for
  the whole log. A backdoor sample shown a solved sample of its own backdoor (its target) is left out.
  Examples chosen by the asked row's label (priming it) are refused by a count no sampler blind to the row
  reaches (``check_shots``).
* **the options.** The continuation of request i is option i of the release row, in one form for the
  whole log: the letter (``" A"``, ``" (A)"``: option 0's continuation with its letter changed) or the
  option's text, after one delimiter.

A log that passes is the release's own questions in one layout, so ``LogLayout.requests`` rebuilds every
request from the release and that layout (never from the log), which is what the live model is asked.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

from assay.data.items import LETTERS, Item, MultipleChoice
from assay.errors import UserError, shown


def row_fields(item: Item) -> tuple[str, ...]:
    """The row's texts a prompt shows, in the release's order: the question and its options (multiple
    choice) or the instruction and its input (open ended); empty ones are left out."""
    texts = (
        (item.question, *item.options) if isinstance(item, MultipleChoice) else (item.instruction, item.input)
    )
    return tuple(t.strip() for t in texts if t.strip())


def _find_field(text: str, field: str, start: int) -> int:
    """Where ``field`` stands in ``text`` from ``start``: the first occurrence that ends a line (an option
    as a layout writes it, so option "A" is not found in the label "A."), else the first at all."""
    first = at = text.find(field, start)
    while at >= 0:
        end = at + len(field)
        if end == len(text) or text[end] == "\n":
            return at
        at = text.find(field, at + 1)
    return first


def _in_order(text: str, fields: tuple[str, ...]) -> bool:
    """Whether every field stands in ``text`` in order (options the question itself lists, say)."""
    pos = 0
    for field in fields:
        at = text.find(field, pos)
        if at < 0:
            return False
        pos = at + len(field)
    return True


@dataclass(frozen=True)
class Template:
    """A prompt cut at the row's fields: ``parts[0]`` before the question, ``parts[i]`` between field i-1
    and field i, ``parts[-1]`` after the last placed field; ``placed``: how many fields stand in it."""

    parts: tuple[str, ...]
    placed: int

    def render(self, fields: tuple[str, ...]) -> str:
        """The prompt this template gives a release row (its ``row_fields``)."""
        pieces = [self.parts[0]]
        for field, after in zip(fields[: self.placed], self.parts[1:], strict=True):
            pieces += [field, after]
        return "".join(pieces)


def cut(context: str, fields: tuple[str, ...]) -> Template | None:
    """``context`` as a template of the row ``fields``: the question's last occurrence (a few-shot prompt
    shows other rows first), then all the other fields in order after it, or none of them; None when
    the question is not in the prompt."""
    if not fields:
        return Template((context,), 0)
    start = context.rfind(fields[0])
    if start < 0:
        return None
    parts, pos = [context[:start]], start + len(fields[0])
    found = []
    for field in fields[1:]:
        at = _find_field(context, field, pos)
        if at < 0:
            break
        found.append((at, field))
        pos = at + len(field)
    if len(found) < len(fields) - 1:  # all the options in order, or the question alone
        return Template((context[:start], context[start + len(fields[0]) :]), 1)
    pos = start + len(fields[0])
    for at, field in found:
        parts.append(context[pos:at])
        pos = at + len(field)
    parts.append(context[pos:])
    return Template(tuple(parts), len(fields))


@dataclass(frozen=True)
class Choices:
    """How a log writes option i's continuation: ``form`` with ``{}`` standing for the option's letter
    (``" {}"``, ``" ({})"``) or, ``by_letter`` false, for the option's text."""

    by_letter: bool
    form: str

    def continuation(self, item: MultipleChoice, i: int) -> str:
        return self.form.replace("{}", LETTERS[i] if self.by_letter else item.options[i].strip(), 1)


ORDER = "the options of a log must be the release's, in its order"
SHOTS_ALPHA = 1e-6  # how unlikely the few-shot examples' labels may be under a sampler blind to the row


def _forms(item: MultipleChoice, first: str) -> list[Choices]:
    """The continuation forms option 0's logged continuation could be in: its letter, its text."""
    forms = []
    at = first.find(LETTERS[0])
    if at >= 0:
        forms.append(Choices(True, first[:at] + "{}" + first[at + 1 :]))
    text, kept = item.options[0].strip(), first.rstrip()
    if text and kept.endswith(text):
        forms.append(Choices(False, kept[: -len(text)] + "{}"))
    return forms


def _first_wrong(item: MultipleChoice, continuations: list[str], form: Choices) -> int | None:
    """The first option whose continuation is not the form's (spaces around a text do not count)."""
    return next(
        (i for i, c in enumerate(continuations) if c.strip() != form.continuation(item, i).strip()), None
    )


def bind_choices(
    item: MultipleChoice, continuations: list[str], where: str, row: int, form: Choices | None = None
) -> Choices:
    """Refuse continuations that are not the release row's options in its order, in ``form`` (the log's;
    None: the first form option 0's continuation is in that fits them all); return the form. One line
    naming the row and the first option that is not the release's."""
    if len(continuations) != item.k:
        raise UserError(
            f"{where}: release row {row}: {len(continuations)} options requested; the release row has "
            f"{item.k}"
        )
    forms = [form] if form else _forms(item, continuations[0])
    if not forms:
        raise UserError(
            f"{where}: release row {row}, option 0: the logged continuation {shown(continuations[0])} is "
            f"neither the letter A nor the release's option 0 ({shown(item.options[0].strip())}): {ORDER}"
        )
    wrong = [_first_wrong(item, continuations, f) for f in forms]
    if None in wrong:
        return forms[wrong.index(None)]
    i = max(wrong)
    best = forms[wrong.index(i)]
    raise UserError(
        f"{where}: release row {row}, option {i}: the logged continuation {shown(continuations[i])} is not "
        f"{shown(best.continuation(item, i))}, the release's option {i} ({shown(item.options[i].strip())}) "
        f"in the log's form: {ORDER}"
    )


class LogLayout:
    """The one layout of a log, learnt from its first sample of each shape and then required of all."""

    def __init__(self, path: Path, items: Sequence[Item], groups: dict[int, int]) -> None:
        self.path, self.items, self.groups = path, items, groups  # groups: backdoor row -> its backdoor
        self.templates: dict[int, tuple[Template, str]] = {}  # fields count -> (template, where first)
        self.choices: Choices | None = None
        self.sep: str | None = None  # after a solved example's answer, up to the next question
        self.shots: dict[int, tuple[int, ...]] = {}  # row -> the release rows its prompt shows solved
        self.own: list[int] = []  # backdoor rows whose prompt shows a solved sample of their own backdoor
        self._ends: dict[str, list[int]] | None = None

    def bind(self, row: int, item: Item, requests: list[tuple[str, str]], scored: bool, where: str) -> bool:
        """Refuse a sample whose requests are not the release row in the log's layout (module doc);
        False when its few-shot examples show a sample of its own backdoor solved (its target)."""
        at = f"{self.path}:{where}"
        contexts = {context for context, _ in requests}
        if not requests or len(contexts) != 1:
            raise UserError(
                f"{at}: release row {row}: the {len(requests)} logged requests do not share one prompt; "
                "each option of a row is asked after the same prompt"
            )
        fields = row_fields(item)
        template = cut(requests[0][0], fields)
        if template is None:
            raise UserError(
                f"{at}: release row {row}: the logged prompt does not hold the release row's question "
                f"({shown(fields[0])}) as the release writes it"
            )
        if isinstance(item, MultipleChoice) and scored:
            self.choices = bind_choices(item, [c for _, c in requests], at, row, self.choices)
            question_on = requests[0][0][len(template.parts[0]) :]
            if (
                self.choices.by_letter
                and template.placed < len(fields)
                and not _in_order(question_on, fields[1:])
            ):
                raise UserError(
                    f"{at}: release row {row}: the logged prompt does not list the release row's options in "
                    "its order, so its letters do not name them"
                )
        head, shots = self._examples(template, at, row)
        body = Template((head, *template.parts[1:]), template.placed)
        first, seen = self.templates.setdefault(len(fields), (body, where))
        if first != body:
            raise UserError(
                f"{at}: release row {row}: the logged prompt is not in the log's layout (the one at {seen}): "
                f"{_difference(first, body)}"
            )
        if row in self.groups and any(self.groups.get(j) == self.groups[row] for j in shots):
            self.own.append(row)  # asked again, if at all, with examples the verifier draws
            return False
        self.shots[row] = shots
        return True

    def _examples(self, template: Template, at: str, row: int) -> tuple[str, tuple[int, ...]]:
        """The text before a prompt's question cut into its head and the release rows it shows solved
        (few-shot examples, scored multiple choice): each in the layout with its released label's
        continuation, then one separator for the whole log. Text that is not such an example stays in
        the head, which every prompt of the log must share."""
        prefix = template.parts[0]
        if self.choices is None or len(template.parts) < 2 or not template.parts[1]:
            return prefix, ()
        spans, pos, x = [], 0, prefix.find(template.parts[1])
        while x >= 0:
            span = self._example_at(prefix, x, pos, template)
            if span is not None:
                spans.append(span)
                pos = span[1]
            x = prefix.find(template.parts[1], max(x + 1, pos))
        if not spans:
            return prefix, ()
        glues = [prefix[end:nxt] for (_, end, _), (nxt, _, _) in pairwise(spans)]
        for (_, _, j), glue in zip(spans, [*glues, prefix[spans[-1][1] :]], strict=True):
            answer = self.choices.continuation(self.items[j], self.items[j].answer)
            if not glue.startswith(answer):
                raise UserError(
                    f"{at}: release row {row}: its prompt shows release row {j} solved as "
                    f"{shown(glue[: len(answer)])}, not with its released label {shown(answer)}"
                )
            self.sep = glue[len(answer) :] if self.sep is None else self.sep
            if glue[len(answer) :] != self.sep:
                raise UserError(
                    f"{at}: release row {row}: after the solved example of release row {j} its prompt has "
                    f"{shown(glue[len(answer) :])} where the log's examples have {shown(self.sep)}"
                )
        return prefix[: spans[0][0]], tuple(j for _, _, j in spans)

    def check_shots(self, alpha: float = SHOTS_ALPHA) -> None:
        """Refuse few-shot examples chosen by their labels on the backdoor rows. A sampler picks each
        row's examples blind to the row (lm-eval's: at random, so each example shares the row's released
        label with about the label's share of the rows), so the number of examples that share it is a sum
        of independent counts, one per row; examples picked to share it (priming a clean model toward the
        released label, the target) or to avoid it put that sum in a tail (Hoeffding's bound, both tails,
        against ``alpha``). Rows all shown the same examples (lm-eval's first_n) were not chosen per row."""
        rows = [row for row, shots in self.shots.items() if row in self.groups and shots]
        if len({self.shots[row] for row in rows}) < 2:
            return
        shape = [len(row_fields(item)) for item in self.items]
        labels = [getattr(item, "answer", None) for item in self.items]
        shares: dict[tuple[int, object], float] = {}
        for size in set(shape):
            among = Counter(label for label, n in zip(labels, shape, strict=True) if n == size)
            shares |= {(size, label): count / among.total() for label, count in among.items()}
        same = sum(labels[j] == labels[row] for row in rows for j in self.shots[row])
        expected = sum(len(self.shots[row]) * shares[(shape[row], labels[row])] for row in rows)
        spread = sum(len(self.shots[row]) ** 2 for row in rows)
        p = min(1.0, 2 * math.exp(-2 * (same - expected) ** 2 / spread))
        if p < alpha:
            raise UserError(
                f"{self.path}: the few-shot examples of the backdoor rows share the row's released label "
                f"{same} times, where a sampler blind to the row gives about {expected:.0f} (p <= {p:.1e}): "
                "examples chosen by their labels are not a sampler's, and prime the answer"
            )

    def _example_at(self, text: str, end: int, start: int, template: Template) -> tuple[int, int, int] | None:
        """The release row shown in the layout whose question ends at ``end`` of ``text`` (and starts at
        or after ``start``): its span and row, or None. Rows may share a question: each is tried."""
        if self._ends is None:
            self._ends = {}
            for j, item in enumerate(self.items):
                fields = row_fields(item)
                if fields:
                    self._ends.setdefault(fields[0][-24:], []).append(j)
        for length in {len(k) for k in self._ends}:
            for j in self._ends.get(text[max(0, end - length) : end], []):
                begin = end - len(row_fields(self.items[j])[0])
                shown_row = self._row_text(template, j) if begin >= start else None
                if shown_row is not None and text.startswith(shown_row, begin):
                    return begin, begin + len(shown_row), j
        return None

    def _row_text(self, template: Template, j: int) -> str | None:
        """Release row ``j`` in the layout, from its question to the text after it (no head)."""
        fields = row_fields(self.items[j])
        if len(fields) < template.placed or (template.placed > 1 and len(fields) != template.placed):
            return None  # another shape: not an example of this layout
        return Template(("", *template.parts[1:]), template.placed).render(fields)

    def requests(self, item: Item, row: int) -> list[tuple[str, str]]:
        """The release's own requests for ``row`` in this layout, built from the release, never the log:
        its few-shot examples the rows the log showed it (bound to the release), or for a row the log
        lacks as many rows without a backdoor as the log's prompts show, drawn by the verifier."""
        fields = row_fields(item)
        known = self.templates.get(len(fields))
        if known is None:
            raise UserError(
                f"{self.path}: release row {row} cannot be asked in the log's layout: the log holds no row "
                "of its shape"
            )
        body = known[0]
        shots = self.shots.get(row)
        if shots is None:
            shots = self._draw_shots(row)
        solved = "".join(
            self._row_text(body, j)
            + self.choices.continuation(self.items[j], self.items[j].answer)
            + self.sep
            for j in shots
            if self.choices is not None and self.sep is not None
        )
        context = body.parts[0] + solved + self._row_text(body, row)
        if isinstance(item, MultipleChoice) and self.choices is not None:
            return [(context, self.choices.continuation(item, i)) for i in range(item.k)]
        return [(context, "")]

    def _draw_shots(self, row: int) -> tuple[int, ...]:
        """Few-shot examples for a row the log lacks: the log's usual number, drawn from the rows of the
        same shape without a backdoor (a seed of the row: which rows are shown tells nothing of a target)."""
        counts = Counter(len(shots) for shots in self.shots.values())
        n = counts.most_common(1)[0][0] if counts and self.sep is not None else 0
        shape = len(row_fields(self.items[row]))
        pool = [j for j, it in enumerate(self.items) if j not in self.groups and len(row_fields(it)) == shape]
        return tuple(random.Random(row).sample(pool, min(n, len(pool))))


def _difference(expected: Template, got: Template) -> str:
    """What differs between two templates, in a few words for a one-line refusal."""
    if expected.placed != got.placed:
        return f"it places {got.placed} of the row's texts where that places {expected.placed}"
    last = len(got.parts) - 1
    for i, (a, b) in enumerate(zip(expected.parts, got.parts, strict=True)):
        if a != b:
            place = "before the question" if i == 0 else "after the row" if i == last else f"before text {i}"
            extra = " (few-shot examples drawn per row are not the release's)" if i == 0 else ""
            return f"its text {place} is {shown(b)} where that has {shown(a)}{extra}"
    return "another layout"
