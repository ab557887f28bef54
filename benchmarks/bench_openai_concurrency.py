"""Throughput of the ``openai:`` backend against the stub server: concurrency 1 vs N.

Each query waits ``--latency`` seconds on the server, so the ideal rate is concurrency / latency
(64 / 0.05 s = 1,280 queries/s); the share of it that is reached shows how much CPU the client and the
server spend per query. Two server placements are measured:

* ``thread``: ``serve_stub`` as shipped, a uvicorn thread in this process (client and server share the GIL);
* ``process``: the same stub in a forked child process, so the client's own cost is isolated.

    python benchmarks/bench_openai_concurrency.py --queries 2000

Prints a table; the ratios are against the concurrency-1 run in the same process. No cache is used.
"""

from __future__ import annotations

import argparse
import multiprocessing
import platform
import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from assay.models import GenerationParams, load_model, user_turn
from assay.models.stub_server import StubServer, serve_stub


def _child(latency: float, pipe: Any, stop: Any, http: str, loop: str) -> None:
    stub = StubServer(latency=latency)
    with serve_stub(stub, http=http, loop=loop) as url:
        pipe.send(url)
        start = time.process_time()
        stop.wait()
        pipe.send((time.process_time() - start, stub.stats.chat_requests))


@contextmanager
def stub_in(placement: str, latency: float, http: str, loop: str) -> Iterator[tuple[str, dict[str, float]]]:
    """Yield (base URL, report); in the process placement, the report gets the server's CPU per query."""
    report: dict[str, float] = {}
    if placement == "thread":
        with serve_stub(StubServer(latency=latency), http=http, loop=loop) as url:
            yield url, report
        return
    context = multiprocessing.get_context("fork")
    ours, theirs = context.Pipe()
    stop = context.Event()
    child = context.Process(target=_child, args=(latency, theirs, stop, http, loop), daemon=True)
    child.start()
    try:
        yield ours.recv(), report
    finally:
        stop.set()
        cpu, served = ours.recv()
        report["server_cpu_ms"] = cpu / max(served, 1) * 1000
        child.join(timeout=10)


def measure(url: str, concurrency: int, queries: int) -> tuple[float, float]:
    """(queries per second, client-process CPU ms per query) for one run, after a warm-up."""
    model = load_model(f"openai:{url}", model_name="stub-model", concurrency=concurrency, max_retries=0)
    params = GenerationParams(max_new_tokens=16)
    model.chat([user_turn(f"warm-up {i}") for i in range(concurrency)], params)
    conversations = [user_turn(f"question {i}: what is {i} + {i}?") for i in range(queries)]
    cpu, wall = time.process_time(), time.perf_counter()
    replies = model.chat(conversations, params)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    assert replies[-1] == f"echo: question {queries - 1}: what is {queries - 1} + {queries - 1}?"
    return queries / wall, cpu / queries * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--queries", type=int, default=2000, help="queries per concurrent run")
    parser.add_argument("--serial-queries", type=int, default=200, help="queries for the concurrency-1 run")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--latency", type=float, default=0.05, help="server latency per query, seconds")
    parser.add_argument("--repeats", type=int, default=3, help="concurrent runs per placement (median shown)")
    parser.add_argument(
        "--http", default="auto", help="uvicorn HTTP parser: auto (httptools if installed), h11"
    )
    parser.add_argument(
        "--loop", default="auto", help="uvicorn event loop: auto (uvloop if installed), asyncio"
    )
    args = parser.parse_args()

    print(
        f"python {platform.python_version()}, {args.latency * 1000:.0f} ms server latency, "
        f"uvicorn http={args.http} loop={args.loop}"
    )
    header = (
        f"{'server':<8} {'conc.':>5} {'queries':>7} {'queries/s':>10} {'ideal':>7} "
        f"{'of ideal':>8} {'vs c=1':>7} {'client CPU ms/q':>15}"
    )
    print(header)
    print("-" * len(header))
    for placement in ("thread", "process"):
        with stub_in(placement, args.latency, args.http, args.loop) as (url, report):
            serial_rate, serial_cpu = measure(url, 1, args.serial_queries)
            runs = [measure(url, args.concurrency, args.queries) for _ in range(args.repeats)]
        rate = statistics.median(r for r, _ in runs)
        cpu = statistics.median(c for _, c in runs)
        for concurrency, queries, value, cost in (
            (1, args.serial_queries, serial_rate, serial_cpu),
            (args.concurrency, args.queries, rate, cpu),
        ):
            ideal = concurrency / args.latency
            print(
                f"{placement:<8} {concurrency:>5} {queries:>7} {value:>10.1f} {ideal:>7.0f} "
                f"{value / ideal:>8.1%} {value / serial_rate:>6.1f}x {cost:>15.2f}"
            )
        spread = ", ".join(f"{r:.0f}" for r, _ in runs)
        server = report.get("server_cpu_ms")
        note = f"; server CPU {server:.2f} ms/q" if server is not None else " (CPU includes the server)"
        print(f"{'':<8} (c={args.concurrency} runs: {spread} queries/s{note})")


if __name__ == "__main__":
    main()
