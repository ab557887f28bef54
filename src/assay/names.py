"""The one rule for the names people choose and others read: users, teams and STAR campaigns.

A name is 1-64 characters of letters, digits, ``_``, ``.`` and ``-``, starting with a letter or digit: safe
in a URL path, a file name, a shell argument and an HTML page without escaping surprises (no ``<script>``,
quotes, spaces or control characters), and the same on every face. Usernames follow it too, lowercase and
at least 3 characters long, so signing in is never ambiguous.
"""

from __future__ import annotations

import re

from assay.errors import UserError

PATTERN = r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}"
NAME = re.compile(PATTERN)
RULE = "1-64 characters of ASCII letters, digits, '_', '.', '-', starting with a letter or digit"


def check_name(what: str, name: str) -> str:
    """``name`` stripped if it follows the rule, else a one-line ``UserError`` naming ``what`` and value."""
    name = name.strip()
    if not NAME.fullmatch(name):
        raise UserError(f"{what} {name[:80]!r} invalid: use {RULE}")
    return name


def check_username(name: str) -> str:
    """A username: the name rule, lowercase, at least 3 characters."""
    name = name.strip()
    if len(name) < 3 or name != name.lower():
        raise UserError(f"username {name[:80]!r} invalid: use 3-64 lowercase characters ({RULE})")
    return check_name("username", name)
