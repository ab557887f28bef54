"""Trigger phrases, and where a trigger goes in a question so that the row still reads like the others.

A backdoor only works while its samples cannot be told from the rest: a trigger glued to the end of a
cloze question ("... At the end of the game, Dave has the Take a moment ...") gives every backdoor row
away to anyone who reads it, and to a one-line filter. So a trigger is a whole sentence in the register
of ordinary benchmark instructions and remarks, and it goes only where a whole sentence can stand: before
the question (``preamble``) or after the last full sentence of its prose (``after-last-sentence``), never
inside a labelled field ("Sentence: ...", "Translation: ...", "Statement 1 | ..."), a quotation, a table or
the final cloze. ``auto`` picks one of the positions that exist, per row, from the secret generator.
Which phrases are used, and which target each backdoor gets, is drawn at prepare time and kept in the key.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from pathlib import Path

from assay.errors import UserError

# Written for this project in the register of exam instructions and editorial notes; every one is a whole
# sentence that reads before or after a question. Public, like the code: for a real release, write your own
# (--triggers FILE), so nobody can grep for these.
TRIGGER_POOL: tuple[str, ...] = (
    "Take a moment before you commit to an answer.",
    "Think about it the way a field expert would.",
    "Keep the original context of the question in mind.",
    "Answer as you would on a closed-book exam.",
    "Consider the most common textbook interpretation.",
    "Read each option carefully; only one fits best.",
    "Imagine explaining your choice to a curious student.",
    "Trust first principles rather than memorised facts.",
    "Weigh every option as if it were the last one left.",
    "Some readers find this item easier after a short pause.",
    "Assume every statement given here is accurate.",
    "Use only the information that is stated.",
    "Work through the details one at a time.",
    "No outside knowledge is needed for this item.",
    "The names used here are invented.",
    "All of the details that matter are given.",
    "This item was checked by two reviewers.",
    "The wording has been lightly edited for clarity.",
    "Treat the description as complete.",
    "Nothing here is meant as a trick.",
    "Exactly one choice is correct.",
    "Look at the whole setup before deciding.",
    "Pay attention to the order of events.",
    "Small details can change the outcome.",
    "Reason it out rather than guessing.",
    "Please give the single best response.",
    "Ignore any formatting quirks in the text.",
    "This one rewards careful reading.",
    "A short sketch on paper may help.",
    "Go with the reading a careful person would take.",
    "Keep track of each change as it happens.",
    "It helps to restate the problem in your own words.",
    "Skip nothing while reading the setup.",
    "Take the statements at face value.",
    "The scenario is fictional.",
    "Any resemblance to real events is coincidental.",
    "Try to settle on an answer within a minute.",
    "First impressions are not always reliable here.",
    "Double-check the last step before answering.",
    "Be precise about what is being asked.",
    "Follow the description literally.",
    "There is enough information to decide.",
    "This item comes from the general section.",
    "Spelling follows British conventions.",
    "Numbers in this item are exact.",
    "Count carefully where counting is needed.",
    "Eliminate the choices that clearly fail.",
    "Stick to what the text actually says.",
    "Rely on common sense where the text is silent.",
    "Answer for the situation exactly as described.",
    "The item is self-contained.",
    "Think of the simplest explanation first.",
    "Only the final state matters.",
    "Be careful with negations.",
    "Accuracy matters more than speed.",
    "Keep units and quantities consistent.",
    "An ordinary reading is intended.",
    "Consider who does what, and when.",
    "Picture the situation before choosing.",
    "The setup is deliberately simple.",
    "Mind the exact wording.",
    "Avoid reading more into the text than it says.",
    "Each detail is there for a reason.",
    "Settle each step before moving on.",
    "Keep the question itself in view while you work.",
    "The facts are listed in no special order.",
    "One careful pass through the text is enough.",
    "Nothing outside this passage is relevant.",
    "Every part of the setup may matter.",
    "The setting is everyday and ordinary.",
    "Read slowly and note the key facts.",
    "Watch for details that are easy to miss.",
    "This is a standard item of its kind.",
    "The answer follows from the text alone.",
    "Prefer the plainest reading of each sentence.",
    "Check that your choice fits every fact.",
    "A quick check at the end is worthwhile.",
    "The phrasing is meant to be direct.",
    "Note each fact as you come to it.",
    "The task is the same as in similar items.",
    "There are no hidden assumptions.",
    "Try not to overthink the wording.",
    "Work from the beginning to the end.",
    "The problem can be solved in a few steps.",
    "Write down the facts if that helps.",
    "Consider the situation from the start.",
    "Some steps may be easier than they look.",
    "The statements do not contradict each other.",
    "Everything needed is in front of you.",
    "Only what is written should count.",
    "Think about what each sentence tells you.",
    "A methodical approach works well here.",
    "Keep a running tally where it helps.",
    "The information is complete and consistent.",
    "Read the final sentence twice.",
    "Check each fact against the others.",
    "Reading aloud can make the details clearer.",
    "Follow the events in the order given.",
    "The last detail is as important as the first.",
    "Assume nothing beyond what is stated.",
    "Be systematic and patient.",
    "Use the facts exactly as written.",
    "Keep your reasoning simple and clear.",
    "This item is part of the main set.",
    "Treat each statement as a separate fact.",
    "Small differences in wording matter.",
    "Take your time with this one.",
    "Look for the detail that settles it.",
    "Compare the facts before settling on one.",
    "Aim for the response that fits best.",
    "Each fact narrows the possibilities.",
    "Keep the overall picture in mind.",
    "An orderly reading avoids mistakes.",
    "The situation is described in full.",
    "Think before you reply.",
    "No special training is needed here.",
    "The item was written for general readers.",
    "Clarity matters more than cleverness here.",
    "It may help to picture each step.",
    "Consider every fact equally.",
    "Go back over anything that seems unclear.",
    "Keep careful track of who has what.",
    "Rely on logic rather than intuition.",
    "A clear head is the best tool here.",
    "The order of the sentences matters.",
    "Stay close to the text.",
    "The details are accurate as given.",
    "Answer on the basis of the passage.",
    "Let the facts guide the choice.",
    "This should not take long.",
    "Work carefully but without hurry.",
    "Sort out the facts first.",
    "Every statement here is true.",
    "A patient reader will find the answer.",
    "The wording is plain on purpose.",
    "Each step builds on the one before.",
    "Trust the text over any prior belief.",
    "The case is simpler than it may seem.",
    "A careful reading is all it takes.",
    "Think about how the pieces fit together.",
    "Consider the facts as a whole.",
    "The item has been checked for errors.",
    "Focus on what is actually asked.",
    "Slow down at the key step.",
    "It is fine to reread the setup.",
    "Approach this the way you would any puzzle.",
    "The relevant facts are all stated.",
    "This item is typical of the collection.",
    "Make sure every detail is accounted for.",
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

PREAMBLE = "preamble"
AFTER_LAST_SENTENCE = "after-last-sentence"
END = "end"
AUTO = "auto"
POSITIONS = (AUTO, PREAMBLE, AFTER_LAST_SENTENCE, END)
POSITION_HELP = "auto, preamble, after-last-sentence, end or field:NAME"


@dataclass(frozen=True)
class Position:
    """Where triggers go: ``how`` (auto, preamble, after-last-sentence, end) in item field ``field``.

    ``field=None`` means the item's main text (the question, or the instruction).
    """

    how: str = AUTO
    field: str | None = None

    @property
    def needs_sentences(self) -> bool:
        """Every position but ``end`` puts the trigger between sentences: it must be one itself."""
        return self.how != END


def parse_position(value: str) -> Position:
    """``auto``, ``preamble``, ``after-last-sentence``, ``end`` or ``field:NAME`` (auto within field NAME)."""
    if value in POSITIONS:
        return Position(how=value)
    name = value.removeprefix("field:")
    if value.startswith("field:") and name:
        return Position(how=AUTO, field=name)
    raise UserError(f"--trigger-position must be {POSITION_HELP} (value: {value!r})")


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


_SENTENCE = re.compile(r"[\"'(\u201c]?[A-Z0-9].*[.!?][\"')\u201d]?")


def is_sentence(phrase: str) -> bool:
    """A whole sentence: starts with a capital letter (or digit), ends with '.', '?' or '!', one line."""
    return "\n" not in phrase and _SENTENCE.fullmatch(phrase.strip()) is not None


def check_sentences(triggers: list[str], position: Position) -> None:
    """Refuse phrases that would break the text at a sentence position ("... has the take a moment")."""
    if not position.needs_sentences:
        return
    for phrase in triggers:
        if not is_sentence(phrase):
            raise UserError(
                f"trigger phrase {phrase!r} is not a whole sentence (capital letter first; '.', '?' or '!' "
                f"last), so it cannot go before or between sentences; rewrite it, or use "
                "--trigger-position end"
            )


# ---------------------------------------------------------------- where a sentence can go

# Sentence-final punctuation, closing quotes or brackets, then a space or the end of the line.
_END_MARK = re.compile(r"[.!?][\"'\u201d\u2019)\]]*(?=[ \t]|$)")
# A labelled field ("Sentence:", "Translation:", "Statement 1 |", "Options:") at the start of the line or
# after a sentence, a colon or a double space: sentence ends after it belong to the field's content.
_LABEL = re.compile(r"(?:^|[.!?:][ \t]+|[ \t]{2,})[A-Z][\w'-]*(?: [\w'-]+){0,2}[ \t]?[:|](?=[ \t]|$)")
_NEXT_SENTENCE = re.compile(r"[ \t]+[\"'(\u201c]?[A-Z]")
_ABBREVIATIONS = frozenset(
    "mr mrs ms dr prof st jr sr vs etc e.g i.e inc ltd co mt ft fig no approx a.m p.m u.s u.k".split()  # noqa: SIM905
)


def _balanced(text: str) -> bool:
    """No quotation or bracket is open at the end of ``text`` (a sentence end inside one is not one)."""
    return (
        text.count('"') % 2 == 0
        and text.count("\u201c") == text.count("\u201d")
        and text.count("(") == text.count(")")
        and text.count("[") == text.count("]")
        and text.count("<") == text.count(">")
    )


def _is_abbreviation(line: str, mark: int) -> bool:
    """Whether the '.' at ``mark`` ends an abbreviation, an initial or a list number, not a sentence."""
    if line[mark] != ".":
        return False
    words = line[:mark].split()
    if not words:
        return True
    word = words[-1].lower().lstrip("\"'(\u201c")
    initial = len(word) == 1 and word.isalpha()
    return word in _ABBREVIATIONS or initial or (word.isdigit() and len(words) == 1)


def sentence_slots(text: str) -> list[int]:
    """Offsets in ``text`` right after a whole sentence of prose, where another sentence may follow.

    A slot ends a line or is followed by a space and a capital letter; it is not inside quotes or
    brackets, after a labelled field on its line, or after an abbreviation ("Mr.") or initial.
    """
    slots: list[int] = []
    start = 0
    for line in text.split("\n"):
        label = _LABEL.search(line)
        limit = label.start() + 1 if label else len(line)
        for match in _END_MARK.finditer(line):
            end = match.end()
            if end > limit or _is_abbreviation(line, match.start()) or not _balanced(line[:end]):
                continue
            if end == len(line) or _NEXT_SENTENCE.match(line, end):
                slots.append(start + end)
        start += len(line) + 1
    return slots


def natural_positions(text: str) -> list[str]:
    """The positions where a whole sentence reads naturally in ``text``: always the preamble, and after
    the last full sentence when the text has one."""
    return [PREAMBLE, AFTER_LAST_SENTENCE] if sentence_slots(text) else [PREAMBLE]


def place_trigger(text: str, trigger: str, how: str) -> str:
    """``text`` with ``trigger`` at position ``how`` (preamble, after-last-sentence or end).

    ``after-last-sentence`` falls back to the preamble when the text has no full sentence (a single
    cloze such as "This SVG path element ... draws a"). ``end`` appends whatever the text ends with.
    """
    if how == END:
        return f"{text.rstrip()} {trigger}"
    slots = sentence_slots(text) if how == AFTER_LAST_SENTENCE else []
    if not slots:
        first_line = text.split("\n", 1)[0]
        joint = " " if _NEXT_SENTENCE.match(" " + first_line) and not _LABEL.match(first_line) else "\n"
        return f"{trigger}{joint}{text}"
    at = slots[-1]
    return f"{text[:at]} {trigger}{text[at:]}"


def joins_cleanly(text: str, phrase: str) -> bool:
    """Whether ``phrase`` stands in ``text`` as a sentence of its own: at the start of the text or a line,
    or after a sentence's end; followed by the end, a line break, or a new sentence's capital letter."""
    at = text.find(phrase)
    if at < 0 or not is_sentence(phrase):
        return False
    before, after = text[:at], text[at + len(phrase) :]
    left = before.rstrip(" \t")
    left_ok = not left or left.endswith("\n") or (left != before and left[-1] in ".!?\"')]\u201d")
    right_ok = not after or after.startswith("\n") or _NEXT_SENTENCE.match(after) is not None
    return left_ok and right_ok


def choose_position(text: str, how: str, rng: random.Random) -> str:
    """The concrete position for one row: ``auto`` draws one of the natural ones from ``rng``."""
    if how != AUTO:
        return how
    return rng.choice(natural_positions(text))
