"""At most ``ASSAY_WEB_THREADS`` requests in progress per worker; the rest wait their turn holding nothing.

Why: a request of a sync route hops between the event loop and the worker's threads several times (the
session dependency, the sign-in lookup, the route, the response's validation), and between hops it can hold
a database connection. With more requests in progress than the pool has connections, every thread could
wait for a connection held by a request that was itself waiting for a thread: the pool's 30 s timeout, then
500s (issue 27: 40 claims at one worker with 200 annotators; ``docs/deploy.md``, "Threads, connections and
the crowd"). Admitting at most as many requests as there are threads, with the pool holding that many
connections plus ``engine.POOL_RESERVE`` for the sweeper and background work, means a request never waits
for a connection at all, whatever its route does between hops, as long as it holds one connection at a time.

A request leaves the gate when its response starts: the request's session (``security.db``) commits before
then, and a long streamed reply (the red-team chat) does not keep others out. The liveness check and static
files need no database and skip the gate, so a busy worker still answers them at once.
"""

from __future__ import annotations

import asyncio
import weakref

from starlette.types import ASGIApp, Message, Receive, Scope, Send

EXEMPT = ("/static/", "/api/v1/health")


class Admission:
    """Pure ASGI middleware: a first-come, first-served gate of ``limit`` requests per event loop."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"ASSAY_WEB_THREADS must be at least 1, not {limit}")
        self.app = app
        self.limit = limit
        self._gates: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = (
            weakref.WeakKeyDictionary()
        )

    def _gate(self) -> asyncio.Semaphore:
        loop = asyncio.get_running_loop()  # one per loop: a test may serve the same app from two
        if loop not in self._gates:
            self._gates[loop] = asyncio.Semaphore(self.limit)
        return self._gates[loop]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"].startswith(EXEMPT):
            await self.app(scope, receive, send)
            return
        gate = self._gate()
        await gate.acquire()
        inside = True

        def leave() -> None:
            nonlocal inside
            if inside:
                inside = False
                gate.release()

        async def send_then_leave(message: Message) -> None:
            if message["type"] == "http.response.start":
                leave()
            await send(message)

        try:
            await self.app(scope, receive, send_then_leave)
        finally:
            leave()
