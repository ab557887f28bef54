"""Web hygiene (issue 36, item 8), over a real HTTP server: no page or API answer is kept by a browser or a
proxy cache (``Cache-Control: no-store``; static files may be cached); the contamination board and the audit
trail come a page at a time with the site's pager, counts right; ``/favicon.ico`` is there, and cached.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI

from assay.dyepack import board, registry
from assay.store.dyepack_models import DyePackBenchmark
from assay.store.paging import Window
from assay.web import accounts, audit
from assay.web.app import create_app
from board_kit import make_releases
from web_client import PASSWORD, csrf, sign_in
from web_server import serve_in_thread

RELEASES, EVENTS = 250, 130
COLUMN = re.compile(r'<th scope="col"><a href="/dyepack/benchmarks/\d+">(release-\d+)</a>')
OPTION = re.compile(r'<option value="\d+"[^>]*>release-\d+</option>')


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> FastAPI:
    """Olga organises, Vera views; 250 releases and one model on the board; 130 more audit events."""
    tmp = tmp_path_factory.mktemp("hygiene")
    commitment = make_releases(tmp / "keys", names=("a",))["a"].commitment_path.read_text()
    web = create_app(f"sqlite:///{tmp / 'web.db'}")
    with web.state.sessions.begin() as session:
        olga = accounts.create_user(session, "olga", PASSWORD, ["organiser"])
        accounts.create_user(session, "vera", PASSWORD, ["viewer"])
        web.state.token = accounts.create_api_token(session, olga, "hygiene")
        first = registry.register_benchmark(session, "release-0000", commitment)
        for n in range(1, RELEASES):  # the same commitment under many names: the board does not mind
            copy = DyePackBenchmark(commitment=first.commitment, commitment_text=first.commitment_text)
            session.add(copy)
            copy.name = f"release-{n:04d}"
        board.add_model(session, "model-0", "openai:http://127.0.0.1:9/v1", added_by="olga")
        for n in range(EVENTS):
            audit.record(session, olga, "user.disable", f"user{n:03d}")
    return web


@pytest.fixture(scope="module")
def base(app: FastAPI) -> Iterator[str]:
    with serve_in_thread(app) as url:
        yield url


@contextmanager
def _client(base: str, username: str | None = None) -> Iterator[httpx.Client]:
    """A browser-like client of the server, signed in as ``username`` if given."""
    with httpx.Client(base_url=base, timeout=30, follow_redirects=False) as client:
        if username:
            assert sign_in(client, username).status_code == 303
        yield client


# ---- Cache-Control ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "path", ["/", "/dyepack/board", "/admin/audit", "/admin/users", "/account", "/no-such-page"]
)
def test_every_page_for_a_signed_in_user_says_no_store(base: str, path: str) -> None:
    with _client(base, "olga") as olga:
        answer = olga.get(path)
    assert answer.status_code in (200, 404), answer.status_code
    assert answer.headers.get("cache-control") == "no-store"


def test_api_answers_form_errors_and_sign_in_say_no_store_and_static_files_do_not(
    app: FastAPI, base: str
) -> None:
    bearer = {"Authorization": f"Bearer {app.state.token}"}
    with _client(base) as anyone, _client(base, "olga") as olga:
        answers = {
            "api": anyone.get("/api/v1/me", headers=bearer),
            "api board": anyone.get("/api/v1/dyepack/board", headers=bearer),
            "api 401": anyone.get("/api/v1/me"),
            "sign-in page": anyone.get("/login"),  # it carries a pre-session token
            "sign-in": sign_in(anyone, "vera"),  # the answer that sets the session cookie
            "form error": olga.post(
                "/dyepack/board/models", data={"csrf_token": csrf(olga, "/dyepack/board"), "name": ""}
            ),
        }
        static = olga.get("/static/assay.css")
    assert {k: (a.status_code, a.headers.get("cache-control")) for k, a in answers.items()} == {
        "api": (200, "no-store"),
        "api board": (200, "no-store"),
        "api 401": (401, "no-store"),
        "sign-in page": (200, "no-store"),
        "sign-in": (303, "no-store"),
        "form error": (400, "no-store"),
    }
    assert static.status_code == 200 and "no-store" not in static.headers.get("cache-control", "")


# ---- pagers ----------------------------------------------------------------------------------------------


def test_the_board_shows_its_releases_a_page_at_a_time(base: str) -> None:
    with _client(base, "vera") as vera:
        first = vera.get("/dyepack/board").text
        second = vera.get("/dyepack/board", params={"limit": 100, "offset": 100}).text
        last = vera.get("/dyepack/board", params={"limit": 100, "offset": 200}).text
    assert COLUMN.findall(first) == [f"release-{n:04d}" for n in range(100)]
    assert COLUMN.findall(second) == [f"release-{n:04d}" for n in range(100, 200)]
    assert COLUMN.findall(last) == [f"release-{n:04d}" for n in range(200, 250)]
    assert first.count('class="cell ') == 100  # one model: one cell per release shown
    assert "Showing 1&ndash;100 of 250." in first and "Showing 101&ndash;200 of 250." in second
    assert "Showing 201&ndash;250 of 250." in last
    assert 'href="/dyepack/board?limit=100&amp;offset=200"' in second  # next
    assert 'href="/dyepack/board?limit=100&amp;offset=0"' in second  # previous
    assert 'rel="next"' not in last
    assert "1 model, 250 releases" in second  # the summary counts the whole board


def test_the_board_check_form_offers_the_page_releases(base: str) -> None:
    with _client(base, "olga") as olga:
        page = olga.get("/dyepack/board", params={"limit": 20, "offset": 40}).text
    assert len(OPTION.findall(page)) == 20 and ">release-0040</option>" in page


def test_the_audit_page_shows_every_event_a_page_at_a_time(app: FastAPI, base: str) -> None:
    with app.state.sessions() as session:
        total = audit.page(session, Window(1))[1]
        expected = [e.target for e in audit.page(session, Window(50, 50))[0]]
    assert total > EVENTS
    with _client(base, "olga") as olga:
        first = olga.get("/admin/audit", params={"limit": 50}).text
        second = olga.get("/admin/audit", params={"limit": 50, "offset": 50}).text
    rows = re.compile(r"<tr><td>[^<]*</td><td>[^<]*</td><td>[^<]*</td><td>([^<]*)</td>")
    assert len(rows.findall(first)) == 50 and rows.findall(first)[0] == f"user{EVENTS - 1:03d}"  # newest
    assert rows.findall(second) == expected
    assert f"Showing 51&ndash;100 of {total}." in second
    assert 'href="/admin/audit?limit=50&amp;offset=100"' in second


# ---- favicon ---------------------------------------------------------------------------------------------


def test_the_favicon_is_served_and_cached(base: str) -> None:
    with _client(base) as anyone:
        icon = anyone.get("/favicon.ico")
    assert icon.status_code == 200
    assert icon.headers["content-type"] == "image/x-icon"
    assert icon.content[:4] == b"\x00\x00\x01\x00" and len(icon.content) < 4096  # an ICO, small
    assert "max-age=" in icon.headers["cache-control"] and "no-store" not in icon.headers["cache-control"]


def test_the_favicon_ships_in_the_wheel() -> None:
    """The image installs assay from its wheel, which carries only package-data's patterns."""
    import fnmatch
    import tomllib

    project = Path(__file__).resolve().parents[2]
    patterns = tomllib.loads((project / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    name = "web/static/favicon.ico"
    assert (project / "src" / "assay" / name).is_file()
    assert any(fnmatch.fnmatch(name, p.replace("**/", "*")) for p in patterns["assay"])
