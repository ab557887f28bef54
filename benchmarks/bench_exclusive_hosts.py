"""What exclusive hosts cost: one queue drained by 2 workers on one machine, with and without sealed jobs.

A sealed (test or holdout) job's detector holds its machine alone (``assay.runner.hostlease``): no other
job's run shares it. The cost is parallelism lost while a sealed job runs beside idle capacity. Two queues
of the same work (``--jobs`` jobs of a detector that sleeps ``--sleep`` s on each of 4 models, run by two
``assay leaderboard worker --once --workers 2`` processes on this machine, bubblewrap, a fresh SQLite
store): all practice (train) jobs, where nothing is exclusive, and half practice, half test, where every
test job holds the host. Prints the wall time of each and the ratio.

    python benchmarks/bench_exclusive_hosts.py --jobs 8 --sleep 1.0
    python benchmarks/bench_exclusive_hosts.py --ray --tasks 12 --sleep 1.0

``--ray``: the same question on a local Ray cluster of 3 nodes of 2 CPUs each (``tests/ray_cluster.py``,
every node offering the ``assay_host`` resource): ``--tasks`` sandboxed runs that sleep ``--sleep`` s,
shared (6 at once) and exclusive (one per node).
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from sqlalchemy import select

from assay.leaderboard import submissions
from assay.runner import isolation_available
from assay.store import Submission, open_store

PROJECT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(PROJECT / "tests"), str(PROJECT / "tests" / "leaderboard")]
from test_leaderboard import fake_detector  # noqa: E402 (the constant baseline with a body of ours)

from fake_board import open_round  # noqa: E402 (the tests' fake round: 4 empty models per split)

SLEEPER = "time.sleep({sleep})\nopen(args.result_filepath, 'w').write('0.5')"


def drain(base: Path, splits: list[str], sleep: float) -> float:
    """Seconds two workers take to run one job per entry of ``splits``."""
    url = f"sqlite:///{base / 'lb.db'}"
    open_round(url, base / "splits")
    sessions = open_store(url)
    for n, split in enumerate(splits):
        with sessions.begin() as session:
            made = fake_detector(base / f"d{n}", SLEEPER.format(sleep=sleep), technique=f"sleeper {n}")
            submissions.submit(session, base / "artifacts", "alpha", "r1", split, made)
    env = {**os.environ, "ASSAY_DB_URL": url, "ASSAY_HOST_LEASE": str(base / "host.lease")}
    command = [sys.executable, "-m", "assay", "leaderboard", "worker", "--once", "--workers", "2"]
    started = time.perf_counter()
    workers = [subprocess.Popen(command, env=env, stderr=subprocess.DEVNULL) for _ in range(2)]
    for worker in workers:
        if worker.wait() != 0:
            sys.exit(f"a worker failed with status {worker.returncode}")
    took = time.perf_counter() - started
    with sessions() as session:
        statuses = session.scalars(select(Submission.status)).all()
    if statuses != ["done"] * len(splits):
        sys.exit(f"not every job ran: {statuses}")
    return took


def ray_rows(tasks: int, sleep: float) -> dict[str, float]:
    """Seconds a 3-node cluster takes for ``tasks`` sandboxed sleeps, shared and exclusive."""
    import secrets

    token = secrets.token_hex(32)  # before ray is imported: it reads the auth settings once
    os.environ.update({"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token})
    import ray

    from assay.runner import Limits, RayExecutor, Task
    from ray_cluster import local_cluster, ray_available

    if reason := ray_available():
        sys.exit(f"no local Ray cluster here: {reason}")
    argv = [sys.executable, "-c", f"import time; time.sleep({sleep})"]
    limits = Limits(wall_seconds=120, memory_bytes=2**30)
    times = {}
    with local_cluster(2, [], head_cpus=2, worker_cpus=2, token=token) as cluster:
        executor = RayExecutor(cluster.address)
        for exclusive in (False, True, False):  # the first shared round warms the nodes up
            batch = [Task(f"t{i}", argv, limits=limits, exclusive=exclusive) for i in range(tasks)]
            started = time.perf_counter()
            results = executor.map(batch)
            took = time.perf_counter() - started
            if not all(result.ok for result in results):
                sys.exit(f"a task failed: {next(r for r in results if not r.ok).stderr[-500:]}")
            times["exclusive (one per node)" if exclusive else "shared (2 per node)"] = took
        ray.shutdown()
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=8)
    parser.add_argument("--sleep", type=float, default=1.0, help="seconds each detector run sleeps")
    parser.add_argument("--ray", action="store_true", help="on a local 3-node Ray cluster instead")
    parser.add_argument("--tasks", type=int, default=12, help="sandboxed runs, with --ray")
    args = parser.parse_args()
    if isolation_available() != "bwrap":
        sys.exit("needs bubblewrap: sealed jobs run nowhere else")
    cpu = platform.processor() or platform.machine()
    print(f"{cpu}, {os.cpu_count()} CPUs, Python {platform.python_version()}")
    if args.ray:
        times = ray_rows(args.tasks, args.sleep)
        print(f"{args.tasks} sandboxed runs of {args.sleep:g} s on 3 Ray nodes of 2 CPUs\n")
        print("| runs | wall time | runs per minute |")
        print("|---|---|---|")
        for name, seconds in times.items():
            print(f"| {name} | {seconds:.1f} s | {60 * args.tasks / seconds:.1f} |")
        shared, exclusive = times["shared (2 per node)"], times["exclusive (one per node)"]
        print(f"\nexclusivity costs {exclusive / shared:.2f}x the wall time of the same runs shared")
        return
    print(f"{args.jobs} jobs of 4 models, {args.sleep:g} s a model, 2 workers x 2 models at once\n")
    queues = {
        "all practice (nothing exclusive)": ["train"] * args.jobs,
        "half test (each test job holds the host)": ["train", "test"] * (args.jobs // 2),
    }
    times = {}
    for name, splits in queues.items():
        with tempfile.TemporaryDirectory(prefix="assay-bench-exclusive-") as folder:
            times[name] = drain(Path(folder), splits, args.sleep)
    print("| queue | wall time | jobs per minute |")
    print("|---|---|---|")
    for name, seconds in times.items():
        print(f"| {name} | {seconds:.1f} s | {60 * args.jobs / seconds:.1f} |")
    first, second = times.values()
    print(f"\nexclusivity costs {second / first:.2f}x the wall time of the same work unshared")


if __name__ == "__main__":
    main()
