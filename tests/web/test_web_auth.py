"""assay.web accounts: login, lockout, sessions, CSRF, API tokens, roles, invitations, CLI and OpenAPI.

Each test gets its own SQLite file; argon2 runs with tiny costs (ASSAY_ARGON2_FAST=1) so logins are fast.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import httpx
import pytest
from argon2 import PasswordHasher
from fastapi import FastAPI
from sqlalchemy import func, select
from starlette.testclient import TestClient
from typer.testing import CliRunner

from assay.cli import app as cli_app
from assay.errors import UserError
from assay.store import Team, WebSession, WebUser, open_store
from assay.store.models import utcnow
from assay.web import accounts
from assay.web.app import create_app
from web_client import PASSWORD, csrf, sign_in
from web_server import serve_in_thread  # tests/ is on sys.path (rootdir conftest)


@pytest.fixture
def app(db_url: str) -> FastAPI:
    web = create_app(db_url)
    with web.state.sessions.begin() as session:
        team = Team(name="alpha")
        session.add(team)
        session.flush()
        accounts.create_user(session, "olga", PASSWORD, ["organiser"])
        accounts.create_user(session, "tom", PASSWORD, ["team_member"], team=team, display_name="Tom")
    return web


@pytest.fixture
def client(app: FastAPI) -> Iterator[TestClient]:
    with TestClient(app) as test_client:
        yield test_client


def login(client: TestClient, username: str = "tom", password: str = PASSWORD, **form: str) -> httpx.Response:
    return sign_in(client, username, password, **form)


def test_login_sets_a_hardened_session_cookie_and_redirects_locally(client: TestClient, db_url: str) -> None:
    response = login(client, next="//evil.example/")
    assert response.status_code == 303 and response.headers["location"] == "/"
    cookie = response.headers["set-cookie"]
    assert cookie.startswith("assay_session=") and "HttpOnly" in cookie and "Path=/" in cookie
    assert "samesite=lax" in cookie.lower() and "Secure" not in cookie
    assert client.get("/api/v1/me").json() == {
        "username": "tom",
        "display_name": "Tom",
        "roles": ["team_member"],
        "team": "alpha",
    }
    client.cookies.clear()
    assert login(client, next="/account").headers["location"] == "/account"
    with TestClient(create_app(db_url, secure_cookies=True)) as secure:
        assert "Secure" in login(secure).headers["set-cookie"]


def test_failed_login_is_generic(client: TestClient) -> None:
    wrong = login(client, password="not the password")
    unknown = login(client, username="nobody")
    assert wrong.status_code == unknown.status_code == 401
    assert "assay_session" not in wrong.headers.get("set-cookie", "")
    message = re.search(r'role="alert">([^<]+)<', wrong.text).group(1)  # type: ignore[union-attr]
    assert message == re.search(r'role="alert">([^<]+)<', unknown.text).group(1)  # type: ignore[union-attr]
    assert "tom" not in message and "nobody" not in message


def test_passwords_are_argon2id_and_rehashed_to_the_default_cost(
    app: FastAPI, monkeypatch: pytest.MonkeyPatch
) -> None:
    with app.state.sessions.begin() as session:
        user = accounts.get_user(session, "tom")
        assert user is not None and user.password_hash.startswith("$argon2id$")
        assert PASSWORD not in user.password_hash
        monkeypatch.delenv("ASSAY_ARGON2_FAST")
        assert accounts.password_hasher().memory_cost == PasswordHasher().memory_cost
        accounts.authenticate(session, "tom", PASSWORD)
        assert f"m={PasswordHasher().memory_cost}," in user.password_hash


def test_create_user_rejects_bad_input_in_one_line(app: FastAPI) -> None:
    with app.state.sessions.begin() as session:
        for args, expected in [
            (("Bad Name", PASSWORD, ["viewer"]), "username 'Bad Name' invalid"),
            (("carol", "short", ["viewer"]), "password too short"),
            (("carol", PASSWORD, ["wizard"]), "unknown role 'wizard'"),
            (("tom", PASSWORD, ["viewer"]), "already taken"),
        ]:
            with pytest.raises(UserError, match=expected) as info:
                accounts.create_user(session, *args)
            assert "\n" not in str(info.value)


def test_logout_ends_the_session_server_side(client: TestClient, app: FastAPI) -> None:
    login(client)
    stolen = client.cookies["assay_session"]
    response = client.post("/logout", data={"csrf_token": csrf(client)}, follow_redirects=False)
    assert response.status_code == 303 and response.headers["location"] == "/login"
    with app.state.sessions() as session:
        assert session.scalar(select(func.count()).select_from(WebSession)) == 0
    client.cookies.clear()
    client.cookies.set("assay_session", stolen)
    assert client.get("/api/v1/me").status_code == 401


def test_cookie_posts_need_the_csrf_token(client: TestClient) -> None:
    login(client)
    token = csrf(client)
    assert client.post("/account/tokens", data={"name": "a"}).status_code == 403
    assert client.post("/account/tokens", data={"name": "a", "csrf_token": "x" * 43}).status_code == 403
    assert client.post("/logout", follow_redirects=False).status_code == 403
    assert client.get("/api/v1/me").status_code == 200  # the refused logout did not log out
    assert client.post("/account/tokens", data={"name": "a", "csrf_token": token}).status_code == 200
    assert (
        client.post("/account/tokens", data={"name": "b"}, headers={"X-CSRF-Token": token}).status_code == 200
    )


def test_bearer_tokens_work_skip_csrf_and_die_when_revoked(client: TestClient) -> None:
    login(client)
    page = client.post("/account/tokens", data={"name": "ci", "csrf_token": csrf(client)})
    raw = re.search(r'value="(assay_[^"]+)"', page.text).group(1)  # type: ignore[union-attr]
    token_id = re.search(r"/account/tokens/(\d+)/revoke", page.text).group(1)  # type: ignore[union-attr]
    client.cookies.clear()
    bearer = {"Authorization": f"Bearer {raw}"}
    assert client.get("/api/v1/me", headers=bearer).json()["username"] == "tom"
    assert client.post("/account/tokens", data={"name": "from-script"}, headers=bearer).status_code == 200
    revoked = client.post(f"/account/tokens/{token_id}/revoke", headers=bearer, follow_redirects=False)
    assert revoked.status_code == 303
    assert client.get("/api/v1/me", headers=bearer).status_code == 401
    assert client.get("/api/v1/me", headers={"Authorization": "Bearer assay_made_up"}).status_code == 401


def test_roles_and_anonymous_access(client: TestClient) -> None:
    anonymous = client.get("/admin/users", follow_redirects=False)
    assert anonymous.status_code == 303 and anonymous.headers["location"] == "/login?next=%2Fadmin%2Fusers"
    api = client.get("/api/v1/me")
    assert api.status_code == 401 and api.json() == {"detail": "not authenticated"}
    login(client, "tom")
    assert client.get("/admin/users").status_code == 403
    assert "/admin/users" not in client.get("/").text  # the nav shows only what the roles open
    client.cookies.clear()
    login(client, "olga")
    assert client.get("/admin/users").status_code == 200
    assert 'href="/admin/users"' in client.get("/").text


def test_invitation_is_single_use(client: TestClient, app: FastAPI) -> None:
    login(client, "olga")
    form = {
        "roles": ["annotator", "red_teamer"],
        "team": "",
        "valid_hours": "2",
        "csrf_token": csrf(client),
    }
    page = client.post("/admin/invitations", data=form)
    assert page.status_code == 201
    link = re.search(r'id="invitation-link" class="token" readonly value="([^"]+)"', page.text).group(1)  # type: ignore[union-attr]
    path = httpx.URL(link).path
    with TestClient(app) as guest:
        assert guest.get(path).status_code == 200
        answer = {"username": "ann", "password": PASSWORD, "password_again": PASSWORD}
        accepted = guest.post(path, data=answer, follow_redirects=False)
        assert accepted.status_code == 303
        assert guest.get("/api/v1/me").json()["roles"] == ["red_teamer", "annotator"]
    with TestClient(app) as second:
        again = second.post(path, data={**answer, "username": "ann2"})
        assert again.status_code == 400 and "already been used" in again.text
        assert second.get(path).status_code == 400


def test_invitation_expires(app: FastAPI) -> None:
    now = utcnow()
    with app.state.sessions.begin() as session:
        olga = accounts.get_user(session, "olga")
        assert olga is not None
        raw = accounts.create_invitation(session, olga, ["viewer"], valid_hours=72, now=now)
        with pytest.raises(UserError, match="expired"):
            accounts.accept_invitation(
                session, raw, "late", PASSWORD, now=now + timedelta(hours=72, seconds=1)
            )
        assert accounts.accept_invitation(session, raw, "early", PASSWORD, now=now).roles == ["viewer"]


def test_security_headers_and_openapi_lists_only_the_api(client: TestClient) -> None:
    page = client.get("/login")
    assert page.headers["x-frame-options"] == "DENY"
    assert page.headers["x-content-type-options"] == "nosniff"
    assert page.headers["referrer-policy"] == "same-origin"
    assert page.headers["content-security-policy"].startswith("default-src 'self'")
    paths = client.get("/api/v1/openapi.json").json()["paths"]
    assert "/api/v1/me" in paths and "/api/v1/health" in paths
    assert all(path.startswith("/api/v1/") for path in paths)
    assert client.get("/static/assay.css").status_code == 200


def test_cli_user_add_list_and_token(
    tmp_path: Path, assay_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runner = CliRunner()
    secret = tmp_path / "pw"
    secret.write_text(PASSWORD + "\n")
    added = runner.invoke(
        cli_app,
        ["user", "add", "alice", "--role", "organiser", "-r", "viewer", "--password-file", str(secret)],
    )
    assert added.exit_code == 0, added.output
    listed = json.loads(runner.invoke(cli_app, ["user", "list", "--json"]).output)
    assert listed[0]["username"] == "alice" and listed[0]["roles"] == ["organiser", "viewer"]
    monkeypatch.setenv("ASSAY_PASSWORD", PASSWORD)
    assert runner.invoke(cli_app, ["user", "add", "bob", "--role", "viewer"]).exit_code == 0
    token = runner.invoke(cli_app, ["user", "token", "alice", "--name", "ci"]).output.strip()
    assert token.startswith("assay_")
    with open_store().begin() as session:
        assert accounts.token_user(session, token).username == "alice"  # type: ignore[union-attr]
        assert session.scalar(select(WebUser.password_hash).where(WebUser.username == "bob")).startswith(
            "$argon2id$"
        )
    monkeypatch.delenv("ASSAY_PASSWORD")
    missing = runner.invoke(cli_app, ["user", "add", "carol", "--role", "viewer"])
    assert isinstance(missing.exception, UserError) and "ASSAY_PASSWORD" in str(missing.exception)


def test_cli_password_disable_and_enable(
    tmp_path: Path, assay_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The shell's way back in: a locked-out organiser gets a new password; disable ends every credential."""
    runner = CliRunner()
    monkeypatch.setenv("ASSAY_PASSWORD", PASSWORD)
    assert runner.invoke(cli_app, ["user", "add", "alice", "--role", "organiser"]).exit_code == 0
    token = runner.invoke(cli_app, ["user", "token", "alice", "--name", "ci"]).output.strip()
    sessions = open_store()
    with sessions.begin() as session:
        alice = accounts.get_user(session, "alice")
        cookie = accounts.start_session(session, alice)  # type: ignore[arg-type]
        for n in range(60):  # from many addresses: unknown clients must now wait for the name
            with pytest.raises(UserError):
                accounts.authenticate(
                    session, "alice", "wrong password!", client=f"10.0.{n // 250}.{n % 250}"
                )
    with sessions.begin() as session:
        assert accounts.waiting(session, [accounts.get_user(session, "alice")])  # type: ignore[list-item]
    new = "a brand new passphrase"
    monkeypatch.setenv("ASSAY_PASSWORD", new)
    assert runner.invoke(cli_app, ["user", "password", "alice"]).exit_code == 0
    with sessions.begin() as session:
        assert accounts.session_user(session, cookie) is None  # sessions ended
        assert accounts.authenticate(session, "alice", new).username == "alice"  # the waits lifted
        assert accounts.token_user(session, token) is not None
    assert runner.invoke(cli_app, ["user", "disable", "alice"]).exit_code == 0
    with sessions.begin() as session:
        assert accounts.token_user(session, token) is None
        with pytest.raises(UserError):
            accounts.authenticate(session, "alice", new)
    assert runner.invoke(cli_app, ["user", "enable", "alice"]).exit_code == 0
    with sessions.begin() as session:
        assert accounts.authenticate(session, "alice", new).username == "alice"
        assert accounts.token_user(session, token) is None  # old tokens stay revoked
    missing = runner.invoke(cli_app, ["user", "disable", "nobody"])
    assert isinstance(missing.exception, UserError) and "no web user 'nobody'" in str(missing.exception)


def test_login_over_a_real_uvicorn_server(app: FastAPI) -> None:
    with serve_in_thread(app) as base_url, httpx.Client(base_url=base_url, follow_redirects=True) as http:
        assert http.get("/api/v1/health").json()["status"] == "ok"
        response = sign_in(http, "olga")
        response = http.get(response.headers["location"])
        assert response.status_code == 200 and str(response.url) == f"{base_url}/"
        assert "Signed in as <strong>olga</strong>" in response.text
        assert http.get("/api/v1/me").json()["roles"] == ["organiser"]


def test_validation_errors_never_become_500_even_for_lone_surrogates(client: TestClient) -> None:
    """Valid JSON that decodes to a lone surrogate ("\\ud800") is a 422, not a crash."""
    login(client, "olga")
    token = (
        client.post("/account/tokens", data={"name": "fuzz", "csrf_token": csrf(client)})
        .text.split('value="assay_')[1]
        .split('"')[0]
    )
    response = client.post(
        "/api/v1/dyepack/benchmarks",
        content=b'"\\ud800"',
        headers={"Authorization": f"Bearer assay_{token}", "Content-Type": "application/json"},
    )
    assert response.status_code == 422
    assert response.json()["detail"][0]["input"] == "\ud800"
