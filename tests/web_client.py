"""Signing in to a real app from a test: the one shared password, a signed-in client, a page's CSRF token.

Every web test module (and the leaderboard's visibility tests, which ask the API) signs in the same way, so a
change to the sign-in form breaks here once, not in each copy.
"""

from __future__ import annotations

import re

import httpx
from fastapi import FastAPI
from starlette.testclient import TestClient

PASSWORD = "correct horse battery"
CSRF_FIELD = re.compile(r'name="csrf_token" value="([^"]+)"')


def sign_in(client: TestClient, username: str, password: str = PASSWORD, **form: str) -> httpx.Response:
    """The sign-in form posted as a browser would (redirects not followed, so the 303 is visible)."""
    return client.post(
        "/login", data={"username": username, "password": password, **form}, follow_redirects=False
    )


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
