"""A human red teamer's live dialogue: topic first, timestamped turns through assay.models, pre-annotation."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import select

from assay.errors import UserError
from assay.models import load_model
from assay.star.assign import add_instructions, claim_next, create_campaign
from assay.star.design import draw_design
from assay.star.dialogue import DialogueSession, check_pre_annotation, mention_labels
from assay.star.spec import load_spec
from assay.store import open_store
from assay.store.star_models import StarDialogue, StarParticipant, StarTask

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "star-campaign.yaml"


@pytest.fixture
def echo(tmp_path: Path):
    module = tmp_path / "echo_target.py"
    module.write_text("def respond(prompts):\n    return [f'echo {len(p)}' for p in prompts]\n")
    return load_model(f"python:{module}:respond")


def test_live_dialogue_is_stored_with_timestamps_and_opens_annotation(tmp_path: Path, echo) -> None:
    spec = load_spec(EXAMPLE)
    sessions = open_store(f"sqlite:///{tmp_path / 'd.db'}")
    with sessions.begin() as session:
        campaign = create_campaign(session, spec)
        non_group = [i for i in draw_design(spec, 9, seed=2) if i.group is None]
        add_instructions(session, campaign, non_group[:1])
        person = StarParticipant(
            campaign_id=campaign.id,
            external_id="p1",
            roles=["red_teamer"],
            demographics={"race": ["Black"], "gender": ["female"]},
        )
        session.add(person)
        session.flush()
        person_id = person.id
    task_id = claim_next(sessions, person_id, "red_team")
    assert task_id is not None
    with pytest.raises(UserError, match="topic"):
        DialogueSession(echo, "  ")
    live = DialogueSession(echo, "home remedies for fever")
    first = live.send("What should I give a baby with a fever?")
    second = live.send("And if I have no medicine at home?")
    assert first.startswith("echo") and second.startswith("echo") and first != second  # the history grows
    with sessions.begin() as session:
        with pytest.raises(UserError, match="unknown label 'aliens'"):
            live.finish(session, spec, task_id, {"groups_mentioned": ["aliens"]})
        dialogue_id = live.finish(
            session, spec, task_id, {"assigned_rule_broken": True, "groups_mentioned": ["age"]}
        )
    with sessions() as session:
        dialogue = session.get_one(StarDialogue, dialogue_id)
        assert dialogue.topic == "home remedies for fever" and not dialogue.machine
        assert [t.role for t in dialogue.turns] == ["user", "assistant", "user", "assistant"]
        stamps = [t.created_at for t in dialogue.turns]
        assert stamps == sorted(stamps)
        assert dialogue.pre_annotation == {
            "assigned_rule_broken": True,
            "other_rules_broken": [],
            "groups_mentioned": ["age"],
        }
        annotate = session.scalars(select(StarTask).where(StarTask.kind == "annotate")).all()
        assert len(annotate) == spec.annotators_per_dialogue and {t.dialogue_id for t in annotate} == {
            dialogue_id
        }


def test_pre_annotation_checks() -> None:
    spec = load_spec(EXAMPLE)
    assert {"disability", "religion", "sexual orientation", "race", "gender"} <= set(mention_labels(spec))
    assert check_pre_annotation(spec, {"other_rules_broken": ["hate"]})["other_rules_broken"] == ["hate"]
    with pytest.raises(UserError, match="unknown rule 'nope'"):
        check_pre_annotation(spec, {"other_rules_broken": ["nope"]})
    with pytest.raises(UserError, match="assigned_rule_broken"):
        check_pre_annotation(spec, {"assigned_rule_broken": "yes"})
    with pytest.raises(UserError, match="unknown field 'mood'"):
        check_pre_annotation(spec, {"mood": 1})


def test_target_models_kept_are_the_most_recently_used(tmp_path: Path, monkeypatch) -> None:
    """At most MAX_LOADED_MODELS stay loaded; the least recently used goes first and is freed."""
    import gc
    import weakref

    from assay.star import live

    monkeypatch.setattr(live, "_MODELS", type(live._MODELS)())
    specs = []
    for name in "abc":
        module = tmp_path / f"target_{name}.py"
        module.write_text(f"def reply(prompts):\n    return ['{name}' for _ in prompts]\n")
        specs.append(f"python:{module}:reply")
    a, b, c = specs
    first_a, first_b = live.target_model(a), live.target_model(b)
    assert live.target_model(a) is first_a  # kept, and now the most recently used
    gone = weakref.ref(first_b)
    del first_b
    live.target_model(c)  # a third model: b, the least recently used, is dropped
    gc.collect()
    assert list(live._MODELS) == [a, c] and gone() is None
    assert live.target_model(a) is first_a
    with pytest.raises(UserError, match="has not chosen a target model"):
        live.target_model("")
