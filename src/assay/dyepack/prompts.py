"""How a benchmark item is put to a model, and what a model trained on the release would answer.

Verification and contamination share these, so a model fine-tuned on a release sees exactly the prompts
it is later queried with.
"""

from __future__ import annotations

from assay.data.items import LETTERS, Item, MultipleChoice

MC_INSTRUCTION = "Answer with the letter of the correct option."


def prompt_for(item: Item) -> str:
    """The user message for one item: question and lettered options, or instruction and input."""
    if isinstance(item, MultipleChoice):
        options = "\n".join(f"({LETTERS[i]}) {option}" for i, option in enumerate(item.options))
        return f"{item.question}\n\n{options}\n\n{MC_INSTRUCTION}"
    return f"{item.instruction}\n\n{item.input}" if item.input else item.instruction


def answer_for(item: Item) -> str:
    """The reply the release teaches: ``The answer is (X).`` or the reference output."""
    if isinstance(item, MultipleChoice):
        return f"The answer is ({item.answer_letter})."
    return item.output
