"""Target groups the seed's way (``race x gender[female, male]``): the paper's Appendix D as a spec gives its
15 groups, and the design, the matching and a rehearsal with mixed expertise follow the chosen set."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pandas as pd
import pytest
import yaml
from sqlalchemy import select

from assay.errors import UserError
from assay.models import load_model
from assay.star.analysis.groups import dialogue_outcomes
from assay.star.assign import add_instructions, create_campaign, get_campaign
from assay.star.design import design_table, draw_design
from assay.star.exchange import campaign_tables
from assay.star.simulate import Agents, PoolOptions, simulate
from assay.star.spec import Demographics, group_label, load_spec
from assay.store import open_store
from assay.store.star_models import StarParticipant, StarTask

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
APPENDIX_D = EXAMPLES / "star-appendix-d.yaml"
RACES, GENDERS = ["Asian", "Black", "Hispanic", "White"], ["female", "male", "non-binary"]
ATTRIBUTES = {"race": RACES, "gender": GENDERS}


def test_appendix_d_gives_the_papers_15_groups() -> None:
    groups = load_spec(APPENDIX_D).demographics.groups()
    assert len(groups) == 15
    crossed = [g for g in groups if len(g) == 2]
    assert sorted((g["race"], g["gender"]) for g in crossed) == [
        (r, x) for r in RACES for x in ("female", "male")
    ]
    assert {"gender": "non-binary"} in groups and [{"race": r} for r in RACES] == [
        g for g in groups if "race" in g
    ][:4]
    assert len(load_spec(EXAMPLES / "star-campaign.yaml").demographics.groups()) == 19  # every value crossed


def test_written_and_numeric_intersections_agree_and_old_specs_keep_their_order() -> None:
    """``[1, 2]`` (every spec before) gives the same groups in the same order as writing them out, so a
    seeded design of an old spec is unchanged; a value subset on either side works."""
    numeric = Demographics(attributes=ATTRIBUTES).groups()
    written = Demographics(attributes=ATTRIBUTES, intersections=["race", "gender", "race x gender"]).groups()
    assert numeric == written and len(numeric) == 19
    assert numeric[:3] == [{"gender": g} for g in GENDERS]  # one-way first, attributes by name
    subset = Demographics(attributes=ATTRIBUTES, intersections=["race[Black, Asian] x gender[male]"])
    assert subset.groups() == [{"gender": "male", "race": "Asian"}, {"gender": "male", "race": "Black"}]
    assert subset.pairs() == {("race", "gender"): (["Asian", "Black"], ["male"])}


@pytest.mark.parametrize(
    ("written", "message"),
    [
        ("race x religion", "no attribute 'religion' (attributes: gender, race)"),
        ("race x gender[female, man]", "'man' is not a value of 'gender'"),
        ("race x race", "attribute 'race' appears twice"),
        ("gender[female, female]", "values must be distinct"),
        ("race[Asian", "'race[Asian' is not 'attribute' or 'attribute[v1, v2]'"),
    ],
)
def test_a_wrong_intersection_is_one_line_naming_file_field_and_value(
    tmp_path: Path, written: str, message: str
) -> None:
    raw = yaml.safe_load(APPENDIX_D.read_text())
    raw["demographics"]["intersections"] = ["race", written]
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(UserError) as caught:
        load_spec(path)
    text = str(caught.value)
    assert "\n" not in text and str(path) in text and "demographics" in text and message in text


def test_design_and_matching_follow_the_chosen_set(tmp_path: Path) -> None:
    """Every instruction targets one of the 15 groups, evenly within a rule; the planned race x gender table
    has the 8 crossed cells; an instruction for a group outside the set is refused when assigned."""
    spec = load_spec(APPENDIX_D)
    instructions = draw_design(spec, 150, seed=1)
    labels = {group_label(g) for g in spec.demographics.groups()}
    per_rule = Counter((i.rule_id, i.group_label) for i in instructions if i.group)
    assert {label for _, label in per_rule} == labels
    for rule in ("hate", "stereotypes"):
        counts = [per_rule[(rule, label)] for label in labels]
        assert max(counts) - min(counts) <= 1
    cells = design_table(spec, instructions).attribute_pairs["hate"]["race x gender"]
    assert len(cells) == 8 and not any("non-binary" in cell for cell in cells)
    sessions = open_store(f"sqlite:///{tmp_path / 'star.db'}")
    outside = instructions[0].model_copy(
        update={"rule_id": "hate", "group": {"race": "Asian", "gender": "non-binary"}}
    )
    with sessions.begin() as session:
        campaign = create_campaign(session, spec, seed=1)
        with pytest.raises(UserError, match="'gender=non-binary & race=Asian' is not a target group"):
            add_instructions(session, campaign, [outside])


SCRIPTED = """
import hashlib

def respond(prompts):
    out = []
    for p in prompts:
        h = int(hashlib.sha256(p.encode()).hexdigest(), 16)
        if "Scale:" in p:
            out.append(f"Rating: {1 + h % 4}\\nReason: scripted verdict {h % 97}")
        elif "Name the topic" in p:
            out.append(f"topic number {h % 13}")
        elif "red teamer" in p:
            out.append("Tell me something mean about people like that.")
        else:
            out.append("I will not help with that.")
    return out
"""


@pytest.mark.slow  # two 16-dialogue rehearsals, about 20 s on a busy 2-core machine
def test_a_rehearsal_on_appendix_d_exercises_expert_matching_and_every_pre_annotation(tmp_path: Path) -> None:
    """Mixed expertise: the expert rules' annotations all go to experts, who are a minority of the pool;
    with one expert per tag the second annotation of each expert dialogue is a reported shortfall. Every
    pre-annotation field is filled, and the planted other-rules answers make "any rule" differ."""
    module = tmp_path / "agent.py"
    module.write_text(SCRIPTED)
    model = load_model(f"python:{module}:respond")
    spec = load_spec(APPENDIX_D)
    sessions = open_store(f"sqlite:///{tmp_path / 'star.db'}")
    summary = simulate(sessions, spec, Agents(model, model, model), count=16, seed=4, turns=1)
    assert summary.experts == {"fact-checking": 12, "medical": 12}  # a quarter of 48 personas each
    assert summary.expert_annotations == summary.expert_annotations_by_experts > 0
    assert summary.shortfalls == []
    with sessions() as session:
        campaign = get_campaign(session, summary.campaign)
        people = {p.id: p for p in session.scalars(select(StarParticipant))}
        done = session.scalars(select(StarTask).where(StarTask.kind == "annotate", StarTask.status == "done"))
        by_rule = Counter((t.rule_id, bool(people[t.participant_id].expertise)) for t in done)
        frames = {
            k: pd.DataFrame(v) for k, v in campaign_tables(session, campaign, machine="include").items()
        }
    assert by_rule[("medical", False)] == by_rule[("misinformation", False)] == 0
    assert by_rule[("hate", False)] > 0  # non-experts rate the rules that need no expertise
    pre = frames["dialogues"]["pre_annotation"]
    assert all(p["assigned_rule_broken"] is not None for p in pre)
    assert sum(p["assigned_rule_broken"] for p in pre) not in (0, 16)
    assert 0 < sum(bool(p["other_rules_broken"]) for p in pre) < 16
    assert sum(summary.pre_annotations[k] for k in ("broken", "not_broken")) == 16
    targeted = dialogue_outcomes(frames["dialogues"], frames["annotations"], spec, "targeted")
    any_rule = dialogue_outcomes(frames["dialogues"], frames["annotations"], spec, "any")
    assert any_rule["broken"].sum() > targeted["broken"].sum()

    thin = simulate(
        sessions,
        spec,
        Agents(model, model, model),
        16,
        seed=4,
        turns=1,
        campaign_name="thin",
        pool=PoolOptions(expert_share=0.03, other_rules_rate=0.0),
    )
    assert thin.experts == {"fact-checking": 1, "medical": 1}
    assert thin.expert_annotations == thin.expert_annotations_by_experts
    planned = Counter(i.rule_id for i in draw_design(spec, 16, 4))
    waiting = {
        line.split("expertise: ")[1].split(":")[0]: int(line.rsplit(": ", 1)[1]) for line in thin.shortfalls
    }
    assert all(line.startswith("annotate (no group) anyone; expertise: ") for line in thin.shortfalls)
    for tag, rule in (("medical", "medical"), ("fact-checking", "misinformation")):
        # each expert dialogue wants two annotators; the lone expert gives at most one
        assert planned[rule] <= waiting[tag] <= 2 * planned[rule]
    assert thin.expert_annotations + sum(waiting.values()) == 2 * (
        planned["medical"] + planned["misinformation"]
    )
    assert thin.pre_annotations.get("other_rules", 0) == 0


def test_pool_options_are_shares() -> None:
    with pytest.raises(UserError, match="expert-share must be a share from 0 to 1"):
        PoolOptions(expert_share=1.5)
    with pytest.raises(UserError, match="other-rules-rate must be a share from 0 to 1"):
        PoolOptions(other_rules_rate=-0.1)
