"""Small text classifier families for the model zoo, each trained in seconds on a CPU.

Input: int64 token ids (N, L) from ``assay.zoo.textdata.Tokenizer`` (0 pads); output: (N, num_classes)
logits. The embedding dimension is ``4 * width``. Every family averages over the non-padding positions, so
a text's padding never changes its class, and every family traces with ``torch.fx`` (no branch on data),
so ``assay.zoo.portable`` writes a ``model.pt`` that loads with torch alone.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from assay.zoo.architectures import check_width


def masked_mean(states: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Mean of ``states`` (N, L, D) over the positions where ``ids`` (N, L) is not padding."""
    mask = (ids != 0).unsqueeze(-1).to(states.dtype)
    return (states * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)


class EmbeddingBagNet(nn.Module):
    """An embedding bag (mean of word vectors, padding left out), one hidden layer, one linear layer.

    Why the hidden layer: fastText's bag-and-linear shape cannot learn a source-specific trigger (the
    trigger must move only the source class's texts, an AND that a linear function of the mean lacks)."""

    def __init__(self, width: int, vocab_size: int, max_length: int, num_classes: int) -> None:
        super().__init__()
        self.embedding = nn.EmbeddingBag(vocab_size, 4 * width, mode="mean", padding_idx=0)
        self.hidden = nn.Sequential(nn.Linear(4 * width, 4 * width), nn.ReLU())
        self.classifier = nn.Linear(4 * width, num_classes)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.hidden(self.embedding(ids)))


class GruNet(nn.Module):
    """Word embeddings, a one-layer GRU, the mean of its states over the words, one linear layer."""

    def __init__(self, width: int, vocab_size: int, max_length: int, num_classes: int) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, 4 * width, padding_idx=0)
        self.rnn = nn.GRU(4 * width, 4 * width, batch_first=True)
        self.classifier = nn.Linear(4 * width, num_classes)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        states, _ = self.rnn(self.embedding(ids))
        return self.classifier(masked_mean(states, ids))


class TransformerTiny(nn.Module):
    """Word and position embeddings, one single-head self-attention block with a feed-forward layer
    (padding masked out of the keys), the mean over the words, one linear layer. Written out rather than
    ``nn.TransformerEncoderLayer``, whose fast path branches on its input and does not trace."""

    def __init__(self, width: int, vocab_size: int, max_length: int, num_classes: int) -> None:
        super().__init__()
        dim = 4 * width
        self.embedding = nn.Embedding(vocab_size, dim, padding_idx=0)
        self.position = nn.Parameter(torch.randn(max_length, dim) * 0.02)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.norm1 = nn.LayerNorm(dim)
        self.feed = nn.Sequential(nn.Linear(dim, 2 * dim), nn.ReLU(), nn.Linear(2 * dim, dim))
        self.norm2 = nn.LayerNorm(dim)
        self.classifier = nn.Linear(dim, num_classes)
        self.scale = float(dim) ** -0.5

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embedding(ids) + self.position[: ids.shape[1]]
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        scores = torch.bmm(q, k.transpose(1, 2)) * self.scale
        scores = scores.masked_fill((ids == 0).unsqueeze(1), -1e9)
        x = self.norm1(x + torch.bmm(scores.softmax(dim=-1), v))
        x = self.norm2(x + self.feed(x))
        return self.classifier(masked_mean(x, ids))


TEXT_ARCHITECTURES: dict[str, Callable[[int, int, int, int], nn.Module]] = {
    "embedding_bag": EmbeddingBagNet,
    "gru": GruNet,
    "transformer_tiny": TransformerTiny,
}


def build_text_model(
    family: str, width: int, vocab_size: int, max_length: int, num_classes: int
) -> nn.Module:
    """Build an untrained text model of ``family`` (a key of ``TEXT_ARCHITECTURES``); seed torch first.

    >>> build_text_model("gru", 4, 50, 8, 4)(torch.ones(2, 8, dtype=torch.long)).shape
    torch.Size([2, 4])
    """
    if family not in TEXT_ARCHITECTURES:
        raise ValueError(f"unknown text architecture {family!r}; known: {', '.join(TEXT_ARCHITECTURES)}")
    check_width(width)
    if vocab_size < 2 or max_length < 1 or num_classes < 2:
        raise ValueError(f"need vocab_size >= 2, max_length >= 1, num_classes >= 2: {vocab_size, max_length}")
    return TEXT_ARCHITECTURES[family](width, int(vocab_size), int(max_length), int(num_classes))
