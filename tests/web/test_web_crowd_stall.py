"""The crowd stall (issue 27): more annotators claiming, reading and rating at once than one worker has
request threads and PostgreSQL connections. Every request must be answered, none with a 5xx, every
acknowledged rating stored once.

Before the fix a STAR route returned while its session still held a connection, and FastAPI then waited for
a thread to validate the response; meanwhile every thread waited for a connection. Nothing moved until the
pool's 30 s timeout, then 500s (``benchmarks/bench_web_annotators.py``: 40 claims at one worker). Here the
worker has 4 threads (``ASSAY_WEB_THREADS``) and 24 annotators go at once, so the same knot forms in a
second instead of at 200 annotators.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest
import uvicorn
from fastapi import FastAPI
from sqlalchemy import func, select
from star_crowd import seed_crowd

from assay.store import StarAnnotation
from assay.web.app import create_app
from web_server import free_port

pytestmark = pytest.mark.slow  # a PostgreSQL database and a real uvicorn server

ANNOTATORS = 24
THREADS = 4


@contextmanager
def _serving(app: FastAPI) -> Iterator[str]:
    """uvicorn in a thread with the app's lifespan (which sizes the request threads)."""
    config = uvicorn.Config(app, host="127.0.0.1", port=free_port(), log_level="warning", lifespan="on")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{config.port}"
    finally:
        server.should_exit = True
        thread.join(60)


async def _annotator(base: str, token: str, codes: Counter, acked: list[int]) -> None:
    """Two rounds of claim -> view -> rate, as fast as the server answers; a dropped connection counts as a
    failure like a 5xx (the stalled server drops some)."""
    try:
        await _rounds(base, token, codes, acked)
    except httpx.TransportError as err:
        codes[("transport", type(err).__name__)] += 1


async def _rounds(base: str, token: str, codes: Counter, acked: list[int]) -> None:
    api = f"{base}/api/v1/star"
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(headers=headers, timeout=90) as client:
        for _ in range(2):
            claim = await client.post(f"{api}/tasks/claim", json={"kind": "annotate"})
            codes[("claim", claim.status_code)] += 1
            if claim.status_code != 200 or claim.json()["task"] is None:
                continue
            task = claim.json()["task"]["id"]
            view = await client.get(f"{api}/tasks/{task}")
            codes[("view", view.status_code)] += 1
            sent = await client.post(f"{api}/tasks/{task}/annotation", json={"rating": 1, "reason": "fine"})
            codes[("annotate", sent.status_code)] += 1
            if sent.status_code == 200:
                acked.append(sent.json()["annotation_id"])


async def _crowd(base: str, tokens: list[str]) -> tuple[Counter, list[int]]:
    codes: Counter = Counter()
    acked: list[int] = []
    await asyncio.gather(*(_annotator(base, token, codes, acked) for token in tokens))
    return codes, acked


def test_more_annotators_than_threads_and_connections_get_no_5xx(
    postgres, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ASSAY_WEB_THREADS", str(THREADS))
    app = create_app(postgres.new_database())
    tokens = seed_crowd(app, ANNOTATORS)
    with _serving(app) as base:
        started = time.monotonic()
        codes, acked = asyncio.run(_crowd(base, tokens))
        took = time.monotonic() - started
    assert {key: n for key, n in codes.items() if key[1] != 200} == {}, codes
    assert codes[("annotate", 200)] == 2 * ANNOTATORS  # every task claimed, read and rated
    assert took < 28, f"{took:.1f} s: requests waited on each other (a pool timeout is 30 s)"
    with app.state.sessions() as session:
        stored = session.scalars(select(StarAnnotation.id)).all()
        doubled = session.scalar(
            select(func.count()).select_from(
                select(StarAnnotation.task_id)
                .group_by(StarAnnotation.task_id)
                .having(func.count() > 1)
                .subquery()
            )
        )
    assert sorted(stored) == sorted(acked) and doubled == 0
