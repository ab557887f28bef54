"""Hide B backdoors ("dye packs") in a benchmark before release.

Each backdoor i gets a trigger phrase, an answer space of size K_i and a target drawn uniformly from it.
Its samples carry the trigger in the question, placed per row where a sentence reads naturally
(``triggers.place_trigger``), and the target as their answer; nothing else marks them.
For multiple choice, all samples of one backdoor have the same number of options, so "the target" means
the same letter for each of them; no sample goes on a row whose label a rule without the key reads from
the row's shape (``priors.set_aside``: in BIG-Bench Hard geometric_shapes every 11-option row is (K)).
For open-ended data the output space is split by K-1 target phrases plus "none of them"; a sample whose
target is a phrase gets that phrase before its reference output.
"""

from __future__ import annotations

import random
import secrets
from collections import Counter, defaultdict
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from pathlib import Path

from assay.data import Benchmark, write_benchmark
from assay.data.items import LETTERS, Item, MultipleChoice, OpenEnded, content_fingerprint, item_kind
from assay.dyepack.audit import StealthAudit, audit_items
from assay.dyepack.fpr import smallest_fpr, weakness
from assay.dyepack.ids import check_unique
from assay.dyepack.key import NONE_LABEL, Backdoor, DyePackKey, Randomness, now_utc
from assay.dyepack.priors import Columns, LabelClass, category_columns, describe_all, set_aside
from assay.dyepack.strip import StripRisk, strip_curve
from assay.dyepack.triggers import (
    TARGET_PHRASE_POOL,
    TRIGGER_POOL,
    Position,
    check_sentences,
    choose_position,
    place_trigger,
)
from assay.errors import UserError
from assay.fileio import atomic_path

DEFAULT_OPEN_K = 10  # the paper's K for open-ended benchmarks


@dataclass(frozen=True)
class PrepareConfig:
    """What the maintainer chooses; everything secret is drawn from ``seed`` or OS entropy."""

    n_backdoors: int
    fraction: float = 0.1
    triggers: Sequence[str] = TRIGGER_POOL
    k: int | None = None
    phrases: Sequence[str] = TARGET_PHRASE_POOL
    seed: int | None = None
    position: Position = field(default_factory=Position)
    cover: float = 1.0  # share of the other rows that carry a cover phrase (see ``cover_groups``)


@dataclass(frozen=True)
class Plan:
    """The released items and the key's backdoors, before anything is written."""

    items: list[Item]
    backdoors: list[Backdoor]
    phrases: list[str] | None
    positions: Counter[str]  # how many backdoor samples got each trigger position
    cover_rows: int = 0  # rows that carry a cover phrase
    set_aside: tuple[LabelClass, ...] = ()  # classes whose label a key-less rule reads (``priors``)
    set_aside_rows: int = 0  # candidate rows no backdoor went on because of them


TEXT_FIELDS = {"multiple_choice": ("question",), "open_ended": ("instruction", "input")}


def trigger_field(items: Sequence[Item], position: Position) -> str:
    """The item field the triggers go in: the question or instruction, or ``field:NAME`` if it is shown."""
    fields = TEXT_FIELDS[item_kind(items[0])]
    name = position.field or fields[0]
    if name not in fields:
        raise UserError(
            f"--trigger-position field:{name}: a trigger must go in a field the prompt shows; "
            f"for this benchmark: {', '.join(fields)}"
        )
    return name


def with_phrase(item: Item, field: str, phrase: str, how: str, rng: random.Random) -> tuple[Item, str]:
    """``item`` with ``phrase`` in ``field`` at a position chosen for this row, and that position."""
    text = getattr(item, field)
    where = choose_position(text, how, rng)
    return replace(item, **{field: place_trigger(text, phrase, where)}), where


def answer_bucket(item: Item) -> tuple[int, ...]:
    """Rows a cover phrase may share: same K and same answer, as every sample of a backdoor has."""
    return (item.k, item.answer) if isinstance(item, MultipleChoice) else (0, 0)


def cover_groups(
    items: Sequence[Item],
    free: list[int],
    sizes: list[int],
    phrases: list[str],
    share: float,
    rng: random.Random,
) -> list[tuple[list[int], str]]:
    """Groups of non-backdoor rows that each carry one unused phrase the way a backdoor carries its trigger.

    A lone trigger sentence in a templated benchmark (every BIG-Bench Hard row of a task is the same
    template) gives its rows away to a diff, a classifier or a count of repeated sentences. Cover rows
    look the same from every side: the same kind of sentence at the same positions, recurring in groups
    of the backdoors' sizes, each group's rows sharing K and answer as a backdoor's samples do (rows left
    over in small K and answer buckets are grouped by K, then at all). What still tells a backdoor apart
    is only that its answers are wrong, which takes solving the items.
    """
    candidates: list[list[int]] = []
    left = list(free)
    # Rows with the same K and answer first; what is left over, by K, then all together: a row without
    # any phrase would be known clean, and the rest a smaller haystack.
    for bucket in (answer_bucket, lambda item: answer_bucket(item)[:1], lambda item: ()):
        found, left = split_into_groups([(bucket(items[row]), row) for row in left], sizes, rng)
        rng.shuffle(found)
        candidates += found
    pool = list(phrases)
    rng.shuffle(pool)
    budget = round(share * len(free))
    groups: list[tuple[list[int], str]] = []
    for rows, phrase in zip(candidates, pool, strict=False):
        if budget < len(rows):
            break
        groups.append((rows, phrase))
        budget -= len(rows)
    return groups


def split_into_groups(
    keyed: list[tuple[tuple[int, ...], int]], sizes: list[int], rng: random.Random
) -> tuple[list[list[int]], list[int]]:
    """Rows split into groups of the given sizes within each key; returns the groups and the rows left."""
    buckets: dict[tuple[int, ...], list[int]] = defaultdict(list)
    for key, row in keyed:
        buckets[key].append(row)
    groups: list[list[int]] = []
    left: list[int] = []
    for key in sorted(buckets):
        rows = buckets[key]
        rng.shuffle(rows)
        while fitting := [size for size in sizes if size <= len(rows)]:
            size = rng.choice(fitting)
            groups.append(sorted(rows[:size]))
            rows = rows[size:]
        left += rows
    return groups, left


def mark_rows(
    items: Sequence[Item],
    released: list[Item],
    backdoors: list[Backdoor],
    eligible: list[int],
    config: PrepareConfig,
    rng: random.Random,
) -> tuple[Counter[str], int]:
    """Put each backdoor's trigger in its samples and cover phrases in other rows, in place in ``released``.

    Returns how many samples got each position, and how many rows carry a cover phrase.
    """
    name, how = trigger_field(items, config.position), config.position.how
    positions: Counter[str] = Counter()
    for backdoor in backdoors:
        for row in backdoor.rows:
            released[row], where = with_phrase(released[row], name, backdoor.trigger, how, rng)
            positions[where] += 1
    taken = {row for backdoor in backdoors for row in backdoor.rows}
    unused = sorted(set(config.triggers) - {backdoor.trigger for backdoor in backdoors})
    free = [row for row in eligible if row not in taken]
    groups = cover_groups(items, free, [len(b.rows) for b in backdoors], unused, config.cover, rng)
    for rows, phrase in groups:
        for row in rows:
            released[row], _ = with_phrase(released[row], name, phrase, how, rng)
    return positions, sum(len(rows) for rows, _ in groups)


def eligible_rows(items: Sequence[Item], config: PrepareConfig) -> list[int]:
    """Rows whose trigger field has text (an empty Alpaca ``input`` cannot hide a sentence)."""
    name = trigger_field(items, config.position)
    return [row for row, item in enumerate(items) if getattr(item, name).strip()]


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


def aside_reason(classes: Sequence[LabelClass]) -> str:
    """Why rows were set aside, naming the classes (the first three), for one-line messages."""
    return f"rows whose label a rule without the key reads are set aside ({describe_all(classes)})"


def draft_multiple_choice(
    items: Sequence[MultipleChoice],
    config: PrepareConfig,
    rng: random.Random,
    columns: Columns | None = None,
) -> Plan:
    """Choose rows and triggers (targets come later, ``draw_targets``) for a multiple-choice benchmark.

    Rows of a class that would expose its backdoor samples to a rule without the key (``priors.set_aside``;
    ``columns``: the benchmark's categorical columns, candidate class keys) are set aside first; what is
    set aside depends on the source labels alone, never on a target or a draw."""
    candidates = [row for row, item in enumerate(items) if config.k is None or item.k == config.k]
    if not candidates:
        ks = sorted({item.k for item in items})
        raise UserError(f"--k {config.k}: no row has {config.k} options (rows have K in {ks})")
    n_samples = count_backdoor_samples(len(items), config)
    kept, exposed = set_aside(items, columns, candidates, n_samples)
    if len(kept) < n_samples:
        which, other = (f"--k {config.k}: ", ", or choose another --k") if config.k is not None else ("", "")
        raise UserError(
            f"{which}{n_samples} backdoor samples need as many rows, {len(kept)} are left once "
            f"{aside_reason(exposed)}; lower --fraction or --backdoors{other}"
        )
    groups: dict[int, list[int]] = defaultdict(list)
    for row in kept:
        groups[items[row].k].append(row)
    sizes = split_evenly(n_samples, config.n_backdoors)
    triggers = draw_triggers(config, rng)
    backdoors: list[Backdoor] = []
    for k, n_in_group in sorted(
        allocate_backdoors({k: len(r) for k, r in groups.items()}, config.n_backdoors).items()
    ):
        needs = sizes[len(backdoors) : len(backdoors) + n_in_group]
        if sum(needs) > len(groups[k]):
            left = f" once {aside_reason(exposed)}" if exposed else ""
            raise UserError(
                f"{n_in_group} backdoors with {k} options need {sum(needs)} rows but only {len(groups[k])} "
                f"rows have that many options{left}; lower --fraction or --backdoors, or choose --k"
            )
        chosen = rng.sample(groups[k], sum(needs))
        for need in needs:
            rows, chosen = sorted(chosen[:need]), chosen[need:]
            backdoors.append(undrawn(len(backdoors), triggers[len(backdoors)], k, rows))
    released: list[Item] = list(items)
    positions, cover = mark_rows(items, released, backdoors, list(range(len(items))), config, rng)
    return Plan(released, backdoors, None, positions, cover, tuple(exposed), len(candidates) - len(kept))


def undrawn(index: int, trigger: str, k: int, rows: list[int]) -> Backdoor:
    """A backdoor whose target is not drawn yet (``draw_targets`` draws it once the draft is kept)."""
    return Backdoor(index=index, trigger=trigger, k=k, target=0, target_label="", rows=rows)


def draw_targets(draft: Plan, rng: random.Random) -> Plan:
    """The draft with each backdoor's target drawn uniformly from its K parts, and its samples relabelled.

    Drawn last, after the draft has passed the stealth audit and nothing else is chosen: every earlier
    choice (rows, triggers, positions, cover, the redraws) is made before any target exists, so the targets
    are uniform and independent of all of it, which is what the false-positive rate rests on.
    """
    released = list(draft.items)
    backdoors: list[Backdoor] = []
    for backdoor in draft.backdoors:
        target = rng.randrange(backdoor.k)
        if draft.phrases is None:
            label = LETTERS[target]
            for row in backdoor.rows:
                released[row] = replace(released[row], answer=target)
        else:
            label = draft.phrases[target] if target < backdoor.k - 1 else NONE_LABEL
            if target < backdoor.k - 1:
                for row in backdoor.rows:
                    released[row] = replace(released[row], output=f"{label} {released[row].output}")
        backdoors.append(backdoor.model_copy(update={"target": target, "target_label": label}))
    return replace(draft, items=released, backdoors=backdoors)


def draft_open_ended(items: Sequence[OpenEnded], config: PrepareConfig, rng: random.Random) -> Plan:
    """Choose rows, triggers and the K-1 target phrases for open-ended data (targets come later)."""
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
    eligible = eligible_rows(items, config)
    if len(eligible) < n_samples:
        raise UserError(
            f"--trigger-position field:{trigger_field(items, config.position)}: {n_samples} backdoor "
            f"samples need as many rows where that field has text, the benchmark has {len(eligible)}"
        )
    chosen = rng.sample(eligible, n_samples)
    released: list[Item] = list(items)
    backdoors: list[Backdoor] = []
    for index, need in enumerate(split_evenly(n_samples, config.n_backdoors)):
        rows, chosen = sorted(chosen[:need]), chosen[need:]
        backdoors.append(undrawn(index, triggers[index], k, rows))
    positions, cover = mark_rows(items, released, backdoors, eligible, config, rng)
    return Plan(released, backdoors, phrases, positions, cover)


def draw_triggers(config: PrepareConfig, rng: random.Random) -> list[str]:
    """B distinct trigger phrases, drawn at random from the pool."""
    pool = sorted(set(config.triggers))
    check_sentences(pool, config.position)
    if len(pool) < config.n_backdoors:
        raise UserError(
            f"--backdoors {config.n_backdoors} needs as many distinct trigger phrases, "
            f"the pool has {len(pool)}; "
            "give more with --triggers FILE"
        )
    return rng.sample(pool, config.n_backdoors)


def draft_release(
    bench: Benchmark, config: PrepareConfig, rng: random.Random, columns: Columns | None = None
) -> Plan:
    """Everything but the targets: rows, triggers, their positions and the cover. ``columns``: the
    benchmark's ``priors.category_columns``, found here when not given."""
    if bench.kind == "multiple_choice":
        columns = category_columns(bench) if columns is None else columns
        return draft_multiple_choice(bench.items, config, rng, columns)  # type: ignore[arg-type]
    return draft_open_ended(bench.items, config, rng)  # type: ignore[arg-type]


def plan_release(bench: Benchmark, config: PrepareConfig, rng: random.Random) -> Plan:
    """A draft and its targets, without the audit."""
    return draw_targets(draft_release(bench, config, rng), rng)


def plan_multiple_choice(items: Sequence[MultipleChoice], config: PrepareConfig, rng: random.Random) -> Plan:
    return draw_targets(draft_multiple_choice(items, config, rng), rng)


def plan_open_ended(items: Sequence[OpenEnded], config: PrepareConfig, rng: random.Random) -> Plan:
    return draw_targets(draft_open_ended(items, config, rng), rng)


@dataclass(frozen=True)
class PrepareResult:
    release_path: Path
    key_path: Path
    commitment_path: Path
    key: DyePackKey
    n_rows: int
    positions: Counter[str]
    cover_rows: int
    audit: StealthAudit | None
    draws: int = 1
    strip: list[StripRisk] | None = None  # the simulated strip-risk curve (multiple choice)
    smallest_fpr: float = 0.0  # every backdoor activated: the strongest accusation the release can make
    weak: str | None = None  # why it can never flag at alpha (``fpr.weakness``), None when it can
    set_aside: tuple[LabelClass, ...] = ()  # classes no backdoor went on: a key-less rule reads their label
    set_aside_rows: int = 0


def draw_release(
    bench: Benchmark, config: PrepareConfig, audit: bool, redraws: int
) -> tuple[Plan, StealthAudit | None, int]:
    """The plan ``prepare_release`` writes, its audit, and how many draws it took."""
    rng, draws = make_rng(config.seed), 0
    columns = category_columns(bench)
    while True:
        draws += 1
        draft = draft_release(bench, config, rng, columns)
        # The audit sees no target (none is drawn yet, and it masks backdoor rows' labels anyway), so
        # whether a draft passes cannot depend on the targets: they stay uniform given a pass.
        stealth = audit_items(draft.items, draft.backdoors, columns=columns) if audit else None
        if stealth is None or stealth.passes or draws > redraws:
            return draw_targets(draft, rng), stealth, draws


def release_paths(source: Path, out_dir: Path, key_path: Path | None = None) -> tuple[Path, Path, Path]:
    """Where ``prepare_release`` writes the release of ``source``, its commitment and its key. A caller
    that names no key gets ``OUT/key.json`` (tests, the web demo); the command line always names one,
    outside the folder (``outputs.default_key_path``)."""
    return out_dir / source.name, out_dir / "commitment.txt", key_path or out_dir / "key.json"


def prepare_release(
    bench: Benchmark,
    config: PrepareConfig,
    out_dir: Path,
    key_path: Path | None = None,
    audit: bool = False,
    redraws: int = 3,
    strip_risk: bool = False,
    alpha: float = 1e-3,
    allow_weak: bool = True,
) -> PrepareResult:
    """Plan the backdoors, then write release, key and commitment; every file is written atomically.

    Rows whose label a rule without the key reads (``priors``) never get a backdoor; the result names
    them. With ``audit``, the stealth audit (``audit.audit_items``, a second or so with scikit-learn) runs on
    the planned release before anything is written, and a release that does not pass it is drawn afresh
    up to ``redraws`` times. This keeps the false-positive rate exact: the targets are drawn after the
    last draw is kept, and the audit masks backdoor rows' labels (``audit.masked_answers``), so passing
    says nothing about the targets, which stay uniform. With ``strip_risk`` (multiple choice), what
    simulated solvers of accuracy 0.6 to 1.0 strip from the release (``strip.strip_curve``). A failure
    anywhere leaves none of the three files. A benchmark whose ``id`` column repeats a value is refused
    first (``ids.check_unique``): an answer sheet could not tell those rows apart. A release whose
    smallest possible FPR (every backdoor activated) exceeds ``alpha`` can never flag a model: without
    ``allow_weak`` it is refused before anything is written; with it, ``PrepareResult.weak`` says so.
    """
    check_unique(bench.path, bench.table.rows, bench.table.locations)
    plan, stealth, draws = draw_release(bench, config, audit, redraws)
    ks = [b.k for b in plan.backdoors]
    weak = weakness(ks, alpha)
    if weak is not None and not allow_weak:
        raise UserError(f"{bench.path}: {weak} (or pass --allow-weak)")
    release_path, commitment_path, key_path = release_paths(bench.path, out_dir, key_path)
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
    return PrepareResult(
        release_path,
        key_path,
        commitment_path,
        key,
        len(plan.items),
        plan.positions,
        plan.cover_rows,
        stealth,
        draws=draws,
        smallest_fpr=smallest_fpr(ks),
        weak=weak,
        set_aside=plan.set_aside,
        set_aside_rows=plan.set_aside_rows,
        strip=strip_curve(plan.items, plan.backdoors, alpha) if strip_risk and not plan.phrases else None,
    )
