"""Which optional extra of assay provides a module, so a command this installation cannot run says so in
one line instead of a traceback.

Why: the platform's own dependencies leave out the model stack (torch, transformers, ...: the ``models``
extra) and Ray, so the platform image stays small (docs/deploy.md). ``assay zoo generate`` there, or any
command that loads a local model, then meets a missing module deep inside; the CLI turns that into one line
naming the extra to install, or the worker image, which carries it.
"""

from __future__ import annotations

EXTRAS = {
    **dict.fromkeys(("torch", "transformers", "peft", "gguf", "accelerate", "safetensors"), "models"),
    "ray": "ray",
    "lm_eval": "lm-eval",
    "vllm": "vllm",
}


def missing(err: ModuleNotFoundError) -> str | None:
    """The one line for a module an extra provides (None for any other missing module: a real bug)."""
    top = (err.name or "").partition(".")[0]
    extra = EXTRAS.get(top)
    if extra is None:
        return None
    return (
        f"this needs {top}, which is not installed here: pip install 'assay[{extra}]' "
        "(in containers, use the worker image: docs/deploy.md)"
    )
