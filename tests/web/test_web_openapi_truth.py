"""The OpenAPI document says what the API answers: a 401 on every operation that needs a sign-in (and that
401 is what an anonymous call gets), and times with their offset, on SQLite too."""

from __future__ import annotations

import re
from datetime import datetime
from pathlib import Path

from starlette.testclient import TestClient

from assay.web import accounts
from assay.web.app import create_app
from web_client import PASSWORD


def test_every_operation_that_needs_a_sign_in_documents_and_answers_401(tmp_path: Path) -> None:
    client = TestClient(create_app(f"sqlite:///{tmp_path / 'web.db'}"))
    schema = client.get("/api/v1/openapi.json").json()
    open_ops = []
    for path, operations in schema["paths"].items():
        for method, operation in operations.items():
            if "401" not in operation["responses"]:
                open_ops.append(path)
                continue
            if method == "get" and "{" not in path:
                answer = client.get(path)
                if {} in operation["security"]:  # sign-in optional (public rounds): a visitor's answer
                    assert answer.status_code == 200, path
                    continue
                assert answer.status_code == 401 and answer.json() == {"detail": "not authenticated"}, path
    assert open_ops == ["/api/v1/health", "/api/v1/ready"]  # liveness and readiness: for probes


def test_times_in_api_answers_carry_their_offset(tmp_path: Path) -> None:
    app = create_app(f"sqlite:///{tmp_path / 'web.db'}")
    with app.state.sessions.begin() as session:
        olga = accounts.create_user(session, "olga", PASSWORD, ["organiser"])
        token = accounts.create_api_token(session, olga, "t")
    headers = {"Authorization": f"Bearer {token}"}
    client = TestClient(app)
    users = client.get("/api/v1/admin/users", headers=headers).json()["items"]
    audit = client.get("/api/v1/admin/audit", headers=headers).json()["items"]
    stamps = [users[0]["created_at"], audit[0]["at"]]
    for stamp in stamps:
        assert re.search(r"(Z|[+-]\d\d:\d\d)$", stamp), stamp
        assert datetime.fromisoformat(stamp).utcoffset() is not None
