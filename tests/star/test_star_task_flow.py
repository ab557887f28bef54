"""The task flow of issue 39 in the pillar (``assay.star.workflow``), without a web server, on a frozen clock:
giving a task back (the permission check, the task open for anyone at once, not counted against the person,
the audit trail), skipping to another task (never the same dialogue again at once), a person's claims passing
over what they gave back while other work exists, and the progress line (done today, the daily cap, the
tasks a claim could hand them now)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from assay.errors import UserError
from assay.star import live, workflow
from assay.star.assign import add_instructions, create_campaign
from assay.star.spec import CampaignSpec
from assay.store import StarParticipant, StarTask, open_store
from assay.store.star_web_models import StarDraft
from assay.store.web_models import WebAuditEvent
from assay.web import audit

NOW = datetime(2026, 11, 22, 10, 0, tzinfo=UTC)
TIMEOUT = timedelta(minutes=live.CampaignSettings().claim_timeout_minutes)
SPEC = {
    "name": "flow",
    "rules": [{"id": "plain", "text": "be nice", "area": "misc"}],
    "templates": {"default": "Break {{ rule.text }}"},
    "annotators_per_dialogue": 2,
    "arbitration_gap": 2,
}
# pool id: (external id, roles, daily cap)
POOL = {1: ("rita", ["red_teamer"], 2), 2: ("rob", ["red_teamer"], 20), 3: ("anna", ["annotator"], 20)}


@pytest.fixture
def sessions(tmp_path: Path) -> sessionmaker[Session]:
    """Three red-team tasks; red teamers rita (daily cap 2) and rob, annotator anna."""
    factory = open_store(f"sqlite:///{tmp_path / 'flow.db'}")
    with factory.begin() as session:
        campaign = create_campaign(session, CampaignSpec.model_validate(SPEC))
        add_instructions(
            session,
            campaign,
            [{"id": f"i{n}", "number": n, "rule_id": "plain", "text": f"instruction {n}"} for n in (1, 2, 3)],
        )
        for pid, (name, roles, cap) in POOL.items():
            session.add(
                StarParticipant(id=pid, campaign_id=campaign.id, external_id=name, roles=roles, daily_cap=cap)
            )
    return factory


def worker(participant_id: int, *roles: str, user_id: int | None = None) -> workflow.Worker:
    return workflow.Worker(frozenset({participant_id}), frozenset(roles), user_id)


RITA, ROB, ANNA = worker(1, "red_teamer"), worker(2, "red_teamer"), worker(3, "annotator")


def progress(sessions: sessionmaker[Session], who: workflow.Worker, at: datetime = NOW) -> workflow.Progress:
    with sessions() as session:
        person = workflow.person_of(session, who, None)
        return workflow.progress(session, who, person, at)


def test_a_given_back_task_is_open_for_someone_else_at_once_and_audited(
    sessions: sessionmaker[Session],
) -> None:
    assert workflow.claim(sessions, RITA, 1, "red_team", NOW) == workflow.Claim(1, True)
    with sessions.begin() as session:
        workflow.commit_topic(session, RITA, 1, "manners", NOW)  # a draft the next holder must not see
        with pytest.raises(workflow.NotYours):
            workflow.give_back(session, ROB, 1, NOW)  # not his task
        with pytest.raises(workflow.NotYours):
            workflow.give_back(session, worker(1, "annotator"), 1, NOW)  # the account lacks the role
        given = workflow.give_back(session, RITA, 1, NOW)
        assert (given.task_id, given.kind) == (1, "red_team")
    with sessions() as session:
        task = session.get_one(StarTask, 1)
        assert (task.status, task.participant_id, task.claimed_at) == ("open", None, None)
        assert session.scalars(select(StarDraft)).all() == []
        event = session.scalars(select(WebAuditEvent)).one()
        assert (event.action, event.target, event.actor_id) == (workflow.GIVE_BACK, "star task 1", None)
        assert "rita" in event.detail and "red-team" in event.detail and "flow" in event.detail
        assert workflow.GIVE_BACK in audit.ACTIONS  # the audit page can say what it means
    assert workflow.claim(sessions, ROB, 2, "red_team", NOW) == workflow.Claim(1, True)  # at once, no sweep


def test_giving_back_is_for_the_holder_of_a_claim_in_time(sessions: sessionmaker[Session]) -> None:
    workflow.claim(sessions, RITA, 1, "red_team", NOW)
    with sessions.begin() as session:
        with pytest.raises(workflow.NotYours):
            workflow.give_back(session, RITA, 1, NOW + TIMEOUT + timedelta(seconds=1))  # past its time
        with pytest.raises(workflow.NotYours):
            workflow.give_back(session, RITA, 2, NOW)  # open, nobody's
        session.execute(update(StarTask).where(StarTask.id == 1).values(status="done", done_at=NOW))
        with pytest.raises(UserError, match="finished"):
            workflow.give_back(session, RITA, 1, NOW)  # done work stays done
        assert session.scalars(select(WebAuditEvent)).all() == []


def test_giving_back_costs_nothing_against_the_cap_or_the_done_count(sessions: sessionmaker[Session]) -> None:
    """Rita's cap is 2 claims a day: she gives back three tasks in a row and still claims a fourth time."""
    assert progress(sessions, RITA) == workflow.Progress(
        done_today=0, claimed_today=0, daily_cap=2, left={"red_team": 3}
    )
    for _ in range(3):
        claimed = workflow.claim(sessions, RITA, 1, "red_team", NOW)
        assert claimed.task_id is not None and claimed.new
        assert progress(sessions, RITA) == workflow.Progress(0, 1, 2, {"red_team": 2})  # besides hers
        with sessions.begin() as session:
            workflow.give_back(session, RITA, claimed.task_id, NOW)
        assert progress(sessions, RITA) == workflow.Progress(0, 0, 2, {"red_team": 3})
    assert workflow.claim(sessions, RITA, 1, "red_team", NOW).task_id is not None


def test_skip_gives_back_and_moves_to_another_dialogue(sessions: sessionmaker[Session]) -> None:
    skipped = workflow.claim(sessions, RITA, 1, "red_team", NOW).task_id
    moved = workflow.skip(sessions, RITA, skipped, NOW)  # type: ignore[arg-type]
    assert (moved.task_id, moved.kind) == (skipped, "red_team") and moved.next_task_id not in {None, skipped}
    assert progress(sessions, RITA) == workflow.Progress(0, 1, 2, {"red_team": 2})

    held = moved.next_task_id
    assert held is not None
    with sessions.begin() as session:  # rita finishes it: one dialogue, two annotation tasks
        workflow.commit_topic(session, RITA, held, "manners", NOW)
        ask = workflow.add_message(session, RITA, held, "hello", NOW)
    assert workflow.save_reply(sessions, ask.draft_id, ask.index, "hi", "m")
    with sessions.begin() as session:
        workflow.finish(session, RITA, held, {"assigned_rule_broken": False}, NOW)
    first = workflow.claim(sessions, ANNA, 3, "annotate", NOW).task_id
    assert progress(sessions, ANNA).left == {"annotate": 0}  # the other one is the same dialogue's
    alone = workflow.skip(sessions, ANNA, first, NOW)  # type: ignore[arg-type]
    assert (
        alone.next_task_id is None
    )  # the dialogue's other annotation task is the same dialogue: not offered
    assert progress(sessions, ANNA) == workflow.Progress(0, 0, 20, {"annotate": 2})
    assert workflow.claim(sessions, ANNA, 3, "annotate", NOW).task_id == first  # back in her queue later


def test_the_progress_line_counts_done_today_claims_and_what_is_left(sessions: sessionmaker[Session]) -> None:
    yesterday = NOW - timedelta(days=1)
    with sessions.begin() as session:
        session.execute(
            update(StarTask)
            .where(StarTask.id == 3)
            .values(status="done", participant_id=1, claimed_at=yesterday, done_at=yesterday)
        )
    assert progress(sessions, RITA) == workflow.Progress(
        0, 0, 2, {"red_team": 2}
    )  # yesterday's is not today's
    workflow.claim(sessions, RITA, 1, "red_team", NOW)
    assert progress(sessions, RITA) == workflow.Progress(0, 1, 2, {"red_team": 1})
    with sessions.begin() as session:
        session.execute(update(StarTask).where(StarTask.id == 1).values(status="done", done_at=NOW))
    assert progress(sessions, RITA) == workflow.Progress(1, 1, 2, {"red_team": 1})
    assert progress(sessions, RITA, NOW + timedelta(days=1)) == workflow.Progress(0, 0, 2, {"red_team": 1})
    with sessions() as session:
        sections = workflow.queue(session, RITA, NOW)
        assert sections[0].progress == workflow.Progress(1, 1, 2, {"red_team": 1})


def _finish(sessions: sessionmaker[Session], who: workflow.Worker, task_id: int) -> None:
    """The red teamer's whole task: topic, one exchange, the pre-annotation."""
    with sessions.begin() as session:
        workflow.commit_topic(session, who, task_id, "manners", NOW)
        ask = workflow.add_message(session, who, task_id, "hello", NOW)
    assert workflow.save_reply(sessions, ask.draft_id, ask.index, "hi", "m")
    with sessions.begin() as session:
        workflow.finish(session, who, task_id, {"assigned_rule_broken": False}, NOW)


def test_a_task_given_back_is_not_handed_straight_back_while_other_work_exists(
    sessions: sessionmaker[Session],
) -> None:
    """Label Studio and Potato pass over what a person skipped: rita gives task 1 back and her next claim is
    task 2 (before: task 1 again, the oldest); rob, who gave nothing back, gets task 1 at once; once only
    what rita gave back is left, she is offered it after all."""
    assert workflow.claim(sessions, RITA, 1, "red_team", NOW).task_id == 1
    with sessions.begin() as session:
        workflow.give_back(session, RITA, 1, NOW)
    assert workflow.claim(sessions, RITA, 1, "red_team", NOW) == workflow.Claim(2, True)
    assert workflow.claim(sessions, ROB, 2, "red_team", NOW) == workflow.Claim(1, True)
    skipped = workflow.skip(sessions, RITA, 2, NOW)
    assert skipped.next_task_id == 3
    with sessions.begin() as session:
        workflow.give_back(session, RITA, 3, NOW)
    assert workflow.claim(sessions, RITA, 1, "red_team", NOW) == workflow.Claim(2, True)  # all she has left
    with sessions() as session:
        person = session.get_one(StarParticipant, 1)
        assert workflow.given_back(session, person) == {1, 2, 3}
        assert workflow.given_back(session, session.get_one(StarParticipant, 2)) == set()


def test_an_annotator_who_gives_back_a_rating_gets_another_dialogue_next(
    sessions: sessionmaker[Session],
) -> None:
    """Two dialogues, two annotation tasks each: anna gives back one of the first dialogue's, and her next
    claims are the second dialogue's (neither the task she gave back nor its sibling); then the first's."""
    for who, pid in ((RITA, 1), (ROB, 2)):
        task = workflow.claim(sessions, who, pid, "red_team", NOW).task_id
        assert task is not None
        _finish(sessions, who, task)
    with sessions() as session:
        by_dialogue: dict[int, list[int]] = {}
        for task in session.scalars(
            select(StarTask).where(StarTask.kind == "annotate").order_by(StarTask.id)
        ):
            by_dialogue.setdefault(task.dialogue_id, []).append(task.id)  # type: ignore[arg-type]
    first, second = by_dialogue.values()
    assert workflow.claim(sessions, ANNA, 3, "annotate", NOW).task_id == first[0]
    with sessions.begin() as session:
        workflow.give_back(session, ANNA, first[0], NOW)
    assert workflow.claim(sessions, ANNA, 3, "annotate", NOW).task_id == second[0]
    with sessions.begin() as session:
        workflow.submit_rating(session, ANNA, second[0], 1, "fine", NOW)
    assert workflow.claim(sessions, ANNA, 3, "annotate", NOW).task_id == first[0]  # nothing else left


def test_the_progress_line_counts_what_a_claim_would_give(sessions: sessionmaker[Session]) -> None:
    """Issue 47: "1 annotation task" left and a Claim button, then "No annotation task is open for you": the
    task left was the second rating of a dialogue she had rated. The line counts by the claim's own rule,
    so it says 0 exactly when the claim gives nothing; a claim past its time counts as open, as the claim
    releases it first, and the daily cap reached counts nothing."""
    task = workflow.claim(sessions, RITA, 1, "red_team", NOW).task_id
    assert task is not None
    _finish(sessions, RITA, task)
    first = workflow.claim(sessions, ANNA, 3, "annotate", NOW).task_id
    with sessions.begin() as session:
        workflow.submit_rating(session, ANNA, first, 1, "fine", NOW)  # type: ignore[arg-type]
    assert progress(sessions, ANNA).left == {"annotate": 0}
    assert workflow.claim(sessions, ANNA, 3, "annotate", NOW).task_id is None

    assert progress(sessions, ROB).left == {"red_team": 2}
    workflow.claim(sessions, ROB, 2, "red_team", NOW)
    assert progress(sessions, RITA).left == {"red_team": 1}  # rob holds one: not hers to take
    late = NOW + TIMEOUT + timedelta(minutes=1)
    assert progress(sessions, RITA, late).left == {"red_team": 2}  # his claim is past its time
    assert workflow.claim(sessions, RITA, 1, "red_team", late).task_id is not None
    assert progress(sessions, RITA, late) == workflow.Progress(1, 2, 2, {"red_team": 0})  # cap reached
    with sessions.begin() as session:
        held = workflow.my_tasks(session, RITA, late)[0]
        workflow.give_back(session, RITA, held.id, late)
    assert workflow.claim(sessions, RITA, 1, "red_team", late).task_id is not None  # the cap counts claims
