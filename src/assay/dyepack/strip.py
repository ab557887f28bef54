"""Strip risk: what a trainer who can solve the items removes from a release before training on it.

A backdoor row carries its random target as its label, so a solver rejects that label (K-1)/K of the time
whatever the row's difficulty (the solver's answer does not depend on the target). The attack measured
here is the one that stripped 24 of 24 backdoor rows from a BIG-Bench Hard release: reject every label
the solver disagrees with, drop those rows, then drop every row sharing a recurring sentence with a dropped
row (the inserted sentence a backdoor's rows share; ``audit.phrase_groups`` finds them without a key).
What it costs the trainer is the clean rows it loses: those its solver gets wrong (the ones whose answers
it wanted most) and those its phrase groups drag along. A backdoor survives while at least one of its
samples is left; the stripped release still flags a contaminated model when a model that follows exactly
the surviving backdoors would be flagged at ``alpha``.

A simulated solver of accuracy ``a`` answers each clean row right with probability ``a`` and otherwise one
of the other options at random, independently; on a backdoor row its answer is uniform over the K options,
which is exactly its distribution over the uniform target draw (P[answer = target] = 1/K at any accuracy).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import numpy as np
from pydantic import BaseModel

from assay.data.items import Item, MultipleChoice
from assay.dyepack.audit import main_text, phrase_groups
from assay.dyepack.key import Backdoor
from assay.errors import UserError
from assay.models.base import OnResult

Attack = Literal["any", "majority"]
ATTACKS: tuple[Attack, ...] = ("any", "majority")
CURVE = (0.6, 0.7, 0.8, 0.9, 0.95, 1.0)  # the solver accuracies ``prepare`` shows
REPEATS = 200  # simulated solvers averaged per accuracy


class StripRisk(BaseModel):
    """What the attack removes. Counts are means over ``repeats`` simulated solvers (1 for a real one)."""

    solver: str
    attack: Attack = "any"
    nominal: float | None = None  # a simulated solver's accuracy: a hypothetical solver, not a real one
    accuracy: float  # share of the clean rows it answered whose label it accepted
    repeats: int
    rows: int
    answered: int | None = None  # rows a real solver named an option for (None: simulated, all of them)
    answered_clean: int | None = None  # of them, clean rows: what ``accuracy`` is measured on
    backdoor_rows: int
    backdoors: int
    rejected_backdoor: float  # backdoor rows whose label the solver rejects
    rejected_clean: float  # clean rows whose label it rejects: rows it gets wrong
    grouped_backdoor: float  # rows the phrase groups of rejected rows add
    grouped_clean: float
    surviving: float  # backdoors with at least one sample left
    flags: float  # share of solvers after whose stripping a contaminated model is still flagged
    alpha: float

    @property
    def unparsed(self) -> int:
        """Rows whose reply named no option: their labels are kept, as if accepted, so a solver that
        abstains looks more accurate than it is; the report counts them."""
        return 0 if self.answered is None else self.rows - self.answered

    @property
    def removed_backdoor(self) -> float:
        return self.rejected_backdoor + self.grouped_backdoor

    @property
    def lost_clean(self) -> float:
        return self.rejected_clean + self.grouped_clean

    @property
    def cost(self) -> float | None:
        """Clean rows lost per backdoor row removed (None when nothing was removed)."""
        return self.lost_clean / self.removed_backdoor if self.removed_backdoor else None

    def summary(self) -> dict:
        return {
            **self.model_dump(),
            "unparsed": self.unparsed,
            "exactly_solvable": exactly_solvable(self),
            "removed_backdoor": self.removed_backdoor,
            "lost_clean": self.lost_clean,
            "cost": self.cost,
        }


def check_multiple_choice(items: Sequence[Item]) -> None:
    if not items or not isinstance(items[0], MultipleChoice):
        raise UserError("strip risk is measured on multiple-choice releases (a solver rejects a label)")


def attacker_groups(items: Sequence[Item], backdoors: Sequence[Backdoor]) -> np.ndarray:
    """Each row's recurring-sentence group (-1 for none), as ``audit.phrase_groups`` finds them; the cap
    (twice the largest backdoor) is lent from the key, as the audit lends it."""
    cap = 2 * max(len(b.rows) for b in backdoors)
    groups = phrase_groups([main_text(item) for item in items], cap)
    shared = np.bincount(groups)
    return np.where(shared[groups] >= 2, groups, -1)


def strip_counts(
    rejected: np.ndarray, groups: np.ndarray, backdoor: np.ndarray, n_backdoors: int, attack: Attack = "any"
) -> tuple[np.ndarray, np.ndarray]:
    """For solvers in rows of ``rejected`` (solvers x rows, True where the label is rejected): the rows
    the attack removes and the backdoors surviving. Beside the rejected rows it removes a phrase group
    with any rejected row (``any``, the attack that stripped BBH) or with at least half its rows rejected
    (``majority``: a backdoor's rows are rejected (K-1)/K of the time, a clean row's only when wrong)."""
    rejected = np.atleast_2d(rejected)
    removed = rejected.copy()
    in_group = groups >= 0
    if in_group.any():
        from scipy.sparse import csr_matrix

        rows = np.flatnonzero(in_group)
        ids = np.unique(groups[rows], return_inverse=True)[1]
        member = csr_matrix((np.ones(len(rows)), (np.arange(len(rows)), ids)))  # rows x groups
        hits = np.asarray((member.T @ rejected[:, rows].T.astype(np.float32)).T)  # solvers x groups
        sizes = np.bincount(ids)
        dropped = hits > 0 if attack == "any" else 2 * hits >= sizes
        removed[:, rows] |= dropped[:, ids]
    left = np.zeros((rejected.shape[0], n_backdoors), dtype=bool)
    for b in range(n_backdoors):
        left[:, b] = (~removed[:, backdoor == b]).any(axis=1)
    return removed, left.sum(axis=1)


def risk_from_rejections(
    solver: str,
    rejected: np.ndarray,
    items: Sequence[Item],
    backdoors: Sequence[Backdoor],
    alpha: float,
    groups: np.ndarray | None = None,
    attack: Attack = "any",
    answered: np.ndarray | None = None,
) -> StripRisk:
    """Average the attack over the solvers in ``rejected`` (solvers x rows). ``answered`` (rows, a real
    solver's): where it named an option; accuracy is then over the clean rows it answered, and the rows
    it left unanswered are counted (their labels stay, as if accepted)."""
    from assay.dyepack.verify import false_positive_rate

    backdoor = np.full(len(items), -1)
    for b in backdoors:
        backdoor[b.rows] = b.index
    groups = attacker_groups(items, backdoors) if groups is None else groups
    rejected = np.atleast_2d(rejected)
    removed, surviving = strip_counts(rejected, groups, backdoor, len(backdoors), attack)
    is_bd = backdoor >= 0
    ks = [b.k for b in backdoors]
    fprs = {s: false_positive_rate(ks, s).fpr if s else 1.0 for s in set(surviving.tolist())}
    grouped = removed & ~rejected
    judged = ~is_bd if answered is None else ~is_bd & answered  # clean rows with an answer
    return StripRisk(
        solver=solver,
        attack=attack,
        accuracy=float(1 - rejected[:, judged].mean()) if judged.any() else 0.0,
        repeats=rejected.shape[0],
        rows=len(items),
        answered=None if answered is None else int(answered.sum()),
        answered_clean=None if answered is None else int(judged.sum()),
        backdoor_rows=int(is_bd.sum()),
        backdoors=len(backdoors),
        rejected_backdoor=float(rejected[:, is_bd].sum(axis=1).mean()),
        rejected_clean=float(rejected[:, ~is_bd].sum(axis=1).mean()),
        grouped_backdoor=float(grouped[:, is_bd].sum(axis=1).mean()),
        grouped_clean=float(grouped[:, ~is_bd].sum(axis=1).mean()),
        surviving=float(surviving.mean()),
        flags=float(np.mean([fprs[s] <= alpha for s in surviving.tolist()])),
        alpha=alpha,
    )


def simulated_rejections(
    items: Sequence[Item], backdoors: Sequence[Backdoor], accuracy: float, repeats: int, seed: int
) -> np.ndarray:
    """Which labels ``repeats`` simulated solvers of ``accuracy`` reject (solvers x rows); see the module
    docstring. Seeded: the same release and seed give the same figures."""
    if not 0 <= accuracy <= 1:
        raise UserError(f"--solver-accuracy must be between 0 and 1 (value: {accuracy})")
    rng = np.random.default_rng(seed)
    rejected = rng.random((repeats, len(items))) >= accuracy  # a clean row's label is true: wrong = rejected
    for b in backdoors:
        # Uniform answer over K, the target is one of them: rejected unless the answer is the target.
        rejected[:, b.rows] = rng.random((repeats, len(b.rows))) >= 1 / b.k
    return rejected


def simulated_risk(
    items: Sequence[Item],
    backdoors: Sequence[Backdoor],
    accuracy: float,
    alpha: float,
    repeats: int = REPEATS,
    seed: int = 0,
    groups: np.ndarray | None = None,
    attack: Attack = "any",
) -> StripRisk:
    """The attack by ``repeats`` simulated solvers of ``accuracy``, averaged."""
    check_multiple_choice(items)
    rejected = simulated_rejections(items, backdoors, accuracy, repeats, seed)
    name = f"simulated, accuracy {accuracy:g}"
    risk = risk_from_rejections(name, rejected, items, backdoors, alpha, groups, attack)
    return risk.model_copy(update={"nominal": accuracy})


def strip_curve(
    items: Sequence[Item],
    backdoors: Sequence[Backdoor],
    alpha: float,
    accuracies: Sequence[float] = CURVE,
    repeats: int = REPEATS,
    seed: int = 0,
) -> list[StripRisk]:
    """``simulated_risk`` at each accuracy under each attack, the phrase groups found once."""
    check_multiple_choice(items)
    groups = attacker_groups(items, backdoors)
    return [
        simulated_risk(items, backdoors, a, alpha, repeats, seed, groups, attack)
        for a in accuracies
        for attack in ATTACKS
    ]


def solver_answers(
    spec: str, items: Sequence[Item], batch_size: int = 8, on_result: OnResult | None = None
) -> list[int | None]:
    """The option a model (any spec ``assay.models`` loads) picks for each released row, asked in our
    chat format with the trigger or cover sentence in place, as an attacker would ask it."""
    from assay.dyepack.extract import extract_choice
    from assay.dyepack.prompts import PromptFormat
    from assay.models.base import GenerationParams
    from assay.models.spec import load_model

    check_multiple_choice(items)
    model = load_model(spec, batch_size=batch_size)
    fmt = PromptFormat()
    replies = model.chat([fmt.chat(item) for item in items], GenerationParams(max_new_tokens=32), on_result)
    return [extract_choice(reply, item.options) for reply, item in zip(replies, items, strict=True)]  # type: ignore[union-attr]


def solver_rejections(answers: Sequence[int | None], items: Sequence[Item]) -> np.ndarray:
    """Labels a real solver rejects: it named an option other than the released one (no option: kept)."""
    return np.array(
        [a is not None and a != item.answer for a, item in zip(answers, items, strict=True)]  # type: ignore[union-attr]
    )


def solver_answered(answers: Sequence[int | None]) -> np.ndarray:
    """Rows where a real solver named an option (``solver_answers`` gives None where it named none)."""
    return np.array([a is not None for a in answers], dtype=bool)


def exactly_solvable(risk: StripRisk) -> bool:
    """A real solver answered every row and accepted every clean label: stripping costs nothing, and no
    placement can change that. Never said of a simulated solver (it is imagined), nor of one that left
    rows unanswered (an unanswered row's label is kept, which is not accepting it)."""
    return (
        risk.nominal is None
        and risk.answered == risk.rows
        and risk.rejected_clean == 0
        and risk.removed_backdoor > 0
    )


def answered_text(risk: StripRisk) -> str:
    """What the accuracy rests on: a real solver's answered and unparsed rows, or a hypothetical one."""
    if risk.nominal is not None:
        return f"a hypothetical solver of accuracy {risk.nominal:g} on every row (simulated, not measured)"
    return (
        f"answered {risk.answered} of {risk.rows} rows ({risk.unparsed} unparsed, their labels kept); "
        f"accuracy {risk.accuracy:.3g} over the {risk.answered_clean} clean rows it answered"
    )


def verdict(risk: StripRisk) -> str:
    """One line a maintainer reads first."""
    cost = "no clean row" if risk.cost is None else f"{risk.cost:.2f} clean rows per backdoor row removed"
    head = (
        f"{risk.solver} ({answered_text(risk)}): strips {risk.removed_backdoor:.1f} of {risk.backdoor_rows} "
        f"backdoor rows at {cost}; {risk.surviving:.1f} of {risk.backdoors} backdoors survive"
    )
    still = "still flags" if risk.flags >= 0.5 else "no longer flags"
    flags = f"the stripped release {still} a contaminated model at alpha {risk.alpha:g}"
    if risk.nominal is not None and risk.nominal == 1 and risk.lost_clean == 0:
        return (
            f"{head}; {flags}. Such a solver would strip the dye packs at no cost; whether one exists for "
            "this task is not measured here: run audit --solver with a real one."
        )
    if risk.unparsed and risk.rejected_clean == 0:
        return (
            f"{head}; {flags}. It rejected no clean label it answered, but left {risk.unparsed} rows "
            "unanswered: that does not show the task is exactly solvable."
        )
    if exactly_solvable(risk):
        return (
            f"{head}. The solver answered every row and got every clean row right: this task is exactly "
            "solvable, so a solver strips the dye packs at no cost, and no choice of rows, cover or fraction "
            "helps."
        )
    return f"{head}; {flags}."
