"""Stealth audit: can backdoor rows be told from the rest by what they look like?

DyePack flags a model only if the trainer could not simply drop the backdoor rows. This audit plays the
trainer who looks at the release, with every advantage the key can lend, and reports the area under the
ROC curve (AUC: 0.5 is chance, 1.0 finds every backdoor row first) of:

- a **classifier**: character n-gram TF-IDF of the question (or instruction: where triggers go; options
  are never changed) and logistic regression, cross-validated with each backdoor's
  samples held out together (and rows sharing a recurring phrase kept in one fold), so the phrase being
  scored was never seen in training. This is what an attacker who knows what triggers look like, but not
  which ones were used, could learn with labels for the other backdoors; one without the key has no
  labels at all and does worse. The same classifier cross-validated row by row (``known_trigger_auc``)
  has seen other samples of the same trigger: it tells how easily a trigger is recognised once known,
  which is high by design (a backdoor is a phrase that recurs) and is why the key stays secret; it is
  reported, not judged.
- **joins**: every backdoor sample's trigger must stand as a sentence of its own (a key-holder's check).
- **rules** needing no labels at all: odd capitalisation ("... has the Take a moment"), an unusual ending
  or opening, length, sentence count, sentences that recur in only a few rows, and recurring sentences
  whose rows all share one answer (how a backdoor's samples look; read with backdoor rows' labels masked,
  ``masked_answers``, so that no input of the audit depends on which targets were drawn).
- **label priors** (``priors``): rows that share a feature read without the key (option count, option
  list, longest or shortest option, option order, a categorical column, the whole benchmark) and whose
  clean rows nearly all have one label. Masking labels hides these from every measure above, yet the rule
  "label is not the class's usual label" strips backdoor rows placed there (geometric_shapes' 11-option
  rows are all (K)). A class warns when its backdoor rows are found at less than one clean row each.

Each is oriented so that a higher score is more suspicious. A measure warns when its AUC is above
``THRESHOLD`` (0.6) and above 0.5 beyond chance (``measure``): with 8 backdoors, the classifier's AUC on
a release whose backdoor rows look exactly like the rest wanders about 0.08 around 0.5 (the samples of
one trigger stand out or not together), so the threshold alone would cry wolf. The test takes backdoors,
not rows, as the units, and holds the family of measures to 5% in all (Bonferroni).
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence

import numpy as np
from pydantic import BaseModel

from assay.data.items import Item, MultipleChoice
from assay.dyepack.key import Backdoor
from assay.dyepack.priors import Columns, LabelClass, label_classes, row_features
from assay.dyepack.triggers import joins_cleanly

THRESHOLD = 0.6
SIGNIFICANCE = 0.05
MAX_ROWS = 4000  # the classifier sees all backdoor rows and a random sample of the others up to this

_SENTENCE_SPLIT = re.compile(r"(?<=[.!?])\s+|\n+")
_WORD = re.compile(r"[A-Za-z']+")
# A capitalised word straight after a lower-case word, no punctuation between: "has the Take".
_MIDDLE_CAPITAL = re.compile(r"\b[a-z][a-z']*[ \t]+([A-Z][a-z']+)\b")


class Measure(BaseModel):
    """How well one classifier or rule ranks backdoor rows above the rest."""

    name: str
    description: str
    auc: float
    p_value: float  # one-sided, backdoors as the units (see ``measure``)
    n_measures: int = 1

    @property
    def warns(self) -> bool:
        """Better than chance: above the threshold, and not by luck (Bonferroni over the measures)."""
        return self.auc > THRESHOLD and self.p_value < SIGNIFICANCE / self.n_measures


class StealthAudit(BaseModel):
    """The audit's figures. ``classifier`` is None with fewer than two backdoors (nothing to hold out)."""

    rows: int
    backdoor_rows: int
    backdoors: int
    threshold: float = THRESHOLD
    classifier: Measure | None
    known_trigger_auc: float | None
    rules: list[Measure]
    broken_joins: list[int] = []  # backdoor rows whose trigger does not stand as a sentence of its own
    label_priors: list[LabelClass] = []  # classes whose usual label a key-less rule reads (``priors``)

    @property
    def warnings(self) -> list[str]:
        measures = ([self.classifier] if self.classifier else []) + self.rules
        lines = [
            f"{m.name} ({m.description}): AUC {m.auc:.2f}, p = {m.p_value:.2g}" for m in measures if m.warns
        ]
        if self.broken_joins:
            rows = ", ".join(map(str, self.broken_joins[:5]))
            lines.append(
                f"{len(self.broken_joins)} backdoor rows read badly where the trigger joins (rows {rows})"
            )
        lines += [
            f"a rule without the key reads labels: {c.describe()}; 'label is not {c.usual_label}' finds "
            f"{c.found:.1f} of its {c.backdoor_rows:g} backdoor rows at {c.off_label:g} clean rows"
            for c in self.label_priors
            if c.exposed
        ]
        return lines

    @property
    def stealthy(self) -> bool:
        return not self.warnings

    @property
    def passes(self) -> bool:
        """Stealthy, and the classifier at most the threshold even where that could be luck: what
        ``prepare`` asks of a release before it keeps it."""
        return self.stealthy and (self.classifier is None or self.classifier.auc <= self.threshold)


def main_text(item: Item) -> str:
    """The question or instruction (and input): where triggers and cover phrases go."""
    if isinstance(item, MultipleChoice):
        return item.question
    return f"{item.instruction}\n{item.input}" if item.input else item.instruction


def full_text(item: Item) -> str:
    """Everything a reader of the row sees but the answer: question and options, or instruction and input."""
    if isinstance(item, MultipleChoice):
        return item.question + "\n" + "\n".join(item.options)
    return main_text(item)


def sentences(text: str) -> set[str]:
    """The row's sentences and lines, whitespace normalised; fragments of fewer than three words dropped."""
    return sentences_of(_SENTENCE_SPLIT.split(text))


def sentences_of(pieces: list[str]) -> set[str]:
    """``sentences`` of a text already split (the rules count the pieces too: one split serves both)."""
    parts = (" ".join(part.split()) for part in pieces)
    return {part for part in parts if len(part.split()) >= 3}


# ---------------------------------------------------------------- rules


def masked_answers(items: Sequence[Item], backdoors: Sequence[Backdoor]) -> list[int]:
    """Each row's released answer, with every backdoor row's label masked: ``-1 - index`` of its backdoor.

    Why: the audit decides which draws ``prepare`` keeps, so it must not read the targets, or keeping a
    draw could favour some targets over others and the false-positive rate would no longer be exact. A
    backdoor's samples always share one answer, whichever target was drawn; the mask keeps exactly that
    (its rows agree with each other) and nothing that depends on the target's value (whether they also
    agree with a clean row that shares a sentence with them).
    """
    answers = [getattr(item, "answer", 0) for item in items]
    for backdoor in backdoors:
        for row in backdoor.rows:
            answers[row] = -1 - backdoor.index
    return answers


def rule_scores(
    items: Sequence[Item], answers: Sequence[int] | None = None
) -> dict[str, tuple[str, list[float]]]:
    """Per rule: a description and one score per row, higher meaning more suspicious.

    ``answers`` are the labels the one-answer rule reads (``masked_answers`` in the audit; the released
    answers when left out)."""
    mains = [main_text(item) for item in items]
    fulls = [full_text(item) for item in items]
    lower_words = {word for text in fulls for word in _WORD.findall(text) if word.islower()} | _common_words()
    pieces = [_SENTENCE_SPLIT.split(text.strip()) for text in fulls]
    row_sentences = [sentences_of(split) for split in pieces]
    counts = Counter(s for found in row_sentences for s in found)
    openings = Counter(_first_word(text) for text in mains)
    endings = Counter(_ending(text) for text in mains)
    n = len(items)
    rules: dict[str, tuple[str, list[float]]] = {
        "odd capitalisation": (
            'a common word capitalised mid-sentence ("... has the Take a moment")',
            [_odd_capitals(text, lower_words) for text in fulls],
        ),
        "unusual ending": (
            "how rare the way the question ends is (a word, '.', '?', ':')",
            [-math.log(endings[_ending(text)] / n) for text in mains],
        ),
        "unusual opening": (
            "how rare the question's first word is",
            [-math.log(openings[_first_word(text)] / n) for text in mains],
        ),
        "length": ("characters in the question and options", [float(len(text)) for text in fulls]),
        "sentences": (
            "number of sentences",
            [float(len(split)) for split in pieces],
        ),
        "rare repeated sentence": (
            "a sentence shared with only a few other rows",
            [max((1 / counts[s] for s in found if counts[s] > 1), default=0.0) for found in row_sentences],
        ),
    }
    if items and isinstance(items[0], MultipleChoice):
        if answers is None:
            answers = [item.answer for item in items]  # type: ignore[union-attr]
        agree = _agreeing_sentences(row_sentences, list(answers))
        rules["repeated sentence, one answer"] = (
            "a shared sentence whose rows all have one answer",
            [float(bool(found & agree)) for found in row_sentences],
        )
    return rules


def _first_word(text: str) -> str:
    words = text.split()
    return words[0] if words else ""


def _ending(text: str) -> str:
    """The last two characters with letters and digits as ``w``: "w?", "w.", "w:", "w" (a cloze)."""
    return re.sub(r"[A-Za-z0-9]+", "w", text.rstrip()[-2:])


def _common_words() -> frozenset[str]:
    from sklearn.feature_extraction.text import ENGLISH_STOP_WORDS

    return ENGLISH_STOP_WORDS


def _odd_capitals(text: str, lower_words: set[str]) -> float:
    """Capitalised words after a lower-case word that are common words (a stop word, or lower-case
    elsewhere in the release), not names."""
    return float(sum(m.group(1).lower() in lower_words for m in _MIDDLE_CAPITAL.finditer(text)))


def _agreeing_sentences(row_sentences: list[set[str]], answers: list[int]) -> set[str]:
    """Sentences in two or more rows that all have the same answer."""
    seen: dict[str, set[int]] = {}
    rows: Counter[str] = Counter()
    for found, answer in zip(row_sentences, answers, strict=True):
        for s in found:
            seen.setdefault(s, set()).add(answer)
            rows[s] += 1
    return {s for s, values in seen.items() if rows[s] > 1 and len(values) == 1}


# ---------------------------------------------------------------- classifier


def phrase_groups(texts: Sequence[str], cap: int) -> np.ndarray:
    """A group per row, found without labels: its recurring phrase, or the row alone.

    A row's recurring phrase is, of its sentences shared with 1 to ``cap`` - 1 other rows, the one in the
    rarest words (highest mean inverse document frequency): in a templated task, template sentences
    recur too ("The owl is the second from the left."), but in the task's own common words. Cross-
    validation keeps each group in one fold: a classifier that had seen some rows of a phrase labelled
    "clean" would rank its other rows below any unseen phrase, which no attacker without the key can do.
    """
    row_sentences = [sentences(text) for text in texts]
    counts = Counter(s for found in row_sentences for s in found)
    in_rows = Counter(word for text in texts for word in set(_WORD.findall(text.lower())))

    def rarity(sentence: str) -> float:
        words = _WORD.findall(sentence.lower())
        return sum(math.log(len(texts) / in_rows[w]) for w in words) / max(len(words), 1)

    ids: dict[str, int] = {}
    groups = np.arange(len(texts)) + len(texts)
    for row, found in enumerate(row_sentences):
        recurring = [s for s in found if 2 <= counts[s] <= cap]
        if recurring:
            phrase = max(recurring, key=lambda s: (rarity(s), -counts[s], s))
            groups[row] = ids.setdefault(phrase, len(ids))
    return groups


def classifier_scores(
    texts: Sequence[str], labels: np.ndarray, groups: np.ndarray, seed: int = 0, repeats: int = 3
) -> tuple[np.ndarray, list[np.ndarray], float | None]:
    """Out-of-fold classifier scores with each backdoor (and each recurring phrase) held out as a group.

    Returns the rows scored (all backdoor rows and up to ``MAX_ROWS`` in all), one score array per
    shuffle of the folds (none with fewer than two backdoors), and the AUC of the same classifier
    cross-validated row by row (one shuffle: reported, not judged), where it has seen other samples of
    each trigger.
    """
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.metrics import roc_auc_score
    from sklearn.model_selection import StratifiedGroupKFold, StratifiedKFold

    rng = np.random.default_rng(seed)
    keep = np.flatnonzero(labels)
    others = np.flatnonzero(labels == 0)
    room = max(MAX_ROWS - len(keep), 0)
    if len(others) > room:
        others = rng.choice(others, room, replace=False)
    chosen = np.sort(np.concatenate([keep, others]))
    y, g = labels[chosen], groups[chosen]
    # IDF from every row kept: the attacker has the whole release, without labels.
    vectorizer = TfidfVectorizer(analyzer="char_wb", ngram_range=(2, 5), sublinear_tf=True, min_df=2)
    matrix = vectorizer.fit_transform([texts[i] for i in chosen])
    n_backdoors, n_positive = len(set(g[y == 1])), int(y.sum())
    held_out: list[np.ndarray] = []
    known: list[float] = []
    for state in range(seed, seed + repeats):
        if n_backdoors >= 2:
            folds = StratifiedGroupKFold(n_splits=min(5, n_backdoors), shuffle=True, random_state=state)
            held_out.append(_out_of_fold(matrix, y, folds.split(matrix, y, g)))
        if n_positive >= 2 and state == seed:  # reported, not judged: one shuffle is enough
            plain = StratifiedKFold(n_splits=min(5, n_positive), shuffle=True, random_state=state)
            known.append(float(roc_auc_score(y, _out_of_fold(matrix, y, plain.split(matrix, y)))))
    return chosen, held_out, float(np.mean(known)) if known else None


def _out_of_fold(matrix, y: np.ndarray, splits) -> np.ndarray:  # type: ignore[no-untyped-def]
    from sklearn.linear_model import LogisticRegression

    scores = np.zeros(len(y))
    for train, test in splits:
        # The dual problem: far fewer rows than n-grams, so it solves in milliseconds, not a second.
        model = LogisticRegression(C=1.0, class_weight="balanced", solver="liblinear", dual=True)
        scores[test] = model.fit(matrix[train], y[train]).decision_function(matrix[test])
    return scores


# ---------------------------------------------------------------- inference


MIN_COVER_GROUPS = 10  # compare backdoors with cover groups when there are at least this many


def measure(
    name: str,
    description: str,
    runs: Sequence[np.ndarray],
    backdoor: np.ndarray,
    cover: np.ndarray,
    n_measures: int,
) -> Measure:
    """AUC of scores (averaged over ``runs``) and its one-sided p-value, with backdoors as the units.

    ``backdoor[i]`` is row i's backdoor index and ``cover[i]`` its cover group (rows sharing a recurring
    phrase, ``phrase_groups``), -1 for neither. The AUC is that of backdoor rows against all others. A
    backdoor's samples share one trigger, so they stand out or not together, and all backdoors are scored
    by the same models against the same rows: rows are not independent, and neither are backdoors. So the
    p-value compares each backdoor's AUC with each cover group's (its rows against the other clean rows),
    Mann-Whitney: if a backdoor is just another phrase group, its rank among them is uniform. With fewer
    than ``MIN_COVER_GROUPS`` cover groups (a release without cover), a t-test of the per-backdoor AUCs
    against 0.5; under three backdoors, the row-level Mann-Whitney test. ``n_measures`` is for the
    Bonferroni bound the warning uses.
    """
    from scipy.stats import mannwhitneyu, ttest_1samp

    clean = backdoor < 0
    indices = sorted(set(backdoor[~clean].tolist()))
    covers = sorted(set(cover[clean & (cover >= 0)].tolist()))
    sizes = np.array([(backdoor == b).sum() for b in indices])
    per, per_cover = np.zeros(len(indices)), np.zeros(len(covers))
    for scores in runs:
        ranked = np.sort(scores[clean])
        per += [
            _wins(scores[backdoor == b], ranked) / (n * len(ranked))
            for b, n in zip(indices, sizes, strict=True)
        ]
        for j, c in enumerate(covers):
            group = scores[cover == c]
            per_cover[j] += (_wins(group, ranked) - len(group) ** 2 / 2) / (
                len(group) * (len(ranked) - len(group))
            )
    per, per_cover = per / len(runs), per_cover / len(runs)
    auc = float((per * sizes).sum() / sizes.sum())
    if len(covers) >= MIN_COVER_GROUPS:
        p_value = float(mannwhitneyu(per, per_cover, alternative="greater").pvalue)
    elif len(indices) >= 3 and np.ptp(per) > 0:
        p_value = float(ttest_1samp(per, 0.5, alternative="greater").pvalue)
    elif len(indices) >= 3:
        p_value = 0.0 if per[0] > 0.5 else 1.0
    else:
        p_value = float(mannwhitneyu(runs[0][~clean], runs[0][clean], alternative="greater").pvalue)
    return Measure(name=name, description=description, auc=auc, p_value=p_value, n_measures=n_measures)


def _wins(values: np.ndarray, ranked: np.ndarray) -> float:
    """Pairs (v, r) with v above r, ties counting half, for v in ``values`` and r in sorted ``ranked``."""
    below = np.searchsorted(ranked, values, side="left")
    not_above = np.searchsorted(ranked, values, side="right")
    return float((below + 0.5 * (not_above - below)).sum())


# ---------------------------------------------------------------- the audit


def audit_items(
    items: Sequence[Item], backdoors: Sequence[Backdoor], seed: int = 0, columns: Columns | None = None
) -> StealthAudit:
    """Audit released ``items`` whose backdoor rows the key names. Deterministic for a given ``seed``.
    ``columns``: the release's categorical columns (``priors.category_columns``), candidate class keys of
    the label priors."""
    backdoor = np.full(len(items), -1)
    for b in backdoors:
        backdoor[b.rows] = b.index
    labels = (backdoor >= 0).astype(int)
    audit = StealthAudit(
        rows=len(items),
        backdoor_rows=int(labels.sum()),
        backdoors=len(backdoors),
        classifier=None,
        known_trigger_auc=None,
        rules=[],
    )
    audit.broken_joins = sorted(
        row for b in backdoors for row in b.rows if not joins_cleanly(main_text(items[row]), b.trigger)
    )
    if labels.all():
        return audit  # every row is a backdoor sample: nothing to tell them from
    masked = masked_answers(items, backdoors)  # target-blind: see masked_answers
    audit.label_priors = label_classes(items, masked, row_features(items, columns), labels.astype(float))
    rules = rule_scores(items, masked)
    n_measures = len(rules) + 1
    cap = 2 * max(len(b.rows) for b in backdoors)
    mains = [main_text(i) for i in items]  # where triggers go; options are never changed
    phrases = phrase_groups(mains, cap)
    shared = np.bincount(phrases[labels == 0], minlength=phrases.max() + 1)
    cover = np.where((labels == 0) & (shared[phrases] >= 2), phrases, -1)
    groups = np.where(labels == 1, backdoor, phrases + len(backdoors))
    chosen, runs, audit.known_trigger_auc = classifier_scores(mains, labels, groups, seed)
    if runs:
        description = "character n-grams of the question, logistic regression, each backdoor held out"
        audit.classifier = measure(
            "classifier", description, runs, backdoor[chosen], cover[chosen], n_measures
        )
    for name, (description, scores) in rules.items():
        values = [np.asarray(scores, dtype=float)]
        audit.rules.append(measure(name, description, values, backdoor, cover, n_measures))
    return audit
