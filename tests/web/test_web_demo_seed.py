"""The demo campaign's seeded dialogues (``assay serve --demo``) are about the rule their task tests: a
dialogue on jokes about a nationality once stood under "no falsehoods" (issue 39)."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import select

from assay.star.assign import campaign_spec
from assay.store import StarCampaign, StarDialogue, StarTask
from assay.web.app import create_app
from assay.web.demo import CAMPAIGN, DEMO_DIALOGUES, seed_demo


def test_every_rule_of_the_demo_has_a_dialogue_written_for_it() -> None:
    assert set(DEMO_DIALOGUES) == {rule["id"] for rule in CAMPAIGN["rules"]}  # type: ignore[index]
    topics = {rule_id: d.topic for rule_id, d in DEMO_DIALOGUES.items()}
    assert "nationality" in topics["no-hate"] and "nationality" not in topics["no-lies"]


def test_the_seeded_dialogues_match_the_rules_of_their_tasks(tmp_path: Path) -> None:
    app = create_app(f"sqlite:///{tmp_path / 'demo.db'}")
    seed_demo(app.state.sessions, tmp_path / "demo")
    with app.state.sessions() as session:
        dialogues = session.scalars(select(StarDialogue)).all()
        assert dialogues
        for dialogue in dialogues:
            rule_id = dialogue.instruction.rule_id
            seeded = DEMO_DIALOGUES[rule_id]
            assert dialogue.topic == seeded.topic, rule_id
            assert [(t.role, t.text) for t in dialogue.turns] == list(seeded.turns)
            task = session.scalars(select(StarTask).where(StarTask.dialogue_id == dialogue.id)).first()
            assert task is not None and task.rule_id == rule_id
            spec = campaign_spec(session.get_one(StarCampaign, dialogue.campaign_id))
            assert spec.rule(rule_id).text in dialogue.instruction.text  # the instruction names that rule
