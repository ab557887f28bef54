"""Rehearse a campaign end to end without people: LLM red teamers, a target model, LLM annotators and
arbitrators, all through the real assignment engine (claims, matching, arbitration), all marked machine-made.

Machine personas cover every combination of the spec's demographic attributes (so every in-group and
out-group requirement can be met, in every annotation arm) and every expertise the rules need. Work runs in
phases, batched per model call: red teaming (topic first, then ``turns`` exchanges), annotation,
arbitration. The summary counts the dialogues of each annotation arm.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy.orm import Session, sessionmaker

from assay.models.base import ChatModel, GenerationParams
from assay.models.choice import choose
from assay.star import agents
from assay.star.assign import (
    add_instructions,
    arbitration_view,
    claim_next,
    create_campaign,
    dialogue_arms,
    shortfalls,
    submit_annotation,
    submit_dialogue,
)
from assay.star.design import draw_design
from assay.star.spec import CampaignSpec
from assay.store.enums import STAR_ROLES, TaskKind
from assay.store.models import utcnow
from assay.store.star_models import StarCampaign, StarDialogue, StarParticipant, StarTask

PERSONA_PREFIX = "llm-persona-"


@dataclass
class SimulationSummary:
    """What a rehearsal produced."""

    campaign: str
    dialogues: int = 0
    annotations: int = 0
    arbitrations: int = 0
    unparsed_ratings: int = 0
    shortfalls: list[str] = field(default_factory=list)
    arms: dict[str, int] = field(default_factory=dict)  # dialogues per annotation arm (none: no target)


@dataclass(frozen=True)
class Agents:
    """The models a rehearsal uses; one model may play several parts."""

    target: ChatModel
    red_teamer: ChatModel
    annotator: ChatModel
    params: GenerationParams = field(default_factory=lambda: GenerationParams(max_new_tokens=64))
    # "text": parse "Rating: N" from the reply; "likelihood": the most likely of "Rating: 1".."Rating: K"
    # under the annotator's weights (hf: models), with the reply kept as the reason.
    ratings: str = "text"


def add_personas(session: Session, campaign: StarCampaign, spec: CampaignSpec) -> list[int]:
    """Machine personas for every combination of attribute values, with every role and expertise.

    Each combination gets ``annotators_per_dialogue + 2`` personas: an in-group dialogue needs its red teamer,
    its annotators and an arbitrator from the same group, all different people.
    """
    attributes = sorted(spec.demographics.attributes)
    expertise = sorted({tag for rule in spec.rules for tag in rule.expertise})
    combos = itertools.product(*(spec.demographics.attributes[a] for a in attributes)) if attributes else [()]
    copies = spec.annotators_per_dialogue + 2
    people = []
    for number, values in enumerate(v for v in combos for _ in range(copies)):
        demographics = {a: [v] for a, v in zip(attributes, values, strict=True)}
        label = ", ".join(values) or "no demographics"
        people.append(
            StarParticipant(
                campaign_id=campaign.id,
                external_id=f"{PERSONA_PREFIX}{number + 1:04d}",
                name=f"LLM persona ({label})",
                demographics=demographics,
                expertise=expertise,
                roles=list(STAR_ROLES),
                daily_cap=1_000_000,
            )
        )
    session.add_all(people)
    session.flush()
    return [p.id for p in people]


def claim_all(
    sessions: sessionmaker[Session], people: list[int], kind: str, limit: int | None = None
) -> list[int]:
    """Claim tasks of ``kind`` round-robin over ``people`` until nobody can claim more (or ``limit``)."""
    claimed: list[int] = []
    while limit is None or len(claimed) < limit:
        got = [
            t
            for p in people
            if (limit is None or len(claimed) < limit) and (t := claim_next(sessions, p, kind))
        ]
        if not got:
            break
        claimed += [t for t in got if t is not None]
    return claimed


@dataclass(frozen=True)
class _Rehearsal:
    """What every phase of one rehearsal works with."""

    sessions: sessionmaker[Session]
    spec: CampaignSpec
    models: Agents
    summary: SimulationSummary


def _red_team(run: _Rehearsal, tasks: list[int], turns: int, seeds: list[str]) -> None:
    models = run.models
    with run.sessions() as session:
        instructions = [session.get_one(StarTask, t).instruction.text for t in tasks]
    seed_for = [seeds[i % len(seeds)] if seeds else None for i in range(len(tasks))]
    topics = models.red_teamer.chat(
        [agents.topic_prompt(text, seed) for text, seed in zip(instructions, seed_for, strict=True)],
        models.params,
    )
    topics = [t.strip().splitlines()[0][:200] if t.strip() else "(no topic)" for t in topics]
    dialogues: list[list[tuple[str, str, datetime]]] = [[] for _ in tasks]
    for _ in range(turns):
        views = [[(r, x) for r, x, _ in d] for d in dialogues]
        attacks = models.red_teamer.chat(
            [agents.red_team_prompt(i, t, v) for i, t, v in zip(instructions, topics, views, strict=True)],
            models.params,
        )
        for d, text in zip(dialogues, attacks, strict=True):
            d.append(("user", text.strip() or "(empty)", utcnow()))
        replies = models.target.chat(
            [agents.target_prompt([(r, x) for r, x, _ in d]) for d in dialogues], models.params
        )
        for d, text in zip(dialogues, replies, strict=True):
            d.append(("assistant", text.strip(), utcnow()))
    with run.sessions.begin() as session:
        for task_id, topic, turns_ in zip(tasks, topics, dialogues, strict=True):
            pre = {
                "assigned_rule_broken": None,
                "other_rules_broken": [],
                "groups_mentioned": agents.groups_mentioned([(r, x) for r, x, _ in turns_], run.spec),
            }
            submit_dialogue(session, task_id, topic, turns_, models.target.model_id, pre, machine=True)
            run.summary.dialogues += 1


def _dialogue_of(session: Session, task_id: int) -> tuple[str, list[tuple[str, str]], str]:
    """The task's rule, the dialogue's turns and the annotator's persona (who they are)."""
    task = session.get_one(StarTask, task_id)
    dialogue = session.get_one(StarDialogue, task.dialogue_id)
    person = session.get(StarParticipant, task.participant_id) if task.participant_id else None
    persona = f"{person.external_id} ({person.name})" if person else ""
    return task.rule_id, [(turn.role, turn.text) for turn in dialogue.turns], persona


def _annotate(run: _Rehearsal, tasks: list[int]) -> None:
    spec = run.spec
    with run.sessions() as session:
        views = [_dialogue_of(session, t) for t in tasks]
    _rate(run, tasks, [agents.annotation_prompt(spec, spec.rule(r), turns, who) for r, turns, who in views])
    run.summary.annotations += len(tasks)


def _arbitrate(run: _Rehearsal, tasks: list[int]) -> None:
    spec = run.spec
    with run.sessions() as session:
        views = [arbitration_view(session, t) for t in tasks]
    prompts = [
        agents.arbitration_prompt(
            spec, spec.rule(v.rule_id), v.turns, [(r.rating, r.reason) for r in v.ratings]
        )
        for v in views
    ]
    _rate(run, tasks, prompts)
    run.summary.arbitrations += len(tasks)


def _rate(run: _Rehearsal, tasks: list[int], prompts: list) -> None:
    spec, models = run.spec, run.models
    replies = models.annotator.chat(prompts, models.params) if prompts else []
    if models.ratings == "likelihood":
        options = [f"Rating: {point}" for point in range(1, len(spec.likert) + 1)]
        picks = choose(models.annotator, prompts, options, [agents.content_free(p) for p in prompts])
        parsed_all = [
            agents.ParsedRating(p, agents.reason_of(r), True) for p, r in zip(picks, replies, strict=True)
        ]
    else:
        parsed_all = [agents.parse_rating(reply, spec) for reply in replies]
    for task_id, parsed in zip(tasks, parsed_all, strict=True):
        run.summary.unparsed_ratings += not parsed.parsed
        submit_annotation(run.sessions, task_id, parsed.rating, parsed.reason, machine=True)


def simulate(
    sessions: sessionmaker[Session],
    spec: CampaignSpec,
    models: Agents,
    count: int,
    seed: int = 0,
    turns: int = 2,
    seed_source: str | None = None,
    campaign_name: str | None = None,
    on_phase: Callable[[str, int], None] | None = None,
) -> SimulationSummary:
    """Design ``count`` instructions, then red team, annotate and arbitrate them with the agents."""
    name = campaign_name or f"{spec.name}-simulated"
    with sessions.begin() as session:
        campaign = create_campaign(session, spec.model_copy(update={"name": name}), seed=seed)
        add_instructions(session, campaign, draw_design(spec, count, seed))
        people = add_personas(session, campaign, spec)
        campaign_id = campaign.id
    seeds = agents.seed_topics(seed_source) if seed_source else []
    summary = SimulationSummary(campaign=name)
    run = _Rehearsal(sessions, spec, models, summary)
    phases: list[tuple[str, Callable[[list[int]], None]]] = [
        (TaskKind.RED_TEAM, lambda ts: _red_team(run, ts, turns, seeds)),
        (TaskKind.ANNOTATE, lambda ts: _annotate(run, ts)),
        (TaskKind.ARBITRATE, lambda ts: _arbitrate(run, ts)),
    ]
    for kind, phase in phases:
        while tasks := claim_all(sessions, people, kind):
            if on_phase is not None:
                on_phase(kind, len(tasks))
            phase(tasks)
    with sessions.begin() as session:
        campaign = session.get_one(StarCampaign, campaign_id)
        missing = shortfalls(session, campaign)
        summary.arms = dict(sorted(Counter(dialogue_arms(session, campaign).values()).items()))
    summary.shortfalls = [
        f"{m.kind} {m.group_label or '(no group)'} {m.requirement}: {m.tasks}" for m in missing
    ]
    return summary
