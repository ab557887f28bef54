"""Issue 39 on the STAR pages and API: "Continue your task" instead of a claim that returns the held task,
giving a task back (API and page: open for someone else at once, in the audit trail, not in the giver's
done count), skipping to another dialogue, the progress line, the red-team page stating its rule once, and
Krippendorff's alpha below its minimum shown as "too few dialogues" on the dashboard, in its API and in the
report instead of a number with a degenerate interval."""

from __future__ import annotations

import html
import re

from fastapi import FastAPI
from starlette.testclient import TestClient
from test_web_star import Person, app, build_app, people, rate, red_team_dialogue, target, wait_for_report

from assay.star.analysis.reliability import MIN_ALPHA_DIALOGUES
from assay.store import StarTask
from assay.web import accounts

__all__ = ["app", "people", "target"]  # fixtures shared with test_web_star
RULE = "The model must stay polite."
TOO_FEW = f"too few dialogues (n = 2, needs >= {MIN_ALPHA_DIALOGUES})"
NUMBER = re.compile(r"\d\.\d")  # what a shown alpha or interval bound looks like


def progress_line(page: str) -> str:
    """The text of the page's progress line (one per campaign)."""
    found = re.search(r'<p class="progress"[^>]*>(.*?)</p>', page, re.S)
    assert found, page
    return " ".join(html.unescape(re.sub(r"<[^>]+>", "", found.group(1))).split())


def test_a_held_task_is_continued_not_claimed_again(app: FastAPI, people: dict[str, Person]) -> None:
    rita = people["rita"]
    queue = rita.get("/star/queue").text
    assert "Claim next red-team task" in queue and "Continue your" not in queue
    assert "none is open for you" not in queue
    assert (
        progress_line(queue)
        == "Done today: 0; daily cap: 0 of 50 claims used; open for you now: 2 red-team tasks"
    )
    task = rita.claim("red_team")
    queue = rita.get("/star/queue").text
    assert "Claim next red-team task" not in queue
    assert re.search(rf'<a [^>]*href="/star/tasks/{task}"[^>]*>Continue your red-team task</a>', queue)
    assert (
        progress_line(queue)
        == "Done today: 0; daily cap: 1 of 50 claims used; open for you now: 1 red-team task"
    )
    page = rita.get(f"/star/tasks/{task}").text
    assert progress_line(page) == progress_line(queue)
    assert "Rule under test" in page and page.count(RULE) == 1  # an instruction that does not quote it
    with app.state.sessions.begin() as session:
        instruction = session.get_one(StarTask, task).instruction
        instruction.text = f"Try to make it break: {RULE}"  # as the spec's template writes it
    page = rita.get(f"/star/tasks/{task}").text
    assert "Rule under test" in page and page.count(RULE) == 1  # quoted once, not repeated


def test_api_give_back_frees_the_task_for_someone_else_at_once_and_audits_it(
    app: FastAPI, people: dict[str, Person]
) -> None:
    red_team_dialogue(people["rita"])
    with app.state.sessions.begin() as session:
        tokens = {
            name: accounts.create_api_token(session, accounts.get_user(session, name), "t")  # type: ignore[arg-type]
            for name in ("anna", "ben")
        }
    with TestClient(app) as client:
        anna, ben = ({"Authorization": f"Bearer {tokens[n]}"} for n in ("anna", "ben"))
        task = client.post("/api/v1/star/tasks/claim", json={"kind": "annotate"}, headers=anna).json()["task"]
        given = client.post(f"/api/v1/star/tasks/{task['id']}/give-back", headers=anna)
        assert given.status_code == 200, given.text
        assert given.json()["task_id"] == task["id"] and given.json()["kind"] == "annotate"
        assert client.get(f"/api/v1/star/tasks/{task['id']}", headers=anna).status_code == 404  # not hers now
        again = client.post(f"/api/v1/star/tasks/{task['id']}/give-back", headers=anna)
        assert again.status_code == 404
        taken = client.post("/api/v1/star/tasks/claim", json={"kind": "annotate"}, headers=ben).json()
        assert taken["new"] is True and taken["task"]["id"] == task["id"]  # the oldest, at once
        mine = client.get("/api/v1/star/tasks", headers=anna).json()["tasks"]
        assert mine == []  # neither held nor in her finished work
    events = people["olga"].get("/api/v1/admin/audit?limit=10").json()["items"]
    event = next(e for e in events if e["action"] == "star.give_back")
    assert event["actor"] == "anna" and event["target"] == f"star task {task['id']}"
    assert "annotation" in event["detail"] and "anna" in event["detail"]
    assert "STAR task given back" in people["olga"].get("/admin/audit").text


def test_skip_on_the_page_moves_on_and_give_back_returns_to_the_queue(
    app: FastAPI, people: dict[str, Person]
) -> None:
    rita, anna = people["rita"], people["anna"]
    first = rita.claim("red_team")
    skipped = rita.post(f"/star/tasks/{first}/give-back", then="next")
    assert skipped.status_code == 303
    moved_on = re.fullmatch(r"/star/tasks/(\d+)\?msg=skipped", skipped.headers["location"])
    assert moved_on, skipped.headers["location"]
    second = int(moved_on.group(1))
    assert second != first
    assert "You skipped your last red-team task" in rita.get(skipped.headers["location"]).text
    assert progress_line(rita.get(f"/star/tasks/{second}").text).startswith(
        "Done today: 0; daily cap: 1 of 50 claims used"
    )
    stopped = rita.post(f"/star/tasks/{second}/give-back", then="queue")
    assert stopped.headers["location"] == "/star/queue?msg=given_back&kind=red_team"
    queue = rita.get(stopped.headers["location"]).text
    assert "You gave the red-team task back" in queue and "Claim next red-team task" in queue
    assert progress_line(queue).startswith("Done today: 0; daily cap: 0 of 50 claims used")

    red_team_dialogue(rita)
    task = anna.claim("annotate")
    alone = anna.post(f"/star/tasks/{task}/give-back", then="next")  # the dialogue's other task: no
    assert alone.headers["location"] == "/star/queue?msg=skipped_none&kind=annotate"
    assert "No other annotation task is open for you" in anna.get(alone.headers["location"]).text
    rate(anna, anna.claim("annotate"), 0, "rude")
    done = anna.post(f"/star/tasks/{task}/give-back", then="queue")
    assert done.status_code == 400 and "finished" in done.text  # a finished task stays finished
    queue = anna.get("/star/queue").text  # the task left is the dialogue's other rating: not hers to take
    assert (
        progress_line(queue)
        == "Done today: 1; daily cap: 1 of 50 claims used; open for you now: 0 annotation tasks"
    )
    assert "none is open for you right now" in queue  # beside the claim button, which would find nothing
    participant = re.search(r'name="participant_id" value="(\d+)"', queue).group(1)  # type: ignore[union-attr]
    claimed = anna.post("/star/queue/claim", participant_id=participant, kind="annotate")
    assert claimed.headers["location"] == "/star/queue?msg=none&kind=annotate"  # as the line said


def test_rating_pages_offer_a_keyboard_submit_and_skip(app: FastAPI, people: dict[str, Person]) -> None:
    red_team_dialogue(people["rita"])
    anna = people["anna"]
    page = anna.get(f"/star/tasks/{anna.claim('annotate')}").text
    assert "Ctrl+Enter submits" in page and "Skip this task" in page and "Give it back" in page
    give_back = re.search(
        r'action="/star/tasks/\d+/give-back">\s*<input [^>]*name="csrf_token" value="([^"]+)', page
    )
    assert give_back and give_back.group(1) == anna.csrf  # a browser's form posts its token
    assert "<script>" not in page and "style=" not in page


def test_alpha_below_its_minimum_is_too_few_dialogues_on_the_dashboard_and_in_the_report(
    db_url: str, target: str
) -> None:
    """Two fully rated dialogues: no alpha, no interval, anywhere; the message instead."""
    app = build_app(db_url, target, instructions=2)
    rita, anna, ben, olga = (Person(app, n) for n in ("rita", "anna", "ben", "olga"))
    for ratings in ((0, 1), (1, 0)):
        red_team_dialogue(rita)
        rate(anna, anna.claim("annotate"), ratings[0], "a")
        rate(ben, ben.claim("annotate"), ratings[1], "b")
    progress = olga.get("/api/v1/star/campaigns/demo/progress").json()
    for scale in ("agreement", "agreement_broken"):
        estimate = progress[scale]
        assert (estimate["alpha"], estimate["low"], estimate["high"]) == (None, None, None)
        assert estimate["n_units"] == 2 and estimate["reason"] == TOO_FEW
    page = olga.get("/star/campaigns/demo").text
    for cell in ("alpha-ordinal", "alpha-nominal"):
        shown = html.unescape(re.search(rf'<dd id="{cell}">(.*?)</dd>', page, re.S).group(1))  # type: ignore[union-attr]
        assert TOO_FEW in shown and not NUMBER.search(shown), shown

    overview = re.search(r'<a href="/star/campaigns/demo">.*?</tr>', olga.get("/dashboard").text, re.S)
    assert overview and TOO_FEW in html.unescape(overview.group(0))  # the organisers' overview too

    olga.post("/star/campaigns/demo/report", embedder="none")
    wait_for_report(olga)
    report = olga.get("/star/campaigns/demo/report").text
    rows = [html.unescape(r) for r in re.findall(r"<tr><td class=\"l\">all \(.*?</tr>", report, re.S)]
    assert len(rows) == 2  # Likert, and broken / not
    for row in rows:
        cells = re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)
        assert TOO_FEW in cells[2] and not NUMBER.search(" ".join(cells[2:4])), row
    for person in (rita, anna, ben, olga):
        person.client.close()
