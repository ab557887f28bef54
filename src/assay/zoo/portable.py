"""Model files any detector can load, with or without ``assay``: a whole-module pickle and weights alone.

TrojAI detectors open ``model.pt`` with a bare ``torch.load`` in their own environment (NIST's example
does). A module pickled as it is names its class, ``assay.zoo.architectures.ResNetTiny``, so it loads only
where ``assay`` is importable. ``save_model`` pickles the module's ``torch.fx`` trace instead: a
``GraphModule`` holding torch's own layers and the generated ``forward`` source, which ``torch.load(path,
weights_only=False)`` rebuilds with nothing but torch installed. Same parameter names, same outputs to the
bit, and the class keeps its name (``model.__class__.__name__`` is ``ResNetTiny``, which NIST's code groups
models by).

``save_weights`` writes the safe form: the state dict as ``model.safetensors`` (no code runs on loading),
with the architecture described by ``reduced-config.json`` (``architecture``, ``width``, ``input_shape``,
``num_classes``); ``load_weights`` builds the module from the two.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import fx, nn

from assay.errors import UserError
from assay.fileio import atomic_path
from assay.zoo.architectures import build_model

WEIGHTS_FILE = "model.safetensors"


def portable(model: nn.Module) -> fx.GraphModule:
    """The module as a ``GraphModule`` that pickles without naming any ``assay`` class.

    Type annotations are dropped from the trace: under ``from __future__ import annotations`` they are
    strings, which fx would store as globals of the generated code and fail to pickle.
    """
    graph_module = fx.symbolic_trace(model.eval())
    for node in graph_module.graph.nodes:
        node.type = None
    graph_module.recompile()
    # torch.fx restores this name on unpickling, so the loaded module reports its family's class name
    graph_module._graphmodule_cls_name = type(model).__name__
    return graph_module


def save_model(model: nn.Module, path: str | Path) -> Path:
    """Write TrojAI's ``model.pt`` (a whole pickled module) loadable without ``assay``, atomically."""
    path = Path(path)
    with atomic_path(path) as tmp:
        torch.save(portable(model), tmp)
    return path


def save_weights(model: nn.Module, path: str | Path) -> Path:
    """Write the state dict as safetensors, atomically: the form a cautious detector loads without pickle.
    Equal weights give equal bytes (:func:`canonical_header`), so a model's content hash names it."""
    from safetensors.torch import save

    path = Path(path)
    state = {name: tensor.contiguous() for name, tensor in model.state_dict().items()}
    data = save(state, metadata={"format": "pt", "architecture": type(model).__name__})
    with atomic_path(path) as tmp:
        tmp.write_bytes(canonical_header(data))
        tmp.chmod(0o644)  # readable by any detector, as model files are
    return path


def canonical_header(data: bytes) -> bytes:
    """``data`` (a safetensors file) with its JSON header's keys sorted, padded to its old length.

    safetensors writes the metadata from a Rust ``HashMap``, whose order changes from one save to the next,
    so one model saved twice could give two files (2 in 30 saves here) and two content hashes for Ray's
    transfer (issue 27). Sorting keeps every offset and tensor byte; only the header's key order changes."""
    size = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + size])
    text = json.dumps(header, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    if len(text) > size:  # pragma: no cover - the same keys and values, so never longer
        return data
    return data[:8] + text + b" " * (size - len(text)) + data[8 + size :]


def _architecture(config: dict) -> nn.Module:
    """An untrained module of the architecture ``reduced-config.json`` describes (image or text)."""
    if config.get("domain") == "text":
        from assay.zoo.textarch import build_text_model

        return build_text_model(
            config["architecture"],
            config["width"],
            config["vocab_size"],
            config["max_length"],
            config["num_classes"],
        )
    return build_model(
        config["architecture"], config["width"], tuple(config["input_shape"]), config["num_classes"]
    )


def load_weights(model_dir: str | Path) -> nn.Module:
    """Build a model from ``model.safetensors`` and the architecture in ``reduced-config.json``; no pickle."""
    from safetensors.torch import load_file

    folder = Path(model_dir)
    config_path = folder / "reduced-config.json"
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
        model = _architecture(config)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UserError(f"{config_path}: not an architecture description ({exc})") from None
    try:
        state = load_file(str(folder / WEIGHTS_FILE))
    except (OSError, ValueError) as exc:
        raise UserError(f"{folder / WEIGHTS_FILE}: not readable weights ({exc})") from None
    try:
        model.load_state_dict(state)
    except RuntimeError as exc:
        first = str(exc).splitlines()[0]
        raise UserError(f"{folder / WEIGHTS_FILE}: does not fit {config['architecture']} ({first})") from None
    return model.eval()
