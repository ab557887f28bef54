"""hf backend: batched left-padded generation equals one-by-one, on a tiny Llama built here; SmolLM2 GGUF."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from pathlib import Path

import pytest

from assay.models import GenerationParams, load_model, render_chat, user_turn

WORDS = ["the", "cat", "dog", "sat", "ran", "on", "a", "mat", "log", "red", "blue", "big", "small"]
WORDS += ["and", "then", "it", "was", "very", "happy", "sad"]


def _build_tiny_llama(directory: Path, *, with_pad: bool = True) -> Path:
    """A word-level tokenizer (no chat template) and a random-init 2-layer Llama, saved as an HF folder."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    specials = ["<unk>", "<eos>", "<pad>"] if with_pad else ["<unk>", "<eos>"]
    vocab = {token: i for i, token in enumerate(specials + WORDS)}
    word_level = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    word_level.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=word_level,
        unk_token="<unk>",
        eos_token="<eos>",
        pad_token="<pad>" if with_pad else None,
    )
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(vocab),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        eos_token_id=vocab["<eos>"],
        bos_token_id=None,
        pad_token_id=vocab.get("<pad>"),
    )
    LlamaForCausalLM(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    """One intra-op thread: these models are too small to gain from two, and torch's spinning OpenMP
    threads make CPU generation many times slower when another process shares the 2 cores."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory) -> Path:
    return _build_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


PROMPTS = [
    "the cat",
    "a big red dog ran on the mat and then it sat",
    "blue",
    "the small cat was very happy and the big dog was sad",
    "it ran",
]


def test_batched_left_padded_greedy_equals_one_by_one(tiny_llama):
    params = GenerationParams(max_new_tokens=8)
    conversations = [user_turn(p) for p in PROMPTS]
    batched = load_model(f"hf:{tiny_llama}", batch_size=8)
    seen: dict[int, str] = {}
    together = batched.chat(conversations, params, on_result=seen.__setitem__)
    alone = load_model(f"hf:{tiny_llama}", batch_size=1).chat(conversations, params)
    assert together == alone
    assert seen == dict(enumerate(together))
    assert all(text.strip() == text for text in together)
    assert sum(bool(text) for text in together) >= 3  # a random model also emits specials, decoded away
    assert set(" ".join(together).split()) <= set(WORDS)


def test_pad_token_falls_back_to_eos_and_batches_of_three(tmp_path):
    directory = _build_tiny_llama(tmp_path / "nopad", with_pad=False)
    model = load_model(f"hf:{directory}", batch_size=3)
    assert model.tokenizer.pad_token == "<eos>"
    params = GenerationParams(max_new_tokens=5)
    conversations = [user_turn(p) for p in PROMPTS]
    assert model.chat(conversations, params) == [model.chat([c], params)[0] for c in conversations]


def test_sampling_is_reproducible_with_a_seed(tiny_llama):
    model = load_model(f"hf:{tiny_llama}")
    params = GenerationParams(max_new_tokens=6, temperature=1.0, seed=7)
    conversations = [user_turn(p) for p in PROMPTS[:3]]
    assert model.chat(conversations, params) == model.chat(conversations, params)


def test_render_chat_fallback_without_template(tiny_llama):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_llama)
    assert render_chat(tokenizer, user_turn("the cat sat")) == "the cat sat"
    conversation = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
        {"role": "user", "content": "and then"},
    ]
    assert render_chat(tokenizer, conversation) == "User: hi\nAssistant: hello\nUser: and then\nAssistant:"
    assert render_chat(tokenizer, conversation, add_generation_prompt=False).endswith("User: and then")


def test_completion_and_batched_loglikelihood_equal_the_models_own_loss(tiny_llama):
    """Plain-text scores (context and continuation tokenized apart, batches of 2 right-padded rows of
    different lengths) equal minus transformers' own cross entropy times the continuation's tokens."""
    import torch

    model = load_model(f"hf:{tiny_llama}", batch_size=2)
    requests = [("the cat", " sat on a mat"), ("a big red dog ran", " on"), ("blue", " and then it was sad")]
    scores = model.loglikelihood(requests)
    for (context, continuation), score in zip(requests, scores, strict=True):
        context_ids = model.tokenizer(context)["input_ids"]
        continuation_ids = model.tokenizer(continuation, add_special_tokens=False)["input_ids"]
        ids = torch.tensor([context_ids + continuation_ids])
        labels = ids.clone()
        labels[0, : len(context_ids)] = -100
        with torch.inference_mode():
            loss = float(model.model(input_ids=ids, labels=labels).loss)
        assert score == pytest.approx(-loss * len(continuation_ids), abs=1e-4)
    params = GenerationParams(max_new_tokens=5)  # without a chat template, chat sends the text as it is
    assert model.complete(PROMPTS, params) == model.chat([user_turn(p) for p in PROMPTS], params)


def test_model_id_changes_when_weights_change(tmp_path):
    directory = _build_tiny_llama(tmp_path / "m")
    first = load_model(f"hf:{directory}").model_id
    weights = next(directory.glob("*.safetensors"))
    os.utime(weights, ns=(weights.stat().st_atime_ns, weights.stat().st_mtime_ns + 10**9))
    assert load_model(f"hf:{directory}").model_id != first


def _fake_gguf_conversion(monkeypatch, tmp_path: Path) -> list[Path]:
    """``_load`` with a GGUF file returns the tiny Llama (standing for transformers' slow conversion) and
    records the call; a GGUF of ours cannot be written here, the cache around the conversion is the test."""
    from assay.models import hf

    tiny = _build_tiny_llama(tmp_path / "tiny")
    monkeypatch.setenv("ASSAY_MODEL_CACHE", str(tmp_path / "cache"))
    conversions: list[Path] = []
    real_load = hf._load

    def fake_load(directory, extra, dtype):
        if "gguf_file" not in extra:
            return real_load(directory, extra, dtype)
        conversions.append(directory / extra["gguf_file"])
        return real_load(tiny, {}, dtype)

    monkeypatch.setattr(hf, "_load", fake_load)
    return conversions


def test_gguf_is_dequantised_once_then_read_from_the_cache(tmp_path, monkeypatch):
    conversions = _fake_gguf_conversion(monkeypatch, tmp_path)
    gguf = tmp_path / "weights" / "m.gguf"
    gguf.parent.mkdir()
    gguf.write_bytes(b"GGUF version one")
    params = GenerationParams(max_new_tokens=4)
    first = load_model(f"hf:{gguf}")
    second = load_model(f"hf:{gguf}")
    assert conversions == [gguf]  # the second load read the saved folder
    assert first.chat([user_turn("the cat")], params) == second.chat([user_turn("the cat")], params)
    assert first.model_id == second.model_id and ".gguf@" in first.model_id  # the file is the identity
    gguf.write_bytes(b"GGUF version two")  # changed in place: a new key, converted again
    load_model(f"hf:{gguf}")
    assert conversions == [gguf, gguf]
    cache = tmp_path / "cache"
    assert len([d for d in cache.iterdir() if (d / "config.json").is_file()]) == 2
    assert not [d for d in cache.iterdir() if d.name.startswith(".")]  # no scratch copy left behind


def test_a_copy_another_process_saved_first_is_kept(tmp_path, monkeypatch):
    """Two processes converting one file at once: the one that renames second keeps the first's copy and
    leaves no scratch folder. (Threads would not do: transformers' loading patches torch globally.)"""
    import shutil

    import torch

    from assay.models import hf

    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    tiny = _build_tiny_llama(tmp_path / "tiny")
    monkeypatch.setenv("ASSAY_MODEL_CACHE", str(tmp_path / "cache"))
    target = tmp_path / "cache" / hf.gguf_key(gguf, torch.float32)
    real_load = hf._load

    def slower_than_the_other(directory, extra, dtype):
        shutil.copytree(tiny, target)  # the other process renames its complete copy in meanwhile
        (target / "winner").touch()
        return real_load(tiny, {}, dtype)

    monkeypatch.setattr(hf, "_load", slower_than_the_other)
    hf.load_hf(gguf.parent, gguf.name)
    assert (target / "winner").is_file() and (target / "config.json").is_file()
    assert [d.name for d in target.parent.iterdir() if d.name != "hashes"] == [target.name]


def test_a_files_hash_is_remembered_until_its_mtime_changes(tmp_path, monkeypatch):
    """The cache key's sha256 is read from a memo while the file's inode, size and mtime are unchanged;
    a new mtime means hashing again, and a file changed within the last seconds is never remembered."""
    import hashlib
    import json
    import os
    import time

    from assay.models import hf

    monkeypatch.setenv("ASSAY_MODEL_CACHE", str(tmp_path / "cache"))
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF weights")
    real = hashlib.sha256(b"GGUF weights").hexdigest()
    assert hf.content_sha256(gguf) == real
    assert not (tmp_path / "cache" / "hashes").exists()  # written just now: racy, not remembered
    hour_ago = time.time() - 3600
    os.utime(gguf, (hour_ago, hour_ago))
    assert hf.content_sha256(gguf) == real
    (memo,) = (tmp_path / "cache" / "hashes").iterdir()
    kept = json.loads(memo.read_text())
    memo.write_text(json.dumps({**kept, "sha256": "f" * 64}))  # a memo that is read says so
    assert hf.content_sha256(gguf) == "f" * 64
    os.utime(gguf, (hour_ago - 60, hour_ago - 60))  # touched: hashed again, the memo replaced
    assert hf.content_sha256(gguf) == real
    assert json.loads(memo.read_text())["sha256"] == real


def test_a_cache_that_cannot_be_written_costs_a_warning_not_the_load(tmp_path, monkeypatch):
    conversions = _fake_gguf_conversion(monkeypatch, tmp_path)
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the cache folder would go")
    monkeypatch.setenv("ASSAY_MODEL_CACHE", str(blocker / "models"))
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    params = GenerationParams(max_new_tokens=3)
    with pytest.warns(UserWarning, match=r"cannot keep the de-quantised model in .*ASSAY_MODEL_CACHE"):
        model = load_model(f"hf:{gguf}")
    assert model.chat([user_turn("the dog")], params)[0]  # the converted model answers all the same
    with pytest.warns(UserWarning):
        load_model(f"hf:{gguf}")
    assert conversions == [gguf, gguf]  # nothing kept: each load converted


@pytest.mark.slow
def test_smollm2_from_the_cache_holds_the_gguf_weights():
    """Independent oracle: the ``gguf`` package's own de-quantisation of two tensors of the file equals the
    weights of the model loaded through the cache (exactly: both are the same float32 values)."""
    import numpy as np
    from gguf import GGUFReader
    from gguf.quants import dequantize

    from assay.assets import asset_path
    from assay.models import load_hf

    path = asset_path("smollm2")
    model, _ = load_hf(path.parent, path.name)
    tensors = {t.name: t for t in GGUFReader(path).tensors}
    for name, weight in [
        ("token_embd.weight", model.get_input_embeddings().weight),
        ("blk.29.ffn_down.weight", model.get_decoder().layers[29].mlp.down_proj.weight),
    ]:
        tensor = tensors[name]
        expected = dequantize(tensor.data, tensor.tensor_type).reshape(weight.shape)
        np.testing.assert_array_equal(weight.detach().numpy(), expected.astype(np.float32))


@pytest.mark.slow
def test_smollm2_gguf_answers(tmp_path):
    from assay.assets import asset_path

    model = load_model(f"hf:{asset_path('smollm2')}", batch_size=2)
    assert model.model_id.startswith("hf:") and ".gguf@" in model.model_id
    prompt = render_chat(model.tokenizer, user_turn("What is the capital of France?"))
    assert "<|im_start|>assistant" in prompt  # SmolLM2's chat template is used
    replies = model.chat(
        [user_turn("What is the capital of France? Answer in one word."), user_turn("Say hello.")],
        GenerationParams(max_new_tokens=12),
    )
    assert "paris" in replies[0].lower()
    assert replies[1] and "<|im_end|>" not in replies[1]
