"""Log-likelihood scoring with a transformers causal LM, each shared context read once.

Why: multiple-choice scoring asks K (context, continuation) pairs that share one long context (a BBH
question of 200-300 tokens) and differ in a few answer tokens. Read as K whole rows, the context is run K
times and the vocabulary projection is computed at every position, though only the continuation's positions
are scored. Here the pairs are grouped by their context's ids; each distinct context is run once (batched
across samples, right-padded) with its key/value cache kept and only its last position projected to the
vocabulary, which scores every continuation's first token; the rest of each continuation (its tokens but
the last) is run on a copy of its context's cache, the K copies batched. Single-token continuations (`` A``
after ``Answer:``) need no second pass at all.

The ids scored are exactly the ids given: nothing is re-tokenized here, so a continuation whose text would
merge with the context's last token when tokenized together is still scored as the caller tokenized it
apart (``HFChatModel.loglikelihood``'s rule), and the numbers equal :func:`score_joined`'s up to float
summation order (~1e-6). A model whose cache is not a plain :class:`~transformers.DynamicCache` (sliding
windows, recurrent layers) has its multi-token pairs scored by :func:`score_joined`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from assay.errors import UserError
from assay.models.base import OnScore

Pair = tuple[list[int], list[int]]

# How many cached context tokens one continuation pass may copy, per ``batch_size`` slot: K copies of a long
# context's cache are the new path's main memory cost (SmolLM2-135M: ~46 kB per token), kept below what the
# joined path's full-vocabulary logits took (~200 kB per token).
CACHE_TOKENS_PER_SLOT = 1024


def check_pairs(pairs: Sequence[Pair]) -> None:
    """Refuse an empty context or continuation before any forward pass (neither can be scored)."""
    for context, continuation in pairs:
        if not context or not continuation:
            raise UserError("log-likelihood needs a non-empty context and continuation")


def _padded(rows: Sequence[Sequence[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ids and their attention mask."""
    width = max(len(row) for row in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for index, row in enumerate(rows):
        ids[index, : len(row)] = torch.tensor(row, dtype=torch.long)
        mask[index, : len(row)] = 1
    return ids, mask


@torch.inference_mode()
def score_joined(
    model: Any,
    pairs: Sequence[Pair],
    batch_size: int,
    pad: int,
    on_result: OnScore | None = None,
    positions: Sequence[int] | None = None,
) -> list[float]:
    """Each pair as one whole row (context + continuation), ``batch_size`` rows per forward pass,
    right-padded (the real tokens keep their positions, padding is masked): the scorer before contexts
    were shared, kept as the reference and for models whose cache cannot be copied. ``positions`` are the
    indices ``on_result`` reports (default: 0, 1, ...)."""
    check_pairs(pairs)
    where = list(positions) if positions is not None else list(range(len(pairs)))
    scores: list[float] = [0.0] * len(pairs)
    for start in range(0, len(pairs), batch_size):
        batch = pairs[start : start + batch_size]
        ids, mask = _padded([c + x for c, x in batch], pad)
        logits = model(input_ids=ids, attention_mask=mask).logits.float()
        for row, (context, continuation) in enumerate(batch):
            steps = torch.arange(len(context) - 1, len(context) + len(continuation) - 1)
            logprobs = torch.log_softmax(logits[row, steps], dim=-1)
            score = float(logprobs[torch.arange(len(continuation)), torch.tensor(continuation)].sum())
            scores[start + row] = score
            if on_result is not None:
                on_result(where[start + row], score)
    return scores


@torch.inference_mode()
def score_shared(
    model: Any, pairs: Sequence[Pair], batch_size: int, pad: int, on_result: OnScore | None = None
) -> list[float]:
    """The same scores as :func:`score_joined`, each distinct context run once (see the module
    docstring). Contexts go longest first, ``batch_size`` per pass, so ``on_result(i, score)`` fires in
    that order, each pair once, when its score is complete."""
    check_pairs(pairs)
    groups: dict[tuple[int, ...], list[int]] = {}
    for index, (context, _) in enumerate(pairs):
        groups.setdefault(tuple(context), []).append(index)
    contexts = sorted(groups, key=len, reverse=True)
    scores: list[float] = [0.0] * len(pairs)
    for start in range(0, len(contexts), batch_size):
        chunk = contexts[start : start + batch_size]
        members = [groups[context] for context in chunk]
        for index, score in _score_contexts(model, pairs, chunk, members, batch_size, pad):
            scores[index] = score
            if on_result is not None:
                on_result(index, score)
    return scores


def _score_contexts(
    model: Any,
    pairs: Sequence[Pair],
    contexts: Sequence[tuple[int, ...]],
    members: Sequence[list[int]],
    batch_size: int,
    pad: int,
) -> list[tuple[int, float]]:
    """(pair index, score) for every pair of these contexts: one pass over the contexts, then the
    continuations' later tokens on copies of their context's cache."""
    ids, mask = _padded(contexts, pad)
    lengths = mask.sum(dim=1)
    longer = [(i, g) for g, group in enumerate(members) for i in group if len(pairs[i][1]) > 1]
    options: dict[str, Any] = {"use_cache": bool(longer)}
    last = lengths - 1
    column = last
    if _keeps_positions(model):  # project only the contexts' last positions to the vocabulary
        kept, column = torch.unique(last, return_inverse=True)  # a 1-D tensor: the same for every row
        options["logits_to_keep"] = kept
    out = model(input_ids=ids, attention_mask=mask, **options)
    logits = out.logits[torch.arange(len(contexts)), column]
    first = torch.log_softmax(logits.float(), dim=-1)  # next-token log-probs after each context
    partial = {i: float(first[g, pairs[i][1][0]]) for g, group in enumerate(members) for i in group}
    cache = out.past_key_values
    if longer and not _copyable(cache):
        rest = [i for i, _ in longer]
        joined = score_joined(model, [pairs[i] for i in rest], batch_size, pad)
        partial.update(zip(rest, joined, strict=True))
        return [(i, partial[i]) for group in members for i in group]
    per_pass = max(1, batch_size * CACHE_TOKENS_PER_SLOT // ids.shape[1])
    for start in range(0, len(longer), per_pass):
        rows = longer[start : start + per_pass]
        tails = _continue(model, cache, mask, lengths, [(pairs[i][1], g) for i, g in rows], pad)
        for (i, _), tail in zip(rows, tails, strict=True):
            partial[i] += tail
    return [(i, partial[i]) for group in members for i in group]


def _keeps_positions(model: Any) -> bool:
    """Whether ``model.forward`` takes ``logits_to_keep`` (transformers' causal LMs do; a 1-D tensor keeps
    those positions of every row)."""
    import inspect

    return "logits_to_keep" in inspect.signature(model.forward).parameters


def _copyable(cache: Any) -> bool:
    """Whether ``cache`` is a plain DynamicCache, whose layers hold every position's keys and values as
    ``[batch, heads, positions, dim]`` tensors that can be row-selected into a new cache."""
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    layers = getattr(cache, "layers", None)
    return type(cache) is DynamicCache and bool(layers) and all(type(x) is DynamicLayer for x in layers)


def _continue(
    model: Any,
    cache: Any,
    mask: torch.Tensor,
    lengths: torch.Tensor,
    rows: Sequence[tuple[list[int], int]],
    pad: int,
) -> list[float]:
    """The log-probability of each continuation's tokens after its first, given (continuation, context
    row): its tokens but the last run on a copy of that context row's cache. The copies sit after the
    padded context width, so each row's padding is masked and its positions continue from its own length."""
    from transformers import DynamicCache

    owner = torch.tensor([g for _, g in rows], dtype=torch.long)
    copied = DynamicCache(ddp_cache_data=[(layer.keys[owner], layer.values[owner]) for layer in cache.layers])
    ids, tail_mask = _padded([x[:-1] for x, _ in rows], pad)
    positions = lengths[owner].unsqueeze(1) + torch.arange(ids.shape[1]).unsqueeze(0)
    logits = model(
        input_ids=ids,
        attention_mask=torch.cat([mask[owner], tail_mask], dim=1),
        position_ids=positions,
        past_key_values=copied,
        use_cache=True,
    ).logits
    tails = []
    for row, (continuation, _) in enumerate(rows):
        logprobs = torch.log_softmax(logits[row, : len(continuation) - 1].float(), dim=-1)
        wanted = torch.tensor(continuation[1:], dtype=torch.long)
        tails.append(float(logprobs[torch.arange(len(wanted)), wanted].sum()))
    return tails
