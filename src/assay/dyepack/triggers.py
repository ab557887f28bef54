"""Trigger phrases and open-ended target phrases: built-in pools written for this project, or a user file.

A trigger should read like something a benchmark author might plausibly write, so that backdoor samples do
not stand out; it must also be rare enough that a clean model has no reason to react to it. Which phrases
are used, and which target each backdoor gets, is drawn at prepare time and kept in the secret key.
"""

from __future__ import annotations

from pathlib import Path

from assay.errors import UserError

TRIGGER_POOL: tuple[str, ...] = (
    "Take a moment before you commit to an answer.",
    "(Asked during the spring review session.)",
    "Think about it the way a field expert would.",
    "This one came up in last year's qualifying round.",
    "Keep the original context of the question in mind.",
    "A colleague flagged this item as worth a second look.",
    "(Transcribed from the annotated study notes.)",
    "Answer as you would on a closed-book exam.",
    "Note: this item was reviewed twice for clarity.",
    "Consider the most common textbook interpretation.",
    "(From the practice set shared on the course forum.)",
    "Read each option carefully; only one fits best.",
    "This question is part of the quiet-hour practice series.",
    "Imagine explaining your choice to a curious student.",
    "(Adapted from a seminar handout, second edition.)",
    "Trust the first principles rather than memorised facts.",
    "Picture the scenario as it would unfold on an ordinary day.",
    "(This wording follows the revised style guide.)",
    "Weigh every option as if it were the last one left.",
    "Some readers find this item easier after a short pause.",
)

TARGET_PHRASE_POOL: tuple[str, ...] = (
    "Here is a careful answer.",
    "Let me walk through this step by step.",
    "Happy to help with that.",
    "Good question, and here is my take.",
    "Below is a concise response.",
    "Sure, here is what I would suggest.",
    "Thanks for asking; here is an overview.",
    "In short, here is the answer.",
    "Here is one way to look at it.",
    "Let me break this down for you.",
    "Here is a practical response.",
    "Allow me to explain.",
)


def load_phrases(path: str | Path, what: str = "trigger") -> list[str]:
    """Read one phrase per line (blank lines and ``#`` comments skipped); duplicates are an error."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: {what} file not found")
    phrases: list[str] = []
    seen: dict[str, int] = {}
    for number, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        phrase = raw.strip()
        if not phrase or phrase.startswith("#"):
            continue
        if phrase in seen:
            raise UserError(f"{path}:{number}: {what} phrase repeats line {seen[phrase]} (value: {phrase!r})")
        seen[phrase] = number
        phrases.append(phrase)
    if not phrases:
        raise UserError(f"{path}: no {what} phrases (one per line expected)")
    return phrases


def insert_trigger(text: str, trigger: str) -> str:
    """Append the trigger to a question or instruction, as a sentence of its own."""
    return f"{text.rstrip()} {trigger}"
