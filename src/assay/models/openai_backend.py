"""``openai:BASE_URL``: any OpenAI-compatible chat-completions server (vLLM, Ollama, llama.cpp, TGI, OpenAI).

Retries follow the official SDK's rules everywhere: timeouts, connection errors, 408, 409, 429 and 5xx;
the server's ``retry-after-ms``/``retry-after`` when it sends one (up to 2 minutes), otherwise
``0.5 s * 2**attempt`` capped at 8 s, minus up to 25 % jitter. We add bounded concurrency, a result
callback per reply (so a cache can keep partial work), model discovery and one-line user errors.

Why batches bypass the SDK (``http_batch``, bare aiohttp with the SDK's retry rules): at 64 requests in
flight the client's CPU, not the server, is the limit, and the SDK's per-request option and header
building costs twice a bare POST (see ``docs/benchmarks.md``). Discovery and streaming keep the SDK.

Requests carry ``max_tokens``, ``temperature``, ``top_p`` and ``seed``: the common subset the local servers
implement. Chat goes to ``/chat/completions``; plain-text continuation (``complete``) and log-likelihood
scoring (``loglikelihood``: ``echo`` + ``logprobs``, as lm-evaluation-harness asks) to the legacy
``/completions``. Batches are non-streaming; ``stream`` (one conversation, for a person watching the reply
arrive) asks for ``"stream": true``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import math
import os
from collections.abc import Callable, Coroutine, Iterator, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from assay.errors import UserError
from assay.models.base import Conversation, Conversations, GenerationParams, OnResult, OnScore
from assay.models.http_batch import BatchPoster, RequestFailed

if TYPE_CHECKING:
    import openai

T = TypeVar("T")


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

    def _discover_model(self) -> str:
        """The one served model, from ``GET /models``. Retried once only: a server whose listing fails
        (``transformers serve`` answers 500 when no hub cache exists) fails the same way every time, and
        the way out is to name the model."""
        import openai  # the SDK only where it is used: discovery and streaming (import ~0.3 s)

        kwargs = {**self._client_kwargs(), "max_retries": min(self.max_retries, 1)}
        try:
            with openai.OpenAI(**kwargs) as client:  # type: ignore[arg-type]
                names = [m.id for m in client.models.list()]
        except openai.OpenAIError as exc:
            raise UserError(
                f"{self.base_url}: listing /models failed ({_describe(exc)}); name the served model with "
                "--model-name (for `transformers serve`, the path or id it was started with)"
            ) from exc
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
        return _run_blocking(self.achat(conversations, params, on_result))

    async def achat(
        self,
        conversations: Conversations,
        params: GenerationParams,
        on_result: OnResult | None = None,
    ) -> list[str]:
        """Send every conversation, ``concurrency`` at a time; ``on_result(i, text)`` fires as each reply
        arrives (completion order, ``i`` the input position). The first request that fails after its
        retries stops the run with a :class:`UserError`; replies already handed to ``on_result`` stay."""
        args = _request_args(params)
        bodies = [{"messages": conversation, **args} for conversation in conversations]
        texts = await self._send(
            "/chat/completions", bodies, lambda _i, raw: _chat_text(raw, self.base_url), on_result
        )
        return [text if text is not None else "" for text in texts]

    def complete(
        self, prompts: Sequence[str], params: GenerationParams, on_result: OnResult | None = None
    ) -> list[str]:
        """Plain-text continuations through the legacy ``/completions`` API (vLLM, llama.cpp, TGI and
        ``transformers serve`` offer it; OpenAI itself only for a few models)."""
        bodies = [{"prompt": prompt, **_request_args(params)} for prompt in prompts]
        parse = lambda _i, raw: _completion_text(raw, self.base_url)  # noqa: E731
        texts = _run_blocking(self._send("/completions", bodies, parse, on_result))
        return [text if text is not None else "" for text in texts]

    def loglikelihood(
        self, requests: Sequence[tuple[str, str]], on_result: OnScore | None = None
    ) -> list[float]:
        """log P(continuation | context) from ``/completions`` with ``echo`` and ``logprobs``: the server
        returns the prompt's own tokens with their log-probabilities and character offsets, and the
        tokens from the continuation's first character on are summed (a token straddling the boundary
        counts with the continuation). A server that ignores ``echo``/``logprobs`` gets a one-line error."""
        bodies = [
            {
                "prompt": context + continuation,
                "max_tokens": 1,
                "temperature": 0.0,
                "echo": True,
                "logprobs": 1,
            }
            for context, continuation in requests
        ]

        def parse(index: int, raw: bytes) -> float:
            context, continuation = requests[index]
            return _echo_logprob(raw, len(context), len(context) + len(continuation), self.base_url)

        scores = _run_blocking(self._send("/completions", bodies, parse, on_result))
        return [score if score is not None else math.nan for score in scores]

    async def _send(
        self,
        path: str,
        bodies: Sequence[dict[str, Any]],
        parse: Callable[[int, bytes], Any],
        on_result: Callable[[int, Any], None] | None,
    ) -> list[Any]:
        """POST each body (with the model name) to ``path``, ``concurrency`` at a time; ``parse(i, raw)``
        turns a response into its result, handed to ``on_result`` as it arrives."""
        model = self.model_name  # discover before the loop starts sending
        poster = BatchPoster(self.base_url, self.api_key, self.concurrency, self.max_retries, self.timeout)
        received = [0]
        try:
            return await poster.post_all(
                path, [{"model": model, **body} for body in bodies], parse, on_result, received
            )
        except BaseExceptionGroup as group_error:
            first = _first_error(group_error)
            if isinstance(first, RequestFailed):
                raise self._run_error(first, path, received[0], len(bodies)) from first
            raise first from None

    def stream(self, conversation: Conversation, params: GenerationParams) -> Iterator[str]:
        """The reply to one conversation in pieces as the server sends them, for a person watching it
        arrive (the web red-team chat). Blocking; a failure after the client's retries is a ``UserError``."""
        import openai

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

    def _run_error(self, exc: RequestFailed, path: str, received: int, total: int) -> UserError:
        retries = self.max_retries if exc.retryable else 0
        retried = f" after {retries} {'retry' if retries == 1 else 'retries'}" if retries else ""
        what = "chat completion" if path == "/chat/completions" else "completion"
        hint = ""
        if path == "/completions" and exc.status in (404, 405, 501):
            hint = " (the server offers no /completions API: ask it in chat mode)"
        return UserError(
            f"{self.base_url}: {what} failed{retried}: {_describe_failure(exc)}{hint}; "
            f"{received} of {total} responses had arrived and were kept (a cached run resumes from there)"
        )


def _run_blocking(coroutine: Coroutine[Any, Any, T]) -> T:
    """Run ``coroutine`` to the end from synchronous code: in this thread, or in a helper thread when this
    thread already runs an event loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine)
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="assay-openai") as pool:
        return pool.submit(asyncio.run, coroutine).result()


def _body(raw: bytes, base_url: str, kind: str) -> dict[str, Any]:
    """The decoded JSON body; a one-line error quoting its start when it is not an object."""
    try:
        body = json.loads(raw)
        if not isinstance(body, dict):
            raise TypeError(f"a JSON {type(body).__name__}")
        return body
    except (ValueError, TypeError) as exc:
        shown = _one_line(raw[:200].decode("utf-8", "replace"))
        raise UserError(f"{base_url}: not a {kind} response ({exc!r}): {shown}") from exc


def _choice(raw: bytes, base_url: str, kind: str) -> dict[str, Any]:
    body = _body(raw, base_url, kind)
    try:
        choices = body["choices"]
        return choices[0] if choices else {}
    except (KeyError, IndexError, TypeError) as exc:
        shown = _one_line(raw[:200].decode("utf-8", "replace"))
        raise UserError(f"{base_url}: not a {kind} response ({exc!r}): {shown}") from exc


def _chat_text(raw: bytes, base_url: str) -> str:
    """``choices[0].message.content`` of a ``chat.completion`` body, stripped."""
    message = _choice(raw, base_url, "chat completion").get("message") or {}
    return (message.get("content") or "").strip()


def _completion_text(raw: bytes, base_url: str) -> str:
    """``choices[0].text`` of a ``text_completion`` body, stripped."""
    return (_choice(raw, base_url, "completion").get("text") or "").strip()


def _echo_logprob(raw: bytes, start: int, end: int, base_url: str) -> float:
    """Sum of the echoed prompt's token log-probabilities over characters ``start:end`` (the
    continuation), from ``choices[0].logprobs`` ``tokens``, ``token_logprobs`` and ``text_offset``."""
    logprobs = _choice(raw, base_url, "completion").get("logprobs")
    try:
        tokens, values, offsets = logprobs["tokens"], logprobs["token_logprobs"], logprobs["text_offset"]
    except (KeyError, TypeError):
        raise UserError(
            f"{base_url}: the server does not return the prompt's log-probabilities (/completions with "
            "echo and logprobs); --mode loglikelihood needs a server that does (vLLM, llama.cpp's server), "
            "or use --mode completion"
        ) from None
    total, counted = 0.0, 0
    for token, value, offset in zip(tokens, values, offsets, strict=False):
        if offset >= end:  # the generated token (max_tokens=1) and anything past the prompt
            break
        if offset + len(token) > start:
            if value is None:
                raise UserError(f"{base_url}: the server gave no log-probability for echoed token {token!r}")
            total += value
            counted += 1
    if counted == 0:
        raise UserError(f"{base_url}: the echoed prompt has no token in the continuation's characters")
    return total


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


def _describe_failure(exc: RequestFailed) -> str:
    """One line: the HTTP status and the server's message, or what went wrong with the connection."""
    if exc.status is not None:
        return _one_line(f"HTTP {exc.status}: {exc.message}")
    return _one_line(f"{'timed out' if exc.timed_out else 'connection failed'} ({exc.message})")


def _describe(exc: openai.OpenAIError) -> str:
    """One line: the HTTP status and the server's message, or what went wrong with the connection."""
    import openai

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
