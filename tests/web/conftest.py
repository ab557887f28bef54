"""What every web test shares: cheap password hashing and a public address.

Sign-ins hash with tiny argon2 costs (the root ``fast_argon2`` fixture, ``ASSAY_ARGON2_FAST=1``) for every
test here, so no module has to remember it; a test that measures real hashing removes the variable itself.
``ASSAY_PUBLIC_URL`` is the TestClient's own address, so invitation and reset links can be issued; a test of
the refusal without one removes it. Signing in, the shared password and CSRF tokens are in
``tests/web_client.py``.
"""

from __future__ import annotations

import pytest

from platform_image import deploy_store  # noqa: F401 (the deploy tests' own podman store, a session fixture)

PUBLIC_URL = "http://testserver"


@pytest.fixture(autouse=True)
def _web_defaults(fast_argon2: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """``fast_argon2`` and ``ASSAY_PUBLIC_URL`` for every web test (and the servers and subprocesses they
    start)."""
    monkeypatch.setenv("ASSAY_PUBLIC_URL", PUBLIC_URL)
