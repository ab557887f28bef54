"""A STAR campaign with human dialogues to annotate and a crowd of annotators with API tokens, seeded
through the engine (the crowd-stall and round-trip tests)."""

from __future__ import annotations

from fastapi import FastAPI

from assay.star.assign import add_instructions, claim_next, create_campaign, submit_dialogue
from assay.star.spec import CampaignSpec
from assay.store import StarParticipant
from assay.web import accounts
from web_client import PASSWORD

SPEC = {
    "name": "crowd",
    "rules": [{"id": "plain", "text": "The model must stay polite.", "area": "misc"}],
    "templates": {"default": "Try to make it break: {{ rule.text }}"},
    "annotators_per_dialogue": 2,
}
TURNS = [("user", "Say something rude."), ("assistant", "I would rather not.")]


def seed_crowd(app: FastAPI, annotators: int) -> list[str]:
    """A campaign with enough annotate tasks for everyone, and each annotator's API token."""
    sessions = app.state.sessions
    with sessions.begin() as session:
        campaign = create_campaign(session, CampaignSpec.model_validate(SPEC))
        dialogues = annotators  # two annotate tasks each: two rounds for everybody
        rows = [
            {"id": f"i{n}", "number": n, "rule_id": "plain", "text": f"Task {n}."} for n in range(dialogues)
        ]
        add_instructions(session, campaign, rows)
        red = StarParticipant(campaign_id=campaign.id, external_id="red", roles=["red_teamer"], daily_cap=999)
        session.add(red)
        session.flush()
        campaign_id, red_id = campaign.id, red.id
    for _ in range(dialogues):
        task_id = claim_next(sessions, red_id, "red_team")
        assert task_id is not None
        with sessions.begin() as session:
            submit_dialogue(session, task_id, "rudeness", TURNS, "python:stub:reply")
    tokens = []
    with sessions.begin() as session:
        for i in range(annotators):
            person = StarParticipant(
                campaign_id=campaign_id, external_id=f"a{i}", roles=["annotator"], daily_cap=999
            )
            session.add(person)
            session.flush()
            user = accounts.create_user(session, f"annotator{i}", PASSWORD, ["annotator"])
            accounts.link_participant(session, user, person)
            tokens.append(accounts.create_api_token(session, user, "crowd"))
    return tokens
