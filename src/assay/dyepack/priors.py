"""Label priors: rows whose label a rule without the key reads from the row's shape.

In BIG-Bench Hard geometric_shapes every 11-option row is labelled (K). A backdoor sample on such a row
carries a target drawn uniformly from its 11 options, so 10 times in 11 its label is not (K), and the rule
"11 options and label != (K)" finds it without the key and at no cost: no clean row breaks the rule. The
stealth audit's other measures mask labels (``audit.masked_answers``), so they cannot see this.

A **class** is the rows that share one value of a feature read without the key: the option count, the
option list itself, which option is the longest or the shortest, whether the options are in order, a
categorical column of the row (a subject, a source: ``category_columns``), or the whole benchmark (its
label prior). Its **usual label** is the most common label of its clean rows. The rule "label is not the
class's usual label" removes the clean rows that break it (what it costs) and each backdoor row in the
class whose target is not the usual label ((K-1)/K of them, over the uniform target draw, whatever the
target turns out to be). A class is **concentrated** when its usual label holds at least ``CONCENTRATED``
of its clean rows, and **exposes** its backdoor rows when, concentrated, the rule costs less than one clean
row per backdoor row removed: ``strip.StripRisk.cost`` below 1, the measure the strip risk reports.

``prepare`` sets exposed classes aside before it draws placements (``set_aside``): it reads only the
clean labels and the features, never a target, so the targets stay uniform and independent of it.
Multiple choice only: an open-ended backdoor's label is a target phrase, not an option position.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np
from pydantic import BaseModel, computed_field

from assay.data.items import LETTERS, Item, MultipleChoice

MIN_CLASS_ROWS = 5  # fewer clean rows than this and a usual label is not evident to anyone without the key
CONCENTRATED = 0.8  # the usual label's share of the clean rows at which a class is reported
SHOWN = 60  # characters of a value kept in reports
_NUMBER = re.compile(r"\s*[-+]?\d+(?:\.\d+)?\s*")

Columns = Mapping[str, Sequence[str | None]]  # a categorical column's value per row (None: no value)
Features = dict[str, list[str | None]]  # feature -> each row's value (None: the row is in no class of it)


class LabelClass(BaseModel):
    """Rows sharing one key-less feature value, their usual label and what the rule against it costs.

    ``backdoor_rows`` are the release's backdoor rows in the class (the audit) or the number a uniform
    placement is expected to put there (``prepare``); ``found`` the backdoor rows the rule is expected to
    remove; ``off_label`` the clean rows it removes, those whose label is not the usual one (``prepare``:
    expected, the rows a backdoor takes no longer being clean)."""

    feature: str
    value: str
    rows: int
    clean_rows: int
    usual_label: str
    usual_share: float  # of the clean rows
    off_label: float
    backdoor_rows: float
    found: float

    @computed_field  # type: ignore[prop-decorator]
    @property
    def cost(self) -> float | None:
        """Clean rows lost per backdoor row removed (None when the rule would remove none)."""
        return self.off_label / self.found if self.found else None

    @computed_field  # type: ignore[prop-decorator]
    @property
    def exposed(self) -> bool:
        """The class is concentrated and the rule finds its backdoor rows at less than one clean row each.

        Concentrated as well: with many backdoor rows about (a high ``--fraction``), dropping any rows at
        all costs little per backdoor row, but a usual label that only a bare majority of the clean rows
        has is not one anyone without the key could tell from the backdoor rows' random labels."""
        return self.usual_share >= CONCENTRATED and self.cost is not None and self.cost < 1

    def describe(self) -> str:
        """``options = 11 (30 rows, 100% labelled (K))``."""
        share = f"{self.usual_share:.0%} labelled {self.usual_label}"
        return f"{self.feature} = {self.value} ({self.rows} rows, {share})"


def describe_all(classes: Sequence[LabelClass], limit: int = 3) -> str:
    """The first ``limit`` classes described, and how many more: for one-line messages."""
    named = "; ".join(c.describe() for c in classes[:limit])
    return named + (f"; and {len(classes) - limit} more" if len(classes) > limit else "")


def letter(index: int) -> str:
    return f"({LETTERS[index]})"


def _unique_extreme(lengths: list[int], pick: Any) -> str | None:
    """The letter of the one option of extreme length, or None on a tie."""
    value = pick(lengths)
    return letter(lengths.index(value)) if lengths.count(value) == 1 else None


def _order(options: tuple[str, ...]) -> str | None:
    """``ascending`` or ``descending`` for three or more options in strict order (as numbers where all
    are numbers, else as text); two options are always in one order or the other, so they have none."""
    if len(options) < 3:
        return None
    if all(_NUMBER.fullmatch(option) for option in options):
        keys: list[Any] = [float(option) for option in options]
    else:
        keys = [option.strip().casefold() for option in options]
    ordered = sorted(keys)
    if len(set(keys)) < len(keys):
        return None
    return "ascending" if keys == ordered else "descending" if keys == ordered[::-1] else None


def option_features(options: tuple[str, ...]) -> tuple[str | None, str | None, str | None]:
    """The longest option's letter, the shortest one's (None on a tie) and the options' order."""
    lengths = [len(option.strip()) for option in options]
    return _unique_extreme(lengths, max), _unique_extreme(lengths, min), _order(options)


def _shown(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= SHOWN else text[: SHOWN - 3] + "..."


def row_features(items: Sequence[Item], columns: Columns | None = None) -> Features:
    """Each key-less feature's value per row, in the order classes are reported (multiple choice only;
    open-ended items have none). ``columns``: ``category_columns`` of the benchmark, if it has any."""
    if not items or not isinstance(items[0], MultipleChoice):
        return {}
    mcs: list[MultipleChoice] = list(items)  # type: ignore[arg-type]
    known: dict[tuple[str, ...], tuple[str | None, str | None, str | None]] = {}  # templated tasks repeat
    shapes = [known.get(i.options) or known.setdefault(i.options, option_features(i.options)) for i in mcs]
    longest, shortest, order = (list(values) for values in zip(*shapes, strict=True))
    features: Features = {
        "every row": ["all"] * len(mcs),
        "options": [str(item.k) for item in mcs],
        "longest option": longest,
        "shortest option": shortest,
        "option order": order,
        "option list": [" | ".join(item.options) for item in mcs],
    }
    for name, values in (columns or {}).items():
        features[f"column {name}"] = list(values)
    return features


def category_columns(bench: Any) -> dict[str, list[str | None]]:
    """The row's columns other than the item's own (question, options, answer), as text per row: candidate
    class keys (a subject, a source, a style). A column holding lists or objects has no class; one with a
    value per row has only classes too small to count. Found by writing a changed item into a row with the
    benchmark's style and seeing which columns change, so any layout works; a benchmark without a table
    (built in memory) has none."""
    from assay.data.styles import RenderError, get_style

    table = getattr(bench, "table", None)
    if table is None or not table.rows or not isinstance(bench.items[0], MultipleChoice):
        return {}
    style = get_style(bench.style)
    own: set[str] = set()
    for row, item in list(zip(table.rows, bench.items, strict=True))[:20]:
        changed = (
            replace(item, question=item.question + " x"),
            replace(item, answer=(item.answer + 1) % item.k),
            replace(item, options=tuple(f"{option} x" for option in item.options)),
        )
        for other in changed:
            try:
                out = style.render(row, other)
            except RenderError:
                continue
            own |= {name for name in set(row) | set(out) if row.get(name) != out.get(name)}
    names = dict.fromkeys(name for row in table.rows for name in row if name not in own)
    return {name: [_category(row.get(name)) for row in table.rows] for name in names}


def _category(value: Any) -> str | None:
    if isinstance(value, bool | int | float | str) and str(value).strip():
        return str(value)
    return None


def label_classes(
    items: Sequence[Item],
    answers: Sequence[int],
    features: Features,
    placed: Sequence[float],
) -> list[LabelClass]:
    """The concentrated classes (at least ``MIN_CLASS_ROWS`` clean rows, the usual label on at least
    ``CONCENTRATED`` of them), exposed ones first.

    ``answers``: each row's label, negative for a backdoor row (``audit.masked_answers``: the class's
    usual label and cost read clean rows only, never a target). ``placed``: backdoor rows at each row, 1 or
    0 in a release, the chance a uniform placement picks it in ``prepare``."""
    return [found for found, _ in _classes(items, answers, features, placed)]


def _groups(values: Sequence[str | None]) -> list[tuple[str, np.ndarray]]:
    """Rows by value, for the values held by at least ``MIN_CLASS_ROWS`` rows, in order of first row."""
    members: dict[str, list[int]] = {}
    for row, value in enumerate(values):
        if value is not None:
            members.setdefault(value, []).append(row)
    return [(name, np.array(rows)) for name, rows in members.items() if len(rows) >= MIN_CLASS_ROWS]


def _classes(
    items: Sequence[Item], answers: Sequence[int], features: Features, placed: Sequence[float]
) -> list[tuple[LabelClass, np.ndarray]]:
    """``label_classes`` with each class's rows; a class with the same rows as an earlier one is left out."""
    if not features:
        return []
    labels = np.asarray(answers)
    clean = labels >= 0
    chance = np.asarray(placed, dtype=float)
    ks = np.array([item.k for item in items])  # type: ignore[union-attr]
    removed = chance * (ks - 1) / ks  # a backdoor row is found unless its target is the usual label
    found: list[tuple[LabelClass, np.ndarray]] = []
    seen: set[bytes] = set()
    for feature, values in features.items():
        for name, rows in _groups(values):
            on_clean = rows[clean[rows]]
            if len(on_clean) < MIN_CLASS_ROWS:
                continue
            counts = np.bincount(labels[on_clean])
            usual = int(counts.argmax())
            if (share := float(counts[usual] / len(on_clean))) < CONCENTRATED:
                continue
            if (signature := rows.tobytes()) in seen:  # the same rows by another feature
                continue
            seen.add(signature)
            off_rows = on_clean[labels[on_clean] != usual]
            off = len(off_rows) - chance[off_rows].sum()  # a row a backdoor takes is no longer clean
            label_class = LabelClass(
                feature=feature,
                value=_shown(name),
                rows=len(rows),
                clean_rows=len(on_clean),
                usual_label=letter(usual),
                usual_share=share,
                off_label=float(off),
                backdoor_rows=float(chance[rows].sum()),
                found=float(removed[rows].sum()),
            )
            found.append((label_class, rows))
    found.sort(key=lambda pair: (not pair[0].exposed, -pair[0].usual_share, -pair[0].rows))
    return found


def set_aside(
    items: Sequence[Item], columns: Columns | None, rows: Sequence[int], n_samples: int
) -> tuple[list[int], list[LabelClass]]:
    """Of the candidate ``rows``, those left once every class that would expose ``n_samples`` backdoor
    rows placed uniformly among them is set aside, and those classes (with their figures when found).

    Setting rows aside puts more backdoor rows on each row left, which may expose another class: repeated
    until none is found. Reads the source labels and the features only (no target, no randomness), so the
    targets drawn later stay uniform and independent of what it sets aside."""
    features = row_features(items, columns)
    answers = [getattr(item, "answer", 0) for item in items]
    candidate = np.zeros(len(items), dtype=bool)
    candidate[list(rows)] = True
    aside = np.zeros(len(items), dtype=bool)
    exposed: dict[bytes, LabelClass] = {}  # by their rows: a value shown cut short may not be unique
    while True:
        left = candidate & ~aside
        chance = min(1.0, n_samples / left.sum()) if left.any() else 0.0
        placed = np.where(left, chance, 0.0)
        new = [
            (label_class, members)
            for label_class, members in _classes(items, answers, features, placed)
            if label_class.exposed and members.tobytes() not in exposed
        ]
        if not new:
            break
        for label_class, members in new:
            exposed[members.tobytes()] = label_class
            aside[members] = True
    return np.flatnonzero(candidate & ~aside).tolist(), list(exposed.values())
