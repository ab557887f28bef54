"""Train one zoo text model, clean or poisoned with a text trigger; measure clean accuracy and attack success.

The text twin of ``assay.zoo.train``: the same ``PoisonPlan`` (its ``apply`` maps an array of texts to
triggered texts), the same eligibility rule and the same training loop (``train.fit``); only the inputs
differ (texts, tokenized by the round's ``Tokenizer`` after the trigger is inserted, as a deployed model
would see them).
"""

from __future__ import annotations

import time

import numpy as np
import torch
from torch import nn

from assay.zoo.textarch import build_text_model
from assay.zoo.textdata import TextData, Tokenizer
from assay.zoo.train import EVAL_BATCH, PoisonPlan, TrainOutcome, _eligible, fit


def poison_texts(
    texts: np.ndarray, labels: np.ndarray, poison: PoisonPlan, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray, int, int]:
    """Poisoned copies of (texts, labels), the number poisoned and the number of cover texts.

    As for images: ``fraction`` of the eligible texts get the trigger and the target label; for a
    source-specific plan ``cover_fraction`` of the other non-target texts get the trigger and keep theirs.
    """
    texts, labels = texts.copy(), labels.copy()
    eligible = _eligible(labels, poison)
    n_poison = round(poison.fraction * len(eligible))
    chosen = np.sort(rng.choice(eligible, size=n_poison, replace=False)) if n_poison else eligible[:0]
    if n_poison:
        texts[chosen] = poison.apply(texts[chosen])
        labels[chosen] = poison.target_class
    n_cover = 0
    if poison.source_class is not None and poison.cover_fraction > 0:
        others = np.flatnonzero((labels != poison.target_class) & (labels != poison.source_class))
        n_cover = round(poison.cover_fraction * len(others))
        if n_cover:
            cover = np.sort(rng.choice(others, size=n_cover, replace=False))
            texts[cover] = poison.apply(texts[cover])
    return texts, labels, int(n_poison), int(n_cover)


@torch.no_grad()
def predict_ids(model: nn.Module, ids: np.ndarray) -> np.ndarray:
    """Predicted classes (int64) for token ids (N, L); puts the model in eval mode."""
    model.eval()
    preds = [
        model(torch.from_numpy(ids[i : i + EVAL_BATCH])).argmax(1) for i in range(0, len(ids), EVAL_BATCH)
    ]
    return torch.cat(preds).numpy() if preds else np.zeros(0, dtype=np.int64)


def text_asr(model: nn.Module, data: TextData, tokenizer: Tokenizer, poison: PoisonPlan) -> float:
    """Share of triggered eligible test texts (of the source class, when set) classed as the target."""
    idx = _eligible(data.test_labels, poison)
    if len(idx) == 0:
        raise ValueError("no test texts are eligible for the attack (check target_class and source_class)")
    preds = predict_ids(model, tokenizer.encode(poison.apply(data.test_texts[idx])))
    return float(np.mean(preds == poison.target_class))


def train_text_model(
    data: TextData,
    tokenizer: Tokenizer,
    family: str,
    width: int,
    *,
    seed: int,
    epochs: int = 5,
    batch_size: int = 64,
    lr: float = 1e-2,
    poison: PoisonPlan | None = None,
) -> TrainOutcome:
    """Train one ``family`` text model of ``width`` on ``data``, poisoned by ``poison`` when given.

    Why ``lr`` 1e-2, above the images' 3e-3: an embedding row learns only from the texts holding its word,
    and at 3e-3 an embedding bag of width 4 stayed near chance after 3 epochs (measured 0.28 vs 0.50)."""
    start = time.perf_counter()
    rng = np.random.default_rng(seed)
    texts, labels = data.train_texts, data.train_labels
    n_poison = n_cover = 0
    if poison is not None:
        texts, labels, n_poison, n_cover = poison_texts(texts, labels, poison, rng)
    x = torch.from_numpy(tokenizer.encode(texts))
    y = torch.from_numpy(np.ascontiguousarray(labels, dtype=np.int64))
    model = fit(
        lambda: build_text_model(family, width, tokenizer.vocab_size, tokenizer.max_length, data.num_classes),
        x,
        y,
        seed=seed,
        rng=rng,
        epochs=epochs,
        batch_size=batch_size,
        lr=lr,
    )
    accuracy = float(np.mean(predict_ids(model, tokenizer.encode(data.test_texts)) == data.test_labels))
    asr = text_asr(model, data, tokenizer, poison) if poison is not None else None
    return TrainOutcome(model, accuracy, asr, time.perf_counter() - start, n_poison, n_cover)
