"""A real uvicorn server in a thread, for tests that need HTTP over a socket (httpx, Playwright).

with serve_in_thread(create_app(url)) as base_url:
    httpx.get(f"{base_url}/api/v1/health")
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import uvicorn


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


@contextmanager
def serve_in_thread(app: Any, host: str = "127.0.0.1", timeout: float = 10.0) -> Iterator[str]:
    """Serve ``app`` on a free port until the block ends; yields ``http://host:port``."""
    config = uvicorn.Config(app, host=host, port=free_port(host), log_level="warning", lifespan="off")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="uvicorn-test", daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            raise RuntimeError(f"uvicorn did not start on {host}:{config.port}")
        time.sleep(0.01)
    try:
        yield f"http://{host}:{config.port}"
    finally:
        server.should_exit = True
        thread.join(timeout)
