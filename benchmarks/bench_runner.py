"""Harness overhead of ``assay.runner.run_task``: milliseconds per trivial task, per isolation level.

Each row runs ``python -c pass`` ``--tasks`` times, one after another: bare with ``subprocess.run``, then
through ``run_task`` with every isolation level this machine offers (fresh folders, limits, sandbox, output
read-back, clean-up). The modes take turns task by task. Reports the median and the overhead over the
bare run.

    python benchmarks/bench_runner.py --tasks 30
    python benchmarks/bench_runner.py --tasks 10 --stage-mib 100

With ``--stage-mib N`` every task also stages an N MiB ``model.pt``, once copied into the run's folder (the
default: a fresh inode and a fixed mtime, so nothing names the model) and once hard-linked
(``Task.shared_stage``: free, but the host file's inode and mtime show through): the price of the copy.

Ratios are against the bare run in the same process. Run on a quiet machine: the timings are small enough
for any other load to show.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path


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
    parser.add_argument("--stage-mib", type=int, default=0, help="also stage a model.pt of this size")
    args = parser.parse_args()

    from assay.runner import Limits, Task, levels_available, run_task
    from assay.runner.workspace import default_base

    argv = [sys.executable, "-c", "pass"]
    task = Task("bench", argv, limits=Limits(wall_seconds=60))
    modes: dict[str, Callable[[], object]] = {"bare subprocess": lambda: subprocess.run(argv, check=True)}
    for level in levels_available():
        modes[f"run_task {level}"] = lambda level=level: run_task(task, isolation=level)
    with tempfile.TemporaryDirectory(dir=_same_disk(default_base())) as folder:
        if args.stage_mib:
            model = Path(folder) / "id-00000003"
            model.mkdir()
            with open(model / "model.pt", "wb") as handle:
                for _ in range(args.stage_mib):
                    handle.write(os.urandom(2**20))
            for shared in (False, True):
                staged = Task(
                    "bench", argv, stage={"model": model}, shared_stage=frozenset({"model"} if shared else ())
                )
                name = f"bwrap {args.stage_mib} MiB {'hard link' if shared else 'copy'}"
                modes[name] = lambda staged=staged: run_task(staged)
        rows = list(_interleaved(modes, args.tasks).items())

    base = statistics.median(rows[0][1])
    print(f"{args.tasks} tasks of `python -c pass` per mode, modes interleaved, {os.cpu_count()} CPUs")
    print(f"{'mode':<26} {'median ms':>10} {'p90 ms':>8} {'overhead ms':>12} {'ratio':>7}")
    for name, times in rows:
        median, p90 = statistics.median(times), statistics.quantiles(times, n=10)[-1]
        print(f"{name:<26} {median:>10.1f} {p90:>8.1f} {median - base:>12.1f} {median / base:>6.2f}x")


def _same_disk(base: Path) -> Path:
    """The runner's base folder (made if need be), so a hard link to the staged model can be made."""
    base.mkdir(parents=True, exist_ok=True)
    return base


if __name__ == "__main__":
    main()
