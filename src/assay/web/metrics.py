"""Prometheus metrics at ``GET /metrics``, for organisers only (a session, or an organiser's API token).

Two kinds of figure:

- **Requests**, counted by this process as they pass (``RequestMetrics``, a pure ASGI middleware): a latency
  histogram per method, *route template* (``/leaderboard/rounds/{name}``, never the raw path, so a scan of
  made-up URLs cannot grow the label set; unmatched paths count as ``<unmatched>``) and status class, and
  the requests in flight. With ``ASSAY_LOG_FORMAT=json`` the same middleware writes one access-log record
  per request (``assay.web.access``: method, route, path, status, duration, client).
- **State**, read from the database at scrape time from each owner's own summary, as the dashboard reads it
  (``assay.leaderboard.status``, ``assay.star.status``, ``assay.dyepack.registry``) plus this process's
  background lanes: leaderboard jobs by status (the queue depth is ``status="queued"``), stale jobs, live
  and unhealthy workers, STAR tasks by campaign, kind and status, DyePack runs by status, background jobs
  by lane and state.

Prometheus authenticates with a bearer token (``authorization: {credentials_file: ...}`` in its scrape
config) made with ``assay user token NAME`` for an organiser account. With ``assay serve --workers N`` the
request figures of every worker are summed: ``serve`` gives the workers a shared ``PROMETHEUS_MULTIPROC_DIR``
(prometheus_client's multiprocess mode), so whichever worker answers a scrape reports them all; the state
figures come from the database and are the same from any worker.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Annotated, Any

from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.responses import Response
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
)
from prometheus_client.core import GaugeMetricFamily
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from assay.store.enums import Role
from assay.store.web_models import WebUser
from assay.web.accounts import has_role
from assay.web.security import DbSession, OptionalUser

PATH = "/metrics"
MULTIPROCESS_ENV = "PROMETHEUS_MULTIPROC_DIR"  # set before prometheus_client is imported (assay serve does)
UNMATCHED = "<unmatched>"
# seconds: sub-millisecond health checks up to the 30 s a stuck database lock can cost
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
access_log = logging.getLogger("assay.web.access")


class RequestMetrics:
    """Latency histogram and in-flight gauge per route template; optionally one access-log record each."""

    def __init__(self, app: ASGIApp, registry: CollectorRegistry, log_requests: bool = False) -> None:
        self.app = app
        self.log_requests = log_requests
        self.latency = Histogram(
            "assay_http_request_duration_seconds",
            "Time to answer a request, by method, route template and status class.",
            ["method", "route", "status"],
            buckets=BUCKETS,
            registry=registry,
        )
        self.in_flight = Gauge(
            "assay_http_requests_in_flight",
            "Requests being answered now.",
            registry=registry,
            multiprocess_mode="livesum",
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start, status = time.perf_counter(), 500  # an exception before the response counts as a 500

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        self.in_flight.inc()
        try:
            await self.app(scope, receive, send_status)
        finally:
            self.in_flight.dec()
            elapsed = time.perf_counter() - start
            route = route_template(scope)
            self.latency.labels(scope["method"], route, f"{status // 100}xx").observe(elapsed)
            if self.log_requests:
                self._log(scope, route, status, elapsed)

    @staticmethod
    def _log(scope: Scope, route: str, status: int, elapsed: float) -> None:
        client = scope.get("client")
        fields = {
            "method": scope["method"],
            "route": route,
            "path": scope["path"],
            "status": status,
            "duration_ms": round(elapsed * 1000, 3),
            "client": client[0] if client else None,
        }
        access_log.info("%s %s %d", scope["method"], scope["path"], status, extra={"fields": fields})


def route_template(scope: Scope) -> str:
    """The matched route's path template (``/api/v1/rounds/{name}``); mounts give their prefix."""
    route = scope.get("route")
    path = getattr(route, "path", None)
    return path if isinstance(path, str) and path else UNMATCHED


def _family(name: str, doc: str, labels: list[str], rows: list[tuple[list[str], float]]) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, doc, labels=labels)
    for values, value in rows:
        family.add_metric(values, value)
    return family


def state_families(session: Any, background: Any) -> list[GaugeMetricFamily]:
    """The platform's state now, from each owner's summary (the dashboard's sources)."""
    from assay.dyepack.registry import run_summary
    from assay.leaderboard.status import queue_status
    from assay.star.status import campaign_summaries

    queue = queue_status(session)
    tasks = [
        ([c.name, kind, status], count)
        for c in campaign_summaries(session)
        for kind, by_status in c.tasks.items()
        for status, count in by_status.items()
    ]
    lanes = [([lane.name, "running"], lane.running) for lane in background.status().lanes]
    lanes += [([lane.name, "queued"], lane.queued) for lane in background.status().lanes]
    return [
        _family(
            "assay_leaderboard_jobs",
            "Leaderboard jobs by status; the queue depth is status=queued.",
            ["status"],
            [([s], n) for s, n in sorted(queue.jobs.items())],
        ),
        _family(
            "assay_leaderboard_stale_jobs",
            "Running jobs whose worker has sent no heartbeat lately.",
            [],
            [([], queue.stale)],
        ),
        _family(
            "assay_leaderboard_workers",
            "Leaderboard workers with a fresh heartbeat: live, and unhealthy (claiming nothing; see status).",
            ["state"],
            [(["live"], len(queue.workers)), (["unhealthy"], queue.unhealthy)],
        ),
        _family(
            "assay_star_tasks",
            "STAR tasks by campaign, kind and status.",
            ["campaign", "kind", "status"],
            tasks,
        ),
        _family(
            "assay_dyepack_runs",
            "DyePack verification runs by status.",
            ["status"],
            [([s], n) for s, n in sorted(run_summary(session).runs.items())],
        ),
        _family(
            "assay_background_jobs",
            "This server process's background jobs (model replies, DyePack runs, reports) by lane and state.",
            ["lane", "state"],
            lanes,
        ),
    ]


class _Snapshot:
    """A one-scrape collector over families already read."""

    def __init__(self, families: list[GaugeMetricFamily]) -> None:
        self.families = families

    def collect(self) -> list[GaugeMetricFamily]:
        return self.families


def organiser(user: OptionalUser) -> WebUser:
    """An organiser (session or Bearer token); else 401, never the pages' redirect to /login, which a
    scraper would follow to a 200 sign-in form; 403 for other roles."""
    if user is None:
        raise HTTPException(401, "not authenticated", headers={"WWW-Authenticate": "Bearer"})
    if not has_role(user, Role.ORGANISER):
        raise HTTPException(403, "metrics are for organisers")
    return user


Organiser = Annotated[WebUser, Depends(organiser)]


def metrics_page(request: Request, session: DbSession, user: Organiser) -> Response:
    """The request figures of this process, then the state figures read now."""
    state = CollectorRegistry(auto_describe=False)
    state.register(_Snapshot(state_families(session, request.app.state.background)))
    requests = request.app.state.metrics_registry
    if os.environ.get(MULTIPROCESS_ENV):  # every worker's figures, from the files they share
        requests = CollectorRegistry()
        multiprocess.MultiProcessCollector(requests)
    body = generate_latest(requests) + generate_latest(state)
    return Response(body, media_type=CONTENT_TYPE_LATEST)


def install(app: FastAPI, log_requests: bool = False) -> None:
    """Add the request middleware and ``GET /metrics`` (organisers) to ``app``; a registry per app, so
    several apps in one process (tests, workers) never share or double-register a metric."""
    app.state.metrics_registry = CollectorRegistry()
    app.add_middleware(RequestMetrics, registry=app.state.metrics_registry, log_requests=log_requests)
    app.add_api_route(PATH, metrics_page, methods=["GET"], include_in_schema=False)
