"""What the contamination-board tests share: two small releases and models that did or did not see them.

The models are stand-ins, said plainly: a *memoriser* of a release answers each released question with the
answer the release gives it (the letter in the released file, which on backdoor rows is the secret target:
exactly what a model trained on the file would have learned); it never reads the key. Asked about a
question it has not seen, it says "A", as the *clean* model always does. The board's job is the matrix and
its rules, not the detection (that is tested with real fine-tuned models in test_dyepack_contamination.py).

    kit = make_releases(tmp / "keys")               # keys/a/{items.jsonl,key.json,commitment.txt}, keys/b/...
    spec = python_memoriser(tmp, kit["a"].release_path)
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from scipy import stats as scipy_stats

from assay.data import read_benchmark
from assay.data.items import LETTERS
from assay.dyepack.prepare import PrepareConfig, PrepareResult, prepare_release

SUBJECTS = ("river", "mountain", "village", "harbour", "castle", "forest", "valley", "island")


def mc_rows(n: int, seed: int) -> list[dict]:
    """``n`` distinct four-option questions, as HF ``cais/mmlu`` rows."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        place = SUBJECTS[i % len(SUBJECTS)]
        options = [str(a + b + d) for d in rng.sample(range(-9, 10), 4)]
        question = (
            f"Survey {seed}-{i}: The {place} counted {a} boats in spring and {b} in autumn. How many in all?"
        )
        rows.append({"question": question, "choices": options, "answer": rng.randrange(4), "subject": place})
    return rows


def make_releases(
    keys: Path, names: tuple[str, ...] = ("a", "b"), rows: int = 60
) -> dict[str, PrepareResult]:
    """One release per name under ``keys/NAME/`` (release, key.json, commitment.txt), as ``prepare`` writes
    them: 6 backdoors with K = 4 (a clean model flags with probability 4^-6), drawn from fixed seeds."""
    made = {}
    for seed, name in enumerate(names, start=11):
        source = keys.parent / f"source-{name}" / "items.jsonl"
        source.parent.mkdir(parents=True, exist_ok=True)
        source.write_text("".join(json.dumps(r) + "\n" for r in mc_rows(rows, seed)), encoding="utf-8")
        config = PrepareConfig(n_backdoors=6, fraction=0.2, seed=seed)
        made[name] = prepare_release(read_benchmark(source), config, keys / name)
    return made


def memorised(release: Path) -> dict[str, str]:
    """Question -> the answer letter the released file gives it."""
    items = read_benchmark(release).items
    return {item.question: LETTERS[item.answer] for item in items}  # type: ignore[union-attr]


def recall(table: dict[str, str], prompt: str) -> str:
    """The reply of a model that memorised ``table``: the answer of the released question asked last in
    the prompt (few-shot examples come before it), else "A"."""
    seen = [(prompt.rfind(q), len(q), letter) for q, letter in table.items() if q in prompt]
    return f"The answer is ({max(seen)[2]})." if seen else "The answer is (A)."


def expected_activated(prepared: PrepareResult, table: dict[str, str] | None) -> int:
    """Backdoors whose majority answer is the target, for a memoriser of ``table`` (None: always A),
    worked out from the key and the released file, without the pillar."""
    questions = [item.question for item in read_benchmark(prepared.release_path).items]  # type: ignore[union-attr]
    activated = 0
    for backdoor in prepared.key.backdoors:
        letters = [recall(table or {}, questions[row])[-3] for row in backdoor.rows]
        top = max(sorted(set(letters)), key=letters.count)
        activated += top == backdoor.target_label
    return activated


def tail(activated: int, backdoors: int = 6, k: int = 4) -> float:
    """P[Binomial(backdoors, 1/k) >= activated], by scipy."""
    return float(scipy_stats.binom.sf(activated - 1, backdoors, 1 / k))


MEMORISER = """
import json
from board_kit import recall
TABLE = json.loads({table!r})
def answer(prompts):
    return [recall(TABLE, p) for p in prompts]
"""


def python_memoriser(folder: Path, release: Path, name: str = "memoriser") -> str:
    """A ``python:`` spec of a model that memorised ``release``."""
    path = folder / f"{name}.py"
    path.write_text(MEMORISER.format(table=json.dumps(memorised(release))), encoding="utf-8")
    return f"python:{path}:answer"


def python_clean(folder: Path) -> str:
    """A ``python:`` spec of a model that saw no release: it always answers (A)."""
    path = folder / "clean.py"
    path.write_text(
        "def answer(prompts):\n    return ['The answer is (A).' for _ in prompts]\n", encoding="utf-8"
    )
    return f"python:{path}:answer"
