"""Turn a model spec string (``hf:PATH``, ``openai:URL``, ``vllm:PATH``, ``python:MOD:FUNC``) into a model.

Why strings: the CLI, config files and the web app all name models the same short way, and one parser
gives every face the same error messages. Backends are imported only when chosen, so naming an
``openai:`` model never imports torch.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from assay.errors import UserError, shown
from assay.extras import missing
from assay.models.base import ChatModel

BACKENDS = ("hf", "openai", "vllm", "python")
SPEC_FORMS = (
    "hf:PATH (a model directory or a .gguf file), openai:BASE_URL (e.g. openai:http://localhost:8000/v1), "
    "vllm:PATH, python:MODULE:FUNCTION (MODULE a dotted name or a .py file)"
)


def split_spec(spec: str) -> tuple[str, str]:
    """A spec's backend and the rest (``("openai", "http://host/v1")``), by its form only: nothing is
    imported or loaded. A ``UserError`` says what is wrong with the form."""
    prefix, sep, rest = spec.partition(":")
    if not sep or not rest:
        raise UserError(f"model spec {spec!r} has no backend prefix; use one of {SPEC_FORMS}")
    if prefix not in BACKENDS:
        raise UserError(f"unknown model backend {prefix!r} in {spec!r}; use one of {SPEC_FORMS}")
    return prefix, rest


def check_spec_form(spec: str, what: str) -> str:
    """``spec`` if its form is right (see ``split_spec``); else a ``UserError`` naming ``what`` (the field
    or setting). For specs stored now and loaded later: an ``hf:`` model takes a while to load and an
    ``openai:`` server may not be up yet, so only the form is checked."""
    try:
        split_spec(spec)
    except UserError:
        raise UserError(f"{what} {shown(spec)} is not a model spec; use one of {SPEC_FORMS}") from None
    return spec


def load_model(
    spec: str,
    *,
    model_name: str | None = None,
    batch_size: int = 8,
    concurrency: int = 16,
    timeout: float = 60.0,
    max_retries: int = 5,
    api_key: str | None = None,
) -> ChatModel:
    """The model ``spec`` names. ``batch_size`` is prompts per forward pass (hf) or per function call
    (python); ``model_name``, ``concurrency``, ``timeout``, ``max_retries`` and ``api_key`` (default:
    ``$OPENAI_API_KEY``) apply to ``openai:``.
    Wrap the result in :class:`~assay.models.cache.CachedModel` to make runs resumable."""
    prefix, rest = split_spec(spec)
    if prefix == "hf":
        directory, gguf_file = _hf_location(rest)  # before importing torch: a typo fails at once
        try:
            from assay.models.hf import HFChatModel
        except ModuleNotFoundError as err:  # the platform image has no model stack: one line, not a traceback
            raise UserError(missing(err) or str(err)) from err

        return HFChatModel(directory, gguf_file=gguf_file, batch_size=batch_size)
    if prefix == "openai":
        from assay.models.openai_backend import OpenAIChatModel

        return OpenAIChatModel(
            _base_url(rest),
            model_name=model_name,
            concurrency=concurrency,
            max_retries=max_retries,
            timeout=timeout,
            api_key=api_key,
        )
    if prefix == "vllm":
        path = _existing(rest, "vllm")
        from assay.models.vllm_backend import VLLMChatModel

        return VLLMChatModel(path)
    from assay.models.python_backend import PythonChatModel  # the one backend left: python

    if ":" not in rest:
        raise UserError(f"model spec {spec!r} needs python:MODULE:FUNCTION; use one of {SPEC_FORMS}")
    return PythonChatModel(rest, batch_size=batch_size)


def _existing(path_text: str, prefix: str) -> Path:
    path = Path(path_text).expanduser()
    if not path.exists():
        raise UserError(f"{prefix}:{path_text}: no such file or directory; use one of {SPEC_FORMS}")
    return path


def _hf_location(path_text: str) -> tuple[Path, str | None]:
    """A directory, or a ``.gguf`` file split into its directory and file name."""
    path = _existing(path_text, "hf")
    if path.is_file():
        if path.suffix.lower() != ".gguf":
            raise UserError(f"hf:{path_text} is a file but not a .gguf file; use one of {SPEC_FORMS}")
        return path.parent, path.name
    return path, None


def _base_url(url: str) -> str:
    """Validate an http(s) URL; a bare host (no path) gets ``/v1``, where vLLM, Ollama, llama.cpp and TGI
    all serve the OpenAI API."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise UserError(f"openai:{url} is not an http(s) URL; use one of {SPEC_FORMS}")
    path = parts.path.rstrip("/") or "/v1"
    return urlunsplit((parts.scheme, parts.netloc, path, parts.query, ""))
