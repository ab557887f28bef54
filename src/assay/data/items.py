"""Benchmark items: what every reader produces and every pillar consumes, whatever the file looked like."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"

Kind = Literal["multiple_choice", "open_ended"]


@dataclass(frozen=True)
class MultipleChoice:
    """A question with K lettered options; ``answer`` indexes ``options`` (0 is A)."""

    question: str
    options: tuple[str, ...]
    answer: int

    @property
    def k(self) -> int:
        return len(self.options)

    @property
    def answer_letter(self) -> str:
        return LETTERS[self.answer]


@dataclass(frozen=True)
class OpenEnded:
    """An instruction, an optional input and a reference output (Alpaca-style)."""

    instruction: str
    input: str
    output: str


Item = MultipleChoice | OpenEnded


def item_kind(item: Item) -> Kind:
    return "multiple_choice" if isinstance(item, MultipleChoice) else "open_ended"


def content_fingerprint(items: Sequence[Item]) -> str:
    """SHA-256 of the items' content, independent of file format, column names and row encoding.

    A release converted from CSV to JSONL keeps its fingerprint; any change to a question, an option,
    an answer or an output changes it.
    """
    digest = hashlib.sha256()
    for item in items:
        # vars(): the fields as they are (str, tuples of str), encoded exactly as asdict's deep copies
        # were, at half the cost (verify fingerprints every row of a 14,000-row release).
        record = {"kind": item_kind(item), **vars(item)}
        digest.update(json.dumps(record, sort_keys=True, ensure_ascii=False).encode("utf-8"))
        digest.update(b"\n")
    return "sha256:" + digest.hexdigest()
