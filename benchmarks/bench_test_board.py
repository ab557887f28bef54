"""The sealed test board as performers see it: the three baselines on a round's test split, each mode.

Runs ``constant``, ``meta_classifier`` and ``neural_cleanse`` as three teams through the real worker and
sandbox on the first ``--models`` models of the test split (fresh SQLite store), then shows the public
standings of the same jobs under each disclosure mode (``grid``, ``bins``, ``exact``: the round's setting
changed and the jobs re-scored by the harness's own ``score_job``), beside each team's exact cross entropy.
A board is useful when its order equals the exact order and the good detectors are not tied.

    python benchmarks/bench_test_board.py build/reference-round/splits --models 40

Prints the machine, then one table per mode: rank, team, exact CE, what the team is shown, interval width.
``--answers FILE`` also keeps each team's answers and the labels (JSON), so modes can be compared later
without running the detectors again.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path

from sqlalchemy import select

from assay.leaderboard import publish, rounds, submissions
from assay.leaderboard.harness import score_job
from assay.leaderboard.scoring import read_truth
from assay.leaderboard.worker import work
from assay.runner import LocalExecutor, isolation_available
from assay.store import Job, open_store

DETECTORS = Path(__file__).resolve().parents[1] / "detectors"
BASELINES = ("constant", "meta_classifier", "neural_cleanse")


def machine() -> str:
    """The facts a figure needs: CPU, cores, Python, isolation."""
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.processor(),
    )
    python = platform.python_version()
    return f"{cpu}, {os.cpu_count()} cores, Python {python}, isolation {isolation_available()}"


def run_baselines(sessions, splits: Path, models: int, workers: int, folder: Path) -> float:  # type: ignore[no-untyped-def]
    """Register the round and the three teams, submit, run every job; the seconds it took."""
    with sessions.begin() as session:
        created = rounds.create_round(
            session, "board", splits, submission_window_s=0, per_model_timeout_s=900
        )
        test = rounds.get_split(created, "test")
        test.model_names = ",".join(rounds.split_models(test)[:models])
        rounds.set_status(session, "board", "open")
        for name in BASELINES:
            rounds.add_team(session, name)
            submissions.submit(session, folder / "artifacts", name, "board", "test", DETECTORS / name)
    start = time.perf_counter()
    work(sessions, LocalExecutor(workers), once=True)
    return time.perf_counter() - start


def show(sessions, mode: str, bits: float) -> None:  # type: ignore[no-untyped-def]
    """Re-score every job under ``mode`` and print the public standings beside the exact scores."""
    with sessions.begin() as session:
        round_ = rounds.get_round(session, "board")
        round_.disclosure, round_.leak_bits = mode, bits
        job_ids = session.scalars(select(Job.id)).all()
    for job_id in job_ids:
        score_job(sessions, job_id)
    with sessions() as session:
        exact = {r.team: r.metrics["cross_entropy"] for r in publish.standings(session, "board", "test")}
        public = publish.standings(session, "board", "test", public=True)
    print(f"\n--disclosure {mode} --leak-bits {bits:g}")
    print(f"{'rank':>5}  {'team':<16} {'exact CE':>9}  {'width':>7}  shown")
    for row in public:
        low, high = row.metrics.get("shown_low"), row.metrics.get("shown_high")
        width = "" if low is None or high is None else f"{high - low:.4f}"
        shown = row.summary or f"CE {row.metrics.get('cross_entropy', float('nan')):.4f}"
        rank = f"{row.rank}{'=' if row.tied_with else ''}"
        print(f"{rank:>5}  {row.team:<16} {exact[row.team]:9.4f}  {width:>7}  {shown}")


def save_answers(sessions, path: Path) -> None:  # type: ignore[no-untyped-def]
    """Each team's answers and the test labels of the models run, as JSON."""
    with sessions() as session:
        jobs = session.scalars(select(Job)).all()
        answers = {job.submission.team.name: {r.model_name: r.value for r in job.results} for job in jobs}
        test = rounds.get_split(rounds.get_round(session, "board"), "test")
        models = rounds.split_models(test)
        truth = {m: t for m, t in read_truth(test.truth_path).items() if m in models}
    path.write_text(json.dumps({"answers": answers, "truth": truth}, indent=1, sort_keys=True))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("splits", type=Path, help="Folder written by 'assay zoo split'.")
    parser.add_argument("--models", type=int, default=40, help="First N models of the test split.")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--bits", type=float, default=8.0)
    parser.add_argument("--answers", type=Path, help="Also write the answers and labels here (JSON).")
    args = parser.parse_args()
    print(f"machine: {machine()}")
    with tempfile.TemporaryDirectory() as folder:
        sessions = open_store(f"sqlite:///{folder}/lb.db")
        seconds = run_baselines(sessions, args.splits, args.models, args.workers, Path(folder))
        print(f"three baselines on {args.models} test models: {seconds:.0f} s with {args.workers} workers")
        if args.answers:
            save_answers(sessions, args.answers)
        for mode in ("refined", "grid", "belief", "bins", "exact"):
            show(sessions, mode, args.bits)


if __name__ == "__main__":
    main()
