"""Log-likelihood scoring that reads each shared context once (``hf_scoring.score_shared``) gives the scores
of the per-pair path (each pair one whole row, ``score_joined``) on a tiny random-init Llama with a
byte-level BPE tokenizer: multi-token, single-token and unequal options, mixed contexts, a continuation
that does not start with a space, and a model whose cache cannot be copied."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from pathlib import Path

import pytest
from tests.tiny_lm import build_tiny_lm

from assay.errors import UserError
from assay.models import load_model

TEXTS = [
    "The following paragraphs each describe a set of five objects arranged in a fixed order.",
    "On a branch, there are five birds: a quail, an owl, a raven, a falcon, and a robin.",
    "The owl is the leftmost. The robin is to the left of the raven. The quail is the rightmost.",
    "Options:\n(A) The quail is the rightmost\n(B) The owl is the rightmost\n(C) The raven\nAnswer: (A)",
    "Answer: A B C D E F G\nThe answer is (B).",
] * 4
CONTEXT = (
    "The owl is the leftmost. The robin is to the left of the raven.\nOptions:\n(A) quail\n(B) owl\nAnswer:"
)
OTHER = "On a branch, there are five birds: a quail and an owl. Answer:"


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    """One intra-op thread: the model is tiny and the 2 cores are shared."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return build_tiny_lm(TEXTS, tmp_path_factory.mktemp("tiny-bpe"), vocab_size=400, hidden=64, layers=2)


@pytest.fixture(scope="module")
def model(tiny):
    return load_model(f"hf:{tiny}", batch_size=3)


def both(model, requests):
    """(shared, joined) scores of the same requests, and the ids each scored."""
    model.share_contexts = True
    shared = model.loglikelihood(requests)
    model.share_contexts = False
    try:
        joined = model.loglikelihood(requests)
    finally:
        model.share_contexts = True
    return shared, joined


def ids(model, text: str) -> list[int]:
    return model.tokenizer(text, add_special_tokens=False)["input_ids"]


def test_multi_token_options_of_one_context(model):
    options = [" (A) The quail is the rightmost", " (B) The owl is the rightmost", " (C) The raven"]
    assert all(len(ids(model, o)) > 2 for o in options)
    shared, joined = both(model, [(CONTEXT, o) for o in options])
    assert shared == pytest.approx(joined, abs=1e-5)


def test_single_token_options_come_from_the_next_token_distribution(model):
    options = [" A", " B", " C", " D", " E"]
    assert all(len(ids(model, o)) == 1 for o in options)
    shared, joined = both(model, [(CONTEXT, o) for o in options])
    assert shared == pytest.approx(joined, abs=1e-5)


def test_options_of_different_lengths(model):
    options = [" A", " (B)", " (C) The raven", " The quail is the rightmost", "\n(A)"]
    assert len({len(ids(model, o)) for o in options}) >= 3
    shared, joined = both(model, [(CONTEXT, o) for o in options])
    assert shared == pytest.approx(joined, abs=1e-5)


def test_pairs_with_different_contexts_mixed_in_one_call(model):
    """Contexts of different lengths interleaved (more than ``batch_size`` of them, so several context
    passes), repeated pairs included: every score lands at its own position."""
    contexts = [CONTEXT, OTHER, "The owl", OTHER + " The quail is", "Answer:"]
    options = [" (A)", " (B) The owl", " A"]
    requests = [(c, o) for o in options for c in contexts] + [(OTHER, " (A)")]
    reported: dict[int, float] = {}
    model.share_contexts = True
    shared = model.loglikelihood(requests, lambda i, s: reported.setdefault(i, s))
    assert reported == dict(enumerate(shared))  # each position reported once, with its score
    _, joined = both(model, requests)
    assert shared == pytest.approx(joined, abs=1e-5)
    assert shared[-1] == pytest.approx(shared[len(contexts) * 0 + 1], abs=1e-6)


def test_a_continuation_that_does_not_start_with_a_space(model):
    """``The quail is the right`` + ``most``: tokenized together, BPE merges ``rightmost`` across the
    boundary; scored apart (the rule kept from before) the ids are the context's then the continuation's,
    and both paths score those same ids."""
    context = "The quail is the right"
    options = ["most", ":(A)", "\n(C)", "(B)"]
    together = [model.tokenizer(context + o, add_special_tokens=False)["input_ids"] for o in options]
    apart = [ids(model, context) + ids(model, o) for o in options]
    assert together != apart  # the boundary merges for some option: scoring apart is a choice kept
    shared, joined = both(model, [(context, o) for o in options])
    assert shared == pytest.approx(joined, abs=1e-5)


def test_empty_parts_are_refused_before_any_pass(model):
    with pytest.raises(UserError, match="non-empty context and continuation"):
        model.loglikelihood([(CONTEXT, " A"), (CONTEXT, "")])


def test_a_cache_that_cannot_be_copied_falls_back_to_whole_rows(model, monkeypatch):
    import assay.models.hf_scoring as scoring

    monkeypatch.setattr(scoring, "_copyable", lambda _cache: False)
    requests = [(CONTEXT, " (A) The quail"), (CONTEXT, " A"), (OTHER, " (B)")]
    shared, joined = both(model, requests)
    assert shared == pytest.approx(joined, abs=1e-5)
