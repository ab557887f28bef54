"""``openai:BASE_URL``: any OpenAI-compatible chat-completions server (vLLM, Ollama, llama.cpp, TGI, OpenAI).

Why the official client: it already knows how to retry. ``AsyncOpenAI(max_retries=n)`` retries timeouts,
connection errors, 408, 409, 429 and 5xx; it waits ``retry-after-ms``/``retry-after`` when the server
sends one (up to 2 minutes), otherwise ``0.5 s * 2**attempt`` capped at 8 s, minus up to 25 % jitter
(``openai._base_client._calculate_retry_timeout``). We add what it lacks: bounded concurrency, a result
callback per reply (so a cache can keep partial work), model discovery and one-line user errors.

Why ``client.post("/chat/completions", cast_to=bytes)`` rather than ``client.chat.completions.create``:
the same request, retries, auth and timeouts, but without the SDK's per-request walk of the typed
``messages`` (about 30 % of its CPU per request) and the typed response build (about 10 %); at 64
requests in flight the client's CPU, not the server, is the limit (see ``docs/benchmarks.md``). For the
same reason the aiohttp transport (``openai.DefaultAioHttpClient``, the ``openai[aiohttp]`` extra) is used
when aiohttp is installed: it costs 40-50 % less CPU per request than the default httpx2 transport.

Only the chat-completions API is used, with ``max_tokens``, ``temperature``, ``top_p`` and ``seed``: the
common subset the local servers implement; batches are non-streaming, ``stream`` (one conversation, for a
person watching the reply arrive) asks for ``"stream": true``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import importlib.util
import json
import os
from collections.abc import Iterator

import openai

from assay.errors import UserError
from assay.models.base import Conversation, Conversations, GenerationParams, OnResult


class OpenAIChatModel:
    """Chat through an OpenAI-compatible endpoint, ``concurrency`` requests in flight at most.

    ``model_name=None`` asks ``GET /models`` and uses the one model served (an error names them when
    there are several). ``api_key`` defaults to ``$OPENAI_API_KEY``, else ``"EMPTY"`` (local servers
    ignore it). ``timeout`` is per request attempt, in seconds.
    """

    def __init__(
        self,
        base_url: str,
        model_name: str | None = None,
        api_key: str | None = None,
        concurrency: int = 16,
        max_retries: int = 5,
        timeout: float = 60.0,
    ) -> None:
        if concurrency < 1:
            raise UserError(f"concurrency must be at least 1, got {concurrency}")
        if max_retries < 0:
            raise UserError(f"max_retries must be at least 0, got {max_retries}")
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key or os.environ.get("OPENAI_API_KEY") or "EMPTY"
        self.concurrency = concurrency
        self.max_retries = max_retries
        self.timeout = timeout
        self._model_name = model_name

    @property
    def model_name(self) -> str:
        """The served model's name; discovered from ``/models`` on first use when not given."""
        if self._model_name is None:
            self._model_name = self._discover_model()
        return self._model_name

    @property
    def model_id(self) -> str:
        return f"openai:{self.base_url}#{self.model_name}"

    def _client_kwargs(self) -> dict[str, object]:
        return {
            "base_url": self.base_url,
            "api_key": self.api_key,
            "max_retries": self.max_retries,
            "timeout": self.timeout,
        }

    def _async_client(self) -> openai.AsyncOpenAI:
        """A client for one event loop (its connection pool belongs to the loop that first uses it)."""
        kwargs = self._client_kwargs()
        if _HAVE_AIOHTTP:
            # RuntimeError: the SDK found aiohttp unusable (e.g. too old); keep its httpx transport then.
            with contextlib.suppress(RuntimeError):
                kwargs["http_client"] = openai.DefaultAioHttpClient()
        return openai.AsyncOpenAI(**kwargs)  # type: ignore[arg-type]

    def _discover_model(self) -> str:
        try:
            with openai.OpenAI(**self._client_kwargs()) as client:  # type: ignore[arg-type]
                names = [m.id for m in client.models.list()]
        except openai.OpenAIError as exc:
            raise UserError(f"{self.base_url}: listing /models failed: {_describe(exc)}") from exc
        if len(names) != 1:
            shown = ", ".join(names) if names else "none"
            raise UserError(
                f"{self.base_url} serves {len(names)} models ({shown}); pick one with --model-name"
            )
        return names[0]

    def chat(
        self, conversations: Conversations, params: GenerationParams, on_result: OnResult | None = None
    ) -> list[str]:
        """Blocking front of :meth:`achat`: runs its own event loop (in a helper thread when the calling
        thread already runs one, e.g. in Jupyter), so it works from any thread."""
        coroutine_args = (conversations, params, on_result)
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(self.achat(*coroutine_args))
        with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="assay-openai") as pool:
            return pool.submit(asyncio.run, self.achat(*coroutine_args)).result()

    async def achat(
        self,
        conversations: Conversations,
        params: GenerationParams,
        on_result: OnResult | None = None,
    ) -> list[str]:
        """Send every conversation, ``concurrency`` at a time; ``on_result(i, text)`` fires as each reply
        arrives (completion order, ``i`` the input position). The first request that fails after its
        retries stops the run with a :class:`UserError`; replies already handed to ``on_result`` stay."""
        model = self.model_name  # discover before the loop starts sending
        results: list[str | None] = [None] * len(conversations)
        pending = iter(enumerate(conversations))
        received = 0
        request_args = _request_args(params)

        async with self._async_client() as client:

            async def worker() -> None:
                nonlocal received
                # One worker per connection pulls the next conversation: cheaper than a task per request.
                for index, conversation in pending:
                    raw = await client.post(
                        "/chat/completions",
                        body={"model": model, "messages": conversation, **request_args},
                        cast_to=bytes,
                    )
                    text = _reply_text(raw, self.base_url)
                    results[index] = text
                    received += 1
                    if on_result is not None:
                        on_result(index, text)

            try:
                async with asyncio.TaskGroup() as group:
                    for _ in range(min(self.concurrency, len(conversations))):
                        group.create_task(worker())
            except BaseExceptionGroup as group_error:
                first = _first_error(group_error)
                if isinstance(first, openai.OpenAIError):
                    raise self._run_error(first, received, len(conversations)) from first
                raise first from None
        return [text if text is not None else "" for text in results]

    def stream(self, conversation: Conversation, params: GenerationParams) -> Iterator[str]:
        """The reply to one conversation in pieces as the server sends them, for a person watching it
        arrive (the web red-team chat). Blocking; a failure after the client's retries is a ``UserError``."""
        model = self.model_name
        try:
            with openai.OpenAI(**self._client_kwargs()) as client:  # type: ignore[arg-type]
                chunks = client.chat.completions.create(
                    model=model,
                    messages=conversation,  # type: ignore[arg-type]
                    stream=True,
                    **_request_args(params),  # type: ignore[arg-type]
                )
                for chunk in chunks:
                    if chunk.choices and chunk.choices[0].delta.content:
                        yield chunk.choices[0].delta.content
        except openai.OpenAIError as exc:
            raise UserError(f"{self.base_url}: streamed chat completion failed: {_describe(exc)}") from exc

    def _run_error(self, exc: openai.OpenAIError, received: int, total: int) -> UserError:
        retries = self.max_retries if _retryable(exc) else 0
        retried = f" after {retries} {'retry' if retries == 1 else 'retries'}" if retries else ""
        return UserError(
            f"{self.base_url}: chat completion failed{retried}: {_describe(exc)}; "
            f"{received} of {total} responses had arrived and were kept (a cached run resumes from there)"
        )


_HAVE_AIOHTTP = importlib.util.find_spec("aiohttp") is not None


def _reply_text(raw: bytes, base_url: str) -> str:
    """``choices[0].message.content`` of a ``chat.completion`` body, stripped; a clear error otherwise."""
    try:
        choices = json.loads(raw)["choices"]
        content = choices[0]["message"]["content"] if choices else ""
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        shown = _one_line(raw[:200].decode("utf-8", "replace"))
        raise UserError(f"{base_url}: not a chat completion response ({exc!r}): {shown}") from exc
    return (content or "").strip()


def _request_args(params: GenerationParams) -> dict[str, object]:
    args: dict[str, object] = {
        "max_tokens": params.max_new_tokens,
        "temperature": params.temperature,
        "top_p": params.top_p,
    }
    if params.seed is not None:
        args["seed"] = params.seed
    return args


def _first_error(group: BaseExceptionGroup) -> BaseException:
    """The error that stopped the run: the first non-cancellation leaf (others were cancelled by it)."""
    leaves: list[BaseException] = []

    def walk(error: BaseException) -> None:
        if isinstance(error, BaseExceptionGroup):
            for inner in error.exceptions:
                walk(inner)
        else:
            leaves.append(error)

    walk(group)
    return next((e for e in leaves if not isinstance(e, asyncio.CancelledError)), leaves[0])


def _retryable(exc: openai.OpenAIError) -> bool:
    if isinstance(exc, openai.APIConnectionError):
        return True
    status = getattr(exc, "status_code", 0)
    return status in (408, 409, 429) or status >= 500


def _describe(exc: openai.OpenAIError) -> str:
    """One line: the HTTP status and the server's message, or what went wrong with the connection."""
    if isinstance(exc, openai.APIConnectionError):
        # The transport's own error says more than the SDK's ("Connection error."): find the innermost.
        # Its type, not the SDK's class, tells a timeout: the aiohttp adapter maps refusals to timeouts.
        cause: BaseException = exc
        while cause.__cause__ is not None:
            cause = cause.__cause__
        if cause is exc:
            return "timed out" if isinstance(exc, openai.APITimeoutError) else "connection failed"
        timed_out = isinstance(cause, TimeoutError) or "timeout" in type(cause).__name__.lower()
        detail = f" ({type(cause).__name__}: {cause})" if str(cause) else f" ({type(cause).__name__})"
        return _one_line(f"{'timed out' if timed_out else 'connection failed'}{detail}")
    if isinstance(exc, openai.APIStatusError):
        message = exc.message
        body = exc.body
        if isinstance(body, dict) and isinstance(body.get("message"), str):
            message = body["message"]
        return _one_line(f"HTTP {exc.status_code}: {message}")
    return _one_line(f"{type(exc).__name__}: {exc}")


def _one_line(text: str, limit: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."
