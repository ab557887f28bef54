"""Pick one of a few fixed continuations by the model's own likelihood, as lm-evaluation-harness asks a
model a multiple-choice question: the answer cannot be off-format, so even a tiny local model gives a
usable rating where its free text would not parse. Needs the weights (``hf:`` models); API models only
return text.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from assay.errors import UserError
from assay.models.base import ChatModel, Conversation, Conversations


def _weights(model: ChatModel) -> Any:
    """The ``HFChatModel`` under any wrappers (``CachedModel`` keeps it as ``.model``), or None."""
    from assay.models.hf import HFChatModel

    seen = model
    while not isinstance(seen, HFChatModel) and hasattr(seen, "model") and seen is not seen.model:
        seen = seen.model
    return seen if isinstance(seen, HFChatModel) else None


def supports_choice(model: ChatModel) -> bool:
    return _weights(model) is not None


def continuation_logprobs(
    model: ChatModel, conversation: Conversation, options: Sequence[str]
) -> list[float]:
    """log P(option | conversation, assistant turn started) for each option: the sum over its tokens
    (``HFChatModel.score_ids``, the scorer DyePack's log-likelihood mode uses too)."""
    return _scores(model, [conversation], options)[0]


def _scores(model: ChatModel, conversations: Conversations, options: Sequence[str]) -> list[list[float]]:
    """Each conversation's option scores from one ``score_ids`` call, so the prompts are run once each and
    batched together (the options of a prompt share its pass)."""
    hf = _weights(model)
    if hf is None:
        raise UserError(f"{model.model_id}: choosing by likelihood needs local weights (an hf: model)")
    from assay.models.hf import render_chat

    option_ids = [hf.tokenizer(o, add_special_tokens=False)["input_ids"] for o in options]
    pairs = []
    for conversation in conversations:
        prompt = render_chat(hf.tokenizer, conversation)
        prompt_ids = hf.tokenizer(prompt, add_special_tokens=not hf._uses_template)["input_ids"]
        pairs += [(prompt_ids, ids) for ids in option_ids]
    flat = hf.score_ids(pairs)
    k = len(options)
    return [flat[i * k : (i + 1) * k] for i in range(len(conversations))]


def choose(
    model: ChatModel,
    conversations: Conversations,
    options: Sequence[str],
    baselines: Conversations | None = None,
) -> list[int]:
    """For each conversation, the index of its most likely option (ties: the first).

    ``baselines`` (one per conversation) calibrates away the model's bias toward some options whatever the
    content ("Calibrate before use", Zhao et al. 2021): each option is scored by log P(option | conversation)
    - log P(option | baseline), with the baseline the same question about content-free input. Small models
    otherwise answer the first option almost always. Equal baselines are scored once; every conversation
    and baseline is scored in one batched call.
    """
    if baselines is not None and len(baselines) != len(conversations):
        raise ValueError(f"{len(conversations)} conversations but {len(baselines)} baselines")
    distinct: dict[str, Conversation] = {}
    for baseline in baselines or ():
        distinct.setdefault(repr(baseline), baseline)
    scored = _scores(model, [*conversations, *distinct.values()], options)
    priors = dict(zip(distinct, scored[len(conversations) :], strict=True))
    picks = []
    for index, scores in enumerate(scored[: len(conversations)]):
        if baselines is not None:
            scores = [s - b for s, b in zip(scores, priors[repr(baselines[index])], strict=True)]
        picks.append(max(range(len(options)), key=lambda i: (scores[i], -i)))
    return picks
