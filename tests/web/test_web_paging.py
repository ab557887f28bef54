"""Every list of the JSON API comes a page at a time, says how many there are, refuses parameters it does
not know, and costs a fixed number of SQL statements whatever the page size (no query per row)."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi import FastAPI
from sqlalchemy import event
from starlette.testclient import TestClient

from assay.web import accounts
from assay.web.app import create_app
from web_client import PASSWORD

LISTS = [
    "/api/v1/admin/users",
    "/api/v1/admin/audit",
    "/api/v1/dyepack/benchmarks",
    "/api/v1/dyepack/runs",
    "/api/v1/leaderboard/rounds",
]


@pytest.fixture
def app(tmp_path: Path) -> FastAPI:
    web = create_app(f"sqlite:///{tmp_path / 'web.db'}")
    with web.state.sessions.begin() as session:
        olga = accounts.create_user(session, "olga", PASSWORD, ["organiser"])
        for n in range(120):
            accounts.create_user(session, f"user{n:03d}", PASSWORD, ["viewer"])
        web.state.token = accounts.create_api_token(session, olga, "paging")
    return web


def get(app: FastAPI, path: str, **params: object):  # type: ignore[no-untyped-def]
    return TestClient(app).get(path, params=params, headers={"Authorization": f"Bearer {app.state.token}"})


@pytest.mark.parametrize("path", LISTS)
def test_every_list_pages_and_refuses_unknown_parameters(app: FastAPI, path: str) -> None:
    page = get(app, path, limit=2, offset=1)
    assert page.status_code == 200, page.text
    body = page.json()
    assert set(body) == {"items", "total", "limit", "offset"} and (body["limit"], body["offset"]) == (2, 1)
    assert len(body["items"]) <= 2
    for bad in ({"limit": 0}, {"limit": 501}, {"offset": -1}, {"limt": 10}):
        refused = get(app, path, **bad)
        assert refused.status_code == 422, (bad, refused.text)
        assert next(iter(bad)) in refused.text


def test_the_users_list_walks_every_account_exactly_once(app: FastAPI) -> None:
    first = get(app, "/api/v1/admin/users", limit=50).json()
    assert first["total"] == 121
    seen = []
    for offset in range(0, 121, 50):
        seen += [
            u["username"] for u in get(app, "/api/v1/admin/users", limit=50, offset=offset).json()["items"]
        ]
    assert seen == sorted(seen) and len(set(seen)) == 121


def test_the_users_api_costs_the_same_statements_for_5_or_500_users(app: FastAPI) -> None:
    statements: list[str] = []
    engine = app.state.sessions.kw["bind"]
    get(app, "/api/v1/admin/users", limit=5)  # the token's first use is written down once: not counted
    event.listen(engine, "before_cursor_execute", lambda *args: statements.append(args[2]))
    get(app, "/api/v1/admin/users", limit=5)
    small = len(statements)
    statements.clear()
    get(app, "/api/v1/admin/users", limit=500)
    assert len(statements) == small <= 8, statements


def test_the_users_page_shows_a_window_with_links_to_the_next(app: FastAPI) -> None:
    from web_client import signed_in

    olga = signed_in(app, "olga")
    page = olga.get("/admin/users", params={"limit": 25, "offset": 25}).text
    assert "Showing 26&ndash;50 of 121" in page
    assert (
        'href="/admin/users?limit=25&amp;offset=50"' in page
        and 'href="/admin/users?limit=25&amp;offset=0"' in page
    )
    assert page.count('href="/admin/users/user') == 25
