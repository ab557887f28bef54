"""Choosing among fixed continuations by likelihood: the scores equal an independent computation (the model's
own cross-entropy loss over the continuation tokens), and calibration subtracts the baseline's scores."""

from __future__ import annotations

import pytest
import torch
from test_models_hf import tiny_llama  # noqa: F401  (fixture)

from assay.errors import UserError
from assay.models import load_model
from assay.models.cache import CachedModel, ResponseCache
from assay.models.choice import choose, continuation_logprobs, supports_choice
from assay.models.hf import render_chat

OPTIONS = ["Rating: 1", "Rating: 2", "Rating: 3", "Rating: 4"]
CONVERSATION = [{"role": "user", "content": "Did the assistant break the rule? Answer with a rating."}]
BASELINE = [{"role": "user", "content": "N/A"}]


def _loss_oracle(hf, conversation, option: str) -> float:
    """-(mean token loss x tokens) over the option, from transformers' own shifted cross entropy."""
    prompt = render_chat(hf.tokenizer, conversation)
    special = not hf._uses_template
    prompt_ids = hf.tokenizer(prompt, add_special_tokens=special)["input_ids"]
    option_ids = hf.tokenizer(option, add_special_tokens=False)["input_ids"]
    ids = torch.tensor([prompt_ids + option_ids])
    labels = ids.clone()
    labels[0, : len(prompt_ids)] = -100
    with torch.inference_mode():
        loss = hf.model(input_ids=ids, labels=labels).loss
    return -float(loss) * len(option_ids)


def test_scores_equal_the_models_own_loss_and_calibration_subtracts(tiny_llama, tmp_path) -> None:  # noqa: F811
    model = load_model(f"hf:{tiny_llama}")
    scores = continuation_logprobs(model, CONVERSATION, OPTIONS)
    expected = [_loss_oracle(model, CONVERSATION, o) for o in OPTIONS]
    assert scores == pytest.approx(expected, abs=1e-4)
    assert choose(model, [CONVERSATION], OPTIONS) == [max(range(4), key=lambda i: expected[i])]
    prior = [_loss_oracle(model, BASELINE, o) for o in OPTIONS]
    calibrated = [s - p for s, p in zip(expected, prior, strict=True)]
    wrapped = CachedModel(model, ResponseCache(tmp_path / "cache.sqlite"))
    assert supports_choice(wrapped)
    best = max(range(4), key=lambda i: calibrated[i])
    assert choose(wrapped, [CONVERSATION], OPTIONS, [BASELINE]) == [best]


def test_text_only_models_are_refused_in_one_line(tmp_path) -> None:
    module = tmp_path / "echo_model.py"
    module.write_text("def respond(prompts):\n    return ['Rating: 2' for _ in prompts]\n")
    model = load_model(f"python:{module}:respond")
    assert not supports_choice(model)
    with pytest.raises(UserError, match="needs local weights"):
        choose(model, [CONVERSATION], OPTIONS)


def test_many_conversations_in_one_call_equal_each_alone(tiny_llama) -> None:  # noqa: F811
    """``choose`` scores every conversation and distinct baseline in one batched call; the picks equal
    those from each conversation's scores alone, minus its own baseline's."""
    model = load_model(f"hf:{tiny_llama}", batch_size=2)
    conversations = [CONVERSATION, BASELINE, [{"role": "user", "content": "the cat sat"}], CONVERSATION]
    baselines = [BASELINE, BASELINE, [{"role": "user", "content": "none"}], BASELINE]
    expected = []
    for conversation, baseline in zip(conversations, baselines, strict=True):
        own = continuation_logprobs(model, conversation, OPTIONS)
        prior = continuation_logprobs(model, baseline, OPTIONS)
        scores = [s - p for s, p in zip(own, prior, strict=True)]
        expected.append(max(range(len(OPTIONS)), key=lambda i, scores=scores: (scores[i], -i)))
    assert choose(model, conversations, OPTIONS, baselines) == expected
    assert choose(model, [], OPTIONS) == []
