"""Why the dashboard and the report say "too few dialogues" below ``MIN_ALPHA_DIALOGUES`` (10): how often
the 95% percentile bootstrap interval of Krippendorff's alpha covers the true alpha, and how often it has no
width at all, with n dialogues of two ratings each.

Each dialogue has a latent point on a 4-point scale; each of two annotators reports it with probability
``--agreement`` and otherwise a uniform random point (the nominal scale: the first two points are "broken",
as in the example campaign). The true alpha is computed on 200,000 dialogues.

    python benchmarks/bench_star_alpha_min_n.py --agreement 0.6 --reps 400

Prints one table per level of measurement: n, the share of samples where alpha is defined, the coverage of
the interval, its median width and the share of zero-width intervals (a number with a degenerate interval,
such as "-0.500 (95% CI -0.500 to -0.500)" for 2 dialogues).
"""

from __future__ import annotations

import argparse

import numpy as np


def _ratings(rng: np.random.Generator, n: int, agreement: float) -> np.ndarray:
    truth = rng.integers(0, 4, size=n)
    noise = rng.integers(0, 4, size=(2, n))
    return np.where(rng.random((2, n)) < agreement, truth, noise).astype(float)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--agreement", type=float, default=0.6)
    parser.add_argument("--reps", type=int, default=400)
    parser.add_argument("--boot", type=int, default=500)
    parser.add_argument("--sizes", default="2,3,5,8,10,15,20,40")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()

    from assay.star.analysis.reliability import MIN_ALPHA_DIALOGUES
    from assay.stats.agreement import bootstrap_alpha_ci, krippendorff_alpha

    rng = np.random.default_rng(args.seed)
    for level in ("ordinal", "nominal"):

        def scale(data: np.ndarray, level: str = level) -> np.ndarray:
            return data if level == "ordinal" else (data < 2).astype(float)

        true = krippendorff_alpha(scale(_ratings(rng, 200_000, args.agreement)), level)
        print(f"\n{level}: true alpha {true:.3f}; minimum shown {MIN_ALPHA_DIALOGUES} dialogues")
        print(f"{'n':>4} {'defined':>8} {'coverage':>9} {'width':>6} {'zero-width':>11}")
        for n in (int(s) for s in args.sizes.split(",")):
            covered, widths, undefined = 0, [], 0
            for rep in range(args.reps):
                try:
                    ci = bootstrap_alpha_ci(
                        scale(_ratings(rng, n, args.agreement)), level, args.boot, seed=rep
                    )
                except ValueError:  # a single value: alpha undefined
                    undefined += 1
                    continue
                if not np.isfinite(ci.alpha):
                    undefined += 1
                    continue
                covered += ci.low <= true <= ci.high
                widths.append(ci.high - ci.low)
            defined = args.reps - undefined
            width = np.array(widths) if widths else np.array([np.nan])
            print(
                f"{n:>4} {defined / args.reps:>8.2f} {covered / max(defined, 1):>9.3f} "
                f"{np.nanmedian(width):>6.2f} {np.mean(width == 0):>11.3f}"
            )


if __name__ == "__main__":
    main()
