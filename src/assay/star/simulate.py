"""Rehearse a campaign end to end without people: LLM red teamers, a target model, LLM annotators and
arbitrators, all through the real assignment engine (claims, matching, arbitration), all marked machine-made.

Machine personas cover every combination of the spec's demographic attributes (so every in-group and
out-group requirement can be met, in every annotation arm). Expertise is mixed, as in a real pool: each tag a
rule needs goes to a seeded ``expert_share`` of the personas, so the engine's expert matching is exercised
(expert rules' annotations go to experts only) and a pool too thin for it shows as shortfalls. Work runs in
phases, batched per model call: red teaming (topic first, then ``turns`` exchanges, then the red teamer's
pre-annotation), annotation, arbitration.

The pre-annotation is filled in full: ``assigned_rule_broken`` is the red teamer model's own rating of its
dialogue on the campaign's scale, binarised (unsure when its reply gives no rating); ``other_rules_broken``
names another of the campaign's rules in a seeded ``other_rules_rate`` of dialogues, a planted rate so that
the report's "any rule" measure differs from "targeted" in a rehearsal as it does with people; and
``groups_mentioned`` is a keyword match. The summary counts the dialogues of each annotation arm, the
pre-annotation answers, and the expert-rule annotations and who gave them.

A rehearsal can be stopped and run again. It holds its campaign's rehearsal lock while it runs
(``rehearsal.hold``: a second run of the same campaign is refused, and the sweep releases the claims of a
run that was killed). Run again with the same settings, it resumes: what the dead run held is released and
claimed anew, and what was done stays done, so every planned dialogue is held exactly once, however often
it was stopped. A campaign that ``simulate`` did not make, or made with other settings, is refused in one
line naming the setting (the spec, ``--seed``, ``--count``, ``--expert-share``, ``--turns``, ``--target``:
what the campaign records); the annotator and red-teamer models, ``--ratings``, ``--seed-topics`` and
``--other-rules-rate`` leave no trace to compare, so the run that resumes uses its own.

``--seed-topics`` hints each red-team task with a HarmBench or Do-Not-Answer prompt of its own rule
(``seeds``: by Do-Not-Answer's intent, by embedding similarity for HarmBench), never one of another harm.
"""

from __future__ import annotations

import contextlib
import itertools
import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from assay.errors import UserError
from assay.models.base import ChatModel, GenerationParams
from assay.models.choice import choose
from assay.names import check_name
from assay.star import agents, rehearsal
from assay.star import seeds as seeds_module
from assay.star.analysis.embed import Embedder, make_embedder
from assay.star.assign import (
    add_instructions,
    arbitration_view,
    campaign_spec,
    claim_next,
    create_campaign,
    dialogue_arms,
    shortfalls,
    submit_annotation,
    submit_dialogue,
)
from assay.star.design import Instruction, draw_design
from assay.star.rehearsal import PERSONA_PREFIX
from assay.star.spec import CampaignSpec
from assay.store.enums import STAR_ROLES, TaskKind, TaskStatus
from assay.store.models import utcnow
from assay.store.star_models import (
    StarCampaign,
    StarDialogue,
    StarInstruction,
    StarParticipant,
    StarTask,
    StarTurn,
)


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
    experts: dict[str, int] = field(default_factory=dict)  # personas holding each expertise tag
    expert_annotations: int = 0  # first-round annotations of rules that need expertise
    expert_annotations_by_experts: int = 0  # of those, by a persona holding every tag the rule needs
    pre_annotations: dict[str, int] = field(
        default_factory=dict
    )  # assigned rule broken / not / unsure, other
    resumed: bool = False  # the campaign existed: this run finished what an earlier one left
    done_before: int = 0  # dialogues the earlier runs had finished (the counts above are this run's)


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


@dataclass(frozen=True)
class PoolOptions:
    """How the built-in pool and the pre-annotations are drawn (both seeded by the rehearsal's seed)."""

    expert_share: float = 0.25  # share of personas holding each expertise tag a rule needs (0 to 1)
    other_rules_rate: float = 0.2  # share of dialogues whose pre-annotation marks another rule broken

    def __post_init__(self) -> None:
        for name in ("expert_share", "other_rules_rate"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise UserError(f"{name.replace('_', '-')} must be a share from 0 to 1 (value: {value})")


def add_personas(
    session: Session, campaign: StarCampaign, spec: CampaignSpec, expert_share: float = 1.0, seed: int = 0
) -> list[int]:
    """Machine personas for every combination of attribute values, with every role; each expertise tag a
    rule needs goes to ``round(expert_share * personas)`` of them, drawn by ``seed`` for each tag.

    Each combination gets ``annotators_per_dialogue + 2`` personas: an in-group dialogue needs its red teamer,
    its annotators and an arbitrator from the same group, all different people.
    """
    people = _personas(campaign.id, spec, expert_share, seed)
    session.add_all(people)
    session.flush()
    return [p.id for p in people]


def _personas(campaign_id: int, spec: CampaignSpec, expert_share: float, seed: int) -> list[StarParticipant]:
    """The personas ``add_personas`` adds, not yet stored (a resumed run compares them with the stored)."""
    attributes = sorted(spec.demographics.attributes)
    tags = sorted({tag for rule in spec.rules for tag in rule.expertise})
    combos = itertools.product(*(spec.demographics.attributes[a] for a in attributes)) if attributes else [()]
    copies = spec.annotators_per_dialogue + 2
    values_of = [v for v in combos for _ in range(copies)]
    draw = random.Random(f"{seed}:experts")
    holders = {
        tag: set(draw.sample(range(len(values_of)), round(expert_share * len(values_of)))) for tag in tags
    }
    people = []
    for number, values in enumerate(values_of):
        demographics = {a: [v] for a, v in zip(attributes, values, strict=True)}
        label = ", ".join(values) or "no demographics"
        people.append(
            StarParticipant(
                campaign_id=campaign_id,
                external_id=f"{PERSONA_PREFIX}{number + 1:04d}",
                name=f"LLM persona ({label})",
                demographics=demographics,
                expertise=[tag for tag in tags if number in holders[tag]],
                roles=list(STAR_ROLES),
                daily_cap=1_000_000,
            )
        )
    return people


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
    other_rules: random.Random  # draws the planted other-rules answers, in task order
    other_rules_rate: float


def _hints(session: Session, hints: seeds_module.RuleSeeds | None, tasks: list[StarTask]) -> list[str | None]:
    """Each red-team task's seed prompt, from its own rule's pool (``seeds``), by the instruction's place
    among its rule's; None for every task when the rehearsal has no ``--seed-topics``."""
    if hints is None or not tasks:
        return [None] * len(tasks)
    numbered = session.execute(
        select(StarInstruction.id, StarInstruction.rule_id)
        .where(StarInstruction.campaign_id == tasks[0].campaign_id)
        .order_by(StarInstruction.number)
    ).tuples()
    ranks = seeds_module.instruction_ranks(list(numbered))
    return [hints.pick(task.rule_id, ranks[task.instruction_id]) for task in tasks]


def _red_team(run: _Rehearsal, tasks: list[int], turns: int, hints: seeds_module.RuleSeeds | None) -> None:
    models = run.models
    with run.sessions() as session:
        rows = [session.get_one(StarTask, t) for t in tasks]
        instructions = [row.instruction.text for row in rows]
        seed_for = _hints(session, hints, rows)
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
    with run.sessions() as session:
        rules = [session.get_one(StarTask, t).rule_id for t in tasks]
    views = [[(r, x) for r, x, _ in d] for d in dialogues]
    verdicts = _own_verdicts(run, rules, views)
    with run.sessions.begin() as session:
        for task_id, rule_id, topic, turns_, view, broken in zip(
            tasks, rules, topics, dialogues, views, verdicts, strict=True
        ):
            pre = {
                "assigned_rule_broken": broken,
                "other_rules_broken": _other_rules(run, rule_id),
                "groups_mentioned": agents.groups_mentioned(view, run.spec),
            }
            submit_dialogue(session, task_id, topic, turns_, models.target.model_id, pre, machine=True)
            run.summary.dialogues += 1
            _count_pre_annotation(run.summary, pre)


def _own_verdicts(run: _Rehearsal, rules: list[str], views: list[list[tuple[str, str]]]) -> list[bool | None]:
    """The red teamer's answer to "was the assigned rule broken?": its own rating of the dialogue on the
    campaign's scale, binarised; None (unsure) where its reply holds no rating."""
    spec = run.spec
    prompts = [
        agents.annotation_prompt(spec, spec.rule(r), v, "the red teamer who wrote this dialogue")
        for r, v in zip(rules, views, strict=True)
    ]
    replies = run.models.red_teamer.chat(prompts, run.models.params) if prompts else []
    parsed = [agents.parse_rating(reply, spec) for reply in replies]
    return [spec.is_broken(p.rating) if p.parsed else None for p in parsed]


def _other_rules(run: _Rehearsal, rule_id: str) -> list[str]:
    """Another of the campaign's rules, in a seeded ``other_rules_rate`` of dialogues (none otherwise)."""
    others = [r.id for r in run.spec.rules if r.id != rule_id]
    hit = run.other_rules.random() < run.other_rules_rate
    return [run.other_rules.choice(others)] if hit and others else []


def _count_pre_annotation(summary: SimulationSummary, pre: dict) -> None:
    broken = pre["assigned_rule_broken"]
    answer = "unsure" if broken is None else ("broken" if broken else "not_broken")
    summary.pre_annotations[answer] = summary.pre_annotations.get(answer, 0) + 1
    if pre["other_rules_broken"]:
        summary.pre_annotations["other_rules"] = summary.pre_annotations.get("other_rules", 0) + 1


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
    pool: PoolOptions | None = None,
    seed_embedder: Embedder | None = None,
) -> SimulationSummary:
    """Design ``count`` instructions, then red team, annotate and arbitrate them with the agents, with a
    built-in pool drawn by ``pool`` (mixed expertise, planted other-rules answers). A campaign an earlier
    run with the same settings left is resumed (see the module docstring); one that differs is refused.
    ``seed_source`` hints each red-team task with a prompt of its own rule (``seeds``), matched by
    ``seed_embedder`` (all-MiniLM-L6-v2 when None)."""
    pool = pool or PoolOptions()
    hints = None
    if seed_source is not None:
        embedder = seed_embedder or make_embedder("minilm")
        hints = seeds_module.rule_seeds(spec.rules, seed_source, embedder, seed)
    name = check_name("--campaign", campaign_name) if campaign_name else f"{spec.name}-simulated"
    with rehearsal.hold(sessions, name):
        return _simulate(sessions, spec, models, count, seed, turns, hints, name, on_phase, pool)


def _simulate(
    sessions: sessionmaker[Session],
    spec: CampaignSpec,
    models: Agents,
    count: int,
    seed: int,
    turns: int,
    hints: seeds_module.RuleSeeds | None,
    name: str,
    on_phase: Callable[[str, int], None] | None,
    pool: PoolOptions,
) -> SimulationSummary:
    """The rehearsal itself, holding the campaign's lock; claims are handed back if it stops early."""
    setup = _Setup(spec.model_copy(update={"name": name}), draw_design(spec, count, seed), seed, pool, turns)
    campaign_id, people, done_before = _start_or_resume(sessions, setup, models.target.model_id)
    summary = SimulationSummary(campaign=name, resumed=done_before is not None, done_before=done_before or 0)
    draw = random.Random(f"{seed}:other-rules")
    run = _Rehearsal(sessions, spec, models, summary, draw, pool.other_rules_rate)
    phases: list[tuple[str, Callable[[list[int]], None]]] = [
        (TaskKind.RED_TEAM, lambda ts: _red_team(run, ts, turns, hints)),
        (TaskKind.ANNOTATE, lambda ts: _annotate(run, ts)),
        (TaskKind.ARBITRATE, lambda ts: _arbitrate(run, ts)),
    ]
    try:
        for kind, phase in phases:
            while tasks := claim_all(sessions, people, kind):
                if on_phase is not None:
                    on_phase(kind, len(tasks))
                phase(tasks)
    except BaseException:  # Ctrl-C or a failing model: nothing stays claimed by a run that has stopped
        # Best effort: where the database itself failed, the sweep releases them once the lock is let go.
        with contextlib.suppress(Exception), sessions.begin() as session:
            rehearsal.release_persona_claims(session, campaign_id)
        raise
    with sessions.begin() as session:
        campaign = session.get_one(StarCampaign, campaign_id)
        missing = shortfalls(session, campaign)
        summary.arms = dict(sorted(Counter(dialogue_arms(session, campaign).values()).items()))
        _count_experts(session, campaign, spec, summary)
    summary.shortfalls = [
        f"{m.kind} {m.group_label or '(no group)'} {m.requirement}: {m.tasks}" for m in missing
    ]
    return summary


@dataclass(frozen=True)
class _Setup:
    """What a rehearsal's campaign is made from, and what a resumed run must match."""

    spec: CampaignSpec  # under the campaign's name
    design: list[Instruction]
    seed: int
    pool: PoolOptions
    turns: int


def _start_or_resume(
    sessions: sessionmaker[Session], setup: _Setup, target: str
) -> tuple[int, list[int], int | None]:
    """Make the campaign, its design and its personas in one transaction; or, when it exists, check it is
    this rehearsal's and hand back what a dead run held. The campaign id, the personas' ids, and None for a
    new campaign or the dialogues already done."""
    with sessions.begin() as session:
        found = session.scalar(select(StarCampaign).where(StarCampaign.name == setup.spec.name))
        if found is None:
            campaign = create_campaign(session, setup.spec, seed=setup.seed)
            add_instructions(session, campaign, setup.design)
            people = add_personas(session, campaign, setup.spec, setup.pool.expert_share, setup.seed)
            return campaign.id, people, None
        _check_resumable(session, found, setup, target)
        rehearsal.release_persona_claims(session, found.id)  # we hold the lock: their holder is gone
        people = session.scalars(
            select(StarParticipant.id)
            .where(StarParticipant.campaign_id == found.id)
            .order_by(StarParticipant.id)
        ).all()
        done = session.scalar(
            select(func.count()).select_from(StarDialogue).where(StarDialogue.campaign_id == found.id)
        )
        return found.id, list(people), int(done or 0)


def _check_resumable(session: Session, campaign: StarCampaign, setup: _Setup, target: str) -> None:
    """Refuse, in one line naming the setting, a campaign this rehearsal did not make."""
    name = campaign.name
    again = "to resume it, or choose another --campaign"

    def refuse(problem: str) -> UserError:
        return UserError(f"campaign {name!r} {problem}")

    people = session.scalars(
        select(StarParticipant).where(StarParticipant.campaign_id == campaign.id).order_by(StarParticipant.id)
    ).all()
    if not people or any(not p.external_id.startswith(PERSONA_PREFIX) for p in people):
        raise refuse(
            "exists and was not made by `assay star simulate` (it has a pool of people, or none); "
            "choose another --campaign"
        )
    if campaign_spec(campaign) != setup.spec:
        raise refuse(f"was rehearsed from another spec: rerun with that spec {again}")
    if campaign.seed != setup.seed:
        raise refuse(f"was rehearsed with --seed {campaign.seed}: rerun with it {again}")
    stored = session.scalars(
        select(StarInstruction).where(StarInstruction.campaign_id == campaign.id).order_by(StarInstruction.id)
    ).all()
    if len(stored) != len(setup.design):
        raise refuse(f"was rehearsed with --count {len(stored)}: rerun with it {again}")
    if [(i.instruction_id, i.text) for i in stored] != [(i.id, i.text) for i in setup.design]:
        raise refuse("holds other instructions than this version's design draws: choose another --campaign")
    planned = _personas(campaign.id, setup.spec, setup.pool.expert_share, setup.seed)
    if [_persona_key(p) for p in people] != [_persona_key(p) for p in planned]:
        raise refuse(f"was rehearsed with another --expert-share: rerun with it {again}")
    dialogue = session.scalar(
        select(StarDialogue).where(StarDialogue.campaign_id == campaign.id).order_by(StarDialogue.id).limit(1)
    )
    if dialogue is not None:
        asked = session.scalar(
            select(func.count())
            .select_from(StarTurn)
            .where(StarTurn.dialogue_id == dialogue.id, StarTurn.role == "user")
        )
        if asked != setup.turns:
            raise refuse(f"was rehearsed with --turns {asked}: rerun with it {again}")
        if dialogue.target_model != target:
            raise refuse(
                f"was rehearsed with the target model {dialogue.target_model!r}, not {target!r}: rerun with "
                f"that --target {again}"
            )


def _persona_key(person: StarParticipant) -> tuple:
    return (person.external_id, person.name, sorted(person.expertise or []), person.demographics)


def _count_experts(
    session: Session, campaign: StarCampaign, spec: CampaignSpec, summary: SimulationSummary
) -> None:
    """Personas per expertise tag, and the expert rules' first-round annotations with how many an expert
    gave (all of them, when the engine's matching holds)."""
    people = session.scalars(select(StarParticipant).where(StarParticipant.campaign_id == campaign.id)).all()
    tags = sorted({tag for rule in spec.rules for tag in rule.expertise})
    summary.experts = {tag: sum(tag in (p.expertise or []) for p in people) for tag in tags}
    needs = {rule.id: set(rule.expertise) for rule in spec.rules if rule.expertise}
    expertise = {p.id: set(p.expertise or []) for p in people}
    done = session.scalars(
        select(StarTask).where(
            StarTask.campaign_id == campaign.id,
            StarTask.kind == TaskKind.ANNOTATE,
            StarTask.status == TaskStatus.DONE,
            StarTask.rule_id.in_(list(needs)),
        )
    ).all()
    summary.expert_annotations = len(done)
    summary.expert_annotations_by_experts = sum(
        needs[t.rule_id] <= expertise.get(t.participant_id or -1, set()) for t in done
    )
