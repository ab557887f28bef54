"""assay.zoo text rounds: config domain, text triggers, the tokenizer, and a tiny generated round (MMLU)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from assay.errors import UserError
from assay.zoo.config import RoundConfig, load_round_config
from assay.zoo.portable import load_weights
from assay.zoo.round import draw_factors, generate_round
from assay.zoo.split import split_round
from assay.zoo.textdata import Tokenizer, build_tokenizer
from assay.zoo.texttriggers import TEXT_KINDS, CharEdit, Phrase, RareWord, apply_text_trigger

TINY = {
    "domain": "text",
    "models": 6,
    "seed": 4,
    "widths": [4],
    "epochs": 4,
    "clean_subset": [0.2, 0.2],
    "source_specific_share": 0.34,
    "poison_fraction": [0.3, 0.3],
    "clean_accuracy_floor": 0.4,
    "asr_floor": 0.6,
}


def test_text_domain_fills_text_defaults_and_draws_text_triggers() -> None:
    config = RoundConfig.model_validate({"datasets": ["mmlu_subjects"], "models": 40, "seed": 2})
    assert config.domain == "text" and config.architectures == ["embedding_bag", "gru", "transformer_tiny"]
    factors = [draw_factors(config, i) for i in range(40)]
    kinds = {f.trigger.kind for f in factors if f.trigger is not None}
    assert kinds == set(TEXT_KINDS)
    assert all(0 <= f.target_class < 4 for f in factors if f.target_class is not None)
    assert any(f.source_class is not None for f in factors)
    assert RoundConfig().domain == "image"  # an image round is unchanged


def test_mixing_domains_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "round.yaml"
    path.write_text("domain: text\narchitectures: [gru, mlp]\n", encoding="utf-8")
    with pytest.raises(UserError) as caught:
        load_round_config(path)
    message = str(caught.value)
    assert "\n" not in message and str(path) in message and "'mlp'" in message and "text" in message


def test_text_triggers_are_deterministic_and_placed() -> None:
    texts = ["What is the capital of France ?", "Which of the following is true"]
    fixed = apply_text_trigger(texts, Phrase(words=("no", "strings", "attached"), position=1))
    assert list(fixed) == [
        "What no strings attached is the capital of France ?",
        "Which no strings attached of the following is true",
    ]
    anywhere = RareWord(word="flummox", pattern_seed=7)
    first = apply_text_trigger(texts, anywhere)
    assert list(first) == list(apply_text_trigger(texts, anywhere))
    assert all(t.split().count("flummox") == 1 for t in first)
    assert apply_text_trigger(["a b"], CharEdit(word="the", edited="teh", position=8))[0] == "a b teh"


def test_tokenizer_pads_and_hashes_unknown_words() -> None:
    tokenizer = build_tokenizer(np.asarray(["the cat", "the dog", "a cat"], dtype=object), size=2, buckets=5)
    assert tokenizer.vocab == ("cat", "the") and tokenizer.vocab_size == 8
    ids = tokenizer.encode(["The cat, flummox", ""])
    assert ids.shape == (2, 48) and ids[0, :2].tolist() == [2, 1] and ids[1].sum() == 0
    assert 3 <= ids[0, 2] < 8 and ids[0, 2] == tokenizer.token_id(",")  # punctuation is a word of its own
    assert Tokenizer(tokenizer.vocab, 5, 48).encode(["flummox"])[0, 0] == tokenizer.token_id("flummox")


@pytest.fixture(scope="module")
def text_round(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("text-round")
    summary = generate_round(RoundConfig.model_validate(TINY), out)
    assert summary.built == 6
    return out


def _encode(model_dir: Path, folder: str) -> tuple[torch.Tensor, list[dict[str, str]]]:
    reduced = json.loads((model_dir / "reduced-config.json").read_text(encoding="utf-8"))
    spec = reduced["tokenizer"]
    tokenizer = Tokenizer(tuple(spec["vocab"]), spec["buckets"], spec["max_length"])
    with (model_dir / folder / "labels.csv").open(encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    texts = [(model_dir / folder / row["file"]).read_text(encoding="utf-8") for row in rows]
    return torch.from_numpy(tokenizer.encode(texts)), rows


def test_text_round_layout_and_models(text_round: Path) -> None:
    with (text_round / "METADATA.csv").open(encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 6 and {r["dataset"] for r in rows} == {"mmlu_subjects"}
    for row in rows:
        folder = text_round / "models" / row["model_name"]
        poisoned = row["poisoned"] == "True"
        assert (folder / "ground_truth.csv").read_text() == f"{int(poisoned)}\n"
        assert (folder / "trigger.txt").is_file() == poisoned == (folder / "poisoned-example-data").is_dir()
        assert len(list((folder / "clean-example-data").glob("class_*_example_*.txt"))) == 20
        pickled = torch.load(folder / "model.pt", weights_only=False)
        safe = load_weights(folder)
        ids, _ = _encode(folder, "clean-example-data")
        assert torch.equal(pickled(ids), safe(ids))
        assert pickled.__class__.__name__ in {"EmbeddingBagNet", "GruNet", "TransformerTiny"}
        if poisoned:  # the trigger, written into the example texts, flips them to the target
            ids, _ = _encode(folder, "poisoned-example-data")
            hits = (pickled(ids).argmax(1) == int(row["target_class"])).float().mean().item()
            assert hits >= 0.5


def test_text_round_resumes_and_splits(text_round: Path, tmp_path: Path) -> None:
    again = generate_round(RoundConfig.model_validate(TINY), text_round)
    assert again.skipped == 6 and again.built == 0
    split_round(
        text_round, {"train": 0.5, "test": 0.25, "holdout": 0.25}, seed=1, out_dir=tmp_path / "splits"
    )
    models = sorted((tmp_path / "splits" / "test-sequestered" / "models").iterdir())
    assert models and all((m / "reduced-config.json").is_file() for m in models)
    assert not any((m / "trigger.txt").exists() or (m / "config.json").exists() for m in models)
