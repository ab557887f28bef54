"""Public standings (issue 39, item 5): an organiser marks a round public, and a visitor who is not signed in
reads its rounds list entry, standings and closed results, as a member of no team does; nothing else opens.

Who sees what is the pillar's (``assay.leaderboard.views``, ``Viewer.anonymous``); the same rule seen through
the command line and the API is in ``tests/leaderboard/test_leaderboard_views.py``. Here: the pages, every
other route of the app for a visitor, the cache headers, the organiser's button and the audit trail.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from sqlalchemy import select
from starlette.testclient import TestClient
from typer.testing import CliRunner

from assay.errors import UserError
from assay.leaderboard import rounds
from assay.store import Submission
from assay.store.web_models import WebAuditEvent
from assay.web import accounts
from assay.web.app import create_app
from fake_board import ANSWERS, TRUTH, fake_splits, scored
from web_client import PASSWORD, csrf, signed_in

PUBLIC_CACHE = "public, max-age=60"
# what a visitor could read before this change, and still may
OPEN_BEFORE = {"/", "/login", "/api/v1/health", "/api/v1/ready", "/api/v1/openapi.json", "/favicon.ico"}
# what it may read now: the public rounds list (page and API), a public round's page and its standings
OPEN_NOW = {
    "/leaderboard",
    "/leaderboard/rounds/r1",
    "/api/v1/leaderboard/rounds",
    "/api/v1/leaderboard/rounds/r1/standings",
}
# a private round: not there for a visitor (404, as a round that does not exist), never a sign-in redirect
PRIVATE = {"/leaderboard/rounds/r2", "/api/v1/leaderboard/rounds/r2/standings"}


@pytest.fixture
def app(tmp_path: Path) -> FastAPI:
    """r1 public and open with a test submission from alpha and one from beta; r2 open and private; one
    account per kind of caller: olga the organiser, tom of alpha, bea of beta, vic of no team."""
    web = create_app(f"sqlite:///{tmp_path / 'web.db'}")
    with web.state.sessions.begin() as session:
        rounds.create_round(session, "r1", fake_splits(tmp_path / "splits"), submission_window_s=3600)
        rounds.create_round(session, "r2", tmp_path / "splits")
        for name in ("r1", "r2"):
            rounds.set_status(session, name, "open")
        rounds.set_public(session, "r1", True)
        alpha = rounds.add_team(session, "alpha")
        accounts.create_user(session, "olga", PASSWORD, ["organiser"])
        beta = rounds.add_team(session, "beta")
        accounts.create_user(session, "tom", PASSWORD, ["team_member"], team=alpha)
        accounts.create_user(session, "bea", PASSWORD, ["team_member"], team=beta)
        accounts.create_user(session, "vic", PASSWORD, ["viewer"])
    web.state.ids = {
        "alpha": scored(web.state.sessions, "alpha", "test", ANSWERS),
        "beta": scored(web.state.sessions, "beta", "test", dict.fromkeys(TRUTH, 0.5)),
    }
    return web


def table(page: str, table_id: str) -> str:
    """The HTML of one table of a page (by its id), or the sentence that stands for it when it has no row."""
    found = re.search(rf'<table[^>]*id="{table_id}".*?</table>', page, re.DOTALL) or re.search(
        rf'<p[^>]*id="{table_id}-empty".*?</p>', page, re.DOTALL
    )
    assert found is not None, f"no table {table_id}"
    return found.group(0)


def get_paths(routes: list[Any], prefix: str = "") -> Iterator[str]:
    """Every GET path of the app, included routers too (as ``test_web_get_writes_nothing`` walks them)."""
    for route in routes:
        if hasattr(route, "original_router"):
            yield from get_paths(route.original_router.routes, prefix + route.include_context.prefix)
        elif "GET" in (getattr(route, "methods", None) or ()):
            yield prefix + route.path


def every_get_url(app: FastAPI) -> set[str]:
    """Each GET route with its parameters filled: both rounds by name, id 1 for every object."""
    urls = set()
    for path in get_paths(app.routes):
        expanded = [path]
        for whole, param in re.findall(r"({(\w+)(?::\w+)?})", path):  # {name} or {id:int}
            values = ["r1", "r2"] if param == "name" else ["olga" if param == "username" else "1"]
            expanded = [u.replace(whole, v) for u in expanded for v in values]
        urls.update(expanded)
    return urls


# --- what a visitor reads ---------------------------------------------------------------------------------


def test_a_visitor_reads_the_public_rounds_and_standings_as_a_member_of_no_team(app: FastAPI) -> None:
    visitor, vic = TestClient(app), signed_in(app, "vic")
    listing = visitor.get("/leaderboard")
    assert listing.status_code == 200
    assert 'href="/leaderboard/rounds/r1"' in listing.text and "/leaderboard/rounds/r2" not in listing.text
    assert 'href="/leaderboard"' in visitor.get("/").text  # the nav offers the public leaderboard

    page = visitor.get("/leaderboard/rounds/r1")
    assert page.status_code == 200
    # the same standings a signed-in member of no team reads, sealed while the round is open
    for table_id in ("test-best", "test-all"):
        assert table(page.text, table_id) == table(vic.get("/leaderboard/rounds/r1").text, table_id)
    assert "alpha-technique" in page.text and "beta-technique" in page.text
    assert "/leaderboard/submissions/" not in page.text  # no team's submission pages
    assert 'class="standings sealed"' in page.text and "0.9000" not in page.text
    assert 'id="holdout-hidden"' in page.text  # holdout only after the close
    assert 'id="public-note"' in page.text and 'href="/login?next=/leaderboard/rounds/r1"' in page.text
    for private in ('id="team-heading"', 'id="round-settings"', 'id="round-public"', "csrf_token"):
        assert private not in page.text

    listed = visitor.get("/api/v1/leaderboard/rounds")
    assert listed.status_code == 200 and [r["name"] for r in listed.json()["items"]] == ["r1"]
    assert listed.json()["total"] == 1  # the private round is not counted either
    assert listed.json()["items"] == [
        r for r in vic.get("/api/v1/leaderboard/rounds").json()["items"] if r["public"]
    ]

    api = visitor.get("/api/v1/leaderboard/rounds/r1/standings", params={"all": True})
    assert api.status_code == 200 and api.json() == vic.get(api.request.url).json()
    assert [r["team"] for r in api.json()["rows"]] == ["alpha", "beta"]
    assert not any("cross_entropy" in r["metrics"] for r in api.json()["rows"])  # the disclosed interval only
    hidden = visitor.get("/api/v1/leaderboard/rounds/r1/standings", params={"split": "holdout"})
    assert hidden.status_code == 404  # holdout: published when the round closes

    with app.state.sessions.begin() as session:
        rounds.set_status(session, "r1", "closed")
    closed = visitor.get("/leaderboard/rounds/r1").text
    assert 'id="holdout-best' in closed and 'id="holdout-hidden"' not in closed
    assert table(closed, "holdout-best") == table(vic.get("/leaderboard/rounds/r1").text, "holdout-best")
    holdout = visitor.get("/api/v1/leaderboard/rounds/r1/standings", params={"split": "holdout"})
    assert holdout.status_code == 200 and holdout.json() == vic.get(holdout.request.url).json()
    exact = visitor.get("/api/v1/leaderboard/rounds/r1/standings").json()["rows"]
    assert all("cross_entropy" in r["metrics"] for r in exact)  # closed: the exact test scores, as for vic


def test_a_private_round_and_every_other_route_stay_closed_to_a_visitor(app: FastAPI) -> None:
    visitor = TestClient(app, follow_redirects=False)
    urls = every_get_url(app)
    assert urls >= OPEN_NOW | PRIVATE and len(urls) > 60
    answers: dict[str, int] = {}
    for url in sorted(urls):
        response = visitor.get(url)
        answers[url] = response.status_code
        if url in OPEN_BEFORE | OPEN_NOW or url.startswith(("/invite/", "/reset/", "/api/v1/docs")):
            assert response.status_code in (200, 400, 404, 503), url  # 400: an unknown link token
        elif url in PRIVATE:
            assert response.status_code == 404, url
        elif url.startswith("/api/") or url == "/metrics":
            assert response.status_code == 401, (url, response.status_code)
        else:
            assert response.status_code == 303, (url, response.status_code)
            assert response.headers["location"].startswith("/login?next="), url
    assert {url: answers[url] for url in OPEN_NOW} == dict.fromkeys(OPEN_NOW, 200)

    # a private round reads as one that does not exist: same status, same words but its name
    unknown = visitor.get("/api/v1/leaderboard/rounds/nope/standings")
    private = visitor.get("/api/v1/leaderboard/rounds/r2/standings")
    assert (private.status_code, private.json()) == (404, {"detail": "no round named 'r2'"})
    assert unknown.json() == {"detail": "no round named 'nope'"}
    page = visitor.get("/leaderboard/rounds/r2")
    assert page.text.replace("r2", "X") == visitor.get("/leaderboard/rounds/zz").text.replace("zz", "X")
    assert 'href="/login?next=/leaderboard/rounds/r2"' in page.text  # a participant may sign in

    # and nothing is written or changed by a visitor
    submit = visitor.post("/api/v1/leaderboard/rounds/r1/submissions", files={"archive": ("a.zip", b"x")})
    assert submit.status_code == 401
    toggled = visitor.post("/leaderboard/rounds/r2/public", data={"public": "true"})
    assert toggled.status_code == 303 and toggled.headers["location"].startswith("/login?next=")
    with app.state.sessions() as session:
        assert rounds.get_round(session, "r2").public is False


def test_a_bad_token_is_still_a_401_on_the_public_standings(app: FastAPI) -> None:
    refused = TestClient(app).get(
        "/api/v1/leaderboard/rounds/r1/standings", headers={"Authorization": "Bearer assay_revoked"}
    )
    assert refused.status_code == 401


def test_public_answers_may_be_cached_by_anyone_only_when_the_visitor_is_anonymous(app: FastAPI) -> None:
    visitor, tom = TestClient(app), signed_in(app, "tom")
    for url in sorted(OPEN_NOW):
        anonymous = visitor.get(url)
        assert anonymous.status_code == 200, url
        assert anonymous.headers["cache-control"] == PUBLIC_CACHE, url
        assert anonymous.headers["vary"] == "Cookie, Authorization", url  # a cache keeps the two apart
        assert "set-cookie" not in anonymous.headers, url
        signed = tom.get(url)
        assert (signed.status_code, signed.headers["cache-control"]) == (200, "no-store"), url
    for url in (*sorted(PRIVATE), "/", "/login", "/leaderboard/rounds/r1/submit"):
        assert visitor.get(url, follow_redirects=False).headers["cache-control"] == "no-store", url


# --- the organiser's switch, and its trail ------------------------------------------------------------------


def test_an_organiser_marks_a_round_public_and_the_audit_trail_says_so(app: FastAPI) -> None:
    olga, tom, visitor = signed_in(app, "olga"), signed_in(app, "tom"), TestClient(app)
    page = olga.get("/leaderboard/rounds/r2").text
    assert 'id="round-public"' in page and "Make the standings public" in page
    assert 'id="public-state"' in page and 'id="round-public"' not in tom.get("/leaderboard/rounds/r2").text

    refused = tom.post("/leaderboard/rounds/r2/public", data={"public": "true", "csrf_token": csrf(tom)})
    assert refused.status_code == 403
    no_token = olga.post("/leaderboard/rounds/r2/public", data={"public": "true"})
    assert no_token.status_code == 403 and "CSRF" in no_token.text
    assert visitor.get("/leaderboard/rounds/r2").status_code == 404
    done = olga.post(
        "/leaderboard/rounds/r2/public",
        data={"public": "true", "csrf_token": csrf(olga)},
        follow_redirects=False,
    )
    assert (done.status_code, done.headers["location"]) == (303, "/leaderboard/rounds/r2")
    assert visitor.get("/leaderboard/rounds/r2").status_code == 200
    assert "Make the standings private" in olga.get("/leaderboard/rounds/r2").text
    again = olga.post("/leaderboard/rounds/r2/public", data={"public": "true", "csrf_token": csrf(olga)})
    assert again.status_code == 200  # already public: nothing changes, nothing is written down
    olga.post("/leaderboard/rounds/r2/public", data={"public": "false", "csrf_token": csrf(olga)})
    assert visitor.get("/leaderboard/rounds/r2").status_code == 404

    with app.state.sessions() as session:
        events = session.scalars(
            select(WebAuditEvent).where(WebAuditEvent.action == "round.public").order_by(WebAuditEvent.id)
        ).all()
        assert [(e.actor.username if e.actor else None, e.target, e.detail) for e in events] == [
            (None, "round r1", "public no -> yes"),  # the fixture's, from the pillar with no actor
            ("olga", "round r2", "public no -> yes"),
            ("olga", "round r2", "public yes -> no"),
        ]
    assert "round made public or private" in olga.get("/admin/audit").text


def test_a_round_is_made_public_from_the_command_line(
    app: FastAPI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from assay.leaderboard.cli import app as leaderboard_cli

    monkeypatch.setenv("ASSAY_DB_URL", f"sqlite:///{tmp_path / 'web.db'}")
    run = lambda *args: CliRunner().invoke(leaderboard_cli, ["round", *args])  # noqa: E731
    made = run("public", "r2", "--on")
    assert made.exit_code == 0 and "round r2 is public" in made.stdout, made.output
    assert TestClient(app).get("/leaderboard/rounds/r2").status_code == 200
    assert "already public" in run("public", "r2", "--on").stdout
    listed = run("list", "--json")
    assert {r["name"]: r["public"] for r in json.loads(listed.stdout)} == {"r1": True, "r2": True}
    hidden = run("public", "r2", "--off")
    assert hidden.exit_code == 0 and "round r2 is private" in hidden.stdout
    missing = run("public", "nope", "--on")  # the root CLI prints a UserError as one line, exit code 2
    assert isinstance(missing.exception, UserError) and "no round named 'nope'" in str(missing.exception)
    assert run("public", "r2").exit_code == 2  # --on or --off must be said
    with app.state.sessions() as session:
        details = session.scalars(
            select(WebAuditEvent.detail).where(WebAuditEvent.target == "round r2").order_by(WebAuditEvent.id)
        ).all()
    assert details[-2:] == ["public no -> yes", "public yes -> no"]


# --- the API's role matrix, the visitor in it ---------------------------------------------------------------

CALLERS = ("anonymous", "vic", "tom", "bea", "olga")  # nobody, no team, alpha's, beta's, the organiser
# (method, path) -> the status each caller gets, in CALLERS order; {alpha} and {job} are alpha's test
# submission and its job. r1 is public and open, r2 private and open, r3 a draft marked public.
ROLE_MATRIX: dict[tuple[str, str], tuple[int, ...]] = {
    ("GET", "/rounds"): (200, 200, 200, 200, 200),
    ("GET", "/rounds/r1/standings"): (200, 200, 200, 200, 200),
    ("GET", "/rounds/r1/standings?all=true"): (200, 200, 200, 200, 200),
    ("GET", "/rounds/r1/standings?split=holdout"): (404, 404, 404, 404, 200),  # until the round closes
    ("GET", "/rounds/r2/standings"): (404, 200, 200, 200, 200),  # private: not there for a visitor
    ("GET", "/rounds/r3/standings"): (404, 404, 404, 404, 200),  # a draft, public or not
    ("GET", "/rounds/nope/standings"): (404, 404, 404, 404, 404),
    ("GET", "/submissions/{alpha}"): (401, 404, 200, 404, 200),
    ("GET", "/jobs/{job}"): (401, 404, 200, 404, 200),
    ("GET", "/status"): (401, 403, 403, 403, 200),
    ("POST", "/rounds/r1/submissions"): (401, 403, 400, 400, 403),  # not an archive: refused, 400
    ("POST", "/rounds/r2/submissions"): (401, 403, 400, 400, 403),
}
# which rounds each caller's list names, newest first
LISTED = {"anonymous": ["r1"], "vic": ["r2", "r1"], "tom": ["r2", "r1"], "bea": ["r2", "r1"]}
LISTED["olga"] = ["r3", "r2", "r1"]


def _caller(app: FastAPI, who: str) -> TestClient:
    """A client for ``who``: a signed-in browser sending its CSRF token as a header, or nobody."""
    if who == "anonymous":
        return TestClient(app)
    client = signed_in(app, who)
    client.headers["X-CSRF-Token"] = csrf(client)
    return client


def test_the_leaderboard_apis_role_matrix_has_no_wrongful_answer(app: FastAPI, tmp_path: Path) -> None:
    """Every caller x every leaderboard API call, against the rule (``views``' docstring): the status, and
    for the rounds list the names; a 2xx where the rule says no would be a leak, a 401/403 for a round the
    caller may not see would tell it the round exists (a visitor gets 404 for r2, the same as for "nope")."""
    with app.state.sessions.begin() as session:
        rounds.create_round(session, "r3", tmp_path / "splits")
        rounds.set_public(session, "r3", True)
    alpha = app.state.ids["alpha"]
    with app.state.sessions() as session:
        job = session.get(Submission, alpha).job.id
    seen: dict[tuple[str, str], tuple[int, ...]] = {}
    lists: dict[str, list[str]] = {}
    for who in CALLERS:
        client = _caller(app, who)
        for method, path in ROLE_MATRIX:
            url = "/api/v1/leaderboard" + path.format(alpha=alpha, job=job)
            files = {"archive": ("a.zip", b"not a zip")} if method == "POST" else None
            response = client.request(method, url, files=files)
            seen[method, path] = (*seen.get((method, path), ()), response.status_code)
            if path == "/rounds":
                lists[who] = [r["name"] for r in response.json()["items"]]
    wrongful = [
        (call, who, got)
        for call, answers in seen.items()
        for who, got, want in zip(CALLERS, answers, ROLE_MATRIX[call], strict=True)
        if got != want and 200 <= got < 300
    ]
    assert wrongful == []
    assert seen == ROLE_MATRIX
    assert lists == LISTED


# --- a private round's name never reaches a visitor --------------------------------------------------------

HIDDEN = ("hidden-qz7", "sealed-wk4")  # private rounds: open with a scored submission, and closed
UNKNOWN = "absent-xy9"  # a round that does not exist, as long as each private name


def _anonymous_urls(app: FastAPI) -> set[str]:
    """Every GET route with each round name (the public one, both private ones, an unknown one) and ids 1-4,
    and the API's lists and standings with their query parameters."""
    urls = set()
    for path in get_paths(app.routes):
        expanded = [path]
        for whole, param in re.findall(r"({(\w+)(?::\w+)?})", path):
            values = ["r1", *HIDDEN, UNKNOWN] if param == "name" else ["olga", "1", "2", "3", "4"]
            expanded = [u.replace(whole, v) for u in expanded for v in values]
        urls.update(expanded)
    lists = ("/api/v1/leaderboard/rounds", "/leaderboard")
    urls |= {f"{url}?limit=1&offset={offset}" for url in lists for offset in range(4)}
    for name in ("r1", *HIDDEN, UNKNOWN):
        standings = f"/api/v1/leaderboard/rounds/{name}/standings"
        urls |= {f"{standings}?split=holdout", f"{standings}?all=true", f"{standings}?split=holdout&all=true"}
    return urls


def test_a_private_rounds_name_never_appears_in_an_anonymous_answer(app: FastAPI) -> None:
    """A visitor learns nothing of a private round, not even that it exists: no answer to a URL that does
    not name it holds its name (body or headers), and a URL that names it is answered as for a round that
    does not exist, word for word but the name."""
    with app.state.sessions.begin() as session:
        for name in HIDDEN:
            rounds.create_round(session, name, rounds.get_round(session, "r1").dataset)
            rounds.set_status(session, name, "open")
    scored(app.state.sessions, "alpha", "test", ANSWERS, round_name=HIDDEN[0])
    scored(app.state.sessions, "beta", "holdout", ANSWERS, round_name=HIDDEN[1])
    with app.state.sessions.begin() as session:
        rounds.set_status(session, HIDDEN[1], "closed")
    visitor = TestClient(app, follow_redirects=False)
    urls = _anonymous_urls(app)
    assert len(urls) > 100
    for url in sorted(urls):
        response = visitor.get(url)
        assert response.status_code < 500, (url, response.status_code)
        named = [name for name in HIDDEN if name in url]
        if not named:
            said = response.text + "\n".join(f"{k}: {v}" for k, v in response.headers.items())
            assert not [name for name in HIDDEN if name in said], url
            continue
        twin = visitor.get(url.replace(named[0], UNKNOWN))
        assert response.status_code == twin.status_code, url
        assert response.text.replace(named[0], UNKNOWN) == twin.text, url
    listed = visitor.get("/api/v1/leaderboard/rounds").json()
    assert [r["name"] for r in listed["items"]] == ["r1"] and listed["total"] == 1
