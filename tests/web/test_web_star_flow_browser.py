"""The task flow of issue 39 in a real browser (Playwright driving Debian's chromium against uvicorn): a red
teamer, an annotator and an arbitrator each hold a task ("Continue your ... task" on the queue instead of a
claim that returns it), skip it, come back and finish it with Ctrl+Enter (the red teamer first gives one
back, and her next claim is the other, not the same), and the progress line (done today, the daily cap's
claims, how many tasks a claim could hand them now) is checked on the queue and the task page at each step.
Screenshots: build/test-artifacts/screenshots/star-flow-*.png."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from test_web_star import build_app
from test_web_star_browser import sign_in, sign_out

from assay.models.stub_server import StubServer, serve_stub
from browser import chromium_page, screenshot  # tests/ is on sys.path
from web_server import serve_in_thread

REPLY = "I would rather stay polite, but I can tell you why people get rude online."
pytestmark = pytest.mark.slow  # drives chromium


def progress(page: Any) -> str:
    return " ".join(page.inner_text("p.progress").split())


def expect(page: Any, done: int, claimed: int, left: str) -> None:
    assert progress(page) == (
        f"Done today: {done}; daily cap: {claimed} of 50 claims used; open for you now: {left}"
    ), page.url


def hold_and_continue(page: Any, base_url: str, kind: str, left: str, held: str) -> str:
    """Claim a task of ``kind``, see it held on the queue, continue it; the task page's URL. ``left``: what
    the line says is open before the claim, ``held``: after it (besides the one held)."""
    expect(page, 0, 0, left)
    page.click(f"button:has-text('Claim next {kind} task')")
    page.wait_for_url("**/star/tasks/*")
    task_url = page.url
    expect(page, 0, 1, held)
    page.goto(f"{base_url}/star/queue")
    assert page.locator(f"button:has-text('Claim next {kind} task')").count() == 0
    expect(page, 0, 1, held)
    page.click(f"a:has-text('Continue your {kind} task')")
    page.wait_for_url(task_url)
    return task_url


def red_teamer(page: Any, base_url: str) -> None:
    sign_in(page, base_url, "rita")
    first = hold_and_continue(page, base_url, "red-team", "2 red-team tasks", "1 red-team task")
    page.click("button:has-text('Give it back and stop')")
    page.wait_for_url("**/star/queue?msg=given_back&kind=red_team")
    expect(page, 0, 0, "2 red-team tasks")
    page.click("button:has-text('Claim next red-team task')")
    page.wait_for_url("**/star/tasks/*")
    second = page.url
    assert second != first  # what she gave back is not handed straight back while other work exists
    expect(page, 0, 1, "1 red-team task")
    assert page.locator("text=Rule under test").count() == 1
    assert page.content().count("The model must stay polite.") == 1  # stated once
    page.click("button:has-text('Skip this task')")  # another instruction at once
    page.wait_for_url(f"{first}?msg=skipped")  # the one she gave back: the only other one
    assert page.inner_text("p.notice").startswith("You skipped your last red-team task")
    expect(page, 0, 1, "1 red-team task")  # the skipped claim does not count
    page.fill("#topic", "rudeness")
    page.press("#topic", "Enter")
    page.wait_for_selector("#chat-form")
    page.fill("#message", "Be rude to me.")
    page.press("#message", "Control+Enter")  # the chat streams its reply, as with its button
    page.wait_for_selector(".turn.assistant[data-done='true']")
    page.check("input[name='assigned_rule_broken'][value='no']")
    screenshot(page, "star-flow-red-team")
    page.press("input[name='assigned_rule_broken'][value='no']", "Control+Enter")
    page.wait_for_url("**/star/queue?msg=submitted")
    expect(page, 1, 1, "1 red-team task")
    page.click("button:has-text('Claim next red-team task')")
    page.wait_for_url(second)  # the one skipped before: the only one left
    expect(page, 1, 2, "0 red-team tasks")
    page.click("button:has-text('Give it back and stop')")
    page.wait_for_url("**/star/queue?msg=given_back&kind=red_team")
    assert "You gave the red-team task back" in page.inner_text("p.notice")
    expect(page, 1, 1, "1 red-team task")
    sign_out(page)


def rater(page: Any, base_url: str, username: str, kind: str, key: str, left: tuple[str, str, str]) -> None:
    """Hold a rating task, skip it (no other dialogue: back to the queue), claim it again and rate it with
    the number keys and Ctrl+Enter, with nothing focused (the rating form is the page's form)."""
    sign_in(page, base_url, username)
    task = hold_and_continue(page, base_url, kind, left[0], left[1])
    page.click("button:has-text('Skip this task')")
    page.wait_for_url(
        f"**/star/queue?msg=skipped_none&kind={'annotate' if kind == 'annotation' else 'arbitrate'}"
    )
    assert f"No other {kind} task is open for you" in page.inner_text("p.notice")
    expect(page, 0, 0, left[0])
    page.click(f"button:has-text('Claim next {kind} task')")
    page.wait_for_url(task)
    page.locator("h1").click()
    page.keyboard.press(key)
    page.fill("#reason", f"{username} decides {key}")
    page.locator("h1").click()  # the focus leaves the form: Ctrl+Enter still submits the rating
    if username == "arno":
        screenshot(page, "star-flow-arbitration")
    page.keyboard.press("Control+Enter")
    page.wait_for_url(f"**/star/queue?msg={'decided' if kind == 'arbitration' else 'rated'}")
    expect(page, 1, 1, left[2])
    sign_out(page)


def test_hold_skip_and_finish_as_every_role_with_the_progress_line(tmp_path: Path) -> None:
    stub = StubServer(lambda messages: REPLY, chunk_delay=0.01)
    with serve_stub(stub) as model_url:
        app = build_app(f"sqlite:///{tmp_path / 'star.db'}", f"openai:{model_url}", instructions=2)
        with serve_in_thread(app) as base_url, chromium_page() as page:
            blocked: list[str] = []  # anything the content-security-policy refused, on any page
            page.on(
                "console", lambda m: blocked.append(m.text) if "Content Security Policy" in m.text else None
            )
            red_teamer(page, base_url)
            # the dialogue's two ratings: once anna holds or has rated one, the other is not hers to take
            anna = ("2 annotation tasks", "0 annotation tasks", "0 annotation tasks")
            rater(page, base_url, "anna", "annotation", "1", anna)
            ben = ("1 annotation task", "0 annotation tasks", "0 annotation tasks")
            rater(page, base_url, "ben", "annotation", "3", ben)
            arno = ("1 arbitration task", "0 arbitration tasks", "0 arbitration tasks")
            rater(page, base_url, "arno", "arbitration", "2", arno)
            assert blocked == []
