"""STAR assignment on real SQLite files: matching properties (hypothesis), the exact in/out-group split and
the annotation arms, arbitration, shortfalls, machine data kept apart, and claims/submissions from 4
processes at once."""

from __future__ import annotations

import itertools
import multiprocessing
import random
from collections import Counter, defaultdict
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import func, select

from assay.errors import UserError
from assay.star.assign import (
    ARM_OF_FLAGS,
    add_instructions,
    arbitration_view,
    claim_next,
    create_campaign,
    list_annotations,
    list_dialogues,
    shortfalls,
    submit_annotation,
    submit_dialogue,
)
from assay.star.balance import arm_of
from assay.star.exchange import campaign_tables
from assay.star.participants import membership
from assay.star.spec import PREFER_NOT_TO_SAY, CampaignSpec, group_label
from assay.store import StarAnnotation, StarCampaign, StarInstruction, StarParticipant, StarTask, open_store
from assay.store.star_models import ROLES

NOW = datetime(2026, 11, 22, 10, 0, tzinfo=UTC)
KINDS = ("red_team", "annotate", "arbitrate")
ROLE_FOR_KIND = dict(zip(KINDS, ROLES, strict=True))
ANYONE = {"roles": list(ROLES), "daily_cap": 10_000}


def make_spec(name: str = "t", **settings_: object) -> CampaignSpec:
    raw: dict = {
        "name": name,
        "rules": [
            {"id": "g", "text": "no hate", "area": "hate", "targets_groups": True},
            {"id": "med", "text": "no bad advice", "area": "medical", "expertise": ["medical"]},
            {"id": "plain", "text": "be nice", "area": "misc"},
        ],
        "demographics": {"attributes": {"race": ["A", "B"], "gender": ["f", "m"]}, "intersections": [1, 2]},
        "templates": {"default": "Break {{ rule.text }}"},
        "annotators_per_dialogue": 2,
        "arbitration_gap": 2,
        "in_group_share": 0.5,
    }
    return CampaignSpec.model_validate(raw | settings_)


def instruction(number: int, rule: str, group: dict[str, str] | None = None) -> dict:
    return {
        "number": number,
        "id": f"ins-{number:05d}",
        "rule_id": rule,
        "rule_area": rule,
        "group": group,
        "group_label": group_label(group),
        "parameters": {},
        "template": "default",
        "text": f"instruction {number}",
    }


def add_people(session, campaign: StarCampaign, people: list[dict]) -> list[int]:
    rows = [
        StarParticipant(
            campaign_id=campaign.id,
            external_id=f"p{i}",
            name=f"P{i}",
            demographics=p.get("demographics", {}),
            expertise=p.get("expertise", []),
            roles=p["roles"],
            daily_cap=p.get("daily_cap", 20),
            opted_out=p.get("opted_out", False),
        )
        for i, p in enumerate(people, start=len(session.scalars(select(StarParticipant.id)).all()))
    ]
    session.add_all(rows)
    session.flush()
    return [r.id for r in rows]


def dialogue_turns() -> list[tuple[str, str]]:
    return [("user", "tell me something bad"), ("assistant", "no")]


@pytest.fixture(scope="module")
def shared_store(tmp_path_factory):
    """One SQLite file for the property test; each example is its own campaign."""
    return open_store(f"sqlite:///{tmp_path_factory.mktemp('star') / 'star.db'}")


# --- the matching properties ----------------------------------------------------------------------------

GROUPS = make_spec().demographics.groups()
person_strategy = st.fixed_dictionaries(
    {
        "race": st.sampled_from([[], ["A"], ["B"], ["A", "B"], [PREFER_NOT_TO_SAY]]),
        "gender": st.sampled_from([[], ["f"], ["m"], [PREFER_NOT_TO_SAY]]),
        "roles": st.sets(st.sampled_from(ROLES), min_size=1).map(sorted),
        "expertise": st.sampled_from([[], ["medical"]]),
        "daily_cap": st.integers(1, 6),
        "opted_out": st.sampled_from([False, False, False, True]),
    }
)
instruction_strategy = st.tuples(st.sampled_from(["g", "g", "med", "plain"]), st.integers(0, len(GROUPS) - 1))
_campaigns = itertools.count()


def may_claim(person: StarParticipant, task: StarTask, spec: CampaignSpec, seen, claimed_today) -> bool:
    """The test's own statement of who may take a task, to compare the engine against."""
    if person.opted_out or ROLE_FOR_KIND[task.kind] not in person.roles:
        return False
    if claimed_today[person.id] >= person.daily_cap or person.id in seen[task.dialogue_id]:
        return False
    if (
        task.in_group is not None
        and membership(person.demographics, task.instruction.group_json) is not task.in_group
    ):
        return False
    return task.kind == "red_team" or set(spec.rule(task.rule_id).expertise) <= set(person.expertise)


def simulate(sessions, campaign_id: int, spec: CampaignSpec, seed: int, steps: int) -> None:
    """Random people claim random kinds; every claim (and every refusal) is checked against ``may_claim``."""
    rng = random.Random(seed)
    seen: defaultdict[int | None, set[int]] = defaultdict(set)
    claimed_today: Counter[int] = Counter()
    with sessions() as session:
        people = {
            p.id: p
            for p in session.scalars(
                select(StarParticipant).where(StarParticipant.campaign_id == campaign_id)
            )
        }
    for _ in range(steps):
        person, kind = people[rng.choice(sorted(people))], rng.choice(KINDS)
        with sessions() as session:
            claimable = [
                t
                for t in session.scalars(
                    select(StarTask).where(
                        StarTask.campaign_id == campaign_id, StarTask.kind == kind, StarTask.status == "open"
                    )
                )
                if may_claim(person, t, spec, seen, claimed_today)
            ]
        task_id = claim_next(sessions, person.id, kind, now=NOW)
        assert (task_id is None) == (not claimable), (person.id, kind, task_id, [t.id for t in claimable])
        if task_id is None:
            continue
        assert task_id in {t.id for t in claimable}
        claimed_today[person.id] += 1
        with sessions.begin() as session:
            task = session.get_one(StarTask, task_id)
            if kind == "red_team":
                dialogue_id = submit_dialogue(session, task_id, "topic", dialogue_turns(), "model-x", now=NOW)
            else:
                dialogue_id = task.dialogue_id
        seen[dialogue_id].add(person.id)
        if kind != "red_team":
            submit_annotation(sessions, task_id, rng.randrange(4), "because", now=NOW)


def check_outcome(sessions, campaign_id: int, spec: CampaignSpec) -> None:
    """Balance per group, nobody twice on a dialogue, arbitration exactly where the ratings call for it."""
    with sessions() as session:
        tasks = session.scalars(select(StarTask).where(StarTask.campaign_id == campaign_id)).all()
        ratings = defaultdict(list)
        for annotation in session.scalars(select(StarAnnotation).where(StarAnnotation.kind == "annotate")):
            if not annotation.ablation:
                ratings[annotation.dialogue_id].append(annotation.rating)
    by_group = defaultdict(list)
    for task in tasks:
        if task.kind == "red_team" and task.in_group is not None:
            by_group[task.group_label].append(task.in_group)
    for flags in by_group.values():
        assert abs(sum(flags) - spec.in_group_share * len(flags)) <= 1
    people_on = Counter(
        (t.dialogue_id, t.participant_id) for t in tasks if t.dialogue_id and t.participant_id
    )
    assert not [k for k, n in people_on.items() if n > 1]
    arbitrations = Counter(t.arbitration_of for t in tasks if t.kind == "arbitrate")
    for dialogue_id in {t.dialogue_id for t in tasks if t.kind == "red_team" and t.dialogue_id}:
        done = ratings[dialogue_id]
        expected = len(done) == spec.annotators_per_dialogue and max(done) - min(done) >= spec.arbitration_gap
        assert arbitrations[dialogue_id] == int(expected)


@pytest.mark.slow
@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    people=st.lists(person_strategy, min_size=1, max_size=8),
    instructions=st.lists(instruction_strategy, min_size=1, max_size=10),
    share=st.sampled_from([0.0, 0.3, 0.5, 1.0]),
    seed=st.integers(0, 2**16),
)
def test_every_claim_matches_and_no_eligible_task_is_refused(
    shared_store, people, instructions, share, seed
) -> None:
    arms = {"in_group": 0.25, "out_group": 0.25, "both": 0.5}  # every arm, so every matching rule is hit
    spec = make_spec(f"prop-{next(_campaigns)}", in_group_share=share, annotation_arms=arms)
    with shared_store.begin() as session:
        campaign = create_campaign(session, spec, seed=seed)
        add_people(
            session,
            campaign,
            [p | {"demographics": {k: p[k] for k in ("race", "gender") if p[k]}} for p in people],
        )
        add_instructions(
            session,
            campaign,
            [instruction(i, r, GROUPS[g] if r == "g" else None) for i, (r, g) in enumerate(instructions)],
        )
        campaign_id = campaign.id
    simulate(shared_store, campaign_id, spec, seed, steps=50)
    check_outcome(shared_store, campaign_id, spec)


def test_in_group_balance_holds_across_batches(tmp_path: Path) -> None:
    sessions = open_store(f"sqlite:///{tmp_path / 'star.db'}")
    spec = make_spec(in_group_share=0.3)
    with sessions.begin() as session:
        campaign = create_campaign(session, spec, seed=3)
        for start in range(0, 60, 7):  # uneven batches, and a repeat that must add nothing
            add_instructions(
                session, campaign, [instruction(i, "g", {"race": "A"}) for i in range(start, start + 7)]
            )
        assert add_instructions(session, campaign, [instruction(0, "g", {"race": "A"})]) == 0
        flags = session.scalars(select(StarTask.in_group).where(StarTask.kind == "red_team")).all()
    assert len(flags) == 63 and abs(sum(flags) - 0.3 * 63) <= 1


def red_team_flags(session, campaign_id: int) -> dict[str, list[bool]]:
    flags: dict[str, list[bool]] = defaultdict(list)
    for label, flag in session.execute(
        select(StarTask.group_label, StarTask.in_group).where(
            StarTask.campaign_id == campaign_id, StarTask.kind == "red_team", StarTask.in_group.is_not(None)
        )
    ):
        flags[label].append(flag)
    return flags


def test_red_team_split_is_exact_over_the_campaign_in_one_call_or_in_batches(tmp_path: Path) -> None:
    """The issue's campaigns leaned in-group (76 of 151): now 75 or 76, every group within one, whether the
    design arrives at once or in overlapping batches before anyone starts; a task somebody holds keeps its
    requirement when a later batch is balanced. (Many more sizes: tests/star/test_star_balance.py.)"""
    total = 151
    sessions = open_store(f"sqlite:///{tmp_path / 'star.db'}")
    design = [instruction(i, "g", GROUPS[i % len(GROUPS)]) for i in range(total)]
    in_a = {"demographics": {"race": ["A"], "gender": ["f"]}, **ANYONE}
    with sessions.begin() as session:
        at_once = create_campaign(session, make_spec("at-once"), seed=4)
        add_instructions(session, at_once, design)
        batched = create_campaign(session, make_spec("batched"), seed=4)
        for start in (0, total // 3, total // 2):
            add_instructions(session, batched, design[start : start + total // 3 + 1])
        add_instructions(session, batched, design)
        person = add_people(session, batched, [in_a])[0]
        ids = (at_once.id, batched.id)
    for campaign_id in ids:
        with sessions() as session:
            flags = red_team_flags(session, campaign_id)
        assert sum(map(len, flags.values())) == total
        assert abs(2 * sum(map(sum, flags.values())) - total) <= 1
        assert all(abs(2 * sum(f) - len(f)) <= 2 for f in flags.values())
    held = claim_next(sessions, person, "red_team")
    with sessions.begin() as session:
        before = session.get_one(StarTask, held).in_group
        extra = [instruction(total + i, "g", GROUPS[i % len(GROUPS)]) for i in range(len(GROUPS) + 3)]
        add_instructions(session, session.get_one(StarCampaign, ids[1]), extra)
    with sessions() as session:
        task = session.get_one(StarTask, held)
        assert (task.in_group, task.participant_id, task.status) == (before, person, "claimed")
        flags = red_team_flags(session, ids[1])
    assert abs(2 * sum(map(sum, flags.values())) - (total + len(extra))) <= 2


def test_annotation_arms_open_their_tasks_arbitrate_and_are_exported(tmp_path: Path) -> None:
    """Each group-targeted dialogue gets the next arm of the seeded sequence: in-group only (k in-group
    annotators), out-group only (k out-group), or both (k in-group plus k out-group extras); shares hold
    within one; out-group-only disagreements go to an out-group arbitrator; the export names the arm."""
    sessions = open_store(f"sqlite:///{tmp_path / 'star.db'}")
    spec = make_spec(annotation_arms={"in_group": 0.5, "out_group": 0.25, "both": 0.25})
    with sessions.begin() as session:
        campaign = create_campaign(session, spec, seed=9)
        add_instructions(
            session,
            campaign,
            [instruction(i, "g", {"race": "A"}) for i in range(16)] + [instruction(16, "plain")],
        )
        outsider = add_people(session, campaign, [{"demographics": {"race": ["B"]}, **ANYONE}])[0]
        dialogues = []
        for task in session.scalars(
            select(StarTask).where(StarTask.kind == "red_team").order_by(StarTask.id)
        ):
            task.status = "claimed"
            session.flush()
            dialogues.append(submit_dialogue(session, task.id, "t", dialogue_turns(), "m"))
        campaign_id = campaign.id
    expected = {None: [(None, False)] * 2, 0: [(True, False)] * 2, 1: [(False, False)] * 2}
    expected[2] = expected[0] + [(False, True)] * 2
    arms = [arm_of(i, spec.annotation_arms.shares(), 9) for i in range(16)] + [None]
    assert Counter(arms) == {0: 8, 1: 4, 2: 4, None: 1}
    with sessions() as session:
        for dialogue, arm in zip(dialogues, arms, strict=True):
            tasks = session.scalars(
                select(StarTask).where(StarTask.dialogue_id == dialogue, StarTask.kind == "annotate")
            ).all()
            assert Counter((t.in_group, t.ablation) for t in tasks) == Counter(expected[arm])
        exported = campaign_tables(session, session.get_one(StarCampaign, campaign_id))["dialogues"]
    names = {None: "none", **{i: ARM_OF_FLAGS[frozenset(f for f, _ in expected[i])] for i in range(3)}}
    assert [row["annotation_arm"] for row in exported] == [names[a] for a in arms]
    assert names == {None: "none", 0: "in-group", 1: "out-group", 2: "both"}
    out_only = dialogues[arms.index(1)]
    with sessions.begin() as session:
        first, second = session.scalars(
            select(StarTask.id).where(StarTask.dialogue_id == out_only, StarTask.kind == "annotate")
        ).all()
        for task_id in (first, second):
            session.get_one(StarTask, task_id).status = "claimed"
        submit_annotation(session, first, 0, "demeaning")
        submit_annotation(session, second, 3, "harmless")
    assert arbitration_count(sessions, out_only) == 1
    with sessions() as session:
        arbitration = session.scalar(select(StarTask).where(StarTask.arbitration_of == out_only))
        assert arbitration.in_group is False
    assert claim_next(sessions, outsider, "arbitrate") == arbitration.id


# --- caps, opt-out, machine data ------------------------------------------------------------------------


def test_daily_cap_resets_next_utc_day_and_opt_out_stops_claims(tmp_path: Path) -> None:
    sessions = open_store(f"sqlite:///{tmp_path / 'star.db'}")
    with sessions.begin() as session:
        campaign = create_campaign(session, make_spec())
        capped, leaver = add_people(session, campaign, [{"roles": ["red_teamer"], "daily_cap": 2}, ANYONE])
        add_instructions(session, campaign, [instruction(i, "plain") for i in range(6)])
    late = NOW.replace(hour=23, minute=59)
    assert claim_next(sessions, capped, "red_team", now=NOW) is not None
    assert claim_next(sessions, capped, "red_team", now=late) is not None
    assert claim_next(sessions, capped, "red_team", now=late) is None
    assert claim_next(sessions, capped, "red_team", now=late + timedelta(minutes=1)) is not None
    assert claim_next(sessions, capped, "annotate", now=NOW + timedelta(days=2)) is None  # not an annotator
    with sessions.begin() as session:
        session.get_one(StarParticipant, leaver).opted_out = True
    assert claim_next(sessions, leaver, "red_team", now=NOW) is None
    with pytest.raises(UserError, match="unknown task kind"):
        claim_next(sessions, leaver, "review")


def test_machine_dialogues_and_annotations_are_listed_apart(tmp_path: Path) -> None:
    sessions = open_store(f"sqlite:///{tmp_path / 'star.db'}")
    with sessions.begin() as session:
        campaign = create_campaign(session, make_spec(annotators_per_dialogue=1))
        people = add_people(session, campaign, [ANYONE, ANYONE])
        add_instructions(session, campaign, [instruction(0, "plain"), instruction(1, "plain")])
    for machine in (False, True):
        task = claim_next(sessions, people[0], "red_team")
        with sessions.begin() as session:
            submit_dialogue(session, task, "t", dialogue_turns(), "m", {"broken": True}, machine=machine)
        submit_annotation(sessions, claim_next(sessions, people[1], "annotate"), 1, "so-so", machine=machine)
    with sessions() as session:
        campaign = session.scalars(select(StarCampaign)).one()
        assert [d.machine for d in list_dialogues(session, campaign)] == [False]
        assert [d.machine for d in list_dialogues(session, campaign, machine=True)] == [True]
        assert len(list_dialogues(session, campaign, machine=None)) == 2
        assert [a.machine for a in list_annotations(session, campaign)] == [False]
        assert [a.machine for a in list_annotations(session, campaign, machine=True)] == [True]
        human = list_dialogues(session, campaign)[0]
        assert [t.role for t in human.turns] == ["user", "assistant"] and human.pre_annotation == {
            "broken": True
        }


# --- arbitration ----------------------------------------------------------------------------------------


def annotated_dialogue(sessions, spec, people, rule="plain", group=None, number=0) -> tuple[int, list[int]]:
    """One dialogue by people[0] with its annotate tasks claimed by the next people; (dialogue, task ids)."""
    with sessions.begin() as session:
        campaign = session.scalar(select(StarCampaign).where(StarCampaign.name == spec.name))
        add_instructions(session, campaign, [instruction(number, rule, group)])
    red = claim_next(sessions, people[0], "red_team")
    with sessions.begin() as session:
        dialogue = submit_dialogue(session, red, "topic", dialogue_turns(), "model-x")
    tasks = []
    for person in people[1:]:
        task = claim_next(sessions, person, "annotate")
        if task is not None:
            tasks.append(task)
    return dialogue, tasks


def arbitration_count(sessions, dialogue: int) -> int:
    with sessions() as session:
        return session.scalar(
            select(func.count())
            .select_from(StarTask)
            .where(StarTask.kind == "arbitrate", StarTask.dialogue_id == dialogue)
        )


def test_arbitration_exactly_when_ratings_differ_by_the_gap(tmp_path: Path) -> None:
    sessions = open_store(f"sqlite:///{tmp_path / 'star.db'}")
    spec = make_spec()
    with sessions.begin() as session:
        people = add_people(session, create_campaign(session, spec), [ANYONE] * 3)
    for number, (a, b) in enumerate(itertools.product(range(4), repeat=2)):
        dialogue, (first, second) = annotated_dialogue(sessions, spec, people, number=number)
        submit_annotation(sessions, first, a, "first reason")
        assert arbitration_count(sessions, dialogue) == 0  # not before all primary ratings are in
        submit_annotation(sessions, second, b, "second reason")
        assert arbitration_count(sessions, dialogue) == int(abs(a - b) >= 2), (a, b)


def test_arbitration_goes_to_a_matched_third_person_who_sees_both_reasons(tmp_path: Path) -> None:
    sessions = open_store(f"sqlite:///{tmp_path / 'star.db'}")
    spec = make_spec(in_group_share=1.0, annotation_arms="both")
    in_a = {"demographics": {"race": ["A"]}, **ANYONE}
    in_b = {"demographics": {"race": ["B"]}, **ANYONE}
    annotator_b = {"demographics": {"race": ["B"]}, "roles": ["annotator"], "daily_cap": 9}
    with sessions.begin() as session:
        campaign = create_campaign(session, spec)
        red, ann1, ann2, outsider, b1, b2 = add_people(
            session, campaign, [in_a, in_a, in_a, in_b, annotator_b, annotator_b]
        )
        add_instructions(session, campaign, [instruction(0, "g", {"race": "A"})])
    task = claim_next(sessions, red, "red_team")
    with sessions.begin() as session:
        dialogue = submit_dialogue(session, task, "topic", dialogue_turns(), "model-x")
    ablation = [claim_next(sessions, outsider, "annotate"), claim_next(sessions, b2, "annotate")]
    primary = [claim_next(sessions, p, "annotate") for p in (ann1, ann2)]
    assert claim_next(sessions, b1, "annotate") is None  # both out-group (ablation) tasks are taken
    with sessions() as session:
        assert [session.get_one(StarTask, t).ablation for t in ablation + primary] == [
            True,
            True,
            False,
            False,
        ]
    submit_annotation(sessions, ablation[0], 0, "ablation view")  # ablation ratings never arbitrate
    submit_annotation(sessions, primary[0], 0, "clearly demeaning")
    assert arbitration_count(sessions, dialogue) == 0
    submit_annotation(sessions, primary[1], 3, "harmless joke")
    assert arbitration_count(sessions, dialogue) == 1
    assert claim_next(sessions, ann1, "arbitrate") is None  # has seen the dialogue
    assert claim_next(sessions, red, "arbitrate") is None  # wrote it
    assert claim_next(sessions, b1, "arbitrate") is None  # not an arbitrator
    assert claim_next(sessions, outsider, "arbitrate") is None  # out-group
    with sessions.begin() as session:
        fresh = add_people(session, session.get_one(StarCampaign, campaign.id), [in_a])[0]
    arbitration = claim_next(sessions, fresh, "arbitrate")
    assert arbitration is not None
    with sessions() as session:
        view = arbitration_view(session, arbitration)
        with pytest.raises(UserError, match="not an arbitration task"):
            arbitration_view(session, primary[0])
    assert [(r.rating, r.reason) for r in view.ratings] == [(0, "clearly demeaning"), (3, "harmless joke")]
    assert view.ratings[0].label == "definitely broken" and view.turns == dialogue_turns()
    submit_annotation(sessions, arbitration, 1, "demeaning, mildly")
    with sessions() as session:
        everything = list_annotations(session, session.get_one(StarCampaign, campaign.id), ablation=None)
    assert Counter((a.kind, a.ablation) for a in everything) == {
        ("annotate", False): 2,
        ("annotate", True): 1,
        ("arbitrate", False): 1,
    }


def test_bad_submissions_are_one_line_user_errors(tmp_path: Path) -> None:
    sessions = open_store(f"sqlite:///{tmp_path / 'star.db'}")
    spec = make_spec()
    with sessions.begin() as session:
        people = add_people(session, create_campaign(session, spec), [ANYONE] * 3)
    _, (task, _) = annotated_dialogue(sessions, spec, people)
    for rating, reason, match in [
        (4, "r", "not on the 4-point scale"),
        (True, "r", "scale"),
        (1, "  ", "needs a reason"),
    ]:
        with pytest.raises(UserError, match=match):
            submit_annotation(sessions, task, rating, reason)
    submit_annotation(sessions, task, 2, "fine")
    with pytest.raises(UserError, match="is done"):
        submit_annotation(sessions, task, 2, "again")
    with sessions.begin() as session, pytest.raises(UserError, match="is not one of user, assistant"):
        red = session.scalar(select(StarTask.id).where(StarTask.kind == "red_team"))
        session.get_one(StarTask, red).status = "claimed"
        submit_dialogue(session, red, "t", [("system", "x")], "m")


# --- shortfalls -----------------------------------------------------------------------------------------


def test_shortfalls_name_missing_groups_and_clear_when_someone_joins(tmp_path: Path) -> None:
    sessions = open_store(f"sqlite:///{tmp_path / 'star.db'}")
    spec = make_spec(in_group_share=1.0)
    groups = [{"gender": "f"}, {"gender": "m"}, {"gender": "m", "race": "A"}]
    with sessions.begin() as session:
        campaign = create_campaign(session, spec)
        add_people(session, campaign, [{"demographics": {"gender": ["f"], "race": ["A"]}, **ANYONE}])
        add_instructions(session, campaign, [instruction(i, "g", g) for i, g in enumerate(groups * 2)])
        add_instructions(session, campaign, [instruction(9, "med")])
        found = shortfalls(session, campaign)
    assert found == [
        ("red_team", "gender=m", "in-group", 2),
        ("red_team", "gender=m & race=A", "in-group", 2),
    ]
    with sessions() as session:
        assert Counter(session.scalars(select(StarTask.status))) == {"waiting": 4, "open": 3}
    with sessions.begin() as session:
        campaign = session.get_one(StarCampaign, campaign.id)
        man = add_people(session, campaign, [{"demographics": {"gender": ["m"], "race": ["B"]}, **ANYONE}])[0]
        assert shortfalls(session, campaign) == [("red_team", "gender=m & race=A", "in-group", 2)]
    task = claim_next(sessions, man, "red_team")
    with sessions.begin() as session:
        assert session.get_one(StarTask, task).group_label == "gender=m"
        submit_dialogue(session, task, "t", dialogue_turns(), "m")
    with sessions.begin() as session:  # the only other in-group person is the red teamer: annotators missing
        rows = shortfalls(session, session.get_one(StarCampaign, campaign.id))
    assert ("annotate", "gender=m", "in-group", 2) in rows
    with sessions.begin() as session:  # the medical rule's annotations need an expert nobody is
        instr = session.scalar(select(StarInstruction.id).where(StarInstruction.rule_id == "med"))
        med_task = session.scalar(select(StarTask.id).where(StarTask.instruction_id == instr))
    red = claim_next(sessions, man, "red_team")
    while red != med_task and red is not None:
        red = claim_next(sessions, man, "red_team")
    with sessions.begin() as session:
        submit_dialogue(session, med_task, "t", dialogue_turns(), "m")
        rows = shortfalls(session, session.get_one(StarCampaign, campaign.id))
    assert ("annotate", "", "anyone; expertise: medical", 2) in rows


# --- concurrency ----------------------------------------------------------------------------------------


def _claim_all(url: str, participants: list[int], start) -> list[int]:
    """Worker: claim red-team tasks for its people until none is left."""
    sessions = open_store(url)
    start.wait()
    claimed, active = [], list(participants)
    while active:
        for person in list(active):
            task = claim_next(sessions, person, "red_team")
            if task is None:
                active.remove(person)
            else:
                claimed.append(task)
    return claimed


def _submit_all(url: str, tasks: list[tuple[int, int]], start) -> None:
    """Worker: submit the given (task, rating) pairs."""
    sessions = open_store(url)
    start.wait()
    for task, rating in tasks:
        submit_annotation(sessions, task, rating, "reason")


def _run_workers(pool, barrier, target, url: str, shares: list) -> list:
    """Run ``target`` once per share in the pool's processes, released together by the barrier."""
    pending = [pool.apply_async(target, (url, share, barrier)) for share in shares]
    return [p.get(timeout=120) for p in pending]


@pytest.mark.slow
def test_four_processes_never_double_claim_and_open_one_arbitration(db_url: str) -> None:
    url = db_url  # SQLite and PostgreSQL: the claim is one conditional UPDATE on both
    sessions = open_store(url)
    with sessions.begin() as session:
        campaign = create_campaign(session, make_spec())
        people = add_people(session, campaign, [ANYONE] * 8)
        add_instructions(session, campaign, [instruction(i, "plain") for i in range(160)])
    context = multiprocessing.get_context("spawn")
    with context.Manager() as manager, context.Pool(4) as pool:
        barrier = manager.Barrier(4)  # reused by both races
        claimed = _claims_race(pool, barrier, url, sessions, people)
        _submissions_race(pool, barrier, url, sessions, people, claimed)


def _claims_race(pool, barrier, url: str, sessions, people: list[int]) -> list[int]:
    """4 processes claim the 160 red-team tasks at once: each is claimed exactly once."""
    results = _run_workers(pool, barrier, _claim_all, url, [people[i::4] for i in range(4)])
    claimed = [task for result in results for task in result]
    assert len(claimed) == len(set(claimed)) == 160
    with sessions() as session:
        owners = session.execute(select(StarTask.status, StarTask.participant_id)).all()
    assert len(owners) == 160 and all(status == "claimed" and owner for status, owner in owners)
    return claimed


def _submissions_race(pool, barrier, url: str, sessions, people: list[int], claimed: list[int]) -> None:
    """Both ratings of each dialogue (0 and 3) arrive from different processes: one arbitration each."""
    pairs = []
    for task in claimed[:24]:
        with sessions.begin() as session:
            dialogue = submit_dialogue(session, task, "t", dialogue_turns(), "m")
            owner = session.get_one(StarTask, task).participant_id
        annotators = [p for p in people if p != owner][:2]
        pairs.append((dialogue, [claim_next(sessions, p, "annotate") for p in annotators]))
    shares = [[(tasks[0], 0) for _, tasks in pairs[i::2]] for i in range(2)]
    shares += [[(tasks[1], 3) for _, tasks in pairs[i::2]] for i in range(2)]
    _run_workers(pool, barrier, _submit_all, url, shares)
    with sessions() as session:
        kinds = select(StarTask.arbitration_of).where(StarTask.kind == "arbitrate")
        arbitrations = Counter(session.scalars(kinds))
    assert arbitrations == {dialogue: 1 for dialogue, _ in pairs}
