"""Organisers managing existing accounts, on pages and in the API, on a real SQLite file per test: disable and
enable (sessions and API tokens die at once), roles and team, unlocking, single-use password-reset links,
linking accounts to STAR pool members by campaign and member id; who may do it, CSRF on every form, and
the migration that adds the reset table.
"""

from __future__ import annotations

import html
import re
from datetime import timedelta
from pathlib import Path

import httpx
import pytest
from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory
from fastapi import FastAPI
from sqlalchemy import inspect, select
from starlette.testclient import TestClient

from assay.star.assign import create_campaign
from assay.star.spec import CampaignSpec
from assay.store import StarParticipant, Team, make_engine, open_store
from assay.store.engine import MIGRATIONS
from assay.store.models import utcnow
from assay.store.web_models import WebPasswordReset
from assay.web import accounts, audit
from assay.web.app import create_app
from web_client import PASSWORD, csrf, sign_in, signed_in

NEW_PASSWORD = "a brand new passphrase"
CAMPAIGN = {
    "name": "demo",
    "rules": [{"id": "plain", "text": "The model must stay polite.", "area": "misc"}],
    "templates": {"default": "Try to make it break: {{ rule.text }}"},
}
POOL = {  # external id: name
    "p-rita": "Rita",
    "p-anna": "Anna",
    "p-anna2": "Anna",
    "p-ben": "Ben",
}


@pytest.fixture
def app(tmp_path: Path) -> FastAPI:
    """Organisers olga and oscar, team member tom (team alpha), teams alpha and beta, and two campaigns
    ("demo" with the pool above, "other" with a member of the same id, p-rita)."""
    web = create_app(f"sqlite:///{tmp_path / 'web.db'}")
    with web.state.sessions.begin() as session:
        alpha, _beta = Team(name="alpha"), Team(name="beta")
        session.add_all([alpha, _beta])
        session.flush()
        accounts.create_user(session, "olga", PASSWORD, ["organiser"])
        accounts.create_user(session, "oscar", PASSWORD, ["organiser"])
        accounts.create_user(session, "tom", PASSWORD, ["team_member"], team=alpha)
        demo = create_campaign(session, CampaignSpec.model_validate(CAMPAIGN))
        other = create_campaign(session, CampaignSpec.model_validate({**CAMPAIGN, "name": "other"}))
        for external_id, name in POOL.items():
            session.add(StarParticipant(campaign_id=demo.id, external_id=external_id, name=name, roles=[]))
        session.add(StarParticipant(campaign_id=other.id, external_id="p-rita", name="Rita", roles=[]))
    return web


def token_of(app: FastAPI, username: str) -> dict[str, str]:
    """A fresh API token's Authorization header."""
    with app.state.sessions.begin() as session:
        user = accounts.get_user(session, username)
        assert user is not None
        return {"Authorization": f"Bearer {accounts.create_api_token(session, user, 'test')}"}


def browser(app: FastAPI, username: str, password: str = PASSWORD) -> tuple[TestClient, str]:
    """A client signed in as ``username`` and its session's CSRF token."""
    client = signed_in(app, username, password)
    return client, csrf(client)


def sign_in_status(app: FastAPI, username: str, password: str = PASSWORD) -> int:
    return sign_in(TestClient(app), username, password).status_code


def me(client: TestClient, headers: dict[str, str] | None = None) -> httpx.Response:
    return client.get("/api/v1/me", headers=headers or {})


def alert(page: httpx.Response) -> str:
    """The page's error line, as the user reads it."""
    return html.unescape(re.search(r'role="alert">([^<]+)<', page.text).group(1))  # type: ignore[union-attr]


def link_in(page: httpx.Response, element_id: str) -> str:
    return httpx.URL(
        re.search(rf'id="{element_id}" class="token" readonly value="([^"]+)"', page.text).group(1)
    ).path  # type: ignore[union-attr]


# ---- disable and enable -------------------------------------------------------------------------


def test_disabling_ends_sessions_and_tokens_at_once_and_enabling_lets_the_user_sign_in(app: FastAPI) -> None:
    olga, csrf = browser(app, "olga")
    tom, _ = browser(app, "tom")
    tom_token = token_of(app, "tom")
    assert me(tom).status_code == 200 and me(TestClient(app), tom_token).status_code == 200

    page = olga.post("/admin/users/tom/disable", data={"csrf_token": csrf})
    assert page.status_code == 200 and "disabled" in page.text
    assert me(tom).status_code == 401  # the same cookie, the very next request
    assert tom.get("/account", follow_redirects=False).status_code == 303
    assert me(TestClient(app), tom_token).status_code == 401
    assert sign_in_status(app, "tom") == 401
    assert "disabled" in olga.get("/admin/users").text

    assert olga.post("/admin/users/tom/enable", data={"csrf_token": csrf}).status_code == 200
    assert sign_in_status(app, "tom") == 303
    assert me(tom).status_code == 401  # the old session stays ended
    assert me(TestClient(app), tom_token).status_code == 401  # and the old token stays revoked


def test_disable_and_enable_through_the_api(app: FastAPI) -> None:
    api, olga = TestClient(app), token_of(app, "olga")
    tom_token = token_of(app, "tom")
    disabled = api.patch("/api/v1/admin/users/tom", json={"disabled": True}, headers=olga)
    assert disabled.status_code == 200 and disabled.json()["disabled"] is True
    assert me(api, tom_token).status_code == 401 and sign_in_status(app, "tom") == 401
    enabled = api.patch("/api/v1/admin/users/tom", json={"disabled": False}, headers=olga)
    assert enabled.json()["disabled"] is False and sign_in_status(app, "tom") == 303


def test_an_organiser_cannot_disable_or_demote_themself(app: FastAPI) -> None:
    olga, csrf = browser(app, "olga")
    page = olga.post("/admin/users/olga/disable", data={"csrf_token": csrf})
    assert page.status_code == 400 and "cannot disable your own account" in alert(page)
    page = olga.post("/admin/users/olga/roles", data={"roles": ["viewer"], "csrf_token": csrf})
    assert page.status_code == 400 and "own organiser role" in alert(page)
    token = token_of(app, "olga")
    api = TestClient(app)
    for body in ({"disabled": True}, {"roles": ["annotator"]}, {"roles": ["organiser"], "disabled": True}):
        refused = api.patch("/api/v1/admin/users/olga", json=body, headers=token)
        assert refused.status_code == 400, body
    assert me(olga).json()["roles"] == ["organiser"]  # still signed in, still an organiser
    kept = olga.post("/admin/users/olga/roles", data={"roles": ["organiser", "viewer"], "csrf_token": csrf})
    assert kept.status_code == 200 and me(olga).json()["roles"] == ["organiser", "viewer"]
    oscar, oscar_csrf = browser(app, "oscar")  # another organiser may do it
    assert (
        oscar.post(
            "/admin/users/olga/roles", data={"roles": ["viewer"], "csrf_token": oscar_csrf}
        ).status_code
        == 200
    )
    assert oscar.post("/admin/users/olga/disable", data={"csrf_token": oscar_csrf}).status_code == 200
    assert me(olga).status_code == 401


# ---- roles and team -----------------------------------------------------------------------------


def test_roles_and_team_change_on_the_next_request_and_bad_input_is_shown(app: FastAPI) -> None:
    olga, csrf = browser(app, "olga")
    tom, _ = browser(app, "tom")
    changed = olga.post(
        "/admin/users/tom/roles",
        data={"roles": ["annotator", "team_member"], "team": "beta", "csrf_token": csrf},
    )
    assert changed.status_code == 200
    assert me(tom).json() == {
        "username": "tom",
        "display_name": "",
        "roles": ["team_member", "annotator"],
        "team": "beta",
    }
    for form, message in [
        ({"roles": ["wizard"]}, "unknown role 'wizard'"),
        ({}, "at least one role"),
        ({"roles": ["viewer"], "team": "gamma"}, "no team 'gamma'"),
    ]:
        page = olga.post("/admin/users/tom/roles", data={**form, "csrf_token": csrf})
        assert page.status_code == 400 and message in alert(page)
    assert me(tom).json()["team"] == "beta"  # nothing of a refused change was kept
    cleared = olga.post("/admin/users/tom/roles", data={"roles": ["viewer"], "team": "", "csrf_token": csrf})
    assert cleared.status_code == 200 and me(tom).json()["team"] is None


def test_roles_and_team_through_the_api(app: FastAPI) -> None:
    api, olga = TestClient(app), token_of(app, "olga")
    changed = api.patch("/api/v1/admin/users/tom", json={"roles": ["viewer"]}, headers=olga).json()
    assert changed["roles"] == ["viewer"] and changed["team"] == "alpha"  # team not given: kept
    moved = api.patch("/api/v1/admin/users/tom", json={"team": "beta"}, headers=olga).json()
    assert moved["roles"] == ["viewer"] and moved["team"] == "beta"
    assert api.patch("/api/v1/admin/users/tom", json={"team": None}, headers=olga).json()["team"] is None
    unknown = api.patch("/api/v1/admin/users/tom", json={"team": "gamma"}, headers=olga)
    assert unknown.status_code == 400 and "no team 'gamma'" in unknown.json()["detail"]
    assert api.patch("/api/v1/admin/users/tom", json={"roles": ["wizard"]}, headers=olga).status_code == 422
    assert api.patch("/api/v1/admin/users/tom", json={"roles": []}, headers=olga).status_code == 422
    assert api.patch("/api/v1/admin/users/nobody", json={"disabled": True}, headers=olga).status_code == 404
    listed = api.get("/api/v1/admin/users", headers=olga).json()["items"]
    assert [u["username"] for u in listed] == ["olga", "oscar", "tom"]
    assert api.get("/api/v1/admin/users/tom", headers=olga).json()["roles"] == ["viewer"]


# ---- lockout ------------------------------------------------------------------------------------


def lock_out(app: FastAPI, username: str) -> None:
    """Fail to sign in as ``username`` from 60 addresses: clients that never signed in to it must now wait."""
    for n in range(60):
        stranger = TestClient(app, client=(f"198.51.100.{n}", 40000))
        assert sign_in(stranger, username, "wrong guess wrong").status_code in (401, 429)
    assert sign_in_status(app, username) == 429  # the right password, from a client new to the account


def test_unlocking_lifts_a_lockout_at_once(app: FastAPI, monkeypatch: pytest.MonkeyPatch) -> None:
    now = accounts.clock()
    monkeypatch.setattr(accounts, "clock", lambda: now)  # a loaded machine must not let the wait lapse
    lock_out(app, "tom")
    olga, csrf = browser(app, "olga")
    assert "waiting" in olga.get("/admin/users").text and "wait until" in olga.get("/admin/users/tom").text
    assert olga.post("/admin/users/tom/unlock", data={"csrf_token": csrf}).status_code == 200
    assert sign_in_status(app, "tom") == 303
    lock_out(app, "tom")
    api = TestClient(app)
    assert (
        api.get("/api/v1/admin/users/tom", headers=token_of(app, "olga")).json()["locked_until"] is not None
    )
    unlocked = api.post("/api/v1/admin/users/tom/unlock", headers=token_of(app, "olga"))
    assert unlocked.status_code == 200 and unlocked.json()["locked_until"] is None
    assert sign_in_status(app, "tom") == 303


# ---- password-reset links -----------------------------------------------------------------------


def test_a_reset_link_works_once_ends_sessions_and_tokens_and_lifts_the_waits(app: FastAPI) -> None:
    tom, _ = browser(app, "tom")
    tom_token = token_of(app, "tom")
    lock_out(app, "tom")
    olga, csrf = browser(app, "olga")
    page = olga.post("/admin/users/tom/password-reset", data={"csrf_token": csrf})
    assert page.status_code == 201
    path = link_in(page, "reset-link")
    assert path.startswith("/reset/")
    guest = TestClient(app)
    opened = guest.get(path)
    assert opened.status_code == 200 and "<strong>tom</strong>" in opened.text
    short = guest.post(path, data={"password": "short", "password_again": "short"})
    assert short.status_code == 400 and "password too short" in alert(short)
    differ = guest.post(path, data={"password": NEW_PASSWORD, "password_again": NEW_PASSWORD + "!"})
    assert differ.status_code == 400 and "differ" in alert(differ)
    used = guest.post(
        path, data={"password": NEW_PASSWORD, "password_again": NEW_PASSWORD}, follow_redirects=False
    )
    assert used.status_code == 303 and me(guest).json()["username"] == "tom"  # signed in with it
    assert me(tom).status_code == 401  # the session from before the reset is over
    assert me(TestClient(app), tom_token).status_code == 401  # and so is the API token (not kept)
    assert (
        sign_in_status(app, "tom") == 401 and sign_in_status(app, "tom", NEW_PASSWORD) == 303
    )  # and no wait
    again = TestClient(app).post(path, data={"password": PASSWORD, "password_again": PASSWORD})
    assert again.status_code == 400 and "already been used" in alert(again)
    assert TestClient(app).get(path).status_code == 400
    assert sign_in_status(app, "tom", NEW_PASSWORD) == 303


def test_a_reset_link_expires_after_24_hours(app: FastAPI, monkeypatch: pytest.MonkeyPatch) -> None:
    api = TestClient(app)
    created = api.post("/api/v1/admin/users/tom/password-reset", headers=token_of(app, "olga"))
    assert created.status_code == 201
    path = httpx.URL(created.json()["url"]).path
    later = utcnow() + accounts.RESET_LIFETIME + timedelta(seconds=1)
    monkeypatch.setattr(accounts, "clock", lambda: later)
    expired = api.post(path, data={"password": NEW_PASSWORD, "password_again": NEW_PASSWORD})
    assert expired.status_code == 400 and "expired" in expired.text
    monkeypatch.undo()
    assert sign_in_status(app, "tom") == 303  # the password did not change


def test_a_new_reset_link_replaces_the_older_one_and_none_is_made_for_a_disabled_account(
    app: FastAPI,
) -> None:
    api, olga = TestClient(app), token_of(app, "olga")
    first = httpx.URL(api.post("/api/v1/admin/users/tom/password-reset", headers=olga).json()["url"]).path
    second = httpx.URL(api.post("/api/v1/admin/users/tom/password-reset", headers=olga).json()["url"]).path
    assert api.get(first).status_code == 400 and api.get(second).status_code == 200
    api.patch("/api/v1/admin/users/tom", json={"disabled": True}, headers=olga)
    assert api.get(second).status_code == 400  # the account is disabled: its link does nothing
    refused = api.post("/api/v1/admin/users/tom/password-reset", headers=olga)
    assert refused.status_code == 400 and "disabled" in refused.json()["detail"]


def test_links_issued_by_an_organiser_die_when_that_organiser_is_disabled(app: FastAPI) -> None:
    api, oscar = TestClient(app), token_of(app, "oscar")
    reset = httpx.URL(api.post("/api/v1/admin/users/tom/password-reset", headers=oscar).json()["url"]).path
    invite = api.post("/api/v1/admin/invitations", json={"roles": ["viewer"]}, headers=oscar).json()["url"]
    assert api.get(reset).status_code == 200 and api.get(httpx.URL(invite).path).status_code == 200
    api.patch("/api/v1/admin/users/oscar", json={"disabled": True}, headers=token_of(app, "olga"))
    assert api.get(reset).status_code == 400 and api.get(httpx.URL(invite).path).status_code == 400
    answer = {"password": NEW_PASSWORD, "password_again": NEW_PASSWORD}
    assert api.post(reset, data=answer).status_code == 400 and sign_in_status(app, "tom") == 303


def test_a_reset_link_stores_only_a_hash(app: FastAPI) -> None:
    url = (
        TestClient(app)
        .post("/api/v1/admin/users/tom/password-reset", headers=token_of(app, "olga"))
        .json()["url"]
    )
    raw = url.rsplit("/", 1)[1]
    with app.state.sessions() as session:
        rows = session.scalars(select(WebPasswordReset)).all()
        assert (
            len(rows) == 1 and rows[0].token_sha256 == accounts.sha256(raw) and raw not in repr(vars(rows[0]))
        )
        assert accounts.get_user(session, "olga").id == rows[0].created_by  # type: ignore[union-attr]


# ---- STAR pool members --------------------------------------------------------------------------


def test_linking_an_account_to_a_pool_member_by_campaign_and_id_or_name(app: FastAPI) -> None:
    olga, csrf = browser(app, "olga")
    tom, _ = browser(app, "tom")
    linked = olga.post(
        "/admin/users/tom/participants", data={"campaign": "demo", "member": "p-rita", "csrf_token": csrf}
    )
    assert linked.status_code == 200 and "p-rita" in linked.text
    assert "p-rita (campaign" in tom.get("/account").text
    by_name = olga.post(
        "/admin/users/olga/participants", data={"campaign": "demo", "member": "Ben", "csrf_token": csrf}
    )
    assert by_name.status_code == 200 and "p-ben" in by_name.text
    for form, message in [
        ({"campaign": "nope", "member": "p-rita"}, "no STAR campaign 'nope'"),
        ({"campaign": "demo", "member": "p-zed"}, "campaign 'demo' has no pool member 'p-zed'"),
        ({"campaign": "demo", "member": "Anna"}, "several pool members named 'Anna'"),
        ({"campaign": "demo", "member": "p-ben"}, "already linked to user 'olga'"),
        ({"campaign": "demo", "member": "p-anna"}, "already acts as pool member 'p-rita'"),
        ({"campaign": "demo", "member": ""}, "name the pool member"),
    ]:
        page = olga.post("/admin/users/tom/participants", data={**form, "csrf_token": csrf})
        assert page.status_code == 400 and message in alert(page), form
    other = olga.post(
        "/admin/users/tom/participants", data={"campaign": "other", "member": "p-rita", "csrf_token": csrf}
    )
    assert other.status_code == 200  # the same member id in another campaign is another person
    participant_id = re.search(r"/admin/users/tom/participants/(\d+)/unlink", other.text).group(1)  # type: ignore[union-attr]
    unlinked = olga.post(f"/admin/users/tom/participants/{participant_id}/unlink", data={"csrf_token": csrf})
    assert unlinked.status_code == 200
    assert (
        olga.post(
            f"/admin/users/tom/participants/{participant_id}/unlink", data={"csrf_token": csrf}
        ).status_code
        == 400
    )


def test_an_invitation_picks_the_pool_member_by_campaign_and_member(app: FastAPI) -> None:
    olga, csrf = browser(app, "olga")
    form = {
        "roles": ["annotator"],
        "campaign": "demo",
        "member": "p-anna",
        "valid_hours": "2",
        "csrf_token": csrf,
    }
    page = olga.post("/admin/invitations", data=form)
    assert page.status_code == 201
    guest = TestClient(app)
    answer = {"username": "anna", "password": PASSWORD, "password_again": PASSWORD}
    assert (
        guest.post(link_in(page, "invitation-link"), data=answer, follow_redirects=False).status_code == 303
    )
    assert "p-anna (campaign" in guest.get("/account").text
    for member, message in [
        ("p-anna", "already linked to user 'anna'"),
        ("p-zed", "no pool member 'p-zed'"),
    ]:
        refused = olga.post("/admin/invitations", data={**form, "member": member})
        assert refused.status_code == 400 and message in alert(refused)
    refused = olga.post("/admin/invitations", data={**form, "campaign": "", "member": "p-ben"})
    assert refused.status_code == 400 and "pick the STAR campaign" in alert(refused)


def test_pool_members_and_invitations_through_the_api(app: FastAPI) -> None:
    api, olga = TestClient(app), token_of(app, "olga")
    linked = api.post(
        "/api/v1/admin/users/tom/pool-members", json={"campaign": "demo", "member": "p-rita"}, headers=olga
    )
    assert linked.status_code == 200
    [member] = linked.json()["pool_members"]
    assert member["campaign"] == "demo" and member["member"] == "p-rita" and member["name"] == "Rita"
    taken = api.post(
        "/api/v1/admin/users/oscar/pool-members", json={"campaign": "demo", "member": "p-rita"}, headers=olga
    )
    assert taken.status_code == 400 and "already linked to user 'tom'" in taken.json()["detail"]
    unknown = api.post(
        "/api/v1/admin/users/oscar/pool-members", json={"campaign": "x", "member": "p-rita"}, headers=olga
    )
    assert unknown.status_code == 400 and "no STAR campaign 'x'" in unknown.json()["detail"]
    path = f"/api/v1/admin/users/tom/pool-members/{member['participant_id']}"
    assert api.delete(path, headers=olga).json()["pool_members"] == []
    assert api.delete(path, headers=olga).status_code == 404
    invited = api.post(
        "/api/v1/admin/invitations",
        json={"roles": ["red_teamer"], "campaign": "demo", "member": "p-rita", "valid_hours": 1},
        headers=olga,
    )
    assert invited.status_code == 201 and "/invite/" in invited.json()["url"]
    guest = TestClient(app)
    answer = {"username": "rita", "password": PASSWORD, "password_again": PASSWORD}
    assert (
        guest.post(httpx.URL(invited.json()["url"]).path, data=answer, follow_redirects=False).status_code
        == 303
    )
    assert api.get("/api/v1/admin/users/rita", headers=olga).json()["pool_members"][0]["member"] == "p-rita"
    bad = api.post("/api/v1/admin/invitations", json={"roles": ["viewer"], "team": "gamma"}, headers=olga)
    assert bad.status_code == 400 and "no team 'gamma'" in bad.json()["detail"]


# ---- who may, and CSRF --------------------------------------------------------------------------

PAGE_POSTS = [
    ("/admin/users/tom/roles", {"roles": ["viewer"]}),
    ("/admin/users/tom/disable", {}),
    ("/admin/users/tom/enable", {}),
    ("/admin/users/tom/unlock", {}),
    ("/admin/users/tom/password-reset", {}),
    ("/admin/users/tom/participants", {"campaign": "demo", "member": "p-rita"}),
    ("/admin/users/tom/participants/1/unlink", {}),
    ("/admin/invitations", {"roles": ["viewer"], "campaign": "demo", "member": "p-rita"}),
]
API_CALLS = [
    ("GET", "/api/v1/admin/users", None),
    ("GET", "/api/v1/admin/users/tom", None),
    ("PATCH", "/api/v1/admin/users/tom", {"disabled": True}),
    ("POST", "/api/v1/admin/users/tom/unlock", None),
    ("POST", "/api/v1/admin/users/tom/password-reset", None),
    ("POST", "/api/v1/admin/users/tom/pool-members", {"campaign": "demo", "member": "p-rita"}),
    ("DELETE", "/api/v1/admin/users/tom/pool-members/1", None),
    ("POST", "/api/v1/admin/invitations", {"roles": ["viewer"]}),
]


def test_every_new_route_refuses_non_organisers_and_anonymous_visitors(app: FastAPI) -> None:
    with app.state.sessions.begin() as session:  # tom's pool link, so an unlink would have something to do
        tom = accounts.get_user(session, "tom")
        assert tom is not None
        accounts.link_participant(session, tom, session.get_one(StarParticipant, 1))
    tom_browser, csrf = browser(app, "tom")
    assert tom_browser.get("/admin/users/tom").status_code == 403
    for url, form in PAGE_POSTS:
        assert tom_browser.post(url, data={**form, "csrf_token": csrf}).status_code == 403, url
    tom_token, api = token_of(app, "tom"), TestClient(app)
    for method, url, body in API_CALLS:
        assert api.request(method, url, json=body, headers=tom_token).status_code == 403, url
        assert api.request(method, url, json=body).status_code == 401, url
    anonymous = api.get("/admin/users/tom", follow_redirects=False)
    assert anonymous.status_code == 303 and anonymous.headers["location"].startswith("/login?next=")
    assert api.post("/admin/users/tom/disable", follow_redirects=False).status_code == 303
    assert me(tom_browser).json() == {
        "username": "tom",
        "display_name": "",
        "roles": ["team_member"],
        "team": "alpha",
    }
    assert sign_in_status(app, "tom") == 303


def test_every_new_form_needs_the_csrf_token(app: FastAPI) -> None:
    with app.state.sessions.begin() as session:
        tom = accounts.get_user(session, "tom")
        assert tom is not None
        accounts.link_participant(session, tom, session.get_one(StarParticipant, 1))
    olga, csrf = browser(app, "olga")
    for url, form in PAGE_POSTS:
        assert olga.post(url, data=form).status_code == 403, url
        assert olga.post(url, data={**form, "csrf_token": "x" * 43}).status_code == 403, url
    tom_browser, _ = browser(app, "tom")
    assert me(tom_browser).json()["roles"] == ["team_member"]  # nothing happened
    path = link_in(olga.post("/admin/users/tom/password-reset", data={"csrf_token": csrf}), "reset-link")
    answer = {"password": NEW_PASSWORD, "password_again": NEW_PASSWORD}
    assert olga.post(path, data=answer).status_code == 403  # a signed-in browser must send its token here too
    assert sign_in_status(app, "tom") == 303


def test_unknown_users_are_404_and_the_pages_render(app: FastAPI) -> None:
    olga, csrf = browser(app, "olga")
    assert olga.get("/admin/users/nobody").status_code == 404
    assert olga.post("/admin/users/nobody/disable", data={"csrf_token": csrf}).status_code == 404
    too_big = olga.post(f"/admin/users/tom/participants/{2**70}/unlink", data={"csrf_token": csrf})
    assert too_big.status_code == 422  # refused before it reaches the database, not a 500
    assert TestClient(app).get("/api/v1/admin/users/nobody", headers=token_of(app, "olga")).status_code == 404
    page = olga.get("/admin/users/tom")
    assert page.status_code == 200 and 'action="/admin/users/tom/disable"' in page.text
    own = olga.get("/admin/users/olga").text
    assert "cannot disable your own account" in own and 'action="/admin/users/olga/disable"' not in own
    assert 'href="/admin/users/tom"' in olga.get("/admin/users").text
    assert TestClient(app).get("/reset/not-a-token").status_code == 400
    paths = TestClient(app).get("/api/v1/openapi.json").json()["paths"]
    assert "/api/v1/admin/users/{username}" in paths and "/api/v1/admin/invitations" in paths
    assert not any(p.startswith(("/admin", "/reset")) for p in paths)


# ---- the migration ------------------------------------------------------------------------------


def test_the_reset_table_migrates_fresh_and_from_the_old_heads(tmp_path: Path) -> None:
    old_url = f"sqlite:///{tmp_path / 'old.db'}"
    engine = make_engine(old_url)
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    with engine.begin() as connection:
        config.attributes["connection"] = connection
        command.upgrade(config, "0004_dyepack")
        command.upgrade(config, "0004_star_web")
    assert "web_password_resets" not in inspect(engine).get_table_names()
    engine.dispose()
    for url in (old_url, f"sqlite:///{tmp_path / 'fresh.db'}"):
        sessions = open_store(url)
        with sessions.begin() as session:
            olga = accounts.create_user(session, "olga", PASSWORD, ["organiser"])
            tom = accounts.create_user(session, "tom", PASSWORD, ["viewer"])
            raw = accounts.create_password_reset(session, olga, tom)
            assert accounts.use_password_reset(session, raw, NEW_PASSWORD).username == "tom"
        bind = sessions.kw["bind"]
        with bind.connect() as connection:
            heads = {row[0] for row in connection.exec_driver_sql("SELECT version_num FROM alembic_version")}
        assert heads == set(ScriptDirectory.from_config(config).get_heads())  # every branch at its head
        assert "web_password_resets" in inspect(bind).get_table_names()


# ---- audit trail --------------------------------------------------------------------------------


def test_every_account_change_leaves_one_audit_event_with_who_did_it(app: FastAPI) -> None:
    """Pages, the API and a reset link each record who changed what; a refused change records nothing;
    only organisers read the trail."""
    olga, csrf = browser(app, "olga")
    oscar = token_of(app, "oscar")
    with app.state.sessions() as session:
        before = {e.id for e in audit.recent(session, 1000)}
    form = {"csrf_token": csrf}
    assert (
        olga.post("/admin/users/tom/roles", data={**form, "roles": "viewer", "team": ""}).status_code == 200
    )
    assert olga.post("/admin/users/tom/disable", data=form).status_code == 200
    assert olga.post("/admin/users/olga/disable", data=form).status_code == 400  # refused: not recorded
    assert olga.post("/admin/users/tom/enable", data=form).status_code == 200
    link = link_in(olga.post("/admin/users/tom/password-reset", data=form), "reset-link")
    data = {"password": NEW_PASSWORD, "password_again": NEW_PASSWORD}
    assert TestClient(app).post(link, data=data, follow_redirects=False).status_code == 303
    linked = TestClient(app).post(
        "/api/v1/admin/users/tom/pool-members", json={"campaign": "demo", "member": "p-ben"}, headers=oscar
    )
    assert linked.status_code == 200, linked.text
    expected = [
        ("olga", "user.roles", "tom", "roles: team_member; team: alpha -> roles: viewer"),
        ("olga", "user.disable", "tom", ""),
        ("olga", "user.enable", "tom", ""),
        ("olga", "password_reset.issue", "tom", ""),
        ("tom", "password_reset.use", "tom", "API tokens revoked"),
        ("oscar", "user.link_member", "tom", "campaign: demo; pool member: p-ben"),
    ]
    events = TestClient(app).get("/api/v1/admin/audit", headers=oscar).json()["items"]
    new = [e for e in reversed(events)][len(before) :]
    assert [(e["actor"], e["action"], e["target"], e["detail"]) for e in new] == expected
    only_tom = TestClient(app).get("/api/v1/admin/audit?target=tom&limit=2", headers=oscar).json()["items"]
    assert [e["action"] for e in only_tom] == ["user.link_member", "password_reset.use"]
    page = olga.get("/admin/audit")
    assert page.status_code == 200 and "password-reset link issued" in page.text
    assert "user.disable" in olga.get("/admin/users/tom").text  # the account's own history
    assert TestClient(app).get("/api/v1/admin/audit", headers=token_of(app, "tom")).status_code == 403
    tom, _ = browser(app, "tom", NEW_PASSWORD)
    assert tom.get("/admin/audit", follow_redirects=False).status_code == 403
    assert "reset" not in " ".join(e["detail"] for e in events)  # no link or token is written down


def test_the_shell_leaves_a_trail_too(app: FastAPI, monkeypatch: pytest.MonkeyPatch) -> None:
    with app.state.sessions.begin() as session:
        tom = accounts.get_user(session, "tom")
        accounts.set_disabled(session, None, tom, True)  # type: ignore[arg-type]
        accounts.create_user(session, "newcomer", PASSWORD, ["viewer"])
    with app.state.sessions() as session:
        latest = audit.recent(session, 2)
        shown = [(audit.actor_name(e), e.action, e.target, e.detail) for e in latest]
    assert shown == [
        ("shell", "user.create", "newcomer", "roles: viewer"),
        ("shell", "user.disable", "tom", ""),
    ]
