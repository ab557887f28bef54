"""Features of one model for the meta-classifier: final-layer weights, clean outputs, generic probes.

Every feature is a float in a dict keyed by a stable name, so the learned parameters can name the features
they use. Nothing here knows the trigger: the probes are generic families (patches, blends, filters, warps,
a universal perturbation and a Neural-Cleanse-like mask search) whose effect on a trojaned model tends to pile
the clean examples into the one target class.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from scipy import ndimage

ARCHITECTURES = ("cnn_small", "resnet_tiny", "mlp")
_EPS = 1e-6


def _zmax(values: np.ndarray, floor: float) -> float:
    """Largest z-score of ``values`` against the others (leave-one-out mean and spread, the spread at least
    ``floor`` so that a flat rest cannot make it explode)."""
    values = np.asarray(values, dtype=np.float64)
    top = int(np.argmax(values))
    rest = np.delete(values, top)
    return float((values[top] - rest.mean()) / max(rest.std(), floor))


def _zmin(values: np.ndarray, floor: float) -> float:
    return _zmax(-np.asarray(values, dtype=np.float64), floor)


def _predict(model: torch.nn.Module, images: np.ndarray, batch: int = 4096) -> np.ndarray:
    """Predicted classes of (M, H, W) float32 images."""
    out = []
    with torch.no_grad():
        for start in range(0, len(images), batch):
            chunk = torch.from_numpy(np.ascontiguousarray(images[start : start + batch], dtype=np.float32))
            out.append(model(chunk).argmax(1).numpy())
    return np.concatenate(out) if out else np.zeros(0, np.int64)


def _flip_features(prefix: str, preds: np.ndarray, clean: np.ndarray, classes: int) -> dict[str, float]:
    """``preds`` (P, N): per probe, the share of examples not already in class c that land in c.

    Features: the largest such share over probes and classes, its mean over the top 5% of probes, and the
    z-score over classes of each class's best share (one class standing out is the trojan signature).
    """
    probes, _n = preds.shape
    shares = np.zeros((probes, classes))
    for c in range(classes):
        eligible = clean != c
        if eligible.any():
            shares[:, c] = ((preds == c) & eligible[None]).sum(1) / eligible.sum()
    per_class = shares.max(0)
    top = np.sort(shares.max(1))[::-1]
    k = max(1, round(0.05 * probes))
    # The class flipped to most often on average across probes.
    mean_class = shares.mean(0)
    return {
        f"{prefix}_max": float(per_class.max()),
        f"{prefix}_top5": float(top[:k].mean()),
        f"{prefix}_z": _zmax(per_class, 0.05),
        f"{prefix}_meanz": _zmax(mean_class, 0.02),
    }


# --- probe families -------------------------------------------------------------------------------------


def _patch_probes(images: np.ndarray, rng: np.random.Generator, patterns: int) -> np.ndarray:
    """Solid white patches (2 and 3 px) at every position, plus random binary patterns at every position."""
    _n, h, w = images.shape
    out = []
    for size in (2, 3):
        fills = [np.ones((size, size), np.float32)]
        fills += [rng.integers(0, 2, (size, size)).astype(np.float32) for _ in range(patterns)]
        for fill in fills:
            for r in range(h - size + 1):
                for c in range(w - size + 1):
                    x = images.copy()
                    x[:, r : r + size, c : c + size] = fill
                    out.append(x)
    return np.stack(out)


def _blend_probes(images: np.ndarray, rng: np.random.Generator, count: int) -> np.ndarray:
    _n, h, w = images.shape
    out = []
    for i in range(count):
        alpha = (0.2, 0.3)[i % 2]
        p = rng.random((h, w), dtype=np.float32)
        out.append((1 - alpha) * images + alpha * p)
    return np.stack(out).astype(np.float32)


def _vignette(shape: tuple[int, int]) -> np.ndarray:
    r, c = np.indices(shape, dtype=np.float64)
    d2 = ((r - (shape[0] - 1) / 2) / (shape[0] / 2)) ** 2 + ((c - (shape[1] - 1) / 2) / (shape[1] / 2)) ** 2
    return d2 / d2.max()


def _filter_probes(images: np.ndarray) -> np.ndarray:
    d2 = _vignette(images.shape[1:])
    blur = ndimage.gaussian_filter(images, sigma=(0, 1, 1), mode="nearest")
    out = []
    for gamma in (0.5, 0.75, 1.0, 1.5, 2.0):
        for contrast in (0.5, 0.75, 1.0):
            for sharpen in (0.0, 1.0, 2.0):
                for vignette in (0.0, 0.5):
                    if (gamma, contrast, sharpen, vignette) == (1.0, 1.0, 0.0, 0.0):
                        continue
                    x = np.clip(images, 0, 1)
                    if sharpen:
                        x = x + sharpen * (x - blur)  # sharpen first, cheap approximation of the filter order
                    x = np.clip(x, 0, 1) ** gamma
                    x = 0.5 + contrast * (x - 0.5)
                    out.append(x * (1.0 - vignette * d2))
    return np.clip(np.stack(out), 0, 1).astype(np.float32)


def _warp_probes(images: np.ndarray, rng: np.random.Generator, count: int) -> np.ndarray:
    n, h, w = images.shape
    grid = 4
    rows = np.linspace(0, grid - 1, h)
    cols = np.linspace(0, grid - 1, w)
    at = np.stack(np.meshgrid(rows, cols, indexing="ij"))
    base = np.mgrid[0:n, 0:h, 0:w].astype(np.float64)
    out = []
    for i in range(count):
        strength = (1.0, 2.0)[i % 2]
        coarse = rng.uniform(-1.0, 1.0, (2, grid, grid))
        fine = np.stack([ndimage.map_coordinates(c, at, order=3, mode="nearest") for c in coarse])
        flow = strength * fine / max(float(np.abs(fine).max()), 1e-12)
        coords = base.copy()
        coords[1:] += flow[:, None]
        out.append(ndimage.map_coordinates(images, coords, order=1, mode="nearest"))
    return np.stack(out).astype(np.float32)


# --- optimisation probes --------------------------------------------------------------------------------


def _universal(model: torch.nn.Module, x: torch.Tensor, classes: int, eps: float, steps: int) -> dict:
    """One L-inf-bounded additive perturbation per target class, optimised for all classes at once."""
    n = x.shape[0]
    delta = torch.zeros(classes, 1, *x.shape[1:], requires_grad=True)
    targets = torch.arange(classes).repeat_interleave(n)
    opt = torch.optim.Adam([delta], lr=eps / 5)
    for _ in range(steps):
        xp = (x[None] + delta).clamp(0, 1).reshape(-1, *x.shape[1:])
        loss = torch.nn.functional.cross_entropy(model(xp), targets, reduction="sum") / n
        opt.zero_grad()
        loss.backward()
        opt.step()
        with torch.no_grad():
            delta.clamp_(-eps, eps)
    with torch.no_grad():
        xp = (x[None] + delta).clamp(0, 1).reshape(-1, *x.shape[1:])
        logits = model(xp)
        losses = torch.nn.functional.cross_entropy(logits, targets, reduction="none").reshape(classes, n)
        hits = (logits.argmax(1) == targets).float().reshape(classes, n)
    loss_c = losses.mean(1).numpy().astype(np.float64)
    asr_c = hits.mean(1).numpy().astype(np.float64)
    return {"loss": loss_c, "asr": asr_c}


def _cleanse(model: torch.nn.Module, x: torch.Tensor, classes: int, steps: int, lam: float) -> dict:
    """Neural-Cleanse-like: per target class a mask and pattern, x' = (1-m) x + m p, CE + lam * |m|_1."""
    n = x.shape[0]
    shape = x.shape[1:]
    mask_logit = torch.full((classes, 1, *shape), -3.0, requires_grad=True)
    pattern_logit = torch.zeros((classes, 1, *shape), requires_grad=True)
    targets = torch.arange(classes).repeat_interleave(n)
    opt = torch.optim.Adam([mask_logit, pattern_logit], lr=0.1)
    for _ in range(steps):
        m = torch.sigmoid(mask_logit)
        p = torch.sigmoid(pattern_logit)
        xp = ((1 - m) * x[None] + m * p).reshape(-1, *shape)
        ce = torch.nn.functional.cross_entropy(model(xp), targets, reduction="sum") / n
        loss = ce + lam * m.sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        m = torch.sigmoid(mask_logit)
        p = torch.sigmoid(pattern_logit)
        xp = ((1 - m) * x[None] + m * p).reshape(-1, *shape)
        hits = (model(xp).argmax(1) == targets).float().reshape(classes, n).mean(1)
    l1 = m.reshape(classes, -1).sum(1).numpy().astype(np.float64)
    return {"l1": l1, "asr": hits.numpy().astype(np.float64)}


# --- everything -----------------------------------------------------------------------------------------


def _final_linear(model: torch.nn.Module, classes: int) -> torch.nn.Linear | None:
    last = None
    for module in model.modules():
        if isinstance(module, torch.nn.Linear) and module.out_features == classes:
            last = module
    return last


def extract(
    model: torch.nn.Module,
    images: np.ndarray,
    labels: np.ndarray,
    architecture: str,
    meta: dict[str, Any],
    classes: int = 10,
) -> dict[str, float]:
    """All features of one model, from its clean examples (N, H, W) float32 in [0, 1]."""
    seed = int(meta.get("seed", 0))
    rng = np.random.default_rng(seed)
    torch.manual_seed(seed)
    for p in model.parameters():
        p.requires_grad_(False)
    feats: dict[str, float] = {}
    for arch in ARCHITECTURES:
        feats[f"arch_{arch}"] = float(architecture == arch)

    # Final layer weights.
    linear = _final_linear(model, classes)
    if linear is not None:
        w = linear.weight.detach().numpy().astype(np.float64)
        b = linear.bias.detach().numpy().astype(np.float64) if linear.bias is not None else np.zeros(classes)
        norms = np.linalg.norm(w, axis=1)
        feats["w_norm_z"] = _zmax(norms, 0.02 * norms.mean())
        feats["w_norm_ratio"] = float(norms.max() / (np.median(norms) + _EPS))
        feats["w_bias_z"] = _zmax(b, 0.02)
        feats["w_bias_range"] = float((b.max() - np.median(b)) / (np.abs(b).mean() + 1e-3))
        pos = np.clip(w, 0, None).sum(1)
        feats["w_pos_z"] = _zmax(pos, 0.02 * pos.mean())
    else:
        for name in ("w_norm_z", "w_norm_ratio", "w_bias_z", "w_bias_range", "w_pos_z"):
            feats[name] = 0.0

    # Clean outputs.
    x = torch.from_numpy(np.ascontiguousarray(images, dtype=np.float32))
    with torch.no_grad():
        logits = model(x)
        probs = torch.softmax(logits, 1).numpy().astype(np.float64)
    logits_np = logits.numpy().astype(np.float64)
    clean = logits_np.argmax(1)
    feats["clean_acc"] = float((clean == labels).mean())
    feats["clean_maxprob"] = float(probs.max(1).mean())
    feats["clean_entropy"] = float(-(probs * np.log(probs + 1e-12)).sum(1).mean())
    feats["clean_logit_z"] = _zmax(logits_np.mean(0), 0.1)
    # Second-best mass: a target class often gets a little of every example's probability.
    second = probs.copy()
    second[np.arange(len(second)), clean] = 0.0
    feats["clean_second_z"] = _zmax(second.mean(0), 0.005)

    # Generic probe families.
    families = {
        "patch": _patch_probes(images, rng, int(meta.get("patch_patterns", 2))),
        "blend": _blend_probes(images, rng, int(meta.get("blend_probes", 40))),
        "filter": _filter_probes(images),
        "warp": _warp_probes(images, rng, int(meta.get("warp_probes", 40))),
    }
    all_preds = []
    for name, probes in families.items():
        p, n = probes.shape[:2]
        preds = _predict(model, probes.reshape(p * n, *images.shape[1:])).reshape(p, n)
        feats.update(_flip_features(f"probe_{name}", preds, clean, classes))
        all_preds.append(preds)
    feats.update(_flip_features("probe_all", np.concatenate(all_preds), clean, classes))

    # Optimisation probes.
    steps = int(meta.get("opt_steps", 40))
    for eps in (0.1, 0.2):
        u = _universal(model, x, classes, eps, steps)
        tag = f"uap{int(eps * 100)}"
        feats[f"{tag}_asr_max"] = float(u["asr"].max())
        feats[f"{tag}_asr_z"] = _zmax(u["asr"], 0.05)
        feats[f"{tag}_loss_z"] = _zmin(np.log(u["loss"] + 1e-4), 0.1)
        feats[f"{tag}_loss_ratio"] = float(
            np.log(np.median(u["loss"]) + 1e-4) - np.log(u["loss"].min() + 1e-4)
        )
    nc = _cleanse(model, x, classes, steps * 2, float(meta.get("cleanse_lambda", 0.02)))
    l1 = nc["l1"] + 0.1 * (1.0 - nc["asr"]) * l1_scale(images)
    feats["nc_l1_min"] = float(l1.min())
    feats["nc_l1_ratio"] = float(np.log(np.median(l1) + 1e-3) - np.log(l1.min() + 1e-3))
    feats["nc_l1_z"] = _zmin(l1, 0.5)
    return feats


def l1_scale(images: np.ndarray) -> float:
    """Number of pixels of one image: the L1 mask norm a failed search is charged for."""
    return float(np.prod(images.shape[1:]))
