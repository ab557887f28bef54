"""Neural Cleanse baseline detector (Wang et al., "Neural Cleanse", IEEE S&P 2019).

For every class t it reverse-engineers the smallest trigger that sends the clean examples of the other classes
to t: a mask m and a pattern p (both sigmoid-parametrised, H x W) with x' = (1 - m) x + m p, minimising
cross-entropy towards t plus lambda_t * |m|_1. All classes are optimised together in one batch (the model sees
num_classes x N images per step). Each class's lambda is adapted as in the paper: raised while the attack
success rate on the examples is at least ``success_threshold``, lowered otherwise; the smallest L1 norm of a
mask that reached the threshold is kept per class.

A trojaned model tends to have one class with an unusually small trigger. The per-model score is the anomaly
index of the smallest norm, (median - min) / (1.4826 * MAD), and the log of the smallest norm over the median
norm. A logistic function of these two scalars, fitted by ``configure`` on a training round and saved as JSON
in the learned-parameters folder, maps them to P(trojaned); without learned parameters, the default
coefficients from the metaparameters apply (the classic rule: anomaly index 2 gives 0.5). The answer is
clipped to [clip_low, clip_high].

    python entrypoint.py infer --model_filepath M --result_filepath R --scratch_dirpath S \
        --examples_dirpath E --metaparameters_filepath metaparameters.json \
        --schema_filepath metaparameters_schema.json --learned_parameters_dirpath learned_parameters
    python entrypoint.py configure --scratch_dirpath S --metaparameters_filepath metaparameters.json \
        --schema_filepath metaparameters_schema.json --learned_parameters_dirpath learned_parameters \
        --configure_models_dirpath ROUND/splits/train
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.nn import functional as F

from assay.trojai import (
    ConfigureArgs,
    InferArgs,
    Metaparameters,
    detector_main,
    load_model,
    read_examples,
    training_models,
)

LEARNED = "logistic.json"
FEATURES = ("anomaly_index", "log_min_over_median")
MAD_CONSISTENCY = 1.4826


@dataclass(frozen=True)
class Reversal:
    """What the reverse-engineering found for one model."""

    norms: np.ndarray  # (C,) smallest L1 norm of a mask reaching the success threshold (H*W when none did)
    reached: np.ndarray  # (C,) bool: whether some mask reached the threshold
    masks: np.ndarray  # (C, H, W) the masks of those norms
    patterns: np.ndarray  # (C, H, W) their patterns


def anomaly_index(values: np.ndarray) -> float:
    """Neural Cleanse anomaly index of the smallest value: (median - min) / (1.4826 * MAD)."""
    values = np.asarray(values, dtype=np.float64)
    median = float(np.median(values))
    mad = MAD_CONSISTENCY * float(np.median(np.abs(values - median)))
    return (median - float(values.min())) / max(mad, 1e-12)


def reverse_engineer(
    model: torch.nn.Module,
    images: np.ndarray,
    labels: np.ndarray,
    num_classes: int,
    *,
    steps: int = 300,
    lr: float = 0.1,
    init_lambda: float = 0.01,
    lambda_factor: float = 1.5,
    patience: int = 5,
    success_threshold: float = 0.99,
    seed: int = 0,
) -> Reversal:
    """Find, for every class at once, the smallest mask and pattern that flip the examples to that class."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.from_numpy(np.ascontiguousarray(images, dtype=np.float32))  # (N, H, W)
    y = torch.from_numpy(np.asarray(labels, dtype=np.int64))
    n, height, width = x.shape
    targets = torch.arange(num_classes)
    # eligible[t, i]: example i is not of class t, so it counts for class t's trigger.
    eligible = (y[None, :] != targets[:, None]).float()  # (C, N)
    counts = eligible.sum(1).clamp(min=1.0)
    flat_targets = targets[:, None].expand(num_classes, n).reshape(-1)

    mask_logit = (torch.randn(num_classes, height, width, generator=generator) * 0.1 - 1.0).requires_grad_()
    pattern_logit = (torch.randn(num_classes, height, width, generator=generator) * 0.1).requires_grad_()
    optimiser = torch.optim.Adam([mask_logit, pattern_logit], lr=lr, betas=(0.5, 0.9))
    lam = torch.full((num_classes,), float(init_lambda))
    above = torch.zeros(num_classes)
    below = torch.zeros(num_classes)
    best_norm = torch.full((num_classes,), float(height * width))
    reached = torch.zeros(num_classes, dtype=torch.bool)
    best_mask = torch.zeros(num_classes, height, width)
    best_pattern = torch.zeros(num_classes, height, width)

    for param in model.parameters():
        param.requires_grad_(False)
    for _ in range(steps):
        mask = torch.sigmoid(mask_logit)  # (C, H, W)
        pattern = torch.sigmoid(pattern_logit)
        stamped = (1 - mask[:, None]) * x[None] + (mask * pattern)[:, None]  # (C, N, H, W)
        logits = model(stamped.reshape(num_classes * n, height, width))
        ce = F.cross_entropy(logits, flat_targets, reduction="none").view(num_classes, n)
        ce = (ce * eligible).sum(1) / counts
        norm = mask.sum((1, 2))
        loss = (ce + lam * norm).sum()
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
        with torch.no_grad():
            hits = (logits.argmax(1).view(num_classes, n) == targets[:, None]).float()
            success = (hits * eligible).sum(1) / counts
            ok = success >= success_threshold
            better = ok & (norm < best_norm)
            best_norm = torch.where(better, norm, best_norm)
            best_mask[better] = mask[better]
            best_pattern[better] = pattern[better]
            reached |= ok
            # The paper's schedule: raise lambda after `patience` successful steps, lower it after
            # `patience` failed ones (by a larger factor, so the search settles near the threshold).
            above = torch.where(ok, above + 1, torch.zeros_like(above))
            below = torch.where(ok, torch.zeros_like(below), below + 1)
            up = above >= patience
            down = below >= patience
            lam = torch.where(up, lam * lambda_factor, lam)
            lam = torch.where(down, lam / lambda_factor**1.5, lam)
            above[up] = 0
            below[down] = 0
    return Reversal(
        norms=best_norm.numpy().astype(np.float64),
        reached=reached.numpy(),
        masks=best_mask.numpy(),
        patterns=best_pattern.numpy(),
    )


def features(reversal: Reversal) -> dict[str, float]:
    """The per-model scalars the logistic map uses."""
    norms = np.maximum(reversal.norms, 1e-6)
    median = float(np.median(norms))
    return {
        "anomaly_index": anomaly_index(norms),
        "log_min_over_median": math.log(float(norms.min()) / median),
        "min_norm": float(norms.min()),
        "median_norm": median,
        "argmin": int(np.argmin(norms)),
        "reached": int(reversal.reached.sum()),
    }


def _reversal_options(meta: Metaparameters) -> dict[str, Any]:
    return {
        "steps": int(meta["steps"]),
        "lr": float(meta["learning_rate"]),
        "init_lambda": float(meta["init_lambda"]),
        "lambda_factor": float(meta["lambda_factor"]),
        "patience": int(meta["patience"]),
        "success_threshold": float(meta["success_threshold"]),
        "seed": int(meta["seed"]),
    }


def model_features(model_filepath, examples_dirpath, meta: Metaparameters) -> dict[str, float]:
    """Load one model and its clean examples and reverse-engineer its triggers."""
    torch.manual_seed(int(meta["seed"]))
    model = load_model(model_filepath)
    images, labels = read_examples(examples_dirpath)
    num_classes = int(model(torch.from_numpy(images[:1])).shape[1])
    return features(reverse_engineer(model, images, labels, num_classes, **_reversal_options(meta)))


def _vector(feats: dict[str, float], names: list[str]) -> np.ndarray:
    # Bounded so that one degenerate model (MAD near 0) cannot dominate the fit or the answer.
    values = {
        "anomaly_index": min(max(feats["anomaly_index"], -10.0), 20.0),
        "log_min_over_median": min(max(feats["log_min_over_median"], -6.0), 0.0),
    }
    return np.array([values[name] for name in names], dtype=np.float64)


def probability(feats: dict[str, float], coefficients: dict[str, Any], meta: Metaparameters) -> float:
    names = list(coefficients["features"])
    z = float(coefficients["intercept"]) + float(
        np.dot(np.asarray(coefficients["weights"], dtype=np.float64), _vector(feats, names))
    )
    p = 1.0 / (1.0 + math.exp(-min(max(z, -50.0), 50.0)))
    return min(max(p, float(meta["clip_low"])), float(meta["clip_high"]))


def default_coefficients(meta: Metaparameters) -> dict[str, Any]:
    """P = sigmoid(slope * (anomaly_index - threshold)): anomaly index `threshold` gives 0.5."""
    slope = float(meta["default_slope"])
    return {
        "features": ["anomaly_index"],
        "weights": [slope],
        "intercept": -slope * float(meta["default_anomaly_threshold"]),
    }


def infer(args: InferArgs, meta: Metaparameters) -> float:
    torch.set_num_threads(int(meta["threads"]))
    learned = args.learned_parameters_dirpath / LEARNED
    if learned.is_file():
        coefficients = json.loads(learned.read_text(encoding="utf-8"))
    else:
        coefficients = default_coefficients(meta)
    feats = model_features(args.model_filepath, args.examples_dirpath, meta)
    return probability(feats, coefficients, meta)


def fit_logistic(x: np.ndarray, y: np.ndarray, c: float) -> tuple[np.ndarray, float]:
    """L2-regularised logistic regression (strength 1/c) on standardised features, in raw units."""
    from sklearn.linear_model import LogisticRegression

    mean, scale = x.mean(0), x.std(0)
    scale = np.where(scale > 1e-9, scale, 1.0)
    fit = LogisticRegression(C=c, max_iter=1000).fit((x - mean) / scale, y)
    weights = fit.coef_[0] / scale
    return weights, float(fit.intercept_[0] - np.dot(weights, mean))


def configure(args: ConfigureArgs, meta: Metaparameters) -> None:
    torch.set_num_threads(int(meta["threads"]))
    models = training_models(args.configure_models_dirpath)
    names = list(FEATURES) if meta["use_ratio_feature"] else ["anomaly_index"]
    rows, table = [], []
    for m in models:
        feats = model_features(m.model_filepath, m.examples_dirpath, meta)
        rows.append(_vector(feats, names))
        table.append({"model": m.name, "poisoned": int(m.poisoned), **feats})
    x, y = np.stack(rows), np.array([int(m.poisoned) for m in models])
    if len(set(y.tolist())) < 2:
        raise ValueError(
            f"{args.configure_models_dirpath}: needs both clean and poisoned models to calibrate"
        )
    weights, intercept = fit_logistic(x, y, float(meta["regularisation_c"]))
    record = {
        "features": names,
        "weights": weights.tolist(),
        "intercept": intercept,
        "training_models": len(models),
        "training_poisoned": int(y.sum()),
    }
    folder = args.learned_parameters_dirpath
    (folder / LEARNED).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    (folder / "training_features.json").write_text(json.dumps(table, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    sys.exit(detector_main(infer, configure))
