"""POST many JSON bodies to one endpoint, ``concurrency`` at a time, with the OpenAI SDK's retry rules.

Why not the SDK for batches: at 64 requests in flight the client's CPU is the limit. Through
``AsyncOpenAI.post`` (aiohttp transport) a request costs ~0.85-1.3 ms of client CPU, most of it building
the SDK's request options and header merges; a bare ``aiohttp`` POST costs ~0.4 ms, which is what lets a
verify run reach 90 % of a server's ideal rate (``docs/benchmarks.md``). The SDK still serves model
discovery and streaming, where one request's overhead does not matter.

Retries copy ``openai._base_client`` (3.54): timeouts, connection errors, 408, 409, 429 and 5xx are
retried (a server's ``x-should-retry: true|false`` overrides the status); the wait is the server's
``retry-after-ms`` or ``retry-after`` (seconds or an HTTP date) when it is in (0, 120] s, a longer one is
not retried, otherwise ``0.5 s * 2**attempt`` capped at 8 s, minus up to 25 % jitter.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import math
import random
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import aiohttp

MAX_RETRY_AFTER = 120.0
INITIAL_DELAY, MAX_DELAY = 0.5, 8.0
RETRIED_STATUSES = frozenset({408, 409, 429})


class RequestFailed(Exception):
    """One request failed after its retries: an HTTP status with the server's message, or a transport
    failure (``status`` None; ``timed_out`` tells a timeout from a refused or broken connection)."""

    def __init__(self, message: str, status: int | None = None, timed_out: bool = False) -> None:
        super().__init__(message)
        self.message, self.status, self.timed_out = message, status, timed_out

    @property
    def retryable(self) -> bool:
        return self.status is None or self.status in RETRIED_STATUSES or self.status >= 500


def retry_after(headers: Mapping[str, str]) -> float | None:
    """Seconds the server asks to wait, from ``retry-after-ms`` then ``retry-after`` (number or date)."""
    for header, divisor in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        value = headers.get(header)
        if value is None:
            continue
        try:
            return float(value) / divisor
        except ValueError:
            continue
    parsed = email.utils.parsedate_tz(headers.get("retry-after") or "")
    return None if parsed is None else email.utils.mktime_tz(parsed) - time.time()


def retry_delay(attempt: int, headers: Mapping[str, str] | None = None) -> float:
    """Seconds before retry number ``attempt + 1`` (the SDK's schedule)."""
    asked = retry_after(headers) if headers is not None else None
    if asked is not None and math.isfinite(asked) and 0 < asked <= MAX_RETRY_AFTER:
        return asked
    return min(INITIAL_DELAY * 2.0**attempt, MAX_DELAY) * (1 - 0.25 * random.random())


def _should_retry(status: int, headers: Mapping[str, str]) -> bool:
    asked = retry_after(headers)
    if asked is not None and math.isfinite(asked) and asked > MAX_RETRY_AFTER:
        return False
    override = headers.get("x-should-retry")
    if override in ("true", "false"):
        return override == "true"
    return status in RETRIED_STATUSES or status >= 500


def error_message(raw: bytes) -> str:
    """The server's own message from an error body (``{"error": {"message"}}``, ``message``,
    ``detail``), else the body's start."""
    try:
        body = json.loads(raw)
    except ValueError:
        return raw[:200].decode("utf-8", "replace")
    if isinstance(body, dict):
        inner = body.get("error")
        for candidate in (inner.get("message") if isinstance(inner, dict) else inner, body.get("message")):
            if isinstance(candidate, str):
                return candidate
        if body.get("detail") is not None:
            return str(body["detail"])
    return raw[:200].decode("utf-8", "replace")


class BatchPoster:
    """One aiohttp session for one event loop: ``post_all`` sends bodies to paths below ``base_url``."""

    def __init__(self, base_url: str, api_key: str, concurrency: int, max_retries: int, timeout: float):
        self.base_url = base_url.rstrip("/") + "/"
        self.headers = {"Authorization": f"Bearer {api_key}", "Content-Type": "application/json"}
        self.concurrency, self.max_retries, self.timeout = concurrency, max_retries, timeout

    async def post_all(
        self,
        path: str,
        bodies: Sequence[dict[str, Any]],
        parse: Callable[[int, bytes], Any],
        on_result: Callable[[int, Any], None] | None,
        received: list[int],
    ) -> list[Any]:
        """POST every body, ``concurrency`` at a time; ``parse(i, raw)`` makes each result, handed to
        ``on_result`` as it arrives; ``received[0]`` counts them (kept when a request fails)."""
        results: list[Any] = [None] * len(bodies)
        pending = iter(enumerate(bodies))
        connector = aiohttp.TCPConnector(limit=self.concurrency)
        timeout = aiohttp.ClientTimeout(total=self.timeout)
        async with aiohttp.ClientSession(
            self.base_url, connector=connector, headers=self.headers, timeout=timeout
        ) as session:

            async def worker() -> None:
                # One worker per connection pulls the next request: cheaper than a task per request.
                for index, body in pending:
                    result = parse(index, await self._post(session, path.lstrip("/"), body))
                    results[index] = result
                    received[0] += 1
                    if on_result is not None:
                        on_result(index, result)

            async with asyncio.TaskGroup() as group:
                for _ in range(min(self.concurrency, len(bodies))):
                    group.create_task(worker())
        return results

    async def _post(self, session: aiohttp.ClientSession, path: str, body: dict[str, Any]) -> bytes:
        data = json.dumps(body).encode()
        for attempt in range(self.max_retries + 1):
            last = attempt == self.max_retries
            try:
                async with session.post(path, data=data) as response:
                    raw = await response.read()
                    if response.status < 400:
                        return raw
                    headers = response.headers
                    if last or not _should_retry(response.status, headers):
                        raise RequestFailed(error_message(raw), status=response.status)
            except (aiohttp.ClientError, TimeoutError) as exc:
                if last:
                    raise _transport_failure(exc) from exc
                headers = None
            await asyncio.sleep(retry_delay(attempt, headers))
        raise AssertionError("unreachable: the last attempt returns or raises")


def _transport_failure(exc: BaseException) -> RequestFailed:
    timed_out = isinstance(exc, TimeoutError) or "timeout" in type(exc).__name__.lower()
    detail = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return RequestFailed(detail, timed_out=timed_out)
