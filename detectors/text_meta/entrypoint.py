"""Text meta-classifier baseline detector: logistic regression on weight statistics and a token probe.

For text models of ``assay zoo generate`` (``domain: text``) or any TrojAI-style text classifier whose
``reduced-config.json`` carries the tokenizer (``vocab``, ``buckets``, ``max_length``) and whose first
embedding layer is indexed by its ids. ``configure`` extracts ``features.py``'s features from every model
of a training round, standardises them per architecture (a GRU's embedding norms are not an embedding
bag's) and fits an L2 logistic regression, C chosen by 5-fold cross-validated log loss with
``--automatic_configuration``; ``infer`` answers the clipped probability for one model. The command
line is the TrojAI one every detector here takes (``configure`` then ``infer``; see ``docs/zoo.md``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import features

from assay import trojai
from assay.errors import UserError

LEARNED = "text_meta.json"
FORMAT = 1
C_GRID = (0.03, 0.1, 0.3, 1.0, 3.0)


def _reduced(model_filepath: Path) -> dict[str, Any]:
    """The model's ``reduced-config.json`` (or NIST's copy, ``config.json``), which must hold a tokenizer."""
    for name in ("reduced-config.json", "config.json"):
        path = model_filepath.parent / name
        value = trojai.read_json(path, "reduced config") if path.is_file() else None
        if isinstance(value, dict) and isinstance(value.get("tokenizer"), dict):
            return value
    raise UserError(
        f"{model_filepath.parent / 'reduced-config.json'}: field 'tokenizer' missing (not a text model?)"
    )


def model_features(
    model_filepath: Path, examples_dirpath: Path, probe_tokens: int
) -> tuple[dict[str, float], str]:
    """The features of one model and its architecture name."""
    import torch

    from assay.zoo.textdata import Tokenizer

    torch.set_num_threads(1)
    reduced = _reduced(model_filepath)
    spec = reduced["tokenizer"]
    tokenizer = Tokenizer(tuple(spec["vocab"]), int(spec["buckets"]), int(spec["max_length"]))
    texts, labels = trojai.read_text_examples(examples_dirpath)
    model = trojai.load_model(model_filepath)
    settings = {"probe_tokens": probe_tokens}
    found = features.extract(model, tokenizer.encode(texts), labels, len(tokenizer.vocab), settings)
    return found, str(reduced.get("architecture", ""))


def scaling(rows: np.ndarray, archs: list[str]) -> dict[str, list[list[float]]]:
    """Mean and scale per architecture (and ``*`` over all models, for an architecture seen too rarely)."""
    groups = {"*": rows, **{a: rows[[x == a for x in archs]] for a in set(archs)}}
    return {
        name: [block.mean(axis=0).tolist(), np.maximum(block.std(axis=0), 1e-6).tolist()]
        for name, block in groups.items()
        if len(block) >= 4 or name == "*"
    }


def standardised(rows: np.ndarray, archs: list[str], scales: dict[str, list[list[float]]]) -> np.ndarray:
    """Each row standardised by its architecture's mean and scale."""
    pairs = [scales.get(a, scales["*"]) for a in archs]
    return np.asarray(
        [(row - np.asarray(m)) / np.asarray(s) for row, (m, s) in zip(rows, pairs, strict=True)]
    )


def learn(rows: np.ndarray, archs: list[str], y: np.ndarray, c: float) -> dict[str, Any]:
    """The JSON-ready learned parameters: per-architecture scaling, coefficients, intercept."""
    from sklearn.linear_model import LogisticRegression

    scales = scaling(rows, archs)
    clf = LogisticRegression(C=c, max_iter=5000).fit(standardised(rows, archs, scales), y)
    return {"scales": scales, "coef": clf.coef_[0].tolist(), "intercept": float(clf.intercept_[0])}


def probability(learned: dict[str, Any], rows: np.ndarray, archs: list[str], clip: float) -> np.ndarray:
    """The clipped logistic probability of each row."""
    z = standardised(rows, archs, learned["scales"]) @ np.asarray(learned["coef"]) + learned["intercept"]
    return np.clip(1.0 / (1.0 + np.exp(-z)), clip, 1.0 - clip)


def out_of_fold(
    rows: np.ndarray, archs: list[str], y: np.ndarray, c: float, clip: float, folds: int
) -> np.ndarray:
    """Stratified k-fold out-of-fold probabilities (fixed seed 0): what configure's choice of C rests on."""
    from sklearn.model_selection import StratifiedKFold

    out = np.zeros(len(y))
    for train, test in StratifiedKFold(folds, shuffle=True, random_state=0).split(rows, y):
        learned = learn(rows[train], [archs[i] for i in train], y[train], c)
        out[test] = probability(learned, rows[test], [archs[i] for i in test], clip)
    return out


def configure(args: trojai.ConfigureArgs, meta: trojai.Metaparameters) -> None:
    models = trojai.training_models(args.configure_models_dirpath)
    table = [model_features(m.model_filepath, m.examples_dirpath, int(meta["probe_tokens"])) for m in models]
    names = sorted(table[0][0])
    rows = np.asarray([[found[n] for n in names] for found, _ in table], dtype=np.float64)
    archs = [arch for _, arch in table]
    y = np.asarray([int(m.poisoned) for m in models])
    if len(set(y.tolist())) < 2:
        raise UserError(
            f"{args.configure_models_dirpath}: needs both clean and poisoned models to learn from"
        )
    c, clip = float(meta["C"]), float(meta["clip"])
    folds = min(5, int(np.bincount(y).min()))
    losses: dict[float, float] = {}
    oof: dict[float, np.ndarray] = {}
    if folds >= 2:
        for g in C_GRID if args.automatic_configuration else (c,):
            oof[g] = out_of_fold(rows, archs, y, g, clip, folds)
            p = np.clip(oof[g], 1e-12, 1 - 1e-12)
            losses[g] = float(-np.mean(y * np.log(p) + (1 - y) * np.log(1 - p)))
        c = min(losses, key=lambda g: losses[g])
    # each training model's out-of-fold probability at the chosen C: what `assay zoo difficulty` reads
    held_out = {m.name: float(v) for m, v in zip(models, oof[c], strict=True)} if oof else {}
    record = {
        "format": FORMAT,
        "technique": "text_meta",
        "features": names,
        "probe_tokens": int(meta["probe_tokens"]),
        "C": c,
        **learn(rows, archs, y, c),
        "training_models": len(models),
        "cross_validation": {
            "folds": folds,
            "log_loss_by_C": {str(g): round(v, 4) for g, v in losses.items()},
            "out_of_fold": held_out,
        },
    }
    path = args.learned_parameters_dirpath / LEARNED
    path.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")


def infer(args: trojai.InferArgs, meta: trojai.Metaparameters) -> float:
    path = args.learned_parameters_dirpath / LEARNED
    if not path.is_file():
        raise UserError(f"{path}: no learned parameters; run configure first")
    learned = trojai.read_json(path, "learned parameters")
    if not isinstance(learned, dict) or learned.get("format") != FORMAT:
        raise UserError(f"{path}: field 'format' must be {FORMAT} (learned by another version)")
    found, arch = model_features(args.model_filepath, args.examples_dirpath, int(learned["probe_tokens"]))
    row = np.asarray([[found[n] for n in learned["features"]]], dtype=np.float64)
    return float(probability(learned, row, [arch], float(meta["clip"]))[0])


if __name__ == "__main__":
    sys.exit(trojai.detector_main(infer, configure))
