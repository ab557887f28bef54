"""Round generation throughput of ``assay zoo generate``: models per minute with 1 and 2 worker processes.

Each run builds the same models (default round config: digits, the three architectures, width 16, 20 epochs,
half poisoned, every trigger kind) into a fresh folder, so retries and model mix are identical across runs.

    python benchmarks/bench_zoo.py --models 12 --workers 1 2

Prints a table; ratios are against the 1-worker run in the same process. Run on a quiet machine: the
workers compete with anything else for the same cores.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", type=int, default=12)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    args = parser.parse_args()

    import torch

    from assay.zoo.config import RoundConfig
    from assay.zoo.round import generate_round

    torch.set_num_threads(1)  # one thread per worker, as the worker processes use
    config = RoundConfig(models=args.models, seed=args.seed)
    rows = []
    for workers in args.workers:
        with tempfile.TemporaryDirectory() as out:
            start = time.perf_counter()
            summary = generate_round(config, out, workers=workers)
            seconds = time.perf_counter() - start
        rows.append((workers, seconds, summary.rejected_attempts))
    base = rows[0][1]
    print(f"{args.models} models (default config, seed {args.seed}), {os.cpu_count()} CPUs")
    print(f"{'workers':>8} {'seconds':>9} {'models/min':>11} {'rejected':>9} {'speed-up':>9}")
    for workers, seconds, rejected in rows:
        rate, ratio = 60 * args.models / seconds, f"{base / seconds:.2f}x"
        print(f"{workers:>8} {seconds:>9.1f} {rate:>11.1f} {rejected:>9} {ratio:>9}")


if __name__ == "__main__":
    main()
