"""What exclusive hosts cost: one queue drained by 2 workers on one machine, with and without sealed jobs.

A sealed (test or holdout) job's detector holds its machine alone (``assay.runner.hostlease``): no other
job's run shares it. The cost is parallelism lost while a sealed job runs beside idle capacity. Two queues
of the same work (``--jobs`` jobs of a detector that sleeps ``--sleep`` s on each of 4 models, run by two
``assay leaderboard worker --once --workers 2`` processes on this machine, bubblewrap, a fresh SQLite
store): all practice (train) jobs, where nothing is exclusive, and half practice, half test, where every
test job holds the host and then leaves it quiet until its publication tick (``leaderboard.hostquiet``: a
practice job waits for that tick on the round's clock, ``--publish-every`` seconds), once with both
workers on one host and once as two pools (``worker --splits test,holdout`` and ``--splits train,smoke``,
each on a host lease of its own: two machines), which never wait on each other. Prints the wall time of
each and the ratios.

    python benchmarks/bench_exclusive_hosts.py --jobs 8 --sleep 1.0 --publish-every 10
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
from assay.store import Job, Submission, open_store
from assay.store.models import as_utc

PROJECT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(PROJECT / "tests"), str(PROJECT / "tests" / "leaderboard")]
from test_leaderboard import fake_detector  # noqa: E402 (the constant baseline with a body of ours)

from fake_board import open_round  # noqa: E402 (the tests' fake round: 4 empty models per split)

SLEEPER = "time.sleep({sleep})\nopen(args.result_filepath, 'w').write('0.5')"


POOLS = (["test", "holdout"], ["train", "smoke"])  # the organiser's lever: sealed jobs on hosts of their own


def drain(
    base: Path, splits: list[str], sleep: float, every_s: int, pools: bool = False
) -> tuple[float, float]:
    """Seconds two workers take to run one job per entry of ``splits`` on a round publishing every
    ``every_s`` seconds (on one host, or with ``pools`` one worker per pool, each on a host of its own),
    and the mean seconds from the start to a practice job's end: the latency the quiet costs practice."""
    url = f"sqlite:///{base / 'lb.db'}"
    open_round(url, base / "splits", publish_every_s=every_s)
    sessions = open_store(url)
    for n, split in enumerate(splits):
        with sessions.begin() as session:
            made = fake_detector(base / f"d{n}", SLEEPER.format(sleep=sleep), technique=f"sleeper {n}")
            submissions.submit(session, base / "artifacts", "alpha", "r1", split, made)
    command = [sys.executable, "-m", "assay", "leaderboard", "worker", "--once", "--workers", "2"]
    runs = []
    for n in range(2):
        host = f"host-{n}.lease" if pools else "host.lease"
        env = {**os.environ, "ASSAY_DB_URL": url, "ASSAY_HOST_LEASE": str(base / host)}
        runs.append((command + (["--splits", ",".join(POOLS[n])] if pools else []), env))
    started, wall_start = time.perf_counter(), time.time()
    workers = [subprocess.Popen(argv, env=env, stderr=subprocess.DEVNULL) for argv, env in runs]
    for worker in workers:
        if worker.wait() != 0:
            sys.exit(f"a worker failed with status {worker.returncode}")
    took = time.perf_counter() - started
    with sessions() as session:
        statuses = session.scalars(select(Submission.status)).all()
        ends = [as_utc(job.finished_at).timestamp() for job in session.scalars(select(Job)) if _practice(job)]
    if statuses != ["done"] * len(splits):
        sys.exit(f"not every job ran: {statuses}")
    return took, sum(end - wall_start for end in ends) / len(ends)


def _practice(job: Job) -> bool:
    return job.submission.split.name in POOLS[1]


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
    parser.add_argument("--publish-every", type=int, default=10, help="the round's clock, in seconds")
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
    every = args.publish_every
    print(
        f"{args.jobs} jobs of 4 models, {args.sleep:g} s a model, 2 workers x 2 models at once, "
        f"published every {every} s\n"
    )
    mixed = ["train", "test"] * (args.jobs // 2)
    queues = {
        "all practice (nothing exclusive)": (["train"] * args.jobs, False),
        "half test, one host (each holds it, then quiet until its tick)": (mixed, False),
        "half test, two pools (--splits, a host each)": (mixed, True),
    }
    times = {}
    for name, (splits, pools) in queues.items():
        with tempfile.TemporaryDirectory(prefix="assay-bench-exclusive-") as folder:
            times[name] = drain(Path(folder), splits, args.sleep, every, pools)
    print("| queue | wall time | jobs per minute | a practice job done after (mean) |")
    print("|---|---|---|---|")
    for name, (seconds, practice) in times.items():
        print(f"| {name} | {seconds:.1f} s | {60 * args.jobs / seconds:.1f} | {practice:.1f} s |")
    unshared, one_host, pooled = (seconds for seconds, _ in times.values())
    print(
        f"\nexclusive hosts and the quiet cost {one_host / unshared:.2f}x the wall time of the same work "
        f"unshared on one host, {pooled / unshared:.2f}x as two pools"
    )


if __name__ == "__main__":
    main()
