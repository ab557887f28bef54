"""A rehearsal's hold on its campaign (``assay.star.rehearsal``), on SQLite and PostgreSQL: one holder at a
time, and the sweep releases the personas' claims only when nobody holds the campaign."""

from __future__ import annotations

import pytest

from assay.errors import UserError
from assay.star import rehearsal
from assay.star.assign import add_instructions, create_campaign
from assay.star.simulate import add_personas, claim_all
from assay.star.spec import CampaignSpec
from assay.store import open_store

SPEC = {
    "name": "held",
    "rules": [{"id": "plain", "text": "Do not help with crimes.", "area": "crime"}],
    "templates": {"default": "Try: {{ rule.text }}"},
}


def test_one_holder_at_a_time_and_the_sweep_waits_for_it(db_url: str) -> None:
    sessions = open_store(db_url)
    with sessions.begin() as session:
        campaign = create_campaign(session, CampaignSpec.model_validate(SPEC))
        rows = [{"id": f"i{n}", "number": n, "rule_id": "plain", "text": "x"} for n in (1, 2, 3)]
        add_instructions(session, campaign, rows)
        people = add_personas(session, campaign, CampaignSpec.model_validate(SPEC))
        campaign_id = campaign.id
    assert rehearsal.release_orphaned(sessions, campaign_id) == 0  # nothing claimed: nothing to do

    with rehearsal.hold(sessions, "held"):
        assert len(claim_all(sessions, people, "red_team")) == 3
        refused = pytest.raises(
            UserError, match=r"'held' is being rehearsed by another `assay star simulate`"
        )
        with refused, rehearsal.hold(sessions, "held", wait=0.1):
            pass
        with rehearsal.hold(sessions, "other", wait=0.1):  # another campaign's lock is another lock
            pass
        assert rehearsal.release_orphaned(sessions, campaign_id) == 0  # its holder is alive
    assert rehearsal.release_orphaned(sessions, campaign_id) == 3  # nobody holds it: released at once
    with sessions() as session:
        assert rehearsal.persona_claims(session, campaign_id) == []
    with rehearsal.hold(sessions, "held", wait=0.1):  # the sweep let go of it
        pass
