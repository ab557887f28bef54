"""What every web test shares: cheap password hashing.

Sign-ins hash with tiny argon2 costs (the root ``fast_argon2`` fixture, ``ASSAY_ARGON2_FAST=1``) for every
test here, so no module has to remember it; a test that measures real hashing removes the variable itself.
Signing in, the shared password and CSRF tokens are in ``tests/web_client.py``.
"""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _cheap_hashing(fast_argon2: None) -> None:
    """Apply ``fast_argon2`` to every web test (and the servers and subprocesses they start)."""
