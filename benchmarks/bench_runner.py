"""Harness overhead of ``assay.runner.run_task``: milliseconds per trivial task, per isolation level.

Each row runs ``python -c pass`` ``--tasks`` times, one after another: bare with ``subprocess.run``, then
through ``run_task`` with every isolation level this machine offers (fresh folders, limits, sandbox, output
read-back, clean-up). The modes take turns task by task. Reports the median and the overhead over the
bare run.

    python benchmarks/bench_runner.py --tasks 30

Ratios are against the bare run in the same process. Run on a quiet machine: the timings are small enough
for any other load to show.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable


def _interleaved(modes: dict[str, Callable[[], object]], tasks: int) -> dict[str, list[float]]:
    """Milliseconds per call of each mode, taking turns so that background load hits every mode alike."""
    for run in modes.values():
        run()  # warm-up: the first call pays for probing the sandbox and filling the page cache
    times: dict[str, list[float]] = {name: [] for name in modes}
    for _ in range(tasks):
        for name, run in modes.items():
            start = time.perf_counter()
            run()
            times[name].append(1000 * (time.perf_counter() - start))
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=30)
    args = parser.parse_args()

    from assay.runner import Limits, Task, levels_available, run_task

    argv = [sys.executable, "-c", "pass"]
    task = Task("bench", argv, limits=Limits(wall_seconds=60))
    modes: dict[str, Callable[[], object]] = {"bare subprocess": lambda: subprocess.run(argv, check=True)}
    for level in levels_available():
        modes[f"run_task {level}"] = lambda level=level: run_task(task, isolation=level)
    rows = list(_interleaved(modes, args.tasks).items())

    base = statistics.median(rows[0][1])
    print(f"{args.tasks} tasks of `python -c pass` per mode, modes interleaved, {os.cpu_count()} CPUs")
    print(f"{'mode':<20} {'median ms':>10} {'p90 ms':>8} {'overhead ms':>12} {'ratio':>7}")
    for name, times in rows:
        median, p90 = statistics.median(times), statistics.quantiles(times, n=10)[-1]
        print(f"{name:<20} {median:>10.1f} {p90:>8.1f} {median - base:>12.1f} {median / base:>6.2f}x")


if __name__ == "__main__":
    main()
