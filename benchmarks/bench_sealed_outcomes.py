"""What one sealed showing reveals, outcome by outcome: the distribution over every label vector.

A showing is one of at most 2^b values fixed before any label is read, so it carries at most b bits on
average over the labels; a single outcome can carry more (the attacker shapes its answers so the true labels
fall in a sparse showing). For a test split of ``--models`` models (default 16: all 2^16 label vectors are
enumerated exactly) and several answer designs, this prints, under ``refined`` (the default) and ``grid``
at ``--bits`` (default 8): the mean bits, the median, the share of label vectors revealing more than b and
more than 12 bits, and the most; then what the publication slot adds (log2 of the ticks a job may finish
in, ``sealing.slot_bits``) for a few clocks.

    python benchmarks/bench_sealed_outcomes.py --models 16 --bits 8
"""

from __future__ import annotations

import argparse
import platform
import time

import numpy as np

from assay.leaderboard.sealing import schedule_words, slot_bits
from assay.stats.disclosure import grid_edges, grid_information, partition


def refined_bits(predictions: np.ndarray, bits: float) -> np.ndarray:
    """Bits each label vector's refined showing reveals (n - log2 of the vectors sharing it), for every
    vector at once: the showing is (grid cell at b - 1, answer-weighted bin at b - 1) of the lattice score,
    as ``assay.stats.disclosure.refined`` computes it for one."""
    n, half = len(predictions), bits - 1.0
    table = partition(predictions, "cross_entropy", half, believed_by_answers=True)
    labels = (np.arange(2**n)[:, None] >> np.arange(n)[None, :]) & 1
    offsets = table.offsets(labels)
    scores = (table.base + offsets) * table.unit / table.n
    edges = grid_edges("cross_entropy", half)
    cells = np.clip(np.searchsorted(edges, scores, side="right") - 1, 0, len(edges) - 2)
    bins = np.searchsorted(table.ends, offsets, side="left")
    showing = cells.astype(np.int64) * (len(table.ends) + 1) + bins
    _, index, counts = np.unique(showing, return_inverse=True, return_counts=True)
    return n - np.log2(counts[index])


def designs(n: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Answer designs: issue 25's probe (log-odds 2^k), random answers, a boosting guess, a constant."""
    logits = 25.0 * 2.0 ** np.arange(n) / 2.0 ** (n - 1)
    return {
        "probe (log-odds 2^k)": 1.0 / (1.0 + np.exp(-logits)),
        "random answers": rng.uniform(0.01, 0.99, n),
        "boosting guess (0.25/0.75)": np.where(rng.random(n) < 0.5, 0.25, 0.75),
        "constant 0.5": np.full(n, 0.5),
    }


def row(name: str, mode: str, per_vector: np.ndarray, bits: float) -> str:
    return (
        f"| {name} | {mode} | {per_vector.mean():.2f} | {np.median(per_vector):.2f} | "
        f"{100 * (per_vector > bits + 1e-9).mean():.2f}% | {100 * (per_vector > 12 + 1e-9).mean():.2f}% | "
        f"{per_vector.max():.2f} |"
    )


def main() -> None:
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=raw)
    parser.add_argument("--models", type=int, default=16)
    parser.add_argument("--bits", type=float, default=8.0)
    parser.add_argument("--seed", type=int, default=2026)
    args = parser.parse_args()
    print(f"{platform.processor() or platform.machine()}, Python {platform.python_version()}")
    print(f"{args.models} models, every one of 2^{args.models} label vectors, b = {args.bits:g}\n")
    print("| answers | mode | mean bits | median | > b bits | > 12 bits | most |")
    print("|---|---|---|---|---|---|---|")
    started = time.perf_counter()
    for name, answers in designs(args.models, np.random.default_rng(args.seed)).items():
        print(row(name, "refined", refined_bits(answers, args.bits), args.bits))
        print(row(name, "grid", grid_information(answers, "cross_entropy", args.bits).bits, args.bits))
    print(f"\n({time.perf_counter() - started:.1f} s)\n")
    print("| clock | total time limit | publication slot bits |")
    print("|---|---|---|")
    for every in (600, 3600, 6 * 3600, 86_400):
        for total in (3600, 86_400):
            print(f"| {schedule_words(every)} | {total / 3600:g} h | {slot_bits(every, total):.2f} |")


if __name__ == "__main__":
    main()
