"""Signing in to a real app from a test: the one shared password, a signed-in client, a page's CSRF token.

Every web test module (and the leaderboard's visibility tests, which ask the API) signs in the same way a
browser does: open ``/login`` (its pre-session token lands in a cookie and in the form), then post the form.
A change to the sign-in form breaks here once, not in each copy.
"""

from __future__ import annotations

import re

import httpx
from fastapi import FastAPI
from starlette.testclient import TestClient

PASSWORD = "correct horse battery"
CSRF_FIELD = re.compile(r'name="csrf_token" value="([^"]+)"')
LOGIN_TOKEN = re.compile(r'name="login_token" value="([^"]+)"')


def login_token(client: httpx.Client) -> str:
    """Open the sign-in page as a browser would: its pre-session token (the cookie lands in the client)."""
    found = LOGIN_TOKEN.search(client.get("/login").text)
    assert found is not None, "no login_token on /login"
    return found.group(1)


def sign_in(client: httpx.Client, username: str, password: str = PASSWORD, **form: str) -> httpx.Response:
    """Open the sign-in page and post its form as a browser would (redirects not followed: the 303 shows)."""
    data = {"username": username, "password": password, "login_token": login_token(client), **form}
    return client.post("/login", data=data, follow_redirects=False)


def signed_in(app: FastAPI, username: str, password: str = PASSWORD) -> TestClient:
    """A new client signed in as ``username`` (the sign-in must succeed)."""
    client = TestClient(app)
    response = sign_in(client, username, password)
    assert response.status_code == 303, response.text
    return client


def csrf(client: TestClient, page: str = "/account") -> str:
    """The CSRF token a form on ``page`` carries for this client's session."""
    found = CSRF_FIELD.search(client.get(page).text)
    assert found is not None, f"no csrf_token on {page}"
    return found.group(1)
