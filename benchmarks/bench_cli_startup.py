"""Start-up cost of everyday commands: wall time and peak memory of a fresh process, against `python -c pass`.

    python benchmarks/bench_cli_startup.py --repeats 7

Each command runs ``--repeats`` times in a fresh interpreter (the median is reported) with its output
discarded; peak memory is the child's maximum resident set size from ``wait4``. Ratios are against the
baseline run in the same process. Goal (issue 18): light commands under 0.3 s and 80 MB on the 2-core machine.
Commands that open the store run against a fresh SQLite file under a temporary ``ASSAY_HOME``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

COMMANDS = {
    "python -c pass (baseline)": ["-c", "pass"],
    "assay --help": ["-m", "assay", "--help"],
    "assay dyepack fpr": [
        "-m",
        "assay",
        "dyepack",
        "fpr",
        "--backdoors",
        "6",
        "--activated",
        "5",
        "--k",
        "4",
    ],
    "assay user --help": ["-m", "assay", "user", "--help"],
    "assay user list": ["-m", "assay", "user", "list"],
    "assay leaderboard show --help": ["-m", "assay", "leaderboard", "show", "--help"],
    "assay leaderboard round list": ["-m", "assay", "leaderboard", "round", "list"],
    "assay star status --help": ["-m", "assay", "star", "status", "--help"],
}


def run_once(args: list[str], env: dict[str, str]) -> tuple[float, int]:
    """Wall seconds and peak RSS bytes of one fresh ``python ARGS``."""
    start = time.perf_counter()
    child = subprocess.Popen(
        [sys.executable, *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env
    )
    _, status, usage = os.wait4(child.pid, 0)
    elapsed = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{args} failed with status {status}")
    return elapsed, usage.ru_maxrss * 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as home:
        env = {**os.environ, "ASSAY_HOME": home, "COLUMNS": "100"}
        run_once(COMMANDS["assay user list"], env)  # create and migrate the store once, outside the timings
        rows = []
        for label, command in COMMANDS.items():
            runs = [run_once(command, env) for _ in range(args.repeats)]
            rows.append((label, statistics.median(t for t, _ in runs), max(m for _, m in runs)))
    base_time, base_mem = rows[0][1], rows[0][2]
    print(f"{'command':34} {'median s':>9} {'x base':>7} {'peak MB':>8} {'x base':>7}  goal (0.3 s, 80 MB)")
    for label, seconds, memory in rows:
        met = "met" if seconds < 0.3 and memory < 80 * 2**20 else "not met"
        print(
            f"{label:34} {seconds:9.3f} {seconds / base_time:7.1f} {memory / 2**20:8.1f} "
            f"{memory / base_mem:7.1f}  {met if label != rows[0][0] else ''}"
        )


if __name__ == "__main__":
    main()
