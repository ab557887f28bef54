"""The Swagger page at /api/v1/docs: every file it loads comes from this host, and it works under its CSP.

FastAPI's own page loads Swagger UI from a CDN and starts it with an inline script, so offline, or under a
CSP without 'unsafe-inline', it shows nothing. The app serves the files of the fastapi-offline package and a
static start script instead.
"""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from fastapi import FastAPI
from starlette.testclient import TestClient

from assay.web import app as web_app
from assay.web.app import create_app

DOCS = "/api/v1/docs"


@pytest.fixture
def app(tmp_path: Path) -> FastAPI:
    return create_app(f"sqlite:///{tmp_path / 'web.db'}")


def referenced(page: str) -> list[str]:
    """Every script, stylesheet and icon address in the page."""
    return re.findall(r'<(?:script|link)\b[^>]*\b(?:src|href)="([^"]+)"', page)


def test_the_docs_page_loads_only_files_served_here(app: FastAPI) -> None:
    client = TestClient(app)
    page = client.get(DOCS)
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    urls = referenced(page.text)
    assert {Path(u).name for u in urls} >= {"swagger-ui-bundle.js", "swagger-ui.css", "swagger-init.js"}
    for url in urls:
        assert not urlsplit(url).netloc and url.startswith("/"), url  # same host, no CDN
        served = client.get(url)
        assert served.status_code == 200 and len(served.content) > 100, url
    assert "cdn" not in page.text.lower() and "<script>" not in page.text  # no inline script
    policy = page.headers["content-security-policy"]
    assert "'unsafe-inline'" not in policy and "http" not in policy and "default-src 'self'" in policy
    assert 'data-openapi-url="/api/v1/openapi.json"' in page.text
    assert client.get("/api/v1/openapi.json").json()["openapi"].startswith("3.1")


def test_other_pages_keep_the_site_policy(app: FastAPI) -> None:
    client = TestClient(app)
    assert "img-src" not in client.get("/login").headers["content-security-policy"]
    assert DOCS not in client.get("/api/v1/openapi.json").json()["paths"]


def test_without_the_swagger_package_the_page_says_what_to_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(web_app, "SWAGGER_PACKAGE", "no_such_package_for_assay_tests")
    page = TestClient(create_app(f"sqlite:///{tmp_path / 'web.db'}")).get(DOCS)
    assert page.status_code == 503 and "/api/v1/openapi.json" in page.text


@pytest.mark.slow
def test_in_a_browser_swagger_ui_renders_with_no_csp_violation_and_no_request_off_host(app: FastAPI) -> None:
    from browser import chromium_page, screenshot  # tests/ is on sys.path
    from web_server import serve_in_thread

    with serve_in_thread(app) as base_url, chromium_page() as page:
        problems: list[str] = []
        host = urlsplit(base_url).netloc
        page.on("console", lambda msg: problems.append(msg.text) if msg.type == "error" else None)
        page.on("pageerror", lambda error: problems.append(str(error)))
        page.on(
            "request", lambda r: problems.append(r.url) if urlsplit(r.url).netloc not in (host, "") else None
        )
        page.goto(f"{base_url}{DOCS}")
        page.wait_for_selector(".opblock-tag", timeout=15_000)  # the operations, grouped by tag
        assert page.locator("#operations-dyepack-api_runs_api_v1_dyepack_runs_get").count() == 1
        page.click("#operations-dyepack-api_runs_api_v1_dyepack_runs_get .opblock-summary")
        page.wait_for_selector(".opblock.is-open")
        screenshot(page, "api-docs")
        assert problems == []
