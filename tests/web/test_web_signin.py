"""Sign-in under attack, from the attacker's side: floods, throttles, enumeration by timing, login CSRF,
links built from a forged Host header, and what a password reset leaves working.

Every test drives a real app over HTTP (Starlette's TestClient, each with its own client address where the
address matters) on a real SQLite file; the timing test calls the real argon2 hasher at its default cost.
"""

from __future__ import annotations

import statistics
import time
from datetime import timedelta
from pathlib import Path

import pytest
from fastapi import FastAPI
from starlette.testclient import TestClient

from assay.store.models import utcnow
from assay.web import accounts, audit, throttle
from assay.web.app import create_app
from assay.web.signin import DEVICE_COOKIE, LOGIN_COOKIE
from web_client import PASSWORD, csrf, login_token, sign_in, signed_in


@pytest.fixture
def app(tmp_path: Path) -> FastAPI:
    web = create_app(f"sqlite:///{tmp_path / 'web.db'}")
    with web.state.sessions.begin() as session:
        accounts.create_user(session, "olga", PASSWORD, ["organiser"])
        accounts.create_user(session, "tom", PASSWORD, ["viewer"])
    return web


def stranger(app: FastAPI, n: int) -> TestClient:
    """A client from an address of its own (TEST-NET-3), with no cookies."""
    return TestClient(app, client=(f"203.0.113.{n}", 40000))


def actions(app: FastAPI) -> list[str]:
    with app.state.sessions() as session:
        return [e.action for e in audit.recent(session)]


def test_an_anonymous_flood_cannot_stop_the_owner_on_a_browser_they_used_before(
    app: FastAPI, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = accounts.clock()
    monkeypatch.setattr(accounts, "clock", lambda: now)  # a slow machine must not let the first wait lapse
    owner = TestClient(app, client=("192.0.2.10", 50000))
    assert sign_in(owner, "olga").status_code == 303 and DEVICE_COOKIE in owner.cookies
    owner.post("/logout", data={"csrf_token": csrf(owner)})
    refused = [sign_in(stranger(app, n), "olga", "a wrong guess!").status_code for n in range(80)]
    assert refused[:50] == [401] * 50 and set(refused[50:]) == {429}  # the name now makes strangers wait
    new_client = TestClient(app, client=("192.0.2.11", 50000))
    waiting = sign_in(new_client, "olga")
    assert waiting.status_code == 429 and int(waiting.headers["retry-after"]) >= 1
    assert sign_in(owner, "olga").status_code == 303  # the owner's own browser is never held back
    assert "signin.throttle" in actions(app)


def test_one_client_guessing_one_name_waits_longer_after_each_failure(
    app: FastAPI, monkeypatch: pytest.MonkeyPatch
) -> None:
    now = utcnow()
    monkeypatch.setattr(accounts, "clock", lambda: now)
    guesser = stranger(app, 1)
    codes = [sign_in(guesser, "tom", "guess guess guess").status_code for _ in range(5)]
    assert codes == [401] * 5
    waits = []
    for _ in range(4):
        blocked = sign_in(guesser, "tom")  # even the right password waits
        assert blocked.status_code == 429 and "too many failed sign-ins" in blocked.text
        waits.append(int(blocked.headers["retry-after"]))
        now += timedelta(seconds=waits[-1])
        assert sign_in(guesser, "tom", "guess guess guess").status_code == 401
    assert waits == [1, 2, 4, 8]
    assert sign_in(stranger(app, 2), "tom").status_code == 303  # another address is not held back
    now += timedelta(seconds=16)
    assert sign_in(guesser, "tom").status_code == 303  # the right password clears this pair's count
    assert sign_in(stranger(app, 1), "tom", "one more slip").status_code == 401  # from zero again, not a wait


def test_one_address_trying_many_names_is_throttled_whatever_the_name(app: FastAPI) -> None:
    sprayer = stranger(app, 3)
    codes = [sign_in(sprayer, f"user{n}", "Password123!").status_code for n in range(20)]
    assert codes == [401] * 20
    assert sign_in(sprayer, "tom").status_code == 429
    assert sign_in(stranger(app, 4), "tom").status_code == 303


def test_known_and_unknown_names_get_the_same_answers(app: FastAPI) -> None:
    def answers(name: str, n: int) -> list[tuple[int, str]]:
        client = stranger(app, n)
        out = []
        for _ in range(7):
            response = sign_in(client, name, "not the password")
            out.append((response.status_code, response.headers.get("retry-after", "")))
        return out

    assert answers("tom", 10) == answers("nobody-here", 11)
    with app.state.sessions() as session:
        assert accounts.waiting(session, [accounts.get_user(session, "tom")]) == {}  # type: ignore[list-item]


def test_timing_does_not_tell_known_names_from_unknown_ones(
    app: FastAPI, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Real argon2 cost: a wrong password for a real name and any password for an unknown name take the same
    time (one verification each), measured interleaved so load drifts hit both alike."""
    monkeypatch.delenv("ASSAY_ARGON2_FAST")
    with app.state.sessions.begin() as session:
        accounts.set_password(session, accounts.get_user(session, "tom"), PASSWORD)  # type: ignore[arg-type]
    times: dict[str, list[float]] = {"tom": [], "nobody-here": []}
    with app.state.sessions() as session:
        for n in range(12):
            for name in times:
                start = time.perf_counter()
                with pytest.raises(accounts.LoginFailed):
                    accounts.authenticate(session, name, "not the password", client=f"192.0.2.{n}-{name}")
                times[name].append(time.perf_counter() - start)
            session.rollback()
    known, unknown = statistics.median(times["tom"]), statistics.median(times["nobody-here"])
    assert 0.8 < known / unknown < 1.25, times


def test_sign_ins_beyond_the_hashing_slots_are_refused_at_once(app: FastAPI) -> None:
    held = [accounts._HASH_SLOTS.acquire(blocking=False) for _ in range(accounts.HASH_SLOTS)]
    try:
        assert all(held)
        start = time.perf_counter()
        busy = sign_in(stranger(app, 5), "tom")
        assert busy.status_code == 429 and busy.headers["retry-after"] == "1"
        assert time.perf_counter() - start < 5  # answered without queueing for a hash
        assert TestClient(app).get("/api/v1/health").status_code == 200
    finally:
        for _ in held:
            accounts._HASH_SLOTS.release()
    assert sign_in(stranger(app, 5), "tom").status_code == 303


def test_login_csrf_another_sites_form_or_no_form_token_is_refused(app: FastAPI) -> None:
    victim = TestClient(app)
    token = login_token(victim)
    forged = victim.post(
        "/login",
        data={"username": "tom", "password": PASSWORD, "login_token": token},
        headers={"origin": "https://evil.example"},
        follow_redirects=False,
    )
    assert (
        forged.status_code == 403 and "another site" in forged.text and "assay_session" not in victim.cookies
    )
    tokenless = TestClient(app).post(
        "/login", data={"username": "tom", "password": PASSWORD}, follow_redirects=False
    )
    assert tokenless.status_code == 403 and "token" in tokenless.text
    cookieless = TestClient(app)
    cookieless.cookies.clear()
    no_cookie = cookieless.post(
        "/login", data={"username": "tom", "password": PASSWORD, "login_token": token}, follow_redirects=False
    )
    assert no_cookie.status_code == 403
    same_site = victim.post(
        "/login",
        data={"username": "tom", "password": PASSWORD, "login_token": token},
        headers={"origin": "http://testserver"},
        follow_redirects=False,
    )
    assert same_site.status_code == 303 and LOGIN_COOKIE not in victim.cookies
    assert actions(app).count("signin.origin") == 3


def test_links_come_from_the_public_url_never_the_host_header(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("ASSAY_PUBLIC_URL")
    bare = create_app(f"sqlite:///{tmp_path / 'bare.db'}")
    with bare.state.sessions.begin() as session:
        olga = accounts.create_user(session, "olga", PASSWORD, ["organiser"])
        token = accounts.create_api_token(session, olga, "t")
    auth = {"Authorization": f"Bearer {token}"}
    refused = TestClient(bare).post("/api/v1/admin/invitations", json={"roles": ["viewer"]}, headers=auth)
    assert refused.status_code == 400 and "--public-url" in refused.json()["detail"]
    with bare.state.sessions() as session:
        assert "invitation.issue" not in [e.action for e in audit.recent(session)]  # nothing half-made
    public = create_app(f"sqlite:///{tmp_path / 'bare.db'}", public_url="https://assay.example.org/board/")
    forged = TestClient(public).post(
        "/api/v1/admin/invitations", json={"roles": ["viewer"]}, headers={**auth, "host": "evil.example"}
    )
    assert forged.status_code == 201
    assert forged.json()["url"].startswith("https://assay.example.org/board/invite/")


def test_a_reset_can_keep_the_api_tokens_when_the_user_says_so(app: FastAPI) -> None:
    with app.state.sessions.begin() as session:
        tom, olga = accounts.get_user(session, "tom"), accounts.get_user(session, "olga")
        token = accounts.create_api_token(session, tom, "ci")  # type: ignore[arg-type]
        link = accounts.create_password_reset(session, olga, tom)  # type: ignore[arg-type]
    guest = TestClient(app)
    new = "a new long passphrase"
    done = guest.post(f"/reset/{link}", data={"password": new, "password_again": new, "keep_tokens": "true"})
    assert done.status_code == 200
    with app.state.sessions() as session:
        assert accounts.token_user(session, token) is not None
        assert "API tokens kept" in audit.recent(session, target="tom")[0].detail
    assert signed_in(app, "tom", new) is not None


def test_quiet_counts_are_forgotten_and_pruned(app: FastAPI) -> None:
    with app.state.sessions.begin() as session:
        attempt = throttle.Attempt("192.0.2.99", "tom")
        then = utcnow() - throttle.FORGET_AFTER - timedelta(minutes=1)
        throttle.record_failure(session, attempt, then)
        assert throttle.prune(session, utcnow()) == 3  # the address, the pair and the name
