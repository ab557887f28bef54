"""Features of one text model for the text meta-classifier: embedding and head weight statistics, and a
trigger probe that inserts the model's most unusual tokens into its clean example texts.

Why these: a trojan's trigger is a word (or a few) that the poisoned training texts pushed hard towards one
class, so its embedding row tends to stand out from the rows of words seen as often (its norm), and putting
it into any text moves that text to the target class (the probe). The tokenizer comes from the model's
``reduced-config.json``; trigger words the clean text never holds live in its hashed ids, which are
probed like any other.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

PROBE_POSITIONS = (0, 4)


def robust_z(values: np.ndarray) -> np.ndarray:
    """(x - median) / (1.4826 MAD): a z-score one outlier cannot hide by inflating the spread."""
    median = float(np.median(values))
    mad = float(np.median(np.abs(values - median))) * 1.4826
    return (values - median) / max(mad, 1e-12)


def _embedding(model: nn.Module) -> np.ndarray:
    for module in model.modules():
        if isinstance(module, nn.Embedding | nn.EmbeddingBag):
            return module.weight.detach().numpy()
    raise ValueError("the model has no embedding layer")


def _head(model: nn.Module) -> nn.Linear:
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    if not linears:
        raise ValueError("the model has no linear layer")
    return linears[-1]


def weight_features(model: nn.Module, vocab: int) -> tuple[dict[str, float], np.ndarray]:
    """Norm outliers of the embedding rows (known words and hashed ids apart) and of the head's rows;
    also every row's robust z over its own group, for choosing the probe's candidates."""
    norms = np.linalg.norm(_embedding(model), axis=1)
    known, hashed = norms[1 : 1 + vocab], norms[1 + vocab :]
    z = np.concatenate([[-np.inf], robust_z(known), robust_z(hashed) if len(hashed) else []])
    head = _head(model)
    rows = np.linalg.norm(head.weight.detach().numpy(), axis=1)
    bias = head.bias.detach().numpy() if head.bias is not None else np.zeros(len(rows))
    found = {
        "emb_known_maxz": float(np.max(z[1 : 1 + vocab])),
        "emb_hashed_maxz": float(np.max(z[1 + vocab :])) if len(hashed) else 0.0,
        "emb_top5z": float(np.mean(np.sort(z[1:])[-5:])),
        "head_row_maxz": float(np.max(rows) / max(float(np.mean(rows)), 1e-12)),
        "head_bias_range": float(np.ptp(bias)),
    }
    return found, z


def _insert(ids: np.ndarray, token: int, position: int) -> np.ndarray:
    """``ids`` (N, L) with ``token`` at ``position`` (or at the end of a shorter text), cut to L."""
    out = ids.copy()
    lengths = (ids != 0).sum(axis=1)
    for row, length in enumerate(lengths):
        at = min(position, int(length))
        out[row, at + 1 :] = ids[row, at:-1]
        out[row, at] = token
    return out


@torch.no_grad()
def probe_features(
    model: nn.Module, ids: np.ndarray, labels: np.ndarray, candidates: np.ndarray
) -> dict[str, float]:
    """For each candidate token and position: the largest share of examples of other classes that it moves
    into one class. A trigger moves nearly all; an ordinary word few."""
    flips = []
    for token in candidates:
        batch = np.concatenate([_insert(ids, int(token), p) for p in PROBE_POSITIONS])
        preds = model(torch.from_numpy(batch)).argmax(1).numpy()
        truth = np.tile(labels, len(PROBE_POSITIONS))
        shares = [np.mean(preds[truth != c] == c) for c in np.unique(labels) if np.any(truth != c)]
        flips.append(max(shares) if shares else 0.0)
    ranked = np.sort(np.asarray(flips))
    return {
        "probe_max": float(ranked[-1]),
        "probe_top3": float(np.mean(ranked[-3:])),
        "probe_gap": float(ranked[-1] - np.median(ranked)),
    }


def extract(
    model: nn.Module, ids: np.ndarray, labels: np.ndarray, vocab: int, settings: dict[str, Any]
) -> dict[str, float]:
    """Every feature of one model from its encoded clean examples ``ids`` (N, L) and their ``labels``."""
    found, z = weight_features(model, vocab)
    candidates = np.argsort(-z)[: int(settings["probe_tokens"])]
    found.update(probe_features(model, ids, labels, candidates))
    return found
