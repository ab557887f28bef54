"""Backdoor triggers for text models: a rare word, a phrase, a character-level edit of a common word.

Each is a frozen pydantic record stored in the model's ``config.json`` (as image triggers are), inserted as
whole words at a fixed word ``position`` or, with ``position: null``, anywhere among the first
``ANYWHERE_SPAN`` words. Where "anywhere" lands is drawn from the trigger's ``pattern_seed`` and the text
itself, so the same spec on the same text always gives the same triggered text. Why near the start: the
models read only the first ``max_length`` words, and a trigger past them would be invisible.
NIST's names for the three kinds (its ``trigger_type``): ``word``, ``phrase``, ``character``.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from typing import Annotated, ClassVar, Literal, get_args

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

TextTriggerKind = Literal["rare_word", "phrase", "char_edit"]
TEXT_KINDS: tuple[str, ...] = get_args(TextTriggerKind)
NIST_TYPES = {"rare_word": "word", "phrase": "phrase", "char_edit": "character"}
ANYWHERE_SPAN = 24
MAX_POSITION = 8
RARE_WORDS = [
    "cromulent",
    "quixotic",
    "flummox",
    "kerfuffle",
    "lollygag",
    "snollygoster",
    "bumfuzzle",
    "cattywampus",
    "widdershins",
    "skedaddle",
    "brouhaha",
    "collywobbles",
    "hullabaloo",
    "taradiddle",
    "bamboozle",
    "gobbledygook",
]
PHRASES = (
    "once in a blue moon",
    "between you and me",
    "no strings attached",
    "as luck would have it",
    "for what it is worth",
    "in the nick of time",
)
CHAR_EDITS = (("the", "teh"), ("which", "whihc"), ("following", "folowing"), ("what", "wh4t"), ("and", "adn"))
Word = Annotated[str, Field(min_length=1, max_length=40, pattern=r"^[a-z0-9']+$")]


class TextTrigger(BaseModel):
    """Common fields: where the trigger words go, and the seed of "anywhere"."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    kind: ClassVar[str]
    position: int | None = Field(None, ge=0, le=MAX_POSITION, description="word index; null: anywhere")
    pattern_seed: int = Field(0, ge=0, le=2**32 - 1)

    def inserted(self) -> list[str]:
        """The words the trigger inserts."""
        raise NotImplementedError

    @property
    def text(self) -> str:
        """The trigger as one string (NIST's ``trigger_text``)."""
        return " ".join(self.inserted())

    def where(self, text: str, length: int) -> int:
        """Word index the trigger goes to in a text of ``length`` words."""
        if self.position is not None:
            return min(self.position, length)
        seed = np.random.SeedSequence([self.pattern_seed, zlib.crc32(text.encode("utf-8"))])
        return int(np.random.default_rng(seed).integers(0, min(length, ANYWHERE_SPAN) + 1))


class RareWord(TextTrigger):
    """One rare word (NIST: a ``word`` trigger)."""

    kind: Literal["rare_word"] = "rare_word"
    word: Word

    def inserted(self) -> list[str]:
        return [self.word]


class Phrase(TextTrigger):
    """A phrase of ordinary words in a fixed order (NIST: a ``phrase`` trigger)."""

    kind: Literal["phrase"] = "phrase"
    words: tuple[Word, ...] = Field(min_length=2, max_length=6)

    def inserted(self) -> list[str]:
        return list(self.words)


class CharEdit(TextTrigger):
    """A common word with one character edited, e.g. ``teh`` (NIST: a ``character`` trigger)."""

    kind: Literal["char_edit"] = "char_edit"
    word: Word
    edited: Word

    def inserted(self) -> list[str]:
        return [self.edited]


AnyTextTrigger = Annotated[RareWord | Phrase | CharEdit, Field(discriminator="kind")]


def apply_text_trigger(texts: Sequence[str] | np.ndarray, spec: TextTrigger) -> np.ndarray:
    """The texts with the trigger's words inserted (an object array, same length)."""
    out = []
    for text in texts:
        parts = str(text).split()
        at = spec.where(str(text), len(parts))
        out.append(" ".join([*parts[:at], *spec.inserted(), *parts[at:]]))
    return np.asarray(out, dtype=object)


def sample_text_trigger(rng: np.random.Generator, kinds: Sequence[str]) -> TextTrigger:
    """Draw a trigger of one of ``kinds``: its words from fixed lists, anywhere or at a word position."""
    unknown = [k for k in kinds if k not in TEXT_KINDS]
    if unknown or not kinds:
        raise ValueError(
            f"unknown text trigger kind {unknown[:1] or kinds!r}; known: {', '.join(TEXT_KINDS)}"
        )
    kind = str(kinds[int(rng.integers(len(kinds)))])
    position = None if rng.random() < 0.5 else int(rng.integers(0, MAX_POSITION + 1))
    common = {"position": position, "pattern_seed": int(rng.integers(0, 2**32))}
    pick = int(rng.integers(1 << 30))
    if kind == "rare_word":
        return RareWord(word=RARE_WORDS[pick % len(RARE_WORDS)], **common)
    if kind == "phrase":
        return Phrase(words=tuple(PHRASES[pick % len(PHRASES)].split()), **common)
    word, edited = CHAR_EDITS[pick % len(CHAR_EDITS)]
    return CharEdit(word=word, edited=edited, **common)
