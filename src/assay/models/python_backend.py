"""``python:MODULE:FUNCTION``: any Python function that maps prompts to completions.

Why: rule-based baselines, mocked models in demos and wrappers around libraries we do not support
directly should be usable wherever a model spec is accepted, with the same cache and runner. The
function sees plain text, not message lists, so that a one-line lambda-like function is enough:
a single user turn is passed as its text; anything longer as a ``User: ...\\nAssistant: ...`` transcript
(see :func:`plain_prompt`). When the function has a parameter named ``params`` it also receives the
:class:`GenerationParams`. ``complete`` hands it plain-text prompts as they are.

Why a wrapper names its model: the response cache keys a reply by ``model_id``. The module's source alone
does not identify what answers (a wrapper that reads the weights' path from an environment variable is the
same source for every model it loads), so a module that loads anything defines ``MODEL_ID``, a string or a
function returning one (called once, at load, so it may read the environment), and that identity joins the
key. Without it the model is marked not cacheable and ``CachedModel`` asks it afresh every time.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from assay.errors import UserError
from assay.models.base import Conversation, Conversations, GenerationParams, OnResult

_ROLE_NAMES = {"system": "System", "user": "User", "assistant": "Assistant"}


def plain_prompt(conversation: Conversation, add_generation_prompt: bool = True) -> str:
    """Conversation as plain text for models and functions without a chat template.

    A single user turn is exactly its text; longer conversations become a ``Role: text`` transcript, one
    turn per line, ending with ``Assistant:`` (when ``add_generation_prompt``) so the reply follows on.
    """
    if len(conversation) == 1 and conversation[0]["role"] == "user":
        return conversation[0]["content"]
    lines = [f"{_ROLE_NAMES.get(m['role'], m['role'].title())}: {m['content']}" for m in conversation]
    if add_generation_prompt and (not conversation or conversation[-1]["role"] != "assistant"):
        lines.append("Assistant:")
    return "\n".join(lines)


class PythonChatModel:
    """Wraps ``FUNCTION(prompts: list[str]) -> list[str]`` from an importable module or a ``.py`` file.

    ``model_id`` includes a hash of the module's source, so editing the function invalidates cached replies,
    and the module's ``MODEL_ID`` (see the module docstring); ``cacheable`` says whether it declared one.
    The function is called once per ``batch_size`` prompts, so an interrupted run keeps finished batches.
    """

    def __init__(self, target: str, batch_size: int = 64) -> None:
        module_ref, sep, function_name = target.rpartition(":")
        if not sep or not module_ref or not function_name:
            raise UserError(f"python model spec needs MODULE:FUNCTION, got {target!r}")
        if batch_size < 1:
            raise UserError(f"batch_size must be at least 1, got {batch_size}")
        self.target = target
        self.batch_size = batch_size
        module = _import(module_ref)
        function = getattr(module, function_name, None)
        if function is None or not callable(function):
            raise UserError(f"python:{target}: {module_ref} has no callable named {function_name!r}")
        self.function: Callable[..., Any] = function
        self._wants_params = "params" in _parameter_names(function)
        identity = _declared_identity(module, target)
        self.cacheable = identity is not None
        self.model_id = f"python:{module_ref}:{function_name}@{_source_hash(module)}"
        if identity is not None:
            self.model_id += f"#{identity}"

    def chat(
        self, conversations: Conversations, params: GenerationParams, on_result: OnResult | None = None
    ) -> list[str]:
        return self.complete([plain_prompt(c) for c in conversations], params, on_result)

    def complete(
        self, prompts: Sequence[str], params: GenerationParams, on_result: OnResult | None = None
    ) -> list[str]:
        """The function's replies to plain-text prompts, ``batch_size`` at a time."""
        results: list[str] = []
        for start in range(0, len(prompts), self.batch_size):
            batch = prompts[start : start + self.batch_size]
            replies = self._call(batch, params)
            for offset, reply in enumerate(replies):
                results.append(reply)
                if on_result is not None:
                    on_result(start + offset, reply)
        return results

    def _call(self, prompts: list[str], params: GenerationParams) -> list[str]:
        kwargs = {"params": params} if self._wants_params else {}
        replies = self.function(list(prompts), **kwargs)
        if not isinstance(replies, list | tuple):
            raise UserError(
                f"python:{self.target} returned {type(replies).__name__}; expected a list of "
                f"{len(prompts)} strings"
            )
        if len(replies) != len(prompts):
            raise UserError(
                f"python:{self.target} returned {len(replies)} completions for {len(prompts)} prompts"
            )
        bad = next((i for i, r in enumerate(replies) if not isinstance(r, str)), None)
        if bad is not None:
            raise UserError(
                f"python:{self.target} returned a {type(replies[bad]).__name__} at position {bad}; "
                "expected strings"
            )
        return list(replies)


def _import(module_ref: str) -> ModuleType:
    """A dotted module name, or a path to a ``.py`` file (loaded under a name derived from its path)."""
    if module_ref.endswith(".py") or "/" in module_ref or "\\" in module_ref:
        path = Path(module_ref).expanduser().resolve()
        if not path.is_file():
            raise UserError(f"python model file not found: {path}")
        name = "assay_user_" + hashlib.sha256(str(path).encode()).hexdigest()[:12]
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise UserError(f"cannot import {path} as a Python module")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except Exception:
            del sys.modules[name]
            raise
        return module
    try:
        return importlib.import_module(module_ref)
    except ModuleNotFoundError as exc:
        if exc.name and module_ref.startswith(exc.name):
            raise UserError(f"python model module {module_ref!r} not found ({exc})") from exc
        raise


def _parameter_names(function: Callable[..., Any]) -> set[str]:
    try:
        return set(inspect.signature(function).parameters)
    except (TypeError, ValueError):  # builtins without a signature
        return set()


def _declared_identity(module: ModuleType, target: str) -> str | None:
    """The module's ``MODEL_ID`` (a string, or a function called now), or None when it declares none."""
    declared = getattr(module, "MODEL_ID", None)
    if declared is None:
        return None
    value = declared() if callable(declared) else declared
    if not isinstance(value, str) or not value:
        raise UserError(f"python:{target}: MODEL_ID must be a non-empty string (value: {value!r})")
    return value


def _source_hash(module: ModuleType) -> str:
    """A short hash of the module's file, or "nofile" for modules without one."""
    file = getattr(module, "__file__", None)
    if not file or not Path(file).is_file():
        return "nofile"
    return hashlib.sha256(Path(file).read_bytes()).hexdigest()[:12]
