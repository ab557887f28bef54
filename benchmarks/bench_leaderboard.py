"""Leaderboard throughput: one detector job on a round's split with 1 and 2 models run at once.

Each run uses a fresh SQLite store, registers the round, submits the detector and runs the job through the
real worker and sandbox (bubblewrap where available), so the figure includes staging, isolation, result
commits and scoring.

    python benchmarks/bench_leaderboard.py build/reference-round/splits --detector meta_classifier

Prints models per minute and the speed-up against 1 worker measured in the same process.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from assay.leaderboard import rounds, submissions
from assay.leaderboard.worker import work
from assay.runner import LocalExecutor, isolation_available
from assay.store import open_store

DETECTORS = Path(__file__).resolve().parents[1] / "detectors"


def one_run(splits: Path, detector: str, split: str, workers: int, limit: int | None) -> tuple[float, int]:
    """Seconds for the whole job, and the number of models it ran (the first ``limit`` of the split)."""
    with tempfile.TemporaryDirectory() as folder:
        sessions = open_store(f"sqlite:///{folder}/lb.db")
        with sessions.begin() as session:
            created = rounds.create_round(session, "bench", splits)
            chosen = rounds.get_split(created, split)
            chosen.model_names = ",".join(rounds.split_models(chosen)[:limit])
            models = len(rounds.split_models(chosen))
            rounds.set_status(session, "bench", "open")
            rounds.add_team(session, "bench")
            submissions.submit(
                session, Path(folder) / "artifacts", "bench", "bench", split, DETECTORS / detector
            )
        start = time.perf_counter()
        work(sessions, LocalExecutor(workers), once=True)
        return time.perf_counter() - start, models


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("splits", type=Path, help="Folder written by 'assay zoo split'.")
    parser.add_argument("--detector", default="meta_classifier")
    parser.add_argument("--split", default="test")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--models", type=int, default=None, help="Only the first N models of the split.")
    args = parser.parse_args()
    rows = [(w, *one_run(args.splits, args.detector, args.split, w, args.models)) for w in args.workers]
    print(f"{args.detector} on the {args.split} split; isolation: {isolation_available()}")
    print(f"{'workers':>8} {'models':>7} {'seconds':>8} {'s/model':>8} {'models/min':>11} {'speed-up':>9}")
    base = rows[0][1]
    for workers, seconds, models in rows:
        ratio, rate = f"{base / seconds:.2f}x", 60 * models / seconds
        print(f"{workers:>8} {models:>7} {seconds:>8.1f} {seconds / models:>8.2f} {rate:>11.1f} {ratio:>9}")


if __name__ == "__main__":
    main()
