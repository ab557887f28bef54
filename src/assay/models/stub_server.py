"""A tiny OpenAI-compatible chat server for tests, benchmarks and dry runs.

Why it exists: the ``openai:`` backend should be tested against a real HTTP server (retries, concurrency,
model discovery) without a GPU or network. The app is a raw ASGI callable rather than a framework app so
that one process can answer well over a thousand requests per second on two cores while it sleeps
``latency`` seconds per request (``asyncio.sleep``: requests overlap, nothing blocks).

Only what the backend uses is served: ``GET /v1/models``, ``POST /v1/chat/completions`` in the real
OpenAI response shape, streamed as ``chat.completion.chunk`` server-sent events (one word per chunk,
``chunk_delay`` seconds apart) when the request asks for ``"stream": true``, and ``POST /v1/completions``
(the prompt given to the responder as one user message; with ``echo`` and ``logprobs`` and a ``scorer``,
the prompt's tokens and their log-probabilities as vLLM returns them); other paths answer 404 in the
OpenAI error shape.

    stub = StubServer(lambda messages: "Paris", latency=0.05, fail_first=2, fail_status=429)
    with serve_stub(stub) as base_url:          # "http://127.0.0.1:PORT/v1"
        model = load_model(f"openai:{base_url}")
        ...
    stub.stats.chat_requests
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from assay.models.base import Message

Responder = Callable[[list[Message]], str]
# The prompt as (token text, log-probability) pairs whose texts join to the prompt: what echo returns.
Scorer = Callable[[str], list[tuple[str, float]]]


def echo_responder(messages: list[Message]) -> str:
    """The default rule: answer with the last user message, so tests can check order and routing."""
    for message in reversed(messages):
        if message["role"] == "user":
            return f"echo: {message['content']}"
    return "echo:"


@dataclass
class StubStats:
    """What the server saw. Updated from the server thread; read it after the client calls return."""

    requests: int = 0  # every HTTP request, failed or not
    chat_requests: int = 0  # POST /chat/completions, failed or not
    model_requests: int = 0  # GET /models
    status_counts: Counter[int] = field(default_factory=Counter)
    # every chat request body in arrival order, plus "_prompt" (last user message) and "_status" (answer)
    chat_bodies: list[dict[str, Any]] = field(default_factory=list)
    completion_requests: int = 0  # POST /completions, failed or not
    completion_bodies: list[dict[str, Any]] = field(default_factory=list)  # as they arrived

    def prompts(self) -> list[str]:
        """The last user message of each chat request that was answered 200, in arrival order."""
        return [body["_prompt"] for body in self.chat_bodies if body.get("_status") == 200]


class StubServer:
    """The ASGI app. ``responder`` maps a conversation to the reply text; an exception in it answers 500.

    ``fail_first`` requests to ``/chat/completions`` answer ``fail_status`` (429 or 5xx, say) before any
    succeeds; ``retry_after`` (seconds), when set, is sent with each 429/500 as ``retry-after-ms``, the
    header the OpenAI client honours instead of its own exponential backoff (tests stay fast).
    ``chunk_delay`` (seconds) is the pause between the words of a streamed reply. ``scorer`` answers
    ``/completions`` requests with ``echo`` and ``logprobs``; without one they get ``"logprobs": null``,
    as from a server that ignores the fields (``transformers serve``). ``models_status`` other than 200
    makes ``GET /models`` fail with it (``transformers serve`` answers 500 without a hub cache);
    ``completions=False`` serves chat only (``/completions`` answers 404).
    """

    def __init__(
        self,
        responder: Responder = echo_responder,
        *,
        latency: float = 0.0,
        fail_first: int = 0,
        fail_status: int = 429,
        retry_after: float | None = None,
        models: Sequence[str] = ("stub-model",),
        chunk_delay: float = 0.0,
        scorer: Scorer | None = None,
        models_status: int = 200,
        completions: bool = True,
    ) -> None:
        if latency < 0 or chunk_delay < 0:
            raise ValueError(f"latency and chunk_delay must be >= 0, got {latency}, {chunk_delay}")
        self.chunk_delay = chunk_delay
        self.responder = responder
        self.scorer = scorer
        self.models_status = models_status
        self.completions = completions
        self.latency = latency
        self.fail_first = fail_first
        self.fail_status = fail_status
        self.retry_after = retry_after
        self.models = list(models)
        self.stats = StubStats()
        listing = [{"id": m, "object": "model", "created": 0, "owned_by": "assay-stub"} for m in models]
        self._models_body = json.dumps({"object": "list", "data": listing}).encode()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":  # lifespan is turned off in serve_stub; ignore anything else
            return
        self.stats.requests += 1
        path: str = scope["path"].rstrip("/")
        method: str = scope["method"]
        if method == "GET" and path.endswith("/models"):
            self.stats.model_requests += 1
            if self.models_status != 200:
                error = _error_body("listing models failed", "server_error")
                await _send_json(send, self.models_status, error)
                return
            await _send_json(send, 200, self._models_body)
            return
        if method == "POST" and path.endswith("/chat/completions"):
            body = await _read_body(receive)
            status, payload, headers = await self._chat(body)
            self.stats.status_counts[status] += 1
            if status == 200 and _wants_stream(body):
                await _send_stream(send, payload, self.chunk_delay)
                return
            await _send_json(send, status, payload, headers)
            return
        if method == "POST" and path.endswith("/completions") and self.completions:
            status, payload = await self._complete(await _read_body(receive))
            self.stats.status_counts[status] += 1
            await _send_json(send, status, payload)
            return
        self.stats.status_counts[404] += 1
        await _send_json(send, 404, _error_body(f"no route {method} {path}", "not_found_error"))

    async def _complete(self, raw: bytes) -> tuple[int, bytes]:
        """A ``text_completion``: the responder's reply to the prompt, after the prompt itself when
        ``echo`` is asked, with the echoed prompt's log-probabilities when ``logprobs`` is too."""
        self.stats.completion_requests += 1
        try:
            request = json.loads(raw)
            prompt, model = request["prompt"], request.get("model")
        except (ValueError, KeyError, TypeError) as exc:
            return 400, _error_body(f"bad request body: {exc}", "invalid_request_error")
        self.stats.completion_bodies.append(request)
        if self.latency:
            await asyncio.sleep(self.latency)
        if model not in self.models:
            return 404, _error_body(f"model {model!r} not served; try {self.models}", "not_found_error")
        try:
            text = self.responder([{"role": "user", "content": prompt}])
        except Exception as exc:
            return 500, _error_body(f"responder failed: {exc!r}", "server_error")
        logprobs = None
        if request.get("echo") and request.get("logprobs") is not None and self.scorer is not None:
            pieces = [*self.scorer(prompt), (text.split(" ")[0] or "x", -1.0)]
            offsets = [sum(len(t) for t, _ in pieces[:i]) for i in range(len(pieces))]
            logprobs = {
                "tokens": [t for t, _ in pieces],
                "token_logprobs": [None, *(v for _, v in pieces[1:])],
                "text_offset": offsets,
                "top_logprobs": None,
            }
            text = prompt + pieces[-1][0]
        elif request.get("echo"):
            text = prompt + text
        choice = {"index": 0, "text": text, "logprobs": logprobs, "finish_reason": "length"}
        body = {"id": "cmpl-stub", "object": "text_completion", "created": int(time.time()), "model": model}
        return 200, json.dumps({**body, "choices": [choice]}).encode()

    async def _chat(self, raw: bytes) -> tuple[int, bytes, list[tuple[bytes, bytes]]]:
        self.stats.chat_requests += 1
        number = self.stats.chat_requests
        try:
            request = json.loads(raw)
            messages = request["messages"]
            model = request.get("model")
        except (ValueError, KeyError, TypeError) as exc:
            return 400, _error_body(f"bad request body: {exc}", "invalid_request_error"), []
        record = {**request, "_prompt": _last_user(messages), "_status": 0}
        self.stats.chat_bodies.append(record)
        if self.latency:
            await asyncio.sleep(self.latency)
        retry_headers = []
        if self.retry_after is not None:
            retry_headers.append((b"retry-after-ms", str(int(self.retry_after * 1000)).encode()))
        if number <= self.fail_first:
            record["_status"] = self.fail_status
            kind = "rate_limit_error" if self.fail_status == 429 else "server_error"
            return self.fail_status, _error_body(f"injected failure {number}", kind), retry_headers
        if model not in self.models:
            record["_status"] = 404
            return 404, _error_body(f"model {model!r} not served; try {self.models}", "not_found_error"), []
        try:
            text = self.responder(messages)
        except Exception as exc:  # the responder's failure becomes the server's 500, as a real server would
            record["_status"] = 500
            return 500, _error_body(f"responder failed: {exc!r}", "server_error"), retry_headers
        record["_status"] = 200
        max_tokens = request.get("max_tokens") or request.get("max_completion_tokens")
        return 200, _completion_body(number, model, messages, text, max_tokens), []


def _wants_stream(raw: bytes) -> bool:
    request = json.loads(raw)  # parsed once already by _chat, which answered 400 if it was not JSON
    return isinstance(request, dict) and request.get("stream") is True


def _chunk(completion: dict[str, Any], delta: dict[str, str], finish: str | None) -> bytes:
    """One ``chat.completion.chunk`` server-sent event."""
    body = {
        "id": completion["id"],
        "object": "chat.completion.chunk",
        "created": completion["created"],
        "model": completion["model"],
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
    }
    return b"data: " + json.dumps(body).encode() + b"\n\n"


async def _send_stream(send: Any, payload: bytes, delay: float) -> None:
    """The completion in ``payload`` as OpenAI streams it: a role chunk, one chunk per word (with its
    trailing space), a finish chunk and ``data: [DONE]``."""
    completion = json.loads(payload)
    choice = completion["choices"][0]
    headers = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    body = {"type": "http.response.body", "more_body": True}
    await send({**body, "body": _chunk(completion, {"role": "assistant"}, None)})
    for word in re.findall(r"\s*\S+\s*", choice["message"]["content"]):
        if delay:
            await asyncio.sleep(delay)
        await send({**body, "body": _chunk(completion, {"content": word}, None)})
    finish = _chunk(completion, {}, choice["finish_reason"]) + b"data: [DONE]\n\n"
    await send({"type": "http.response.body", "body": finish})


def _last_user(messages: list[Message]) -> str:
    return next((m["content"] for m in reversed(messages) if m.get("role") == "user"), "")


def _completion_body(
    number: int, model: str, messages: list[Message], text: str, max_tokens: int | None
) -> bytes:
    """The OpenAI ``chat.completion`` object; a "token" is a whitespace-separated word here."""
    words = text.split()
    finish = "stop"
    if max_tokens is not None and len(words) > max_tokens:
        text, finish = " ".join(words[:max_tokens]), "length"
    prompt_tokens = sum(len(str(m.get("content", "")).split()) for m in messages)
    completion_tokens = min(len(words), max_tokens or len(words))
    return json.dumps(
        {
            "id": f"chatcmpl-stub-{number}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "logprobs": None,
                    "finish_reason": finish,
                }
            ],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            },
        }
    ).encode()


def _error_body(message: str, kind: str) -> bytes:
    return json.dumps({"error": {"message": message, "type": kind, "param": None, "code": None}}).encode()


async def _read_body(receive: Any) -> bytes:
    chunks = []
    while True:
        event = await receive()
        chunks.append(event.get("body", b""))
        if not event.get("more_body"):
            return b"".join(chunks)


async def _send_json(
    send: Any, status: int, body: bytes, headers: Sequence[tuple[bytes, bytes]] = ()
) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                *headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


@contextlib.contextmanager
def serve_stub(
    stub: StubServer | None = None,
    *,
    http: str = "auto",
    loop: str = "auto",
    start_timeout: float = 10.0,
) -> Iterator[str]:
    """Run ``stub`` (an echo server by default) on 127.0.0.1 in a background thread; yield its base URL.

    The port is chosen by the OS (bound here, then handed to uvicorn, so there is no race for it). The
    socket is created with ``IPPROTO_TCP`` on purpose: asyncio sets ``TCP_NODELAY`` only on sockets whose
    ``proto`` says TCP, and without it Nagle's algorithm plus delayed ACKs add ~40 ms to every response.
    ``http``/``loop`` are uvicorn's settings: "auto" picks httptools and uvloop when they are installed.
    On exit the server stops and the thread is joined.
    """
    import uvicorn  # imported here so `import assay.models` stays light

    app = stub if stub is not None else StubServer()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(
        app,
        http=http,
        loop=loop,
        lifespan="off",
        log_level="warning",
        access_log=False,
        backlog=4096,
        timeout_keep_alive=30,
        timeout_graceful_shutdown=2,
    )
    server = uvicorn.Server(config)
    failure: list[BaseException] = []

    def run() -> None:
        try:
            server.run(sockets=[sock])
        except BaseException as exc:  # surfaced to the caller below
            failure.append(exc)

    thread = threading.Thread(target=run, name=f"assay-stub-{port}", daemon=True)
    thread.start()
    deadline = time.monotonic() + start_timeout
    while not server.started:
        if failure or not thread.is_alive():
            sock.close()
            raise RuntimeError(f"stub server on port {port} failed to start: {failure[:1]}")
        if time.monotonic() > deadline:
            server.should_exit = True
            sock.close()
            raise RuntimeError(f"stub server on port {port} did not start in {start_timeout} s")
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        server.should_exit = True
        thread.join(timeout=start_timeout)
        sock.close()
