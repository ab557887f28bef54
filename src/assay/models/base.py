"""The one protocol for "a model we query": batched chat/text generation with a stable identity, plus
``stream_chat`` for a person watching one reply arrive (backends may add a ``stream`` method)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from typing import Literal, Protocol, TypedDict, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field


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


def stream_chat(model: ChatModel, conversation: Conversation, params: GenerationParams) -> Iterator[str]:
    """The reply to one conversation in pieces: the backend's own ``stream(conversation, params)`` when it
    has one (``openai:``), else the whole reply from ``chat`` as a single piece, so every backend can sit
    behind a streaming chat page."""
    stream = getattr(model, "stream", None)
    if callable(stream):
        yield from stream(conversation, params)
    else:
        yield model.chat([conversation], params)[0]
