"""Request bodies bounded while they arrive: the one mechanism behind every upload route's size limit.

A route class made by ``bounded_route`` wraps the request's ``receive``: a declared Content-Length over the
limit fails on the first read, before a byte is taken in; a chunked body, or one whose Content-Length
understates it, is cut off as soon as the bytes received pass the limit. Starlette's form parser spools
file parts to disk past 1 MiB, so memory stays small either way. The body is read before any dependency
runs, so an oversize body is refused before sign-in is even checked: nothing of it is stored.

The error is a ``TooLarge`` (413) that the route supplies with a message saying the limit and what to do;
FastAPI lets an ``HTTPException`` out of body parsing, so pages render it and the API returns it as JSON.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import HTTPException, Request
from fastapi.responses import Response
from fastapi.routing import APIRoute
from starlette.types import Message, Receive

FORM_OVERHEAD = 64 * 2**10  # multipart headers and the small form fields around an upload's files


class TooLarge(HTTPException):
    """413: the request body, or one file in it, is over its limit; ``detail`` says which and what to do."""

    def __init__(self, detail: str) -> None:
        super().__init__(413, detail)


def bounded_receive(
    receive: Receive, declared: str, limit: int, too_large: Callable[[], TooLarge]
) -> Receive:
    """``receive`` raising ``too_large()`` once the body passes ``limit`` bytes, or at once if declared so."""
    received = 0

    async def bounded() -> Message:
        nonlocal received
        if declared.isdigit() and int(declared) > limit:
            raise too_large()
        message = await receive()
        received += len(message.get("body", b""))
        if received > limit:
            raise too_large()
        return message

    return bounded


def bounded_route(limit: Callable[[], int], too_large: Callable[[], TooLarge]) -> type[APIRoute]:
    """An ``APIRoute`` class (a router's ``route_class``) whose request bodies may not pass ``limit()`` bytes.

    ``limit`` is called for each request, so it can read module constants that a test lowers.
    """

    class BoundedBody(APIRoute):
        def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
            handler = super().get_route_handler()

            async def bounded(request: Request) -> Response:
                declared = request.headers.get("content-length", "")
                receive = bounded_receive(request.receive, declared, limit(), too_large)
                return await handler(Request(request.scope, receive))

            return bounded

    return BoundedBody
