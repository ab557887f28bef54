"""The contamination board on the web: adding models (page and API), checking a release's pending models
with an uploaded key in the background, the matrix page and its exports, who may do what, key secrecy; and
the whole thing in Chromium, where a clean and a contaminated model meet two releases.

Models are stand-ins (``tests/board_kit.py``): a ``python:`` memoriser of release a (what a model trained on
it would answer, without reading the key) and a model that always answers (A).
"""

from __future__ import annotations

import csv
import html
import io
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from starlette.testclient import TestClient
from test_web_get_writes_nothing import MarkGets, guard_writes  # the one GET guard

from assay.dyepack import board, registry
from assay.dyepack.prepare import PrepareResult
from assay.web import accounts
from assay.web.app import create_app
from board_kit import expected_activated, make_releases, memorised, python_clean, python_memoriser, tail
from browser import chromium_page, screenshot
from web_client import PASSWORD, csrf, sign_in
from web_server import serve_in_thread


@pytest.fixture(scope="module")
def kit(tmp_path_factory: pytest.TempPathFactory) -> dict[str, PrepareResult]:
    return make_releases(tmp_path_factory.mktemp("board") / "keys")


@pytest.fixture
def app(tmp_path: Path, kit: dict[str, PrepareResult]) -> FastAPI:
    """Olga organises, Vera views; both releases are registered by their commitments."""
    web = create_app(f"sqlite:///{tmp_path / 'web.db'}")
    with web.state.sessions.begin() as session:
        accounts.create_user(session, "olga", PASSWORD, ["organiser"])
        accounts.create_user(session, "vera", PASSWORD, ["viewer"])
        for name, prepared in kit.items():
            registry.register_benchmark(session, f"release-{name}", prepared.commitment_path.read_text())
    return web


@pytest.fixture
def bodies() -> list[str]:
    return []


@pytest.fixture
def client(app: FastAPI, bodies: list[str]) -> Iterator[TestClient]:
    def record(response: httpx.Response) -> None:
        response.read()
        bodies.append(response.text)

    with TestClient(app, follow_redirects=False) as test_client:
        test_client.event_hooks = {"request": [], "response": [record]}
        yield test_client


def login(client: TestClient, username: str) -> str:
    client.cookies.clear()
    assert sign_in(client, username).status_code == 303
    return csrf(client, "/dyepack/board")


def check(
    client: TestClient, token: str, release_id: int, prepared: PrepareResult, **fields: str
) -> httpx.Response:
    files = {
        "release": (
            prepared.release_path.name,
            prepared.release_path.read_bytes(),
            "application/octet-stream",
        ),
        "key": ("key.json", prepared.key_path.read_bytes(), "application/json"),
    }
    data = {"csrf_token": token, "release_id": str(release_id), **fields}
    return client.post("/dyepack/board/check", data=data, files=files)


def settled(get: Any, timeout: float = 60.0) -> dict:
    """The board's JSON once no cell is queued or running."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        matrix = get("/api/v1/dyepack/board").json()
        if not any(c["state"] in ("queued", "running") for row in matrix["cells"] for c in row):
            return matrix
        time.sleep(0.05)
    raise AssertionError(f"the board's checks did not finish in {timeout} s")


def test_organisers_add_models_and_check_pending_cells_everyone_sees_only_verdicts(
    client: TestClient, bodies: list[str], kit: dict[str, PrepareResult], tmp_path: Path
) -> None:
    token = login(client, "olga")
    form = {
        "csrf_token": token,
        "name": "clean",
        "model": python_clean(tmp_path),
        "mode": "chat",
        "fewshot": "0",
    }
    added = client.post("/dyepack/board/models", data=form)
    assert added.headers["location"] == "/dyepack/board?msg=added&subject=1"
    added = client.post(  # the API says so in its answer
        "/api/v1/dyepack/board/models",
        json={"name": "saw-a", "spec": python_memoriser(tmp_path, kit["a"].release_path)},
        headers={"x-csrf-token": token},
    )
    assert added.status_code == 201, added.text
    assert {k: added.json()[k] for k in ("kind", "format", "added_by")} == {
        "kind": "python",
        "format": "chat",
        "added_by": "olga",
    }
    leaky = {**form, "name": "leaky", "model": "openai:https://u:sk-leak@h/v1", "api_key_env": "sk-typed-key"}
    refused = client.post("/dyepack/board/models", data=leaky)
    assert refused.status_code == 400 and "would show them on the board" in refused.text
    assert "sk-typed-key" not in refused.text  # the key-variable field is not sent back (a key may be in it)
    error = refused.text.split('role="alert">', 1)[1].split("</p>", 1)[0]
    assert "sk-leak" not in error  # only the submitter's own form field holds what they typed

    assert check(client, token, 1, kit["a"]).status_code == 303
    wrong = check(client, token, 2, kit["a"])  # release b's cells, release a's key
    assert (
        wrong.status_code == 400
        and "does not match the commitment registered for 'release-b'" in html.unescape(wrong.text)
    )
    matrix = settled(client.get)
    assert [[c["state"] for c in row] for row in matrix["cells"]] == [
        ["done", "pending"],
        ["done", "pending"],
    ]
    again = check(client, token, 1, kit["a"])
    assert again.status_code == 200 and "nothing to do" in again.text
    assert check(client, token, 2, kit["b"]).status_code == 303
    matrix = settled(client.get)

    tables = [None, memorised(kit["a"].release_path)]
    for row, table in zip(matrix["cells"], tables, strict=True):
        for cell, name in zip(row, "ab", strict=True):
            activated = expected_activated(kit[name], table)
            assert (cell["activated"], cell["backdoors"], cell["format"]) == (activated, 6, "chat")
            assert cell["fpr"] == pytest.approx(tail(activated), rel=1e-9)
    assert [[c["flagged"] for c in row] for row in matrix["cells"]] == [[False, False], [True, False]]
    assert [m["name"] for m in matrix["models"]] == ["clean", "saw-a"]  # nothing of the refused one was kept

    login(client, "vera")
    page = client.get("/dyepack/board")
    assert page.status_code == 200 and "6/6 activated" in page.text and "Add a model" not in page.text
    assert (
        client.post("/dyepack/board/models", data={**form, "csrf_token": csrf(client, "/")}).status_code
        == 403
    )
    exported = client.get("/dyepack/board/export.csv")
    assert exported.headers["content-disposition"] == 'attachment; filename="dyepack-board.csv"'
    rows = list(csv.DictReader(io.StringIO(exported.text)))
    assert [(r["model"], r["release"], r["verdict"]) for r in rows][1:3] == [
        ("clean", "release-b", "not flagged"),
        ("saw-a", "release-a", "contaminated"),
    ]
    assert "<script" not in client.get("/dyepack/board/export.html").text
    for prepared in kit.values():
        for secret in registry.secrets_of(prepared.key):
            assert all(secret not in body for body in bodies), secret


def test_reading_a_full_board_writes_nothing(
    app: FastAPI, kit: dict[str, PrepareResult], tmp_path: Path
) -> None:
    """The GET guard of test_web_get_writes_nothing on the board's pages with finished, failed and pending
    cells (the demo database that test reads has no board models)."""
    sessions = app.state.sessions
    with sessions.begin() as session:
        board.add_model(session, "clean", python_clean(tmp_path))
        board.add_model(session, "broken", f"python:{tmp_path / 'missing.py'}:answer")
    with sessions() as session:
        plans = [p for p in board.plan_checks(session, board.keys_in(kit["a"].key_path.parent)) if p.jobs]
    board.check_pending(sessions, plans)
    caught = guard_writes(app)
    reader = TestClient(MarkGets(app))
    assert sign_in(reader, "vera").status_code == 303
    for path in (
        "/dyepack/board",
        "/dyepack/board/export.csv",
        "/dyepack/board/export.html",
        "/api/v1/dyepack/board",
    ):
        assert reader.get(path).status_code == 200, path
    states = [[c["state"] for c in row] for row in reader.get("/api/v1/dyepack/board").json()["cells"]]
    assert states == [["done", "pending"], ["failed", "pending"]] and caught == []


def notice(page: str) -> str:
    """The text of the page's notice line."""
    return html.unescape(page.split('role="status">', 1)[1].split("</p>", 1)[0])


def summary(page: str) -> str:
    """The board's summary line, its whitespace as a browser shows it."""
    return " ".join(page.split('id="board-summary">', 1)[1].split("</p>", 1)[0].split())


def test_a_failed_model_is_retried_when_asked_or_dropped_and_every_action_says_what_it_did(
    client: TestClient, kit: dict[str, PrepareResult], tmp_path: Path
) -> None:
    """Issue 47: a model that cannot be asked stayed "1 pending" for ever and was run again on every check,
    and neither adding a model nor starting checks said anything."""
    token = login(client, "olga")
    form = {"csrf_token": token, "name": "broken", "model": f"python:{tmp_path / 'gone.py'}:answer"}
    added = client.post("/dyepack/board/models", data=form)
    assert notice(client.get(added.headers["location"]).text) == (
        "Added broken to the board: pending against 2 releases. Upload a release's key below to check it."
    )
    started = check(client, token, 1, kit["a"])
    assert started.headers["location"] == "/dyepack/board?msg=checking&subject=1"
    matrix = settled(client.get)
    assert (matrix["pending"], matrix["failed"]) == (1, 1)
    page = client.get(started.headers["location"]).text
    assert notice(page) == "The checks against release-a have finished: their verdicts are on the board."
    assert summary(page).startswith("1 model, 2 releases: 0 flagged, 1 pending, 1 failed.")
    assert 'name="retry_failed"' in page and 'action="/dyepack/board/models/1/drop"' in page
    again = check(client, token, 1, kit["a"])  # not run again on every check
    assert again.status_code == 200 and "only with the retry box ticked" in notice(again.text)
    assert check(client, token, 1, kit["a"], retry_failed="yes").status_code == 303  # run again when asked
    runs = client.get("/api/v1/dyepack/runs").json()["items"]
    assert len(runs) == 2
    settled(client.get)
    dropped = client.post("/dyepack/board/models/1/drop", data={"csrf_token": token})
    assert dropped.headers["location"] == "/dyepack/board?msg=dropped&subject=broken"
    page = client.get(dropped.headers["location"]).text
    assert notice(page) == "Dropped broken from the board; its past checks stay in the list of runs."
    assert summary(page).startswith("0 models, 2 releases: 0 flagged, 0 pending.")
    assert len(client.get("/api/v1/dyepack/runs").json()["items"]) == 2  # no verdict lost
    api = {"x-csrf-token": token}
    added = client.post(
        "/api/v1/dyepack/board/models", json={"name": "spare", "spec": form["model"]}, headers=api
    )
    gone = client.delete(f"/api/v1/dyepack/board/models/{added.json()['id']}", headers=api)
    assert gone.status_code == 200 and gone.json()["name"] == "spare"  # the API face does the same
    again = client.delete(f"/api/v1/dyepack/board/models/{added.json()['id']}", headers=api)
    assert again.status_code == 400 and "no model with id" in again.json()["detail"]
    login(client, "vera")
    refused = client.post("/dyepack/board/models/1/drop", data={"csrf_token": csrf(client, "/")})
    assert refused.status_code == 403


def note_error(message: Any, problems: list[str]) -> None:
    """Console errors (script errors, CSP violations), but not the browser's own favicon probe."""
    if message.type == "error" and not message.location.get("url", "").endswith("/favicon.ico"):
        problems.append(f"{message.text} at {message.location}")


@pytest.mark.slow  # drives chromium: ~6 s
def test_the_board_shows_a_clean_and_a_contaminated_model_against_two_releases_in_chromium(
    app: FastAPI, kit: dict[str, PrepareResult], tmp_path: Path
) -> None:
    specs = {"clean": python_clean(tmp_path), "saw-a": python_memoriser(tmp_path, kit["a"].release_path)}
    with serve_in_thread(app) as base_url, chromium_page() as page:
        problems: list[str] = []
        page.on("console", lambda message: note_error(message, problems))
        page.goto(f"{base_url}/login?next=/dyepack/board")
        page.fill("#username", "olga")
        page.fill("#password", PASSWORD)
        page.click("button:has-text('Sign in')")
        page.wait_for_url("**/dyepack/board")
        for name, spec in specs.items():
            page.fill("#model-name", name)
            page.fill("#model-spec", spec)
            page.click("button:has-text('Add to the board')")
            page.wait_for_url("**/dyepack/board?msg=added*")
            assert page.inner_text("p.notice").startswith(f"Added {name} to the board: pending against 2")
        assert page.locator("td.cell.pending").count() == 4
        for option, name in (("release-a", "a"), ("release-b", "b")):
            page.select_option("#check-release-id", label=option)
            page.set_input_files("#check-release", str(kit[name].release_path))
            page.set_input_files("#check-key", str(kit[name].key_path))
            page.click("button:has-text('Check pending models')")
            page.wait_for_url("**/dyepack/board?msg=checking*")
            assert f"against release-{name}" in page.inner_text("p.notice")  # under way, or finished
        settled(lambda path: page.request.get(base_url + path))
        page.reload()

        def cell(model: str, release: str) -> Any:
            return page.locator(f'td.cell[data-model="{model}"][data-release="{release}"]')

        assert "contaminated" in cell("saw-a", "release-a").inner_text()
        assert cell("saw-a", "release-a").get_attribute("class") == "cell flagged"
        assert "6/6 activated" in cell("saw-a", "release-a").inner_text()
        for model, release in (("clean", "release-a"), ("clean", "release-b"), ("saw-a", "release-b")):
            assert cell(model, release).get_attribute("class") == "cell clear"
            assert "not flagged" in cell(model, release).inner_text()
        assert "FPR 0.000244" in cell("saw-a", "release-a").inner_text()  # 4^-6
        assert page.inner_text("#board-summary").startswith("2 models, 2 releases: 1 flagged, 0 pending.")
        screenshot(page, "dyepack-board")
        page.click('td.cell[data-model="saw-a"][data-release="release-a"] a.verdict')
        page.wait_for_url("**/dyepack/runs/*")
        assert "Contaminated" in page.inner_text("#verdict-heading")
    assert problems == []
