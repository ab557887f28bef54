"""Playwright driving Debian's chromium (never a downloaded browser), for the web pages' browser tests.

    with chromium_page() as page:
        page.goto(base_url + "/login")
        screenshot(page, "login")

Tests that import this skip with a clear message when /usr/bin/chromium is absent (the Makefile installs it).
Screenshots go to ``ASSAY_TEST_ARTIFACTS`` (default ``build/test-artifacts``) under ``screenshots/``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = Path("/usr/bin/chromium")
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
ARTIFACTS = Path(
    os.environ.get("ASSAY_TEST_ARTIFACTS", Path(__file__).resolve().parents[1] / "build" / "test-artifacts")
)


def need_chromium() -> None:
    if not CHROMIUM.exists():
        pytest.skip(f"{CHROMIUM} not found: `make install` installs Debian's chromium for the browser tests")


@contextmanager
def chromium_page(**context: Any) -> Iterator[Any]:
    """A fresh browser context and page; closed (with the browser) when the block ends."""
    need_chromium()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=ARGS, headless=True)
        try:
            page = browser.new_context(viewport={"width": 1200, "height": 900}, **context).new_page()
            page.set_default_timeout(15_000)
            yield page
        finally:
            browser.close()


def screenshot(page: Any, name: str) -> Path:
    """A full-page PNG under ARTIFACTS/screenshots/NAME.png, kept after the test as an artifact."""
    path = ARTIFACTS / "screenshots" / f"{name}.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(path), full_page=True)
    return path


def sign_in_page(page: Any, base_url: str, username: str, password: str, next_path: str) -> None:
    """Sign ``username`` in through the login form, as a person does, and land on ``next_path``."""
    page.goto(f"{base_url}/login?next={next_path}")
    page.fill("#username", username)
    page.fill("#password", password)
    page.click("button:has-text('Sign in')")
    page.wait_for_url(f"**{next_path}")
