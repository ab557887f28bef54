"""HTTP's method rules on the API: a 405 names every method of its path, a literal path beside a parameter
path is a 405 (not the parameter's 422), strict booleans, and what a visitor may read without signing in.

On one app with an organiser's API token; every request is one in-process call.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from fastapi import FastAPI
from starlette.testclient import TestClient

from assay.web import accounts
from assay.web.app import create_app
from web_client import PASSWORD


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> FastAPI:
    folder: Path = tmp_path_factory.mktemp("methods")
    web = create_app(f"sqlite:///{folder / 'web.db'}")
    with web.state.sessions.begin() as session:
        olga = accounts.create_user(session, "olga", PASSWORD, ["organiser"])
        accounts.create_user(session, "vic", PASSWORD, ["viewer"])
        web.state.token = accounts.create_api_token(session, olga, "t")
    return web


@pytest.fixture(scope="module")
def client(app: FastAPI) -> TestClient:
    return TestClient(app, headers={"Authorization": f"Bearer {app.state.token}"})


@pytest.mark.parametrize(
    ("method", "url", "allow"),
    [
        ("OPTIONS", "/api/v1/dyepack/benchmarks", "GET, POST"),  # two routes: was "GET" alone
        ("PUT", "/api/v1/dyepack/benchmarks", "GET, POST"),
        ("POST", "/api/v1/admin/users/vic", "GET, PATCH"),  # was "GET" alone
        ("GET", "/api/v1/star/tasks/claim", "POST"),  # was a 422: "claim" is not a task id
        ("POST", "/api/v1/star/campaigns/demo/themes/labels", "GET"),  # was a 422: "labels" is no action
        ("DELETE", "/api/v1/me", "GET"),
    ],
)
def test_a_405_names_every_method_of_its_path(client: TestClient, method: str, url: str, allow: str) -> None:
    response = client.request(method, url)
    assert response.status_code == 405, response.text
    assert response.headers["allow"] == allow


def test_the_routes_beside_a_literal_still_take_their_parameters(client: TestClient) -> None:
    assert client.get("/api/v1/star/tasks/12345").status_code in (403, 404)  # an id: the task route
    assert client.get("/api/v1/star/tasks/abc").status_code == 404  # neither route: no such path
    label = client.post("/api/v1/star/campaigns/nope/themes/label", json={"key": "ab", "label": "x"})
    assert label.status_code in (403, 404) and "campaign" in label.text.lower()


@pytest.mark.parametrize("value", [0, 1, "true", "false", None, [], "yes"])
def test_disabled_takes_only_true_or_false(client: TestClient, value: object) -> None:
    response = client.patch("/api/v1/admin/users/vic", json={"disabled": value})
    if value is None:  # null: leave it as it is
        assert response.status_code == 200 and response.json()["disabled"] is False
    else:
        assert response.status_code == 422 and "disabled" in response.text
    assert client.get("/api/v1/admin/users/vic").json()["disabled"] is False


def test_a_visitor_reads_the_api_description_and_nothing_else(app: FastAPI) -> None:
    """docs/web.md: the OpenAPI document and its Swagger page are public (they describe the program, as its
    source does, and hold no data); every operation that needs a sign-in is a 401 for a visitor. The one
    whose sign-in is optional (the rounds list and a public round's standings) say so with OpenAPI's empty
    requirement, and answer a visitor for public rounds only: the list is empty, round "1" is none, a 404."""
    visitor = TestClient(app)
    assert visitor.get("/api/v1/openapi.json").status_code == 200
    assert visitor.get("/api/v1/docs").status_code in (200, 503)  # 503: Swagger UI files not installed
    schema = visitor.get("/api/v1/openapi.json").json()
    public, optional_paths = {"/api/v1/health", "/api/v1/ready"}, []
    for path, operations in schema["paths"].items():
        for method, operation in operations.items():
            if path in public:
                assert not operation.get("security"), path
                continue
            assert "401" in operation["responses"], (method, path)
            url = re.sub(r"\{(\w+)\}", lambda m: "label" if m[1] == "action" else "1", path)
            answer = visitor.request(method.upper(), url)
            optional = {} in operation["security"]
            expected = (404 if "{name}" in path else 200) if optional else 401
            assert answer.status_code == expected, (method, path, answer.status_code)
            if optional:
                optional_paths.append(path)
    assert optional_paths == ["/api/v1/leaderboard/rounds", "/api/v1/leaderboard/rounds/{name}/standings"]
    assert visitor.get("/api/v1/leaderboard/rounds").json()["items"] == []
