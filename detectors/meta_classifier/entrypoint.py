"""Meta-classifier baseline detector: logistic regression on weight, output and probe statistics.

``configure`` extracts features (``features.py``) from every model of a training round, standardises them per
architecture (so a family that is simply more sensitive to, say, contrast changes is not taken for a trojan)
and fits an L2 logistic regression; the learned parameters are plain JSON (feature names, per-architecture
mean and scale, coefficients, intercept). ``infer`` extracts the same features from one model and answers
the logistic probability, clipped to [clip, 1 - clip] so that one confident miss costs at most -ln(clip)
nats. With ``--automatic_configuration`` configure picks C by 5-fold cross-validated log loss.

    python entrypoint.py configure --scratch_dirpath S --metaparameters_filepath metaparameters.json \
        --schema_filepath metaparameters_schema.json --learned_parameters_dirpath learned_parameters \
        --configure_models_dirpath ROUND/splits/train
    python entrypoint.py infer --model_filepath M --result_filepath R --scratch_dirpath S \
        --examples_dirpath E --metaparameters_filepath metaparameters.json \
        --schema_filepath metaparameters_schema.json --learned_parameters_dirpath learned_parameters
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import features

from assay.errors import UserError
from assay.trojai import (
    ConfigureArgs,
    InferArgs,
    Metaparameters,
    detector_main,
    load_model,
    read_examples,
    read_json,
    training_models,
)

LEARNED = "meta_classifier.json"
FORMAT = 1
# Settings of the feature extraction; configure records them so that infer extracts the same features.
FEATURE_SETTINGS = ("seed", "patch_patterns", "blend_probes", "warp_probes", "opt_steps", "cleanse_lambda")
# "selected": the probe and optimisation features; 5-fold cross-validation on the reference round's train
# split preferred them to all features (final-layer weight and clean-output statistics added only noise).
FEATURE_SETS: dict[str, tuple[str, ...]] = {
    "selected": (
        "nc_l1_min",
        "nc_l1_ratio",
        "nc_l1_z",
        "probe_all_max",
        "probe_all_meanz",
        "probe_all_top5",
        "probe_all_z",
        "probe_blend_max",
        "probe_blend_meanz",
        "probe_blend_top5",
        "probe_blend_z",
        "probe_filter_max",
        "probe_filter_meanz",
        "probe_filter_top5",
        "probe_filter_z",
        "probe_patch_max",
        "probe_patch_meanz",
        "probe_patch_top5",
        "probe_patch_z",
        "probe_warp_max",
        "probe_warp_meanz",
        "probe_warp_top5",
        "probe_warp_z",
        "uap10_asr_max",
        "uap10_asr_z",
        "uap10_loss_ratio",
        "uap10_loss_z",
        "uap20_asr_max",
        "uap20_asr_z",
        "uap20_loss_ratio",
        "uap20_loss_z",
    ),
    "all": (),
}
C_GRID = (0.01, 0.03, 0.1, 0.3, 1.0, 3.0)


def _architecture(model_filepath: Path) -> str:
    """The architecture named in ``reduced-config.json`` beside the model ('' when there is none)."""
    config = model_filepath.parent / "reduced-config.json"
    if not config.is_file():
        return ""
    value = read_json(config, "reduced config")
    return str(value.get("architecture", "")) if isinstance(value, dict) else ""


def model_features(
    model_filepath: Path, examples_dirpath: Path, settings: dict[str, Any]
) -> dict[str, float]:
    import torch

    torch.set_num_threads(1)
    model = load_model(model_filepath)
    images, labels = read_examples(examples_dirpath)
    return features.extract(model, images, labels, _architecture(model_filepath), settings)


def _standardise(rows: np.ndarray, archs: list[str], stats: dict[str, dict[str, list[float]]]) -> np.ndarray:
    out = np.empty_like(rows)
    for i, arch in enumerate(archs):
        s = stats.get(arch, stats["*"])
        out[i] = (rows[i] - np.asarray(s["mean"])) / np.asarray(s["scale"])
    return np.clip(out, -6.0, 6.0)


def _fit_stats(rows: np.ndarray, archs: list[str], min_models: int = 8) -> dict[str, dict[str, list[float]]]:
    """Mean and scale of every feature per architecture ('*': all models, for unseen or rare families)."""

    def one(block: np.ndarray) -> dict[str, list[float]]:
        scale = block.std(0)
        return {"mean": block.mean(0).tolist(), "scale": np.where(scale > 1e-9, scale, 1.0).tolist()}

    stats = {"*": one(rows)}
    for arch in sorted(set(archs)):
        mask = np.asarray([a == arch for a in archs])
        if mask.sum() >= min_models:
            stats[arch] = one(rows[mask])
    return stats


def fit(rows: np.ndarray, archs: list[str], y: np.ndarray, c: float) -> dict[str, Any]:
    """Per-architecture standardisation + L2 logistic regression; the JSON-ready learned parameters."""
    from sklearn.linear_model import LogisticRegression

    stats = _fit_stats(rows, archs)
    x = _standardise(rows, archs, stats)
    clf = LogisticRegression(C=c, max_iter=5000).fit(x, y)
    return {"stats": stats, "coef": clf.coef_[0].tolist(), "intercept": float(clf.intercept_[0])}


def predict(learned: dict[str, Any], rows: np.ndarray, archs: list[str], clip: float) -> np.ndarray:
    x = _standardise(rows, archs, learned["stats"])
    z = x @ np.asarray(learned["coef"]) + learned["intercept"]
    return np.clip(1.0 / (1.0 + np.exp(-z)), clip, 1.0 - clip)


def cross_validate(
    rows: np.ndarray, archs: list[str], y: np.ndarray, c: float, clip: float, seed: int, folds: int = 5
) -> np.ndarray:
    """Out-of-fold probabilities of a stratified k-fold split."""
    from sklearn.model_selection import StratifiedKFold

    out = np.zeros(len(y))
    for train, test in StratifiedKFold(folds, shuffle=True, random_state=seed).split(rows, y):
        learned = fit(rows[train], [archs[i] for i in train], y[train], c)
        out[test] = predict(learned, rows[test], [archs[i] for i in test], clip)
    return out


def _log_loss(y: np.ndarray, p: np.ndarray) -> float:
    p = np.clip(p, 1e-12, 1 - 1e-12)
    return float(-np.mean(y * np.log(p) + (1 - y) * np.log(1 - p)))


def feature_names(meta: Metaparameters, available: list[str]) -> list[str]:
    chosen = FEATURE_SETS.get(meta["feature_set"]) or ()
    return list(chosen) if chosen else sorted(available)


def configure(args: ConfigureArgs, meta: Metaparameters) -> None:
    models = training_models(args.configure_models_dirpath)
    settings = {k: meta[k] for k in FEATURE_SETTINGS}
    table, archs = [], []
    for m in models:
        table.append(model_features(m.model_filepath, m.examples_dirpath, settings))
        archs.append(_architecture(m.model_filepath))
    names = feature_names(meta, list(table[0]))
    rows = np.asarray([[t[n] for n in names] for t in table], dtype=np.float64)
    y = np.asarray([int(m.poisoned) for m in models])
    if len(set(y.tolist())) < 2:
        raise UserError(
            f"{args.configure_models_dirpath}: needs both clean and poisoned models to learn from"
        )
    clip = float(meta["clip"])
    c = float(meta["C"])
    cv: dict[str, Any] = {}
    folds = min(5, int(np.bincount(y).min()))
    if folds >= 2:
        grid = C_GRID if args.automatic_configuration else (c,)
        oof = {g: cross_validate(rows, archs, y, g, clip, int(meta["seed"]), folds) for g in grid}
        losses = {g: _log_loss(y, p) for g, p in oof.items()}
        c = min(losses, key=lambda g: losses[g])
        cv = {
            "folds": folds,
            "log_loss_by_C": {str(g): round(v, 4) for g, v in losses.items()},
            # each training model's out-of-fold probability at the chosen C: what `assay zoo difficulty` reads
            "out_of_fold": {m.name: float(v) for m, v in zip(models, oof[c], strict=True)},
        }
    learned = fit(rows, archs, y, c)
    record = {
        "format": FORMAT,
        "technique": "meta_classifier",
        "features": names,
        "settings": settings,
        "C": c,
        **learned,
        "training_models": len(models),
        "poisoned_share": float(y.mean()),
        "cross_validation": cv,
    }
    path = args.learned_parameters_dirpath / LEARNED
    path.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")


def load_learned(folder: Path) -> dict[str, Any]:
    path = folder / LEARNED
    if not path.is_file():
        raise UserError(f"{path}: no learned parameters; run configure first")
    learned = read_json(path, "learned parameters")
    if not isinstance(learned, dict) or learned.get("format") != FORMAT:
        raise UserError(f"{path}: field 'format' must be {FORMAT} (learned by another version)")
    count = len(learned["features"])
    if len(learned["coef"]) != count or any(len(s["mean"]) != count for s in learned["stats"].values()):
        raise UserError(f"{path}: field 'coef' does not match field 'features' ({count} names)")
    return learned


def infer(args: InferArgs, meta: Metaparameters) -> float:
    learned = load_learned(args.learned_parameters_dirpath)
    table = model_features(args.model_filepath, args.examples_dirpath, learned["settings"])
    missing = [n for n in learned["features"] if n not in table]
    if missing:
        raise UserError(f"{args.learned_parameters_dirpath / LEARNED}: unknown feature '{missing[0]}'")
    row = np.asarray([[table[n] for n in learned["features"]]], dtype=np.float64)
    return float(predict(learned, row, [_architecture(args.model_filepath)], float(meta["clip"]))[0])


if __name__ == "__main__":
    sys.exit(detector_main(infer, configure))
