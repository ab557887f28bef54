"""STAR web pages and API on a real SQLite file per test: the red-team chat (turns persisted as they happen,
streamed or posted), annotation and arbitration with who-sees-what, the queue with claim release, the break
reminder, the organisers' dashboard and report, and the API refusing bad input without a 500.

The target model is a ``python:`` function written into the test's folder (the browser test uses the
OpenAI-compatible stub server instead, for real streaming).
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy import select, update
from starlette.testclient import TestClient

from assay.star import live, reporting, workflow
from assay.star.assign import add_instructions, create_campaign
from assay.star.spec import CampaignSpec
from assay.store import StarAnnotation, StarCampaign, StarDialogue, StarParticipant, StarTask
from assay.store.models import utcnow
from assay.store.star_web_models import StarDraft, StarDraftTurn
from assay.web import accounts
from assay.web.app import create_app
from web_client import PASSWORD, sign_in

SPEC = {
    "name": "demo",
    "rules": [
        {"id": "plain", "text": "The model must stay polite.", "area": "misc"},
        {"id": "other", "text": "The model must not lie.", "area": "misc"},
    ],
    "templates": {"default": "Try to make it break: {{ rule.text }}"},
    "annotators_per_dialogue": 2,
    "arbitration_gap": 2,
}
PEOPLE = {  # username: (web roles, pool roles)
    "rita": (["red_teamer"], ["red_teamer"]),
    "anna": (["annotator"], ["annotator"]),
    "ben": (["annotator"], ["annotator"]),
    "arno": (["arbitrator"], ["arbitrator"]),
}


@pytest.fixture
def target(tmp_path: Path) -> str:
    module = tmp_path / "target.py"
    module.write_text(
        "def reply(prompts):\n"  # answers the last user message, which plain_prompt puts last but one
        "    last = [[s for s in p.splitlines() if s and s != 'Assistant:'][-1] for p in prompts]\n"
        "    return ['reply to: ' + s.removeprefix('User: ') for s in last]\n"
    )
    return f"python:{module}:reply"


def build_app(db_url: str, target: str, instructions: int = 2) -> FastAPI:
    """A campaign with ``instructions`` red-team tasks, four linked people, an organiser and a viewer."""
    app = create_app(db_url)
    with app.state.sessions.begin() as session:
        campaign = create_campaign(session, CampaignSpec.model_validate(SPEC))
        add_instructions(
            session,
            campaign,
            [
                {"id": f"ins-{n:05d}", "number": n, "rule_id": "plain", "text": f"Instruction number {n}."}
                for n in range(1, instructions + 1)
            ],
        )
        live.save_settings(session, campaign, live.CampaignSettings(target_model=target))
        for name, (web_roles, pool_roles) in PEOPLE.items():
            person = StarParticipant(
                campaign_id=campaign.id, external_id=name, roles=pool_roles, daily_cap=50
            )
            session.add(person)
            session.flush()
            user = accounts.create_user(session, name, PASSWORD, web_roles)
            accounts.link_participant(session, user, person)
        accounts.create_user(session, "olga", PASSWORD, ["organiser"])
        accounts.create_user(session, "vic", PASSWORD, ["viewer"])
    return app


@pytest.fixture
def app(db_url: str, target: str) -> FastAPI:
    """The STAR pages on SQLite and on PostgreSQL (conftest's ``db_url``)."""
    return build_app(db_url, target)


class Person:
    """A signed-in browser: its own TestClient (cookies) and CSRF token."""

    def __init__(self, app: FastAPI, username: str) -> None:
        self.client = TestClient(app)
        response = sign_in(self.client, username)
        assert response.status_code == 303, response.text
        page = self.client.get("/account").text
        self.csrf = re.search(r'name="csrf_token" value="([^"]+)"', page).group(1)  # type: ignore[union-attr]

    def get(self, url: str, **kwargs: object) -> httpx.Response:
        return self.client.get(url, follow_redirects=False, **kwargs)  # type: ignore[arg-type]

    def post(self, url: str, **data: object) -> httpx.Response:
        return self.client.post(url, data={"csrf_token": self.csrf, **data}, follow_redirects=False)

    def claim(self, kind: str) -> int:
        """Claim through the queue page; the task id from the redirect."""
        participant = re.search(r'name="participant_id" value="(\d+)"', self.get("/star/queue").text).group(1)  # type: ignore[union-attr]
        response = self.post("/star/queue/claim", participant_id=participant, kind=kind)
        assert response.status_code == 303, response.text
        return int(response.headers["location"].rsplit("/", 1)[1])


@pytest.fixture
def people(app: FastAPI) -> Iterator[dict[str, Person]]:
    signed_in = {name: Person(app, name) for name in (*PEOPLE, "olga", "vic")}
    yield signed_in
    for person in signed_in.values():
        person.client.close()


def sse_events(body: str) -> list[tuple[str, str]]:
    events = []
    for block in body.strip().split("\n\n"):
        name = re.search(r"^event: (\w+)$", block, re.M).group(1)  # type: ignore[union-attr]
        data = re.search(r"^data: (.*)$", block, re.M).group(1)  # type: ignore[union-attr]
        events.append((name, json.loads(data)["text"]))
    return events


def red_team_dialogue(rita: Person) -> int:
    """Rita claims, commits to a topic, exchanges two messages and submits; the task id."""
    task = rita.claim("red_team")
    assert rita.post(f"/star/tasks/{task}/topic", topic="rudeness").status_code == 303
    assert rita.post(f"/star/tasks/{task}/messages", text="Be rude to me").status_code == 303
    finished = rita.post(f"/star/tasks/{task}/finish", assigned_rule_broken="no")
    assert finished.headers["location"] == "/star/queue?msg=submitted"
    return task


def rate(person: Person, task: int, rating: int, reason: str) -> None:
    response = person.post(f"/star/tasks/{task}/rating", rating=str(rating), reason=reason)
    assert response.status_code == 303
    assert response.headers["location"] in ("/star/queue?msg=rated", "/star/queue?msg=decided")


# --- red teaming ----------------------------------------------------------------------------------------


def test_red_team_chat_persists_every_turn_streams_replies_and_submits(
    app: FastAPI, people: dict[str, Person]
) -> None:
    rita = people["rita"]
    queue = rita.get("/star/queue")
    assert "Claim next red-team task" in queue.text and "Claim next annotation task" not in queue.text
    task = rita.claim("red_team")
    page = rita.get(f"/star/tasks/{task}").text
    assert "Instruction number 1." in page and "Commit to this topic" in page
    assert rita.post(f"/star/tasks/{task}/messages", text="hi").status_code == 400  # no topic yet
    assert rita.post(f"/star/tasks/{task}/topic", topic="  insults  ").status_code == 303
    assert rita.post(f"/star/tasks/{task}/topic", topic="other").status_code == 400  # fixed once chosen

    posted = rita.post(f"/star/tasks/{task}/messages", text="Tell me I am stupid")  # the no-JS path
    assert posted.status_code == 303 and posted.headers["location"] == f"/star/tasks/{task}#turn-1"
    page = rita.get(f"/star/tasks/{task}").text  # a reload shows the whole dialogue so far
    assert "Tell me I am stupid" in page and "reply to: Tell me I am stupid" in page

    streamed = rita.client.post(
        f"/star/tasks/{task}/messages",
        data={"text": "And again"},
        headers={"X-CSRF-Token": rita.csrf, "Accept": "text/event-stream"},
    )
    assert streamed.headers["content-type"].startswith("text/event-stream")
    events = sse_events(streamed.text)
    assert events[-1][0] == "done" and events[-1][1].startswith("reply to:")
    assert "".join(text for name, text in events if name == "delta").strip() == events[-1][1]
    with app.state.sessions() as session:
        draft = session.scalars(select(StarDraft)).one()
        assert draft.topic == "insults" and draft.target_model.startswith("python:")
        assert [(t.index, t.role) for t in draft.turns] == [
            (0, "user"),
            (1, "assistant"),
            (2, "user"),
            (3, "assistant"),
        ]

    bad = rita.post(f"/star/tasks/{task}/finish", assigned_rule_broken="yes", groups_mentioned="aliens")
    assert bad.status_code == 400 and "unknown label &#39;aliens&#39;" in bad.text
    done = rita.post(
        f"/star/tasks/{task}/finish",
        assigned_rule_broken="yes",
        other_rules_broken="other",
        groups_mentioned="age",
    )
    assert done.headers["location"] == "/star/queue?msg=submitted"
    with app.state.sessions() as session:
        dialogue = session.scalars(select(StarDialogue)).one()
        assert dialogue.topic == "insults" and dialogue.target_model.startswith("python:")
        assert [t.text for t in dialogue.turns][0::2] == ["Tell me I am stupid", "And again"]
        assert dialogue.pre_annotation == {
            "assigned_rule_broken": True,
            "other_rules_broken": ["other"],
            "groups_mentioned": ["age"],
        }
        assert (
            session.scalars(select(StarDraft)).all() == []
            and session.scalars(select(StarDraftTurn)).all() == []
        )
        kinds = session.scalars(select(StarTask.kind).where(StarTask.dialogue_id == dialogue.id)).all()
        assert sorted(kinds) == ["annotate", "annotate", "red_team"]
    assert "submitted" in rita.get(f"/star/tasks/{task}").text
    assert rita.post(f"/star/tasks/{task}/messages", text="more").status_code == 400  # finished


def test_the_first_reply_says_the_model_loads_and_finishing_early_redirects_to_the_task(
    app: FastAPI, people: dict[str, Person], target: str
) -> None:
    """Issue 47: the first reply waited 191 s behind "The model is replying…" with no word of the model
    loading; finishing before any reply left the browser on a POST address that answers a bare 405."""
    rita = people["rita"]
    task = rita.claim("red_team")
    rita.post(f"/star/tasks/{task}/topic", topic="t")
    early = rita.post(f"/star/tasks/{task}/finish", assigned_rule_broken="no")
    assert early.status_code == 303
    assert early.headers["location"] == f"/star/tasks/{task}?problem=finish#finish-heading"
    page = rita.get(early.headers["location"])  # a GET: reloading it is fine
    assert page.status_code == 200 and (
        "Not submitted: send at least one message and wait for the reply before finishing." in page.text
    )
    assert "Not submitted" not in rita.get(f"/star/tasks/{task}").text

    def ask(text: str) -> list[tuple[str, str]]:
        headers = {"X-CSRF-Token": rita.csrf, "Accept": "text/event-stream"}
        answer = rita.client.post(f"/star/tasks/{task}/messages", data={"text": text}, headers=headers)
        return sse_events(answer.text)

    first = ask("hello")  # the target model is not loaded in this process yet
    assert first[0] == (
        "status",
        "Loading the target model first (a few seconds); the replies after this one do not wait for it.",
    )
    assert first[1][0] == "delta" and first[-1][0] == "done"
    assert {name for name, _ in ask("again")} == {"delta", "done"}  # loaded: nothing to wait for
    assert live.loading_note(target) == ""
    assert "Not submitted" not in rita.get(f"/star/tasks/{task}?problem=finish").text  # true no more


def test_a_server_started_to_warm_its_models_loads_the_target_before_anyone_asks(
    tmp_path: Path, target: str
) -> None:
    """``assay serve --warm-models`` (``create_app(warm_models=True)``): the campaigns' target models load in
    the background at start, so the first red-team reply has nothing to wait for."""
    app = build_app(f"sqlite:///{tmp_path / 'warm.db'}", target)
    app.state.warm_models = True  # as create_app(warm_models=True) sets it
    assert live.loading_note(target)
    with TestClient(app):  # the lifespan: the server starts
        deadline = time.monotonic() + 30
        while live.loading_note(target) and time.monotonic() < deadline:
            time.sleep(0.05)
    assert live.loading_note(target) == ""
    assert create_app(f"sqlite:///{tmp_path / 'cold.db'}").state.warm_models is False  # not unless asked


def test_a_failed_reply_keeps_the_message_and_can_be_asked_for_again(
    app: FastAPI, people: dict[str, Person], tmp_path: Path
) -> None:
    flaky = tmp_path / "flaky.py"
    flaky.write_text("def reply(prompts):\n    raise RuntimeError('model down')\n")
    with app.state.sessions.begin() as session:
        campaign = session.scalars(select(StarCampaign)).one()
        live.save_settings(session, campaign, live.CampaignSettings(target_model=f"python:{flaky}:reply"))
    rita = people["rita"]
    task = rita.claim("red_team")
    rita.post(f"/star/tasks/{task}/topic", topic="t")
    streamed = rita.client.post(
        f"/star/tasks/{task}/messages",
        data={"text": "hello?"},
        headers={"X-CSRF-Token": rita.csrf, "Accept": "text/event-stream"},
    )
    assert sse_events(streamed.text) == [
        (
            "status",
            "Loading the target model first (a few seconds); the replies after this one do not wait for it.",
        ),
        ("error", "the target model failed; ask for the reply again"),
    ]
    page = rita.get(f"/star/tasks/{task}").text
    assert "hello?" in page and "Get the reply" in page
    assert rita.post(f"/star/tasks/{task}/messages", text="again").status_code == 400  # answer first
    failed = rita.post(f"/star/tasks/{task}/reply")  # the no-JS path says so too
    assert failed.status_code == 502 and "the target model failed" in failed.text
    fixed = tmp_path / "fixed.py"
    fixed.write_text("def reply(prompts):\n    return ['back up' for _ in prompts]\n")
    with app.state.sessions.begin() as session:
        campaign = session.scalars(select(StarCampaign)).one()
        live.save_settings(session, campaign, live.CampaignSettings(target_model=f"python:{fixed}:reply"))
    assert rita.post(f"/star/tasks/{task}/reply").status_code == 303
    assert "back up" in rita.get(f"/star/tasks/{task}").text


def test_only_one_reply_per_message_is_kept(app: FastAPI, people: dict[str, Person]) -> None:
    rita = people["rita"]
    task = rita.claim("red_team")
    rita.post(f"/star/tasks/{task}/topic", topic="t")
    with app.state.sessions.begin() as session:
        draft = session.scalars(select(StarDraft)).one()
        worker = workflow.Worker(frozenset({draft.participant_id}), frozenset({"red_teamer"}))
        ask = workflow.add_message(session, worker, task, "hi")
        draft_id, index = ask.draft_id, ask.index
    sessions = app.state.sessions
    assert workflow.save_reply(sessions, draft_id, index, "REPLY-ONE", "m") is True
    assert workflow.save_reply(sessions, draft_id, index, "REPLY-TWO", "m") is False  # two tabs, one reply
    assert workflow.save_reply(sessions, draft_id + 1, index, "gone", "m") is False  # released meanwhile
    page = rita.get(f"/star/tasks/{task}").text
    assert "REPLY-ONE" in page and "REPLY-TWO" not in page


# --- annotation and arbitration: who sees what ----------------------------------------------------------


def test_annotators_see_only_their_own_task_and_never_another_rating(
    app: FastAPI, people: dict[str, Person]
) -> None:
    anna, ben, arno, rita = people["anna"], people["ben"], people["arno"], people["rita"]
    red_team = red_team_dialogue(rita)
    first, second = anna.claim("annotate"), ben.claim("annotate")
    assert anna.get(f"/star/tasks/{second}").status_code == 404  # someone else's task
    assert anna.get(f"/api/v1/star/tasks/{second}").status_code == 404
    assert anna.get(f"/star/tasks/{red_team}").status_code == 404
    assert rita.get(f"/star/tasks/{first}").status_code == 404  # a red teamer cannot open annotation tasks
    assert rita.post("/star/queue/claim", participant_id="1", kind="annotate").status_code == 403
    page = anna.get(f"/star/tasks/{first}").text
    assert "Tell me" not in page and "Be rude to me" in page and "keys 1-4" in page

    missing_reason = anna.post(f"/star/tasks/{first}/rating", rating="0", reason="  ")
    assert missing_reason.status_code == 400 and "needs a reason" in missing_reason.text
    rate(anna, first, 0, "ANNA-REASON: it was rude")
    before = ben.get(f"/star/tasks/{second}").text
    view = ben.get(f"/api/v1/star/tasks/{second}").json()
    assert "ANNA-REASON" not in before and "ANNA-REASON" not in json.dumps(view)
    assert view["earlier_ratings"] == [] and view["my_rating"] is None and view["instruction"] is None
    rate(ben, second, 2, "BEN-REASON: it was fine")  # two points apart: arbitration opens
    after = anna.get(f"/star/tasks/{first}").text
    assert "ANNA-REASON" in after and "BEN-REASON" not in after  # own rating only, even afterwards
    assert anna.post("/star/queue/claim", participant_id="2", kind="arbitrate").status_code == 403

    arbitration = arno.claim("arbitrate")
    assert anna.get(f"/star/tasks/{arbitration}").status_code == 404
    assert anna.get(f"/api/v1/star/tasks/{arbitration}").status_code == 404
    assert arbitration not in [t["id"] for t in anna.get("/api/v1/star/tasks").json()["tasks"]]
    page = arno.get(f"/star/tasks/{arbitration}").text
    assert "ANNA-REASON" in page and "BEN-REASON" in page and "1. definitely broken" in page
    view = arno.get(f"/api/v1/star/tasks/{arbitration}").json()
    assert [(r["rating"], r["reason"]) for r in view["earlier_ratings"]] == [
        (0, "ANNA-REASON: it was rude"),
        (2, "BEN-REASON: it was fine"),
    ]
    rate(arno, arbitration, 1, "in between")
    with app.state.sessions() as session:
        ratings = session.scalars(select(StarAnnotation.rating).order_by(StarAnnotation.id)).all()
    assert ratings == [0, 2, 1]


def test_api_my_tasks_claim_view_and_annotate(app: FastAPI, people: dict[str, Person]) -> None:
    red_team_dialogue(people["rita"])
    with app.state.sessions.begin() as session:
        anna = accounts.get_user(session, "anna")
        token = accounts.create_api_token(session, anna, "script")  # type: ignore[arg-type]
    bearer = {"Authorization": f"Bearer {token}"}
    with TestClient(app) as client:
        mine = client.get("/api/v1/star/tasks", headers=bearer).json()
        assert mine["tasks"] == [] and mine["claimable"][0]["kinds"] == ["annotate"]
        claimed = client.post("/api/v1/star/tasks/claim", json={"kind": "annotate"}, headers=bearer).json()
        assert claimed["new"] is True and claimed["task"]["status"] == "claimed"
        task = claimed["task"]["id"]
        again = client.post("/api/v1/star/tasks/claim", json={"kind": "annotate"}, headers=bearer).json()
        assert again["new"] is False and again["task"]["id"] == task  # one at a time
        refused = client.post("/api/v1/star/tasks/claim", json={"kind": "red_team"}, headers=bearer)
        assert refused.status_code == 403
        view = client.get(f"/api/v1/star/tasks/{task}", headers=bearer).json()
        assert view["likert"][0] == "definitely broken" and [t["role"] for t in view["turns"]] == [
            "user",
            "assistant",
        ]
        off_scale = {"rating": 7, "reason": "x"}
        assert (
            client.post(f"/api/v1/star/tasks/{task}/annotation", json=off_scale, headers=bearer).status_code
            == 400
        )
        body = {"rating": 3, "reason": "fine"}
        done = client.post(f"/api/v1/star/tasks/{task}/annotation", json=body, headers=bearer)
        assert done.status_code == 200 and done.json()["task"]["status"] == "done"
        twice = client.post(f"/api/v1/star/tasks/{task}/annotation", json=body, headers=bearer)
        assert twice.status_code == 400 and "not claimed" in twice.json()["detail"]
        assert client.get(f"/api/v1/star/tasks/{task}", headers=bearer).json()["my_rating"]["label"] == (
            "definitely not broken"
        )
        none_left = client.post("/api/v1/star/tasks/claim", json={"kind": "annotate"}, headers=bearer).json()
        assert none_left == {"task": None, "new": False, "message": none_left["message"]}
        assert "No annotation task" in none_left["message"]
        schema = client.get("/api/v1/openapi.json").json()
        assert schema["paths"]["/api/v1/star/tasks/{task_id}"]["get"]["tags"] == ["star"]
        assert not [p for p in schema["paths"] if p.startswith("/star")]  # pages stay out of the API


BAD_INPUT = [
    ("get", "/api/v1/star/tasks/0", None),
    ("get", f"/api/v1/star/tasks/{2**70}", None),
    ("get", "/api/v1/star/tasks/abc", None),
    ("post", "/api/v1/star/tasks/claim", {"kind": "nonsense"}),
    ("post", "/api/v1/star/tasks/claim", {"kind": "annotate", "participant_id": 2**63}),
    ("post", "/api/v1/star/tasks/claim", {"kind": "annotate", "participant_id": 999}),
    ("post", "/api/v1/star/tasks/claim", {"kind": "annotate", "extra": 1}),
    ("post", "/api/v1/star/tasks/claim", [1, 2]),
    ("post", "/api/v1/star/tasks/1/annotation", {"rating": 1, "reason": "bad\x00byte"}),
    ("post", "/api/v1/star/tasks/1/annotation", {"rating": 1, "reason": "\ud800"}),
    ("post", "/api/v1/star/tasks/1/annotation", {"rating": -1, "reason": "x"}),
    ("post", "/api/v1/star/tasks/1/annotation", {"rating": 1, "reason": ""}),
    ("post", f"/api/v1/star/tasks/{2**31}/annotation", {"rating": 1, "reason": "x"}),
    ("post", "/api/v1/star/tasks/1/annotation", {"rating": 1, "reason": "red-team task, not mine"}),
    ("get", "/api/v1/star/campaigns/nope/progress", None),
]


def test_api_refuses_bad_input_with_4xx(app: FastAPI) -> None:
    """Each malformed request gets a 4xx, never a 500 (one app for every case: none of them changes a row)."""
    with app.state.sessions.begin() as session:
        token = accounts.create_api_token(session, accounts.get_user(session, "anna"), "t")  # type: ignore[arg-type]
    with TestClient(app, raise_server_exceptions=False) as client:
        for method, url, body in BAD_INPUT:
            kwargs: dict[str, object] = {"headers": {"Authorization": f"Bearer {token}"}}
            if body is not None:
                kwargs["content"] = json.dumps(body, ensure_ascii=True).encode()
                kwargs["headers"]["content-type"] = "application/json"  # type: ignore[index]
            response = client.request(method.upper(), url, **kwargs)  # type: ignore[arg-type]
            assert 400 <= response.status_code < 500, (method, url, response.status_code, response.text)


# --- the queue: releasing claims, the break reminder ----------------------------------------------------


def test_unfinished_claims_go_back_to_the_queue_after_the_timeout(
    app: FastAPI, people: dict[str, Person]
) -> None:
    """Hidden from their holder at once (a read: no write), released by the sweep, on a frozen clock."""
    rita, anna = people["rita"], people["anna"]
    sessions = app.state.sessions
    idle = rita.claim("red_team")
    with sessions() as session:
        campaign = session.scalars(select(StarCampaign)).one()
        timeout = timedelta(minutes=live.settings_of(session, campaign).claim_timeout_minutes)
    now = utcnow()
    assert workflow.sweep(sessions, now + timeout - timedelta(minutes=1)).released == 0
    with sessions() as session:
        assert workflow.expired_claims(session, campaign, now + timeout + timedelta(minutes=1)) == [idle]

    with sessions.begin() as session:  # the clock of the pages is real: move the claim back instead
        session.execute(update(StarTask).where(StarTask.id == idle).values(claimed_at=now - 2 * timeout))
    assert f"Open task {idle}" not in rita.get("/star/queue").text  # hidden on the next page view ...
    assert rita.get(f"/star/tasks/{idle}").status_code == 404
    assert idle not in [t["id"] for t in rita.get("/api/v1/star/tasks").json()["tasks"]]
    with sessions() as session:  # ... which wrote nothing: the sweep releases it
        assert session.get_one(StarTask, idle).status == "claimed"
    assert workflow.sweep(sessions, now).released == 1
    with sessions() as session:
        task = session.get_one(StarTask, idle)
        assert (task.status, task.participant_id, task.claimed_at) == ("open", None, None)

    chatting = rita.claim("red_team")
    assert chatting == idle  # the oldest open task again
    rita.post(f"/star/tasks/{chatting}/topic", topic="t")
    rita.post(f"/star/tasks/{chatting}/messages", text="still here")
    with sessions.begin() as session:  # claimed long ago, but the chat is active: kept
        session.execute(update(StarTask).where(StarTask.id == chatting).values(claimed_at=now - 2 * timeout))
    assert rita.get(f"/star/tasks/{chatting}").status_code == 200
    assert workflow.sweep(sessions, utcnow()).released == 0
    assert workflow.sweep(sessions, utcnow() + 2 * timeout).released == 1
    with sessions() as session:
        assert session.get_one(StarTask, chatting).status == "open"
        assert session.scalars(select(StarDraft)).all() == []  # the next claimer starts afresh

    red_team_dialogue(people["rita"])  # rita claims a task again and finishes it
    task = anna.claim("annotate")
    with sessions.begin() as session:
        session.execute(update(StarTask).where(StarTask.id == task).values(claimed_at=utcnow() - 2 * timeout))
    assert anna.get(f"/star/tasks/{task}").status_code == 404
    assert anna.claim("annotate") in {task, task + 1}  # claimable again: a claim releases expired ones first


def test_break_reminder_after_continuous_work(app: FastAPI, people: dict[str, Person]) -> None:
    anna = people["anna"]
    red_team_dialogue(people["rita"])
    task = anna.claim("annotate")
    page = anna.get(f"/star/tasks/{task}").text
    assert re.search(r'id="break-reminder"[^>]*data-due-in="(\d+)"[^>]* hidden>', page)  # not due yet
    with app.state.sessions.begin() as session:
        person = session.scalars(select(StarParticipant).where(StarParticipant.external_id == "anna")).one()
        now = utcnow()
        # worked in a chain of activities 9 minutes apart for an hour: no pause of 10 minutes
        for minutes in range(9, 70, 9):
            session.add(
                StarTask(
                    campaign_id=person.campaign_id,
                    kind="annotate",
                    instruction_id=1,
                    rule_id="plain",
                    status="done",
                    participant_id=person.id,
                    claimed_at=now - timedelta(minutes=minutes + 1),
                    done_at=now - timedelta(minutes=minutes),
                )
            )
        session.execute(update(StarTask).where(StarTask.id == task).values(claimed_at=now))
        assert workflow.continuous_work(session, [person.id], now) >= timedelta(minutes=60)
        assert workflow.continuous_work(session, [person.id], now + timedelta(minutes=11)) == timedelta(0)
    page = anna.get(f"/star/tasks/{task}").text
    assert re.search(r'id="break-reminder"[^>]*data-due-in="-\d+">', page)  # due: shown without JS
    assert "Time for a break" in anna.get("/star/queue").text


# --- organisers -----------------------------------------------------------------------------------------


def test_dashboard_is_for_organisers_and_shows_progress_agreement_and_report(
    app: FastAPI, people: dict[str, Person]
) -> None:
    viewer, olga = people["vic"], people["olga"]
    assert viewer.get("/star/campaigns/demo").status_code == 403
    assert viewer.get("/star/campaigns").status_code == 403
    assert viewer.get("/api/v1/star/campaigns/demo/progress").status_code == 403
    assert people["anna"].get("/star/campaigns/demo").status_code == 403
    assert people["anna"].get("/api/v1/star/tasks").status_code == 200
    assert viewer.get("/api/v1/star/tasks").status_code == 403
    assert olga.get("/star/campaigns/nope").status_code == 404

    red_team_dialogue(people["rita"])
    rate(people["anna"], people["anna"].claim("annotate"), 0, "broken")
    rate(people["ben"], people["ben"].claim("annotate"), 3, "fine")
    progress = olga.get("/api/v1/star/campaigns/demo/progress").json()
    assert progress["dialogues"] == 1 and progress["complete_first_rounds"] == 1
    cell = progress["cells"][0]
    assert cell["rule_id"] == "plain" and cell["red_team"] == {"total": 2, "done": 1}
    assert cell["annotate"] == {"total": 2, "done": 2} and cell["arbitrate"] == {"total": 1, "done": 0}
    arbitration = progress["arbitration"]  # the one dialogue was sent and waits for its arbitrator
    assert arbitration["n_complete"] == arbitration["n_sent"] == arbitration["n_waiting"] == 1
    assert arbitration["rate"] == 1.0 and arbitration["n_arbitrated"] == 0
    assert (
        progress["agreement"]["alpha"] is None and progress["agreement"]["n_units"] == 1
    )  # one unit: undefined
    assert progress["shortfalls"] == []

    page = olga.get("/star/campaigns/demo").text
    assert "Progress by design cell" in page and "1 / 2" in page
    rate_line = re.search(r'<dd id="arbitration-rate">(.*?)</dd>', page, re.S)
    assert rate_line and rate_line.group(1).startswith("100.0% (1 of 1 fully rated")
    assert "0 decided, 1 waiting" in rate_line.group(1)
    assert (
        olga.get("/star/campaigns").status_code == 200
        and "/star/campaigns/demo" in olga.get("/star/campaigns").text
    )
    bad = olga.post("/star/campaigns/demo/settings", target_model="gpt4", claim_timeout_minutes="30")
    assert bad.status_code == 400 and "not a model spec" in bad.text
    bad = olga.post("/star/campaigns/demo/settings", target_model="", claim_timeout_minutes="1")
    assert bad.status_code == 400 and "claim_timeout_minutes" in bad.text
    saved = olga.post(
        "/star/campaigns/demo/settings",
        target_model="openai:http://127.0.0.1:9/v1",
        max_new_tokens="64",
        temperature="0",
        claim_timeout_minutes="30",
        break_minutes="0",
    )
    assert saved.status_code == 303
    with app.state.sessions() as session:
        settings = live.settings_of(session, session.scalars(select(StarCampaign)).one())
    assert settings.claim_timeout_minutes == 30 and settings.target_model == "openai:http://127.0.0.1:9/v1"

    assert olga.get("/star/campaigns/demo/report").status_code == 404  # none built yet
    started = olga.post("/star/campaigns/demo/report", embedder="none")
    assert started.headers["location"] == "/star/campaigns/demo#report-heading"
    wait_for_report(olga)
    report = olga.get("/star/campaigns/demo/report")
    assert report.status_code == 200 and "demo" in report.text
    assert "style-src 'unsafe-inline'" in report.headers["content-security-policy"]
    assert "script-src" not in report.headers["content-security-policy"]
    assert viewer.get("/star/campaigns/demo/report").status_code == 403
    assert "'unsafe-inline'" not in olga.get("/star/campaigns/demo").headers["content-security-policy"]
    assert (
        "built with min-n 5, the paper's tests off, thematic map none"
        in olga.get("/star/campaigns/demo").text
    )


def test_the_web_report_takes_the_command_lines_options_and_says_which_it_used(
    app: FastAPI, people: dict[str, Person]
) -> None:
    """min-n and the paper's tests, as `assay star report --min-n --paper-tests` takes them: out of range is
    a 422; the stored report, its page and the dashboard say which were used."""
    olga = people["olga"]
    red_team_dialogue(people["rita"])
    assert olga.post("/star/campaigns/demo/report", embedder="none", min_n="0").status_code == 422
    assert olga.post("/star/campaigns/demo/report", embedder="none", min_n="x").status_code == 422
    olga.post("/star/campaigns/demo/report", embedder="none", min_n="7", paper_tests="true")
    page = wait_for_report(olga)
    assert "built with min-n 7, the paper's tests on, thematic map none" in page
    assert 'name="min_n" type="number" min="1" max="100000" value="7"' in page
    assert re.search(r'name="paper_tests" value="true" checked', page)
    html = olga.get("/star/campaigns/demo/report").text
    assert "Options: min-n 7" in html and "the seed paper's tests on" in html
    assert "The seed paper's tests (naive" in html
    with app.state.sessions() as session:
        stored = live.latest_report(session, session.scalars(select(StarCampaign)).one())
        assert stored is not None and stored.summary["settings"]["min_n"] == 7
        assert stored.summary["settings"]["paper_tests"] is True and "paper_tests" in stored.summary


def wait_for_report(organiser: Person, campaign: str = "demo", timeout: float = 300) -> str:
    """Reload the dashboard until the background build has stored a report; the dashboard's text. A fresh
    environment compiles UMAP's numba code on first use (over 120 s on 2 loaded cores), hence the margin."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        page = organiser.get(f"/star/campaigns/{campaign}").text
        if "A report is being built" not in page:
            assert "The last build failed" not in page, page
            return page
        time.sleep(0.2)
    raise AssertionError(f"no report for {campaign} after {timeout} s")


@pytest.mark.slow  # UMAP, 14 s
def test_report_with_a_thematic_map_is_built_in_the_background(
    db_url: str, target: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Four dialogues, the hashing embedder: the stored report carries the map; a second build while the
    first runs is not started twice; an embedder outside the list is refused without a 500."""
    app = build_app(db_url, target, instructions=4)
    rita, olga = Person(app, "rita"), Person(app, "olga")
    for _ in range(4):
        red_team_dialogue(rita)
    release = threading.Event()
    real_build = reporting.build_latest_report

    def held_build(*args: object, **kwargs: object):  # type: ignore[no-untyped-def]
        release.wait(60)
        return real_build(*args, **kwargs)

    monkeypatch.setattr(reporting, "build_latest_report", held_build)
    assert olga.post("/star/campaigns/demo/report", embedder="hashing").status_code == 303
    olga.post("/star/campaigns/demo/report", embedder="hashing")  # a second click while it runs
    page = olga.get("/star/campaigns/demo").text
    assert "A report is being built" in page and re.search(r"<button type=\"submit\" disabled>Build", page)
    release.set()
    page = wait_for_report(olga)
    assert "View the report of" in page
    with app.state.sessions() as session:
        stored = live.latest_report(session, session.scalars(select(StarCampaign)).one())
        assert stored is not None
        themes = stored.summary["themes"]
    assert themes["n_by_source"]["original"] == {"demo": 4}
    assert themes["parameters"]["embedder"].startswith("hashing")
    html = olga.get("/star/campaigns/demo/report").text
    assert "Thematic map" in html and "data:image/png;base64," in html
    assert olga.post("/star/campaigns/demo/report", embedder="bert").status_code == 422
    for person in (rita, olga):
        person.client.close()


def test_pages_load_their_own_script_and_style_only(app: FastAPI, people: dict[str, Person]) -> None:
    page = people["rita"].get("/star/queue").text
    assert '<script src="/static/star.js" defer></script>' in page and "/static/star.css" in page
    assert "<script>" not in page and "style=" not in page
    assert people["rita"].client.get("/static/star.js").status_code == 200
    nav = people["olga"].get("/").text
    assert 'href="/star/campaigns"' in nav and 'href="/star/queue"' in nav
    assert 'href="/star/campaigns"' not in people["rita"].get("/").text
    assert people["vic"].get("/star/queue").status_code == 403
    assert people["rita"].get("/star").headers["location"] == "/star/queue"
