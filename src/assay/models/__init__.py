"""Models we query: one protocol (:class:`ChatModel`), backends chosen by a spec string, a response cache.

    from assay.models import CachedModel, GenerationParams, ResponseCache, load_model, user_turn

    model = CachedModel(load_model("openai:http://localhost:8000/v1"), ResponseCache())
    replies = model.chat([user_turn("2+2=?")], GenerationParams(max_new_tokens=8))

Backends (and so torch, transformers, openai) are imported on first use, keeping ``import assay.models``
fast for commands that never load a model.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from assay.models.base import (
    ChatModel,
    Conversation,
    GenerationParams,
    Message,
    OnResult,
    stream_chat,
    user_turn,
)
from assay.models.cache import CachedModel, ResponseCache, cache_key
from assay.models.spec import load_model

if TYPE_CHECKING:
    from assay.models.hf import HFChatModel, load_hf, render_chat
    from assay.models.openai_backend import OpenAIChatModel
    from assay.models.python_backend import PythonChatModel, plain_prompt
    from assay.models.stub_server import StubServer, serve_stub
    from assay.models.vllm_backend import VLLMChatModel

_LAZY = {
    "HFChatModel": "assay.models.hf",
    "load_hf": "assay.models.hf",
    "render_chat": "assay.models.hf",
    "OpenAIChatModel": "assay.models.openai_backend",
    "PythonChatModel": "assay.models.python_backend",
    "plain_prompt": "assay.models.python_backend",
    "StubServer": "assay.models.stub_server",
    "serve_stub": "assay.models.stub_server",
    "VLLMChatModel": "assay.models.vllm_backend",
}

__all__ = [
    "CachedModel",
    "ChatModel",
    "Conversation",
    "GenerationParams",
    "HFChatModel",
    "Message",
    "OnResult",
    "OpenAIChatModel",
    "PythonChatModel",
    "ResponseCache",
    "StubServer",
    "VLLMChatModel",
    "cache_key",
    "load_hf",
    "load_model",
    "plain_prompt",
    "render_chat",
    "serve_stub",
    "stream_chat",
    "user_turn",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'assay.models' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
