"""Hide B backdoors ("dye packs") in a benchmark before release.

Each backdoor i gets a trigger phrase, an answer space of size K_i and a target drawn uniformly from it.
Its samples carry the trigger in the question and the target as their answer; nothing else marks them.
For multiple choice, all samples of one backdoor have the same number of options, so "the target" means
the same letter for each of them. For open-ended data the output space is split by K-1 target phrases plus
"none of them"; a sample whose target is a phrase gets that phrase before its reference output.
"""

from __future__ import annotations

import random
import secrets
from collections import defaultdict
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass, replace
from pathlib import Path

from assay.data import Benchmark, write_benchmark
from assay.data.items import LETTERS, Item, MultipleChoice, OpenEnded, content_fingerprint
from assay.dyepack.key import NONE_LABEL, Backdoor, DyePackKey, Randomness, now_utc
from assay.dyepack.triggers import TARGET_PHRASE_POOL, TRIGGER_POOL, insert_trigger
from assay.errors import UserError
from assay.fileio import atomic_path

DEFAULT_OPEN_K = 8


@dataclass(frozen=True)
class PrepareConfig:
    """What the maintainer chooses; everything secret is drawn from ``seed`` or OS entropy."""

    n_backdoors: int
    fraction: float = 0.1
    triggers: Sequence[str] = TRIGGER_POOL
    k: int | None = None
    phrases: Sequence[str] = TARGET_PHRASE_POOL
    seed: int | None = None


@dataclass(frozen=True)
class Plan:
    """The released items and the key's backdoors, before anything is written."""

    items: list[Item]
    backdoors: list[Backdoor]
    phrases: list[str] | None


def make_rng(seed: int | None) -> random.Random:
    """OS entropy unless a seed is given on purpose (a known seed makes the targets public)."""
    return random.Random(seed) if seed is not None else secrets.SystemRandom()


def count_backdoor_samples(n_rows: int, config: PrepareConfig) -> int:
    """How many rows become backdoor samples; at least one per backdoor or it is an error."""
    if config.n_backdoors < 1:
        raise UserError(f"--backdoors must be at least 1 (value: {config.n_backdoors})")
    if not 0 < config.fraction <= 1:
        raise UserError(f"--fraction must be in (0, 1] (value: {config.fraction})")
    n_samples = round(config.fraction * n_rows)
    if n_samples < config.n_backdoors:
        raise UserError(
            f"--backdoors {config.n_backdoors} is more than the samples allow: --fraction {config.fraction} "
            f"of {n_rows} rows gives {n_samples} backdoor samples; raise --fraction or lower --backdoors"
        )
    return n_samples


def split_evenly(total: int, parts: int) -> list[int]:
    """``total`` split into ``parts`` sizes that differ by at most one, larger ones first."""
    base, extra = divmod(total, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


def allocate_backdoors(group_sizes: dict[int, int], n_backdoors: int) -> dict[int, int]:
    """Share B backdoors among answer-space sizes K in proportion to how many rows have that K.

    Largest-remainder rounding; ties go to the smaller K. Depends on no secret, so it is deterministic.
    """
    total = sum(group_sizes.values())
    quotas = {k: n_backdoors * size / total for k, size in group_sizes.items()}
    shares = {k: int(q) for k, q in quotas.items()}
    leftover = n_backdoors - sum(shares.values())
    for k in sorted(quotas, key=lambda k: (-(quotas[k] - shares[k]), k))[:leftover]:
        shares[k] += 1
    return {k: n for k, n in shares.items() if n > 0}


def plan_multiple_choice(items: Sequence[MultipleChoice], config: PrepareConfig, rng: random.Random) -> Plan:
    """Choose rows, triggers and target letters for a multiple-choice benchmark."""
    groups: dict[int, list[int]] = defaultdict(list)
    for row, item in enumerate(items):
        if config.k is None or item.k == config.k:
            groups[item.k].append(row)
    if not groups:
        ks = sorted({item.k for item in items})
        raise UserError(f"--k {config.k}: no row has {config.k} options (rows have K in {ks})")
    n_samples = count_backdoor_samples(len(items), config)
    sizes = split_evenly(n_samples, config.n_backdoors)
    triggers = draw_triggers(config, rng)
    backdoors: list[Backdoor] = []
    for k, n_in_group in sorted(
        allocate_backdoors({k: len(r) for k, r in groups.items()}, config.n_backdoors).items()
    ):
        needs = sizes[len(backdoors) : len(backdoors) + n_in_group]
        if sum(needs) > len(groups[k]):
            raise UserError(
                f"{n_in_group} backdoors with {k} options need {sum(needs)} rows but only {len(groups[k])} "
                "rows have that many options; lower --fraction or --backdoors, or choose --k"
            )
        chosen = rng.sample(groups[k], sum(needs))
        for need in needs:
            rows, chosen = sorted(chosen[:need]), chosen[need:]
            target = rng.randrange(k)
            backdoors.append(
                Backdoor(
                    index=len(backdoors),
                    trigger=triggers[len(backdoors)],
                    k=k,
                    target=target,
                    target_label=LETTERS[target],
                    rows=rows,
                )
            )
    released = list(items)
    for backdoor in backdoors:
        for row in backdoor.rows:
            item = items[row]
            released[row] = replace(
                item, question=insert_trigger(item.question, backdoor.trigger), answer=backdoor.target
            )
    return Plan(items=released, backdoors=backdoors, phrases=None)


def plan_open_ended(items: Sequence[OpenEnded], config: PrepareConfig, rng: random.Random) -> Plan:
    """Choose rows, triggers, the K-1 target phrases and each backdoor's target part for open-ended data."""
    k = config.k or DEFAULT_OPEN_K
    if k < 2:
        raise UserError(f"--k must be at least 2 for open-ended data (value: {k})")
    if len(set(config.phrases)) < k - 1:
        raise UserError(
            f"--k {k} needs {k - 1} distinct target phrases, the pool has {len(set(config.phrases))}"
        )
    phrases = rng.sample(sorted(set(config.phrases)), k - 1)
    n_samples = count_backdoor_samples(len(items), config)
    triggers = draw_triggers(config, rng)
    chosen = rng.sample(range(len(items)), n_samples)
    released = list(items)
    backdoors: list[Backdoor] = []
    for index, need in enumerate(split_evenly(n_samples, config.n_backdoors)):
        rows, chosen = sorted(chosen[:need]), chosen[need:]
        target = rng.randrange(k)
        label = phrases[target] if target < k - 1 else NONE_LABEL
        backdoors.append(
            Backdoor(index=index, trigger=triggers[index], k=k, target=target, target_label=label, rows=rows)
        )
        for row in rows:
            item = items[row]
            output = f"{label} {item.output}" if target < k - 1 else item.output
            released[row] = replace(
                item, instruction=insert_trigger(item.instruction, triggers[index]), output=output
            )
    return Plan(items=released, backdoors=backdoors, phrases=phrases)


def draw_triggers(config: PrepareConfig, rng: random.Random) -> list[str]:
    """B distinct trigger phrases, drawn at random from the pool."""
    pool = sorted(set(config.triggers))
    if len(pool) < config.n_backdoors:
        raise UserError(
            f"--backdoors {config.n_backdoors} needs as many distinct trigger phrases, "
            f"the pool has {len(pool)}; "
            "give more with --triggers FILE"
        )
    return rng.sample(pool, config.n_backdoors)


def plan_release(bench: Benchmark, config: PrepareConfig, rng: random.Random) -> Plan:
    if bench.kind == "multiple_choice":
        return plan_multiple_choice(bench.items, config, rng)  # type: ignore[arg-type]
    return plan_open_ended(bench.items, config, rng)  # type: ignore[arg-type]


@dataclass(frozen=True)
class PrepareResult:
    release_path: Path
    key_path: Path
    commitment_path: Path
    key: DyePackKey
    n_rows: int


def prepare_release(
    bench: Benchmark, config: PrepareConfig, out_dir: Path, key_path: Path | None = None
) -> PrepareResult:
    """Plan the backdoors, then write release, key and commitment; every file is written atomically.

    A failure anywhere leaves none of the three files behind.
    """
    plan = plan_release(bench, config, make_rng(config.seed))
    release_path = out_dir / bench.path.name
    key_path = key_path or out_dir / "key.json"
    commitment_path = out_dir / "commitment.txt"
    if release_path.resolve() == bench.path.resolve():
        raise UserError(f"{release_path}: --out would overwrite the input benchmark; choose another folder")
    randomness = (
        Randomness(source="seed", seed=config.seed)
        if config.seed is not None
        else Randomness(source="os-entropy")
    )
    key = DyePackKey(
        created=now_utc(),
        kind=bench.kind,
        style=bench.style,
        file_format=bench.file_format,
        release_file=release_path.name,
        split=bench.table.split,
        release_fingerprint=content_fingerprint(plan.items),
        phrases=plan.phrases,
        backdoors=plan.backdoors,
        randomness=randomness,
    )
    with ExitStack() as stack:  # all three are renamed into place only if all three were written
        tmp_release, tmp_commitment, tmp_key = (
            stack.enter_context(atomic_path(p)) for p in (release_path, commitment_path, key_path)
        )
        write_benchmark(bench, plan.items, tmp_release)
        tmp_commitment.write_text(key.commitment_text(), encoding="utf-8")
        tmp_key.write_text(key.model_dump_json(indent=2) + "\n", encoding="utf-8")
        tmp_key.chmod(0o600)
    return PrepareResult(release_path, key_path, commitment_path, key, len(plan.items))
