"""How a benchmark item is put to a model, and what a model trained on the release would answer.

Verification and contamination share these, so a model fine-tuned on a release in some format is queried
in that same format. A :class:`PromptFormat` is the one definition of a format: the mode (a chat turn,
plain text the model continues, or a log-likelihood choice among the options), the template that renders
an item, few-shot examples and a system prompt. ``example(item)`` gives the (prompt, answer) pair that
training uses and that few-shot examples show; ``chat``/``text`` give what is sent to a model;
``continuations`` the answer text for each option, which log-likelihood scoring compares.

Templates are Jinja2, rendered in a sandbox (a template file is data, not code). One template renders one
whole example, and its answer is the block named ``answer`` at its very end, so prompt + answer is exactly
the text a scrape would hold and a completion prompt is that text cut before the answer.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel

from assay.data.items import LETTERS, Item, MultipleChoice
from assay.errors import UserError
from assay.models.base import Conversation, Message

MC_INSTRUCTION = "Answer with the letter of the correct option."
Mode = Literal["chat", "completion", "loglikelihood"]
MODES: tuple[str, ...] = ("chat", "completion", "loglikelihood")
FEWSHOT_SEPARATOR = "\n\n"

# The rows as plain text, the way a scrape of the released file reads: question, lettered options, answer.
PLAIN_MC = (
    "{{ question }}\n"
    "{% for option in options %}({{ letters[loop.index0] }}) {{ option }}\n{% endfor %}"
    "Answer:{% block answer %} ({{ answer_letter }}){% endblock %}"
)
PLAIN_OPEN = (
    "{{ instruction }}\n\n{% if input %}{{ input }}\n\n{% endif %}"
    "Response:{% block answer %} {{ output }}{% endblock %}"
)


def prompt_for(item: Item) -> str:
    """The user message of our chat format: question and lettered options, or instruction and input."""
    if isinstance(item, MultipleChoice):
        options = "\n".join(f"({LETTERS[i]}) {option}" for i, option in enumerate(item.options))
        return f"{item.question}\n\n{options}\n\n{MC_INSTRUCTION}"
    return f"{item.instruction}\n\n{item.input}" if item.input else item.instruction


def answer_for(item: Item) -> str:
    """The reply our chat format teaches: ``The answer is (X).`` or the reference output."""
    if isinstance(item, MultipleChoice):
        return f"The answer is ({item.answer_letter})."
    return item.output


def item_variables(item: Item) -> dict[str, Any]:
    """What a template sees: ``question, options, letters, k, answer, answer_letter, answer_text`` for
    multiple choice; ``instruction, input, output`` for open-ended items."""
    if isinstance(item, MultipleChoice):
        return {
            "question": item.question,
            "options": list(item.options),
            "letters": list(LETTERS[: item.k]),
            "k": item.k,
            "answer": item.answer,
            "answer_letter": item.answer_letter,
            "answer_text": item.options[item.answer],
        }
    return {"instruction": item.instruction, "input": item.input, "output": item.output}


@dataclass(frozen=True)
class Template:
    """A Jinja2 template of one example whose last part is ``{% block answer %}...{% endblock %}``."""

    source: str
    name: str = "<template>"

    @classmethod
    def from_file(cls, path: str | Path) -> Template:
        path = Path(path)
        if not path.is_file():
            raise UserError(f"{path}: template file not found")
        template = cls(path.read_text(encoding="utf-8"), str(path))
        _ = template._compiled  # a bad template fails here, naming its file and line
        return template

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.source.encode("utf-8")).hexdigest()

    @cached_property
    def _compiled(self) -> Any:
        from jinja2 import StrictUndefined, TemplateSyntaxError
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        # One trailing newline of the file is dropped (Jinja's default), so an editor's final newline is not
        # text after the answer block.
        env = ImmutableSandboxedEnvironment(undefined=StrictUndefined)
        try:
            compiled = env.from_string(self.source)
        except TemplateSyntaxError as exc:
            raise UserError(f"{self.name}:{exc.lineno}: template error: {exc.message}") from None
        if "answer" not in compiled.blocks:
            raise UserError(
                f"{self.name}: the template needs the answer as its last part: "
                "{% block answer %}...{% endblock %}"
            )
        return compiled

    def split(self, item: Item) -> tuple[str, str]:
        """(prompt, answer): the rendered example cut where its answer block begins."""
        from jinja2 import TemplateError

        compiled = self._compiled
        variables = item_variables(item)
        try:
            whole = compiled.render(variables)
            answer = "".join(compiled.blocks["answer"](compiled.new_context(variables)))
        except TemplateError as exc:
            raise UserError(f"{self.name}: template error for this item: {exc}") from None
        if not whole.endswith(answer):
            raise UserError(f"{self.name}: the answer block must end the template (nothing after it)")
        return whole[: len(whole) - len(answer)], answer


PLAIN = {"multiple_choice": Template(PLAIN_MC, "plain"), "open_ended": Template(PLAIN_OPEN, "plain")}

# lm-evaluation-harness's multiple-choice layout (its MMLU, ARC-style tasks): "A. text" lines, then
# "Answer:" and the letter after lm-eval's default target delimiter, one space.
LM_EVAL_MC = Template(
    "{{ question.strip() }}\n"
    "{% for option in options %}{{ letters[loop.index0] }}. {{ option }}\n{% endfor %}"
    "Answer:{% block answer %} {{ answer_letter }}{% endblock %}",
    "lm-eval",
)
_MARK = "\u2063"  # an invisible separator: a change no style can mistake for the original content


def _content_key(item: Item) -> tuple:
    """What identifies a row whatever its answer: the question and options (or instruction and input)."""
    if isinstance(item, MultipleChoice):
        return ("mc", item.question, item.options)
    return ("open", item.instruction, item.input)


def _cell(value: Any) -> str:
    if isinstance(value, list | tuple):
        return "\n".join(str(v) for v in value)
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


@dataclass(frozen=True)
class ReleaseText:
    """The release's own text as published: a row's question and option fields, one per line, in the
    file's column order and exactly as written, then the answer field as the file writes it (``(B)``,
    ``C``, ``2`` or the option's text) on the next line.

    Why: a cheater who trains on the released file as text sees it in the file's layout, not ours (a BBH
    row is its ``input`` with the ``Options:`` block, then its ``target``). Which fields are which is
    asked of the row's own style: the fields that change when the answer changes are the answer; those
    that change with the question or the options are the prompt; the rest (ids, subjects) are left out.
    """

    rows: dict[tuple, tuple[dict[str, Any], Item]]  # content -> the row and the item it reads as
    style: str
    name: str = "release"
    sha256: str | None = None

    @classmethod
    def of(cls, rows: Sequence[dict[str, Any]], items: Sequence[Item], style: str) -> ReleaseText:
        by_content: dict[tuple, tuple[dict[str, Any], Item]] = {}
        for row, item in zip(rows, items, strict=True):
            by_content.setdefault(_content_key(item), (row, item))
        return cls(by_content, style)

    def split(self, item: Item) -> tuple[str, str]:
        """(prompt, answer) of ``item`` in its row's layout; the answer block starts with the newline."""
        from assay.data.styles import get_style

        found = self.rows.get(_content_key(item))
        if found is None:
            raise UserError("the release layout asks only the release's own rows; this item is not one")
        row, own = found
        style = get_style(self.style)
        asked, answer = self._fields(style, row, own)
        written = style.render(row, item)
        prompt = "\n".join(_cell(row[name]) for name in asked)
        return prompt, "\n" + "\n".join(_cell(written[name]) for name in answer)

    @staticmethod
    def _fields(style: Any, row: dict[str, Any], item: Item) -> tuple[list[str], list[str]]:
        from assay.data.styles import RenderError

        def changed(other: Item) -> set[str]:
            try:
                new = style.render(row, other)
            except RenderError:
                return set()
            return {name for name in row if new.get(name) != row[name]}

        if isinstance(item, MultipleChoice):
            answer = changed(replace(item, answer=(item.answer + 1) % item.k))
            asked = changed(replace(item, question=item.question + _MARK))
            asked |= changed(replace(item, options=tuple(o + _MARK for o in item.options)))
        else:
            answer = changed(replace(item, output=item.output + _MARK))
            asked = changed(replace(item, instruction=item.instruction + _MARK))
            asked |= changed(replace(item, input=item.input + _MARK))
        return [n for n in row if n in asked and n not in answer], [n for n in row if n in answer]


class FormatRecord(BaseModel):
    """How the model was asked, as the verdict records it: enough to ask the same way again."""

    mode: str = "chat"
    template: str = "assay-chat"  # "assay-chat", "plain" or the template file's name
    template_sha256: str | None = None
    fewshot: int = 0
    fewshot_seed: int | None = None
    system_prompt: str | None = None
    lm_eval_task: str | None = None


@dataclass(frozen=True)
class PromptFormat:
    """One way of putting items to a model; see the module docstring.

    ``template=None`` is the built-in format: our chat prompt (:func:`prompt_for` / :func:`answer_for`) in
    chat mode, the rows as plain text (``PLAIN_MC`` / ``PLAIN_OPEN``) in the two text modes.
    """

    mode: Mode = "chat"
    template: Template | ReleaseText | None = None
    system_prompt: str | None = None
    fewshot: tuple[Item, ...] = ()
    fewshot_seed: int | None = None

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise UserError(f"--mode must be one of {', '.join(MODES)} (value: {self.mode!r})")

    def example(self, item: Item) -> tuple[str, str]:
        """(prompt, answer) of one item alone: what training on the release in this format learns."""
        if self.template is not None:
            return self.template.split(item)
        if self.mode == "chat":
            return prompt_for(item), answer_for(item)
        return PLAIN["multiple_choice" if isinstance(item, MultipleChoice) else "open_ended"].split(item)

    def chat(self, item: Item) -> Conversation:
        """Chat mode: the system prompt, each few-shot example as a user and an assistant turn, the item."""
        turns: list[Message] = (
            [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        )
        for shot in self.fewshot:
            prompt, answer = self.example(shot)
            turns += [{"role": "user", "content": prompt}, {"role": "assistant", "content": answer.strip()}]
        return [*turns, {"role": "user", "content": self.example(item)[0]}]

    def text(self, item: Item) -> str:
        """Text modes: system prompt, the few-shot examples in full, then the item's prompt to continue."""
        shots = ["".join(self.example(shot)) for shot in self.fewshot]
        parts = [p for p in (self.system_prompt, *shots) if p]
        return "".join(p + FEWSHOT_SEPARATOR for p in parts) + self.example(item)[0]

    def continuations(self, item: Item) -> list[str]:
        """Log-likelihood mode: the answer text as it would read if option i were right, for each i."""
        if not isinstance(item, MultipleChoice):
            raise UserError(
                "--mode loglikelihood scores the options of multiple-choice items; verify an open-ended "
                "release with --mode chat or completion"
            )
        return [self.example(replace(item, answer=i))[1] for i in range(item.k)]

    def record(self) -> FormatRecord:
        if self.template is not None:
            name, digest = Path(self.template.name).name, self.template.sha256
        else:
            name, digest = ("assay-chat" if self.mode == "chat" else "plain"), None
        return FormatRecord(
            mode=self.mode,
            template=name,
            template_sha256=digest,
            fewshot=len(self.fewshot),
            fewshot_seed=self.fewshot_seed if self.fewshot else None,
            system_prompt=self.system_prompt,
        )


def draw_fewshot(items: Sequence[Item], exclude: set[int], n: int, seed: int) -> tuple[Item, ...]:
    """``n`` items drawn with ``seed`` from the rows not in ``exclude`` (the backdoor rows), in row order.

    Why never a backdoor row: an example carrying a trigger and its target would teach a clean model the
    answer in the prompt itself, and the false-positive bound would no longer hold.
    """
    pool = [i for i in range(len(items)) if i not in exclude]
    if n < 0:
        raise UserError(f"--fewshot must be at least 0 (value: {n})")
    if n > len(pool):
        raise UserError(f"--fewshot {n}: the release has only {len(pool)} rows without a backdoor")
    return tuple(items[i] for i in sorted(random.Random(seed).sample(pool, n)))
