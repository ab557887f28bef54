"""Theme labelling in a real browser (Playwright driving Debian's chromium against uvicorn on 127.0.0.1): two
annotators label the four clusters of a campaign's map and disagree on one, an arbitrator settles it with
one click, and the organiser rebuilds the report, whose cluster table then carries the four labels.
Screenshots: build/test-artifacts/screenshots/star-themes-*.png.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import pytest
from test_web_star import build_app
from test_web_star_browser import sign_in, sign_out
from test_web_star_themes import TEXTS, add_dialogues, rebuild_report

from browser import chromium_page, screenshot
from web_server import serve_in_thread

pytestmark = pytest.mark.slow  # drives chromium, and draws two maps


def label_all(page: Any, base_url: str, username: str, labels: dict[str, str]) -> None:
    """Sign in, follow the queue's link to the themes page, give each cluster its label."""
    sign_in(page, base_url, username)
    page.click("a:has-text('Label the themes of this campaign')")
    page.wait_for_url("**/star/campaigns/demo/themes")
    for key, label in labels.items():
        page.fill(f"#label-{key}", label)
        page.click(f"#cluster-{key} button:has-text('Save label')")
        page.wait_for_url(f"**/themes#cluster-{key}")
        assert page.inner_text(f"#cluster-{key} .my-label") == label.strip()  # as given, trimmed
    if username == "anna":
        screenshot(page, "star-themes-labelling")
    sign_out(page)


def test_two_reviewers_label_a_third_settles_and_the_report_shows_it(tmp_path: Path) -> None:
    target = tmp_path / "target.py"
    target.write_text("def reply(prompts):\n    return ['no' for _ in prompts]\n")
    app = build_app(f"sqlite:///{tmp_path / 'star.db'}", f"python:{target}:reply", instructions=4)
    keys = add_dialogues(app, TEXTS)
    rebuild_report(app)  # the map the reviewers label (the organiser rebuilds it in the browser below)
    with serve_in_thread(app) as base_url, chromium_page() as page:
        blocked: list[str] = []
        page.on("console", lambda m: blocked.append(m.text) if "Content Security Policy" in m.text else None)
        anna = ["Weapons", "Baking", "Loans", "Pistols"]
        ben = ["weapons", "Cakes", "loans.", " PISTOLS"]  # the same but for one, after normalisation
        label_all(page, base_url, "anna", dict(zip(keys, anna, strict=True)))
        label_all(page, base_url, "ben", dict(zip(keys, ben, strict=True)))

        sign_in(page, base_url, "arno")
        page.goto(f"{base_url}/star/campaigns/demo/themes")
        assert page.locator("button:has-text('Settle')").count() == 3  # two picks and a free label, once
        disputed = page.locator(f"#cluster-{keys[1]}")
        assert disputed.get_attribute("data-status") == "disagreement"
        assert "Baking" in disputed.inner_text() and "Cakes" in disputed.inner_text()
        screenshot(page, "star-themes-settle")
        disputed.locator("button:has-text('Settle as \"Cakes\"')").click()
        page.wait_for_url(f"**/themes#cluster-{keys[1]}")
        assert page.locator("button:has-text('Settle')").count() == 0
        assert page.inner_text(f"#cluster-{keys[1]} .theme-label") == "Cakes"
        assert page.inner_text("#themes-decided") == "4"
        sign_out(page)

        sign_in(page, base_url, "olga")
        page.goto(f"{base_url}/star/campaigns/demo/themes")
        page.click("#themes-rebuild a:has-text('rebuild the report')")
        page.wait_for_url("**/star/campaigns/demo#report-heading")
        page.select_option("#report-embedder", "hashing")
        page.click("button:has-text('Build the report now')")
        page.wait_for_url("**/star/campaigns/demo#report-heading")
        deadline = time.monotonic() + 120
        while page.locator("text=A report is being built").count() and time.monotonic() < deadline:
            time.sleep(0.3)
            page.reload()
        page.click("a:has-text('View the report')")
        page.wait_for_url("**/star/campaigns/demo/report")
        labels = page.locator("#themes-table td.theme-label").all_inner_texts()
        assert sorted(labels) == ["Cakes", "Loans", "Pistols", "Weapons"]  # anna's spelling; Cakes settled
        assert re.search(r"4 of 4 clusters labelled", page.inner_text("body"))
        screenshot(page, "star-themes-report")
        assert blocked == []
