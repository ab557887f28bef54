"""STAR thematic map: c-TF-IDF against a hand count, MiniLM against sentence-transformers, the embedding
cache, planted themes recovered end to end, and a run on real HH-RLHF dialogues."""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from sklearn.feature_extraction.text import ENGLISH_STOP_WORDS
from sklearn.metrics import adjusted_rand_score

from assay.errors import UserError
from assay.star.analysis import (
    EmbeddingCache,
    HashingEmbedder,
    MiniLMEmbedder,
    class_tfidf_terms,
    dialogue_text,
    embed_texts,
    make_embedder,
    points_frame,
    table_frame,
    thematic_map,
)
from assay.star.analysis.embed import cache_key, minilm_dir

HH_RLHF = (Path(__file__).parents[2] / "../shared/data/hh-rlhf/harmless-base-test.jsonl.gz").resolve()

VOCABULARIES = {
    "weapons": "rifle pistol ammunition grenade trigger barrel sniper bullet holster cartridge explosive "
    "detonator caliber shotgun revolver silencer scope armor missile artillery",
    "medicine": "aspirin dosage insulin antibiotic vaccine symptom diagnosis tablet prescription fever "
    "nausea infection surgeon clinic ibuprofen allergy therapy virus bacteria ointment",
    "finance": "mortgage dividend portfolio investor equity bond interest loan banking credit savings stock "
    "budget taxes inflation broker pension refinance hedge fund",
    "cooking": "recipe oven flour butter garlic onion simmer saute bake sugar pasta sauce skillet roast "
    "vinegar pepper dough knead whisk marinade",
}
TOPICS = list(VOCABULARIES)
# source -> (size, topic probabilities): A mostly weapons, B mostly medicine, C finance and cooking.
MIX = {
    "A": (60, [0.8, 0.1, 0.05, 0.05]),
    "B": (50, [0.1, 0.8, 0.05, 0.05]),
    "C": (40, [0.05, 0.05, 0.45, 0.45]),
}


# ---------------------------------------------------------------- class-based TF-IDF


def _hand_ctfidf(docs_by_class: dict[str, list[str]]) -> dict[str, dict[str, float]]:
    """The c-TF-IDF formula with plain counting: tf/words(c) * log(1 + mean words per class / f(t))."""
    counts = {
        label: Counter(
            w
            for w in re.findall(r"[a-z]+", " ".join(docs).lower())
            if len(w) >= 3 and w not in ENGLISH_STOP_WORDS
        )
        for label, docs in docs_by_class.items()
    }
    total = Counter()
    for c in counts.values():
        total.update(c)
    average = sum(total.values()) / len(counts)
    return {
        label: {t: n / sum(c.values()) * math.log(1 + average / total[t]) for t, n in c.items()}
        for label, c in counts.items()
    }


def test_class_tfidf_matches_hand_computation():
    docs = {
        "guns": ["The rifle and the pistol are loaded.", "A rifle, a scope, and ammo for the rifle."],
        "food": ["Bake the bread in the oven.", "The oven is hot; bake bread and cake.", "Cake with sugar."],
        "mixed": ["A pistol in the oven is a bad idea", "we ate cake at the range"],
    }
    expected = _hand_ctfidf(docs)
    got = class_tfidf_terms(docs, top=100)
    assert set(got) == set(docs)
    for label, terms in got.items():
        assert dict(terms).keys() == expected[label].keys()
        for term, weight in terms:
            assert abs(weight - expected[label][term]) < 1e-12, (label, term)
        keys = [(-w, t) for t, w in terms]
        assert keys == sorted(keys)  # heaviest first, ties alphabetical
    assert got["guns"][0][0] == "rifle"
    assert [t for t, _ in class_tfidf_terms(docs, top=2)["food"]] == [t for t, _ in got["food"][:2]]


def test_class_tfidf_only_stop_words_gives_empty_lists():
    assert class_tfidf_terms({0: ["the and of"], 1: ["a to it"]}) == {0: [], 1: []}
    assert class_tfidf_terms({}) == {}


# ---------------------------------------------------------------- embedders


@pytest.fixture(scope="module")
def minilm() -> MiniLMEmbedder:
    try:
        minilm_dir()
    except UserError as err:
        pytest.skip(str(err))
    return MiniLMEmbedder(batch_size=2)


@pytest.mark.slow
def test_minilm_matches_sentence_transformers(minilm):
    sentence_transformers = pytest.importorskip("sentence_transformers")
    texts = [
        "A man is eating food.",
        "Someone is having a meal.",
        "The stock market fell sharply today.",
        "How do I pick a lock?",
        "word " * 400,  # longer than 256 tokens: truncated the same way
    ]
    ours = minilm.encode(texts)
    oracle = sentence_transformers.SentenceTransformer(str(minilm_dir()), device="cpu", local_files_only=True)
    theirs = oracle.encode(texts, normalize_embeddings=True)
    assert ours.dtype == np.float32 and ours.shape == (5, 384)
    np.testing.assert_allclose(ours, theirs, atol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-5)
    assert ours[0] @ ours[1] > ours[0] @ ours[2] + 0.3  # paraphrase closer than an unrelated sentence


def test_hashing_embedder_unit_rows_and_deterministic():
    embedder = HashingEmbedder(n_features=256)
    vectors = embedder.encode(["rifle pistol", "rifle pistol", "oven bread", "the"])
    assert embedder.name == "hashing-256" and vectors.dtype == np.float32 and vectors.shape == (4, 256)
    np.testing.assert_allclose(np.linalg.norm(vectors[:3], axis=1), 1.0, atol=1e-6)
    assert np.array_equal(vectors[0], vectors[1]) and not vectors[3].any()  # stop words only: zero row


class CountingEmbedder:
    """Wraps an embedder and counts the texts it was asked to encode."""

    def __init__(self, name: str = "counting"):
        self.inner, self.name, self.encoded = HashingEmbedder(n_features=64), name, 0

    def encode(self, texts: list[str]) -> np.ndarray:
        self.encoded += len(texts)
        return self.inner.encode(texts)


def test_cache_encodes_each_text_once(tmp_path):
    texts = ["rifle pistol", "oven bread", "rifle pistol", "bond stock", "oven bread"]
    embedder = CountingEmbedder()
    with EmbeddingCache(tmp_path / "cache" / "embeddings.sqlite") as cache:
        first = embed_texts(texts, embedder, cache)
        assert embedder.encoded == 3  # duplicates encoded once
        second = embed_texts(texts, embedder, cache)
        assert embedder.encoded == 3  # all hits
        assert np.array_equal(first, second) and np.array_equal(first, embed_texts(texts, CountingEmbedder()))
        assert len(cache) == 3
        other = CountingEmbedder(name="other")
        embed_texts(texts[:2], other, cache)
        assert other.encoded == 2 and len(cache) == 5  # another name is another key
    assert cache_key("a", "text") != cache_key("b", "text")
    with EmbeddingCache(tmp_path / "cache" / "embeddings.sqlite") as reopened:
        assert sorted(reopened.get_many("counting", texts)) == [0, 1, 2, 3, 4]


def test_make_embedder_names_and_plugins(tmp_path, monkeypatch):
    assert isinstance(make_embedder("hashing"), HashingEmbedder)
    assert isinstance(make_embedder("minilm"), MiniLMEmbedder)  # lazy: nothing loaded yet
    with pytest.raises(UserError, match="unknown embedder 'nope'"):
        make_embedder("nope")
    (tmp_path / "my_embedder_plugin.py").write_text(
        "import numpy as np\n"
        "class Ones:\n"
        "    name = 'ones'\n"
        "    def encode(self, texts):\n"
        "        return np.ones((len(texts), 3), dtype=np.float32) / np.sqrt(3)\n"
        "not_an_embedder = dict\n",
        encoding="utf-8",
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    plugin = make_embedder("my_embedder_plugin:Ones")
    assert plugin.name == "ones" and plugin.encode(["a", "b"]).shape == (2, 3)
    with pytest.raises(UserError, match="no callable 'Missing'"):
        make_embedder("my_embedder_plugin:Missing")
    with pytest.raises(UserError, match="needs a str 'name'"):
        make_embedder("my_embedder_plugin:not_an_embedder")
    with pytest.raises(UserError, match="cannot import module"):
        make_embedder("no_such_module_here:Thing")


def test_dialogue_text_from_list_and_json():
    turns = [
        {"index": 1, "role": "assistant", "text": "No.", "created_at": None},
        {"index": 0, "role": "user", "text": "Help me?", "created_at": None},
    ]
    assert dialogue_text(turns) == "User: Help me?\nAssistant: No."
    assert dialogue_text(json.dumps(turns)) == dialogue_text(turns)
    assert dialogue_text(turns, roles=False) == "Help me?\nNo."
    with pytest.raises(UserError, match="not JSON"):
        dialogue_text("{oops")


# ---------------------------------------------------------------- thematic map


def planted_dialogues(seed: int = 7) -> pd.DataFrame:
    """Dialogues whose words all come from one planted topic; the topic mix differs by source."""
    rng = np.random.default_rng(seed)
    rows = []
    for source, (size, mix) in MIX.items():
        for i in range(size):
            topic = TOPICS[rng.choice(len(TOPICS), p=mix)]
            words = VOCABULARIES[topic].split()
            user, assistant = (" ".join(rng.choice(words, size=8)) for _ in range(2))
            turns = [
                {"index": 0, "role": "user", "text": f"Tell me about {user}", "created_at": None},
                {"index": 1, "role": "assistant", "text": f"Sure: {assistant}", "created_at": None},
            ]
            rows.append(
                {"dialogue_id": f"{source}-{i:03d}", "source": source, "topic": topic, "turns": turns}
            )
    return pd.DataFrame(rows)


@pytest.fixture(scope="module")
def planted():
    dialogues = planted_dialogues()
    theme = thematic_map(dialogues, HashingEmbedder(), n_clusters=4, seed=3)
    return dialogues, theme


@pytest.mark.slow
def test_planted_themes_are_recovered(planted):
    dialogues, theme = planted
    topic = dict(zip(dialogues["dialogue_id"], dialogues["topic"], strict=True))
    points = points_frame(theme)
    assert list(points.columns) == ["dialogue_id", "source", "x", "y", "cluster"]
    planted_topics = [topic[d] for d in points["dialogue_id"]]
    assert adjusted_rand_score(planted_topics, points["cluster"]) > 0.8
    for cluster, terms in theme.terms.items():
        members = [t for t, c in zip(planted_topics, points["cluster"], strict=True) if c == cluster]
        majority = Counter(members).most_common(1)[0][0]
        vocabulary = set(VOCABULARIES[majority].split())
        assert len(terms) == 8 and all(term in vocabulary for term, _ in terms), (cluster, majority, terms)
    sizes = [row.n for row in theme.table]
    assert sizes == sorted(sizes, reverse=True) and sum(sizes) == theme.n == 120


@pytest.mark.slow
def test_downsampling_and_independence(planted):
    _, theme = planted
    assert theme.per_source == 40
    assert {s: (v.original, v.sampled) for s, v in theme.n_by_source.items()} == {
        "A": (60, 40),
        "B": (50, 40),
        "C": (40, 40),
    }
    assert points_frame(theme)["source"].value_counts().to_dict() == {"A": 40, "B": 40, "C": 40}
    test = theme.independence
    assert (
        test is not None
        and test.p_value < 1e-6
        and test.df == 6
        and test.n == 120
        and "chi-square" in test.test
    )
    table = table_frame(theme)
    assert list(table.columns) == [
        "cluster", "n", "count_A", "count_B", "count_C", "share_A", "share_B", "share_C", "terms",
    ]  # fmt: skip
    np.testing.assert_allclose(table[["share_A", "share_B", "share_C"]].sum(), 1.0)
    assert (theme.embedder, theme.metric, theme.n_neighbors, theme.n_clusters) == (
        "hashing-4096",
        "cosine",
        5,
        4,
    )
    assert _round_trips(theme)


def _round_trips(theme) -> bool:
    """The result survives JSON (terms keyed by int cluster)."""
    return type(theme).model_validate_json(theme.model_dump_json()) == theme


@pytest.mark.slow
def test_same_seed_same_map(planted):
    dialogues, theme = planted
    shuffled = dialogues.sample(frac=1.0, random_state=1)  # row order must not matter
    again = thematic_map(shuffled, HashingEmbedder(), n_clusters=4, seed=3)
    assert again.points == theme.points and again.terms == theme.terms


@pytest.mark.slow
def test_explicit_per_source_and_small_inputs():
    dialogues = planted_dialogues()
    theme = thematic_map(dialogues, HashingEmbedder(), n_clusters=50, n_neighbors=50, per_source=3, seed=0)
    assert theme.n == 9 and theme.n_clusters == 9 and theme.n_neighbors == 8
    assert {v.sampled for v in theme.n_by_source.values()} == {3}
    one_source = thematic_map(dialogues[dialogues["source"] == "A"].head(6), HashingEmbedder(), n_clusters=2)
    assert one_source.independence is None and "fewer than 2 sources" in one_source.reason
    three = [thematic_map(dialogues.head(3), HashingEmbedder(), seed=0) for _ in range(2)]  # spectral failed
    assert three[0].n == 3 and three[0].points == three[1].points
    pilot = [thematic_map(dialogues.head(12), HashingEmbedder(), n_neighbors=2, seed=0) for _ in range(2)]
    assert pilot[0].points == pilot[1].points  # a graph in pieces: the spectral start did not repeat
    with pytest.raises(UserError, match="at least 3 dialogues"):
        thematic_map(dialogues.head(2), HashingEmbedder())
    with pytest.raises(UserError, match="column"):
        thematic_map(dialogues.drop(columns=["turns"]), HashingEmbedder())


@pytest.mark.slow
def test_thematic_map_on_hh_rlhf():
    if not HH_RLHF.exists():
        pytest.skip(f"HH-RLHF test split not found at {HH_RLHF} (../shared/data/hh-rlhf); this test needs it")
    from assay.star.exchange import import_hh_rlhf

    dialogues = pd.DataFrame(import_hh_rlhf(HH_RLHF, limit=200))
    theme = thematic_map(dialogues, HashingEmbedder(), n_clusters=5, seed=0)
    assert theme.n == 200 and len(theme.table) == 5
    assert {p.cluster for p in theme.points} == set(range(5))
    assert all(len(theme.terms[c]) > 0 for c in range(5))
    assert theme.independence is None  # one source
