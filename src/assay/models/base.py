"""The one protocol for "a model we query": batched chat/text generation with a stable identity, plus
``stream_chat`` for a person watching one reply arrive (backends may add a ``stream`` method)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from typing import Literal, Protocol, TypedDict, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

from assay.errors import UserError


class Message(TypedDict):
    role: Literal["system", "user", "assistant"]
    content: str


Conversation = list[Message]
Conversations = Sequence[Conversation]  # a batch: one reply comes back for each

# Called as each response arrives (index into the request list, text), so callers can cache and show
# progress without waiting for the whole batch.
OnResult = Callable[[int, str], None]


class GenerationParams(BaseModel):
    """Decoding settings; part of the cache key, so two runs with the same params share responses."""

    model_config = ConfigDict(frozen=True)

    max_new_tokens: int = Field(default=32, ge=1, le=32768)
    temperature: float = Field(default=0.0, ge=0.0, le=5.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    seed: int | None = None

    def cache_key(self) -> str:
        return json.dumps(self.model_dump(), sort_keys=True)


def user_turn(prompt: str) -> Conversation:
    """A single-turn conversation holding ``prompt`` as the user's message."""
    return [{"role": "user", "content": prompt}]


@runtime_checkable
class ChatModel(Protocol):
    """What every backend provides. ``model_id`` identifies the weights/endpoint for the response cache."""

    @property
    def model_id(self) -> str: ...

    def chat(
        self, conversations: Conversations, params: GenerationParams, on_result: OnResult | None = None
    ) -> list[str]:
        """Return one assistant reply per conversation, in order; call ``on_result`` as each arrives."""
        ...


# Called as each log-likelihood arrives (index into the request list, the score).
OnScore = Callable[[int, float], None]


@runtime_checkable
class CompletionModel(Protocol):
    """A model that continues plain text (no chat template): base models, scraped-text contamination."""

    @property
    def model_id(self) -> str: ...

    def complete(
        self, prompts: Sequence[str], params: GenerationParams, on_result: OnResult | None = None
    ) -> list[str]:
        """Return the continuation of each prompt, in order; call ``on_result`` as each arrives."""
        ...


@runtime_checkable
class ScoringModel(Protocol):
    """A model that scores text: log P(continuation | context), summed over the continuation's tokens."""

    @property
    def model_id(self) -> str: ...

    def loglikelihood(
        self, requests: Sequence[tuple[str, str]], on_result: OnScore | None = None
    ) -> list[float]:
        """One log-probability per (context, continuation) pair, in order."""
        ...


_CAPABILITY = {
    "complete": "continuing plain text needs an hf:, openai: (/v1/completions), vllm: or python: model",
    "loglikelihood": "scoring by log-likelihood needs model scores: an hf: or vllm: model, or an openai: "
    "server with /v1/completions echo+logprobs (python: functions return text only)",
}


def require(model: ChatModel, method: str) -> Callable:
    """``model``'s ``complete`` or ``loglikelihood`` method, or a one-line ``UserError`` saying which
    backends have it."""
    found = getattr(model, method, None)
    if not callable(found):
        raise UserError(f"{model.model_id}: {_CAPABILITY[method]}")
    return found


def stream_chat(model: ChatModel, conversation: Conversation, params: GenerationParams) -> Iterator[str]:
    """The reply to one conversation in pieces: the backend's own ``stream(conversation, params)`` when it
    has one (``openai:``), else the whole reply from ``chat`` as a single piece, so every backend can sit
    behind a streaming chat page."""
    stream = getattr(model, "stream", None)
    if callable(stream):
        yield from stream(conversation, params)
    else:
        yield model.chat([conversation], params)[0]
