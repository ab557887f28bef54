"""Krippendorff's alpha throughput: seconds per call at each level of measurement on STAR-sized annotations.

The data are 4-point ordinal ratings (1-4) from 3 coders on 100,000 units, each coder agreeing with a latent
true rating 70% of the time, and 10% of codes missing at random, so every level sees the same values.

    python benchmarks/bench_agreement.py --units 100000 --coders 3 --repeats 3

Prints a table; ratios are against the nominal level in the same process (best of the repeats). The goal is
under 2 s per call.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np


def _ratings(units: int, coders: int, missing: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    truth = rng.integers(1, 5, size=units)
    noise = rng.integers(1, 5, size=(coders, units))
    data = np.where(rng.random((coders, units)) < 0.7, truth, noise).astype(float)
    data[rng.random(data.shape) < missing] = np.nan
    return data


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--units", type=int, default=100_000)
    parser.add_argument("--coders", type=int, default=3)
    parser.add_argument("--missing", type=float, default=0.1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    from assay.stats.agreement import LEVELS, krippendorff_alpha

    data = _ratings(args.units, args.coders, args.missing, args.seed)
    rows = []
    for level in LEVELS:
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            value = krippendorff_alpha(data, level)
            times.append(time.perf_counter() - start)
        rows.append((level, min(times), value))
    base = rows[0][1]
    print(
        f"{args.units:,} units x {args.coders} coders, 4-point ratings, {args.missing:.0%} missing, "
        f"best of {args.repeats}, {os.cpu_count()} CPUs"
    )
    print(f"{'level':>9} {'s/call':>8} {'alpha':>8} {'vs nominal':>11}")
    for level, seconds, value in rows:
        print(f"{level:>9} {seconds:>8.3f} {value:>8.4f} {seconds / base:>10.2f}x")


if __name__ == "__main__":
    main()
