"""A response cache that makes long model runs resumable and reproducible.

Why SQLite: one file, no server, safe for several processes (WAL mode lets readers work while one writer
commits), and a reply is durable as soon as its row is committed. Each reply is handed to a writer thread
the moment the backend reports it and committed with whatever else arrived during the previous commit
(one transaction per batch; at most one commit per 20 ms, replies arriving more slowly are committed at
once), so a run stopped halfway (an exception, Ctrl-C, a lost server, even SIGKILL) loses at most the
replies of those 20 ms, and the next run asks only for what is missing. Why a thread: a commit per reply
on the event loop's thread held back a 64-connection client by ~0.1-0.2 ms per reply, a fifth of its rate
(``docs/benchmarks.md``).

The key is ``sha256(model_id, params.cache_key(), conversation JSON)``: a different model, decoding setting
or conversation is a different entry. To draw several independent samples of one prompt, vary the seed.
Plain-text completions and log-likelihood scores are keyed the same way with their kind
(:func:`request_key`), so they never meet a chat reply. Everything rests on ``model_id`` naming what
answers: a model that cannot say (a ``python:`` wrapper without ``MODEL_ID``, ``cacheable = False``) is
passed through uncached rather than risk serving one model's replies for another.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import queue
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from assay.config import settings
from assay.models.base import (
    ChatModel,
    Conversation,
    Conversations,
    GenerationParams,
    OnResult,
    OnScore,
    require,
)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS responses (
    key        TEXT PRIMARY KEY,   -- sha256 hex of model_id, params and conversation
    model_id   TEXT NOT NULL,      -- for people inspecting the file; not part of lookups
    response   TEXT NOT NULL,
    created_at REAL NOT NULL       -- unix time the reply was stored
)
"""
BATCH_WAIT = 0.02  # seconds a reply may wait for others before its commit
_INSERT = "INSERT OR REPLACE INTO responses (key, model_id, response, created_at) VALUES (?, ?, ?, ?)"


def cache_key(model_id: str, params: GenerationParams, conversation: Conversation) -> str:
    """The cache key of one request; stable across processes and Python versions."""
    return keys_after([model_id, params.cache_key()], [list(conversation)])[0]


def request_key(model_id: str, kind: str, params: GenerationParams | None, request: Any) -> str:
    """The cache key of a ``completion`` or ``loglikelihood`` request (any JSON value)."""
    return keys_after([model_id, kind, params.cache_key() if params else None], [request])[0]


def keys_after(shared: list[Any], requests: Sequence[Any]) -> list[str]:
    """The SHA-256 of ``json.dumps([*shared, request])`` (sorted keys, UTF-8) for each request.

    WHY: ``verify`` keys 10,000 prompts before its first query; the part they share (the model, the
    generation parameters through pydantic) is serialised once here, not 10,000 times (0.19 -> 0.08 CPU s).
    The text is exactly what one ``json.dumps`` of the whole list gives (items joined by ", "), so keys stay
    those of earlier caches; a test holds them equal."""
    head = json.dumps(shared, sort_keys=True, ensure_ascii=False)[:-1] + (", " if shared else "")
    return [
        hashlib.sha256(f"{head}{json.dumps(r, sort_keys=True, ensure_ascii=False)}]".encode()).hexdigest()
        for r in requests
    ]


class ResponseCache:
    """Replies by key in one SQLite file (default: ``settings().cache_path``). Thread-safe: backends may
    report results from another thread than the caller's."""

    def __init__(self, path: str | Path | None = None) -> None:
        self.path = Path(path) if path is not None else settings().cache_path
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(self.path, timeout=30.0, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")  # durable across crashes of the process, cheap
        self._db.execute(_SCHEMA)

    def get_many(self, keys: Iterable[str]) -> dict[str, str]:
        """The stored replies among ``keys``."""
        wanted = list(dict.fromkeys(keys))
        found: dict[str, str] = {}
        with self._lock:
            for start in range(0, len(wanted), 500):  # stay under SQLite's bound-parameter limit
                chunk = wanted[start : start + 500]
                marks = ",".join("?" * len(chunk))
                rows = self._db.execute(f"SELECT key, response FROM responses WHERE key IN ({marks})", chunk)
                found.update(rows.fetchall())
        return found

    def get(self, key: str) -> str | None:
        return self.get_many([key]).get(key)

    def put(self, key: str, model_id: str, response: str) -> None:
        """Store one reply and commit at once (autocommit), so it survives an interrupted run."""
        self._insert([(key, model_id, response, time.time())])

    def _insert(self, rows: list[tuple[str, str, str, float]]) -> None:
        with self._lock:
            self._db.execute("BEGIN")
            try:
                self._db.executemany(_INSERT, rows)
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    @contextlib.contextmanager
    def writer(self) -> Iterator[Callable[[str, str, str], None]]:
        """``put(key, model_id, response)`` that returns at once; a thread commits what has arrived,
        a batch per transaction. Leaving the block waits for every reply to be committed (and raises
        the writer's error, if any)."""
        pending: queue.SimpleQueue[tuple[str, str, str, float] | None] = queue.SimpleQueue()
        failure: list[BaseException] = []

        def drain() -> None:
            done, last_commit = False, 0.0
            while not done:
                rows = [pending.get()]
                # Replies arriving faster than one per BATCH_WAIT gather for one commit (one wake-up per
                # batch, not per reply); a slower trickle is committed at once.
                time.sleep(max(0.0, last_commit + BATCH_WAIT - time.monotonic()))
                with contextlib.suppress(queue.Empty):
                    while True:
                        rows.append(pending.get_nowait())
                done = rows[-1] is None
                batch = [row for row in rows if row is not None]
                if batch and not failure:
                    try:
                        self._insert(batch)
                    except BaseException as error:  # reported to the caller when the block ends
                        failure.append(error)
                last_commit = time.monotonic()

        thread = threading.Thread(target=drain, name="assay-cache-writer", daemon=True)
        thread.start()
        try:
            yield lambda key, model_id, response: pending.put((key, model_id, response, time.time()))
        finally:
            pending.put(None)
            thread.join()
        if failure:
            raise failure[0]

    def __len__(self) -> int:
        with self._lock:
            return self._db.execute("SELECT COUNT(*) FROM responses").fetchone()[0]

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def __enter__(self) -> ResponseCache:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class CachedModel:
    """A model that answers from ``cache`` and sends only what is missing to ``model``: chat replies,
    plain-text completions and log-likelihood scores alike.

    Identical requests within one call are sent once. ``on_result(i, value)`` fires for cached results
    first (in input order), then for new ones as the wrapped model reports them; every input position is
    reported, duplicates included. A model with ``cacheable = False`` is asked directly (``caching`` says so).
    """

    def __init__(self, model: ChatModel, cache: ResponseCache) -> None:
        self.model = model
        self.cache = cache
        self.caching = bool(getattr(model, "cacheable", True))

    @property
    def model_id(self) -> str:
        return self.model.model_id

    def chat(
        self, conversations: Conversations, params: GenerationParams, on_result: OnResult | None = None
    ) -> list[str]:
        keys = keys_after([self.model_id, params.cache_key()], [list(c) for c in conversations])
        ask = lambda requests, report: self.model.chat(requests, params, report)  # noqa: E731
        return self._through(conversations, keys, ask, on_result)

    def complete(
        self, prompts: Sequence[str], params: GenerationParams, on_result: OnResult | None = None
    ) -> list[str]:
        complete = require(self.model, "complete")
        keys = keys_after([self.model_id, "completion", params.cache_key()], list(prompts))
        return self._through(
            prompts, keys, lambda requests, report: complete(requests, params, report), on_result
        )

    def loglikelihood(
        self, requests: Sequence[tuple[str, str]], on_result: OnScore | None = None
    ) -> list[float]:
        score = require(self.model, "loglikelihood")
        keys = keys_after([self.model_id, "loglikelihood", None], [list(r) for r in requests])
        return self._through(requests, keys, score, on_result, json.dumps, json.loads)

    def _through(
        self,
        requests: Sequence[Any],
        keys: list[str],
        ask: Callable[[list[Any], Callable[[int, Any], None]], list[Any]],
        on_result: Callable[[int, Any], None] | None,
        encode: Callable[[Any], str] = str,
        decode: Callable[[str], Any] = str,
    ) -> list[Any]:
        """Cached results for ``keys``; the missing requests go to ``ask(requests, report)`` once each."""
        if not self.caching:
            return ask(list(requests), on_result or (lambda _i, _v: None))
        results: list[Any] = [None] * len(requests)
        cached = self.cache.get_many(keys)
        positions: dict[str, list[int]] = {}  # missing key -> input positions asking for it
        for index, key in enumerate(keys):
            if key in cached:
                results[index] = decode(cached[key])
                if on_result is not None:
                    on_result(index, results[index])
            else:
                positions.setdefault(key, []).append(index)
        if positions:
            missing = list(positions)
            with self.cache.writer() as put:

                def store(j: int, value: Any) -> None:
                    key = missing[j]
                    if results[positions[key][0]] is not None:  # already stored (reported twice)
                        return
                    put(key, self.model_id, encode(value))
                    for index in positions[key]:
                        results[index] = value
                        if on_result is not None:
                            on_result(index, value)

                replies = ask([requests[positions[key][0]] for key in missing], store)
                for j, value in enumerate(replies):  # a backend that skipped on_result still gets cached
                    store(j, value)
        return [r if r is not None else "" for r in results]
