"""STAR's live workflow (``assay.star.workflow``) and its one read model (``assay.star.status``), without a
web server, on a frozen clock: who may open and claim what, claims past their time hidden at once and
released by the sweep (a chat with a recent turn kept), shortfalls re-checked by the sweep and reported by
the read model, and ``assay star sweep`` / ``status`` from the command line."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker
from typer.testing import CliRunner

from assay.cli import app as cli
from assay.errors import UserError
from assay.star import live, status, workflow
from assay.star.assign import add_instructions, create_campaign
from assay.star.spec import CampaignSpec
from assay.store import StarParticipant, StarTask, open_store
from assay.store.star_models import StarCampaign

NOW = datetime(2026, 11, 22, 10, 0, tzinfo=UTC)
TIMEOUT = timedelta(minutes=live.CampaignSettings().claim_timeout_minutes)
SPEC = {
    "name": "wf",
    "rules": [
        {"id": "plain", "text": "be nice", "area": "misc"},
        {"id": "med", "text": "no bad advice", "area": "medical", "expertise": ["medical"]},
    ],
    "templates": {"default": "Break {{ rule.text }}"},
    "annotators_per_dialogue": 2,
    "arbitration_gap": 2,
}


@pytest.fixture
def sessions(tmp_path: Path) -> sessionmaker[Session]:
    """A campaign with three red-team tasks (one needs nobody special), a red teamer and an annotator."""
    factory = open_store(f"sqlite:///{tmp_path / 'wf.db'}")
    with factory.begin() as session:
        campaign = create_campaign(session, CampaignSpec.model_validate(SPEC))
        add_instructions(
            session,
            campaign,
            [{"id": f"i{n}", "number": n, "rule_id": "plain", "text": f"instruction {n}"} for n in (1, 2, 3)],
        )
        for name, roles in (("rita", ["red_teamer"]), ("anna", ["annotator"])):
            session.add(StarParticipant(campaign_id=campaign.id, external_id=name, roles=roles, daily_cap=50))
    return factory


def worker(participant_id: int, *roles: str) -> workflow.Worker:
    return workflow.Worker(frozenset({participant_id}), frozenset(roles))


RITA = worker(1, "red_teamer")


def test_claims_are_the_holders_and_expire_on_a_frozen_clock(sessions: sessionmaker[Session]) -> None:
    first = workflow.claim(sessions, RITA, 1, "red_team", NOW)
    assert first == workflow.Claim(1, True)
    assert workflow.claim(sessions, RITA, None, "red_team", NOW) == workflow.Claim(1, False)  # one at a time
    with pytest.raises(workflow.NotAllowed):
        workflow.claim(sessions, RITA, 1, "annotate", NOW)  # not her role
    with pytest.raises(workflow.NotYours):
        workflow.claim(sessions, RITA, 2, "red_team", NOW)  # not her pool entry
    with sessions() as session:
        assert workflow.open_task(session, RITA, 1, NOW).id == 1
        with pytest.raises(workflow.NotYours):
            workflow.open_task(session, worker(2, "red_teamer"), 1, NOW)  # someone else's
        with pytest.raises(workflow.NotYours):
            workflow.open_task(session, worker(1, "annotator"), 1, NOW)  # the account lacks the role
        late = NOW + TIMEOUT + timedelta(seconds=1)
        with pytest.raises(workflow.NotYours):
            workflow.open_task(session, RITA, 1, late)  # past its time: hidden before any sweep
        assert [s.tasks for s in workflow.queue(session, RITA, late)] == [[]]
        assert session.get_one(StarTask, 1).status == "claimed"  # ... and nothing written

    assert workflow.sweep(sessions, NOW + TIMEOUT - timedelta(seconds=1)).released == 0
    assert workflow.sweep(sessions, NOW + TIMEOUT + timedelta(seconds=1)).released == 1
    with sessions() as session:
        task = session.get_one(StarTask, 1)
        assert (task.status, task.participant_id) == ("open", None)


def test_a_chat_in_use_keeps_its_claim_and_a_claim_releases_expired_ones_first(
    sessions: sessionmaker[Session],
) -> None:
    workflow.claim(sessions, RITA, 1, "red_team", NOW)
    chat_at = NOW + TIMEOUT - timedelta(minutes=1)
    with sessions.begin() as session:
        workflow.commit_topic(session, RITA, 1, "manners", chat_at)
        ask = workflow.add_message(session, RITA, 1, "hello", chat_at)
    assert (ask.task_id, ask.index) == (1, 1) and ask.conversation[-1]["content"].endswith("hello")
    assert workflow.sweep(sessions, NOW + TIMEOUT + timedelta(minutes=1)).released == 0  # typing
    with sessions() as session:
        assert workflow.task_view(session, workflow.open_task(session, RITA, 1, NOW + TIMEOUT)).awaiting
    later = chat_at + TIMEOUT + timedelta(minutes=1)
    assert workflow.claim(sessions, RITA, 1, "red_team", later) == workflow.Claim(
        1, True
    )  # released, reclaimed
    with sessions() as session:
        view = workflow.task_view(session, workflow.open_task(session, RITA, 1, later))
        assert view.draft is None and view.turns == []  # the earlier draft went with the release


def test_finishing_and_rating_go_through_the_engine(sessions: sessionmaker[Session]) -> None:
    workflow.claim(sessions, RITA, 1, "red_team", NOW)
    with sessions.begin() as session:
        workflow.commit_topic(session, RITA, 1, "manners", NOW)
        ask = workflow.add_message(session, RITA, 1, "hello", NOW)
        with pytest.raises(UserError, match="wait for the reply"):
            workflow.finish(session, RITA, 1, {}, NOW)
    assert workflow.save_reply(sessions, ask.draft_id, ask.index, "hi there", "m")
    with sessions.begin() as session:
        assert workflow.pending_reply(session, RITA, 1, NOW) is None
        workflow.finish(session, RITA, 1, {"assigned_rule_broken": False}, NOW)
    anna = worker(2, "annotator")
    claimed = workflow.claim(sessions, anna, 2, "annotate", NOW)
    assert claimed.new and claimed.task_id is not None
    with sessions.begin() as session:
        with pytest.raises(workflow.NotYours):
            workflow.submit_rating(session, RITA, 1, 0, "red-team tasks take no rating", NOW)
        workflow.submit_rating(session, anna, claimed.task_id, 3, "fine", NOW)
        view = workflow.task_view(session, workflow.open_task(session, anna, claimed.task_id, NOW))
        assert (
            view.mine is not None and view.topic == "manners" and view.turns[-1] == ("assistant", "hi there")
        )


def test_shortfalls_are_marked_by_the_sweep_and_read_by_the_status(sessions: sessionmaker[Session]) -> None:
    with sessions.begin() as session:
        campaign = session.scalars(select(StarCampaign)).one()
        add_instructions(session, campaign, [{"id": "m1", "number": 9, "rule_id": "med", "text": "med"}])
        session.query(StarParticipant).filter_by(external_id="rita").delete()  # nobody may red-team now
    with sessions() as session:
        campaign = session.scalars(select(StarCampaign)).one()
        assert status.campaign_status(session, campaign, n_boot=0).shortfalls == []  # not checked yet
    assert workflow.sweep(sessions, NOW).waiting == 4
    with sessions() as session:
        report = status.campaign_status(session, campaign, n_boot=0)
        assert [(s.kind, s.requirement, s.tasks) for s in report.shortfalls] == [("red_team", "anyone", 4)]
        assert report.tasks == {"red_team": {"waiting": 4}}
        assert session.scalar(select(func.count()).where(StarTask.status == "waiting")) == 4
        summary = status.campaign_summaries(session)[0]
        assert (summary.name, summary.shortfall_tasks, summary.dialogues) == ("wf", 4, 0)


def test_sweep_and_status_from_the_command_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    factory = open_store(url)
    with factory.begin() as session:
        campaign = create_campaign(session, CampaignSpec.model_validate(SPEC))
        add_instructions(session, campaign, [{"id": "i1", "number": 1, "rule_id": "plain", "text": "x"}])
    monkeypatch.setenv("ASSAY_DB_URL", url)
    runner = CliRunner()
    swept = runner.invoke(cli, ["star", "sweep"])
    assert swept.exit_code == 0 and "0 claim(s) released, 1 task(s) waiting" in swept.output
    shown = runner.invoke(cli, ["star", "status", "wf", "--json", "--bootstrap", "0"])
    report = json.loads(shown.output)
    assert report["tasks"] == {"red_team": {"waiting": 1}} and report["shortfalls"][0]["tasks"] == 1
