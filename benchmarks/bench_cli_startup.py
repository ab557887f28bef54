"""Start-up cost of everyday commands: wall time and peak memory of a fresh process, against `python -c pass`.

    python benchmarks/bench_cli_startup.py --repeats 15

Each command runs ``--repeats`` times in a fresh interpreter with its output discarded, the commands taking
turns (round-robin), so a burst of load from other processes hits them all alike. Reported: the fastest and
the median wall time, and the fastest CPU time (user + system, from ``wait4``, which other processes' load
disturbs less than wall time); peak memory is the child's maximum resident set size. Ratios are against the
``python -c pass`` baseline run in the same process. Goal (issues 18 and 27): every ``--help``, ``dyepack
fpr`` and ``user list`` under 0.3 s, and light commands under 80 MB, on the 2-core machine. Commands that
open the store run against a fresh SQLite file under a temporary ``ASSAY_HOME``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

SUBAPPS = ("user", "serve", "dyepack", "zoo", "leaderboard", "star")
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
    "assay user list": ["-m", "assay", "user", "list"],
    **{f"assay {name} --help": ["-m", "assay", name, "--help"] for name in SUBAPPS},
    "assay dyepack fpr --help": ["-m", "assay", "dyepack", "fpr", "--help"],
    "assay leaderboard show --help": ["-m", "assay", "leaderboard", "show", "--help"],
    "assay star status --help": ["-m", "assay", "star", "status", "--help"],
    "assay leaderboard round list": ["-m", "assay", "leaderboard", "round", "list"],
}


def run_once(args: list[str], env: dict[str, str]) -> tuple[float, float, int]:
    """Wall seconds, CPU seconds and peak RSS bytes of one fresh ``python ARGS``."""
    start = time.perf_counter()
    child = subprocess.Popen(
        [sys.executable, *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env
    )
    _, status, usage = os.wait4(child.pid, 0)
    elapsed = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{args} failed with status {status}")
    return elapsed, usage.ru_utime + usage.ru_stime, usage.ru_maxrss * 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    print(f"{os.cpu_count()} CPUs, load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    runs: dict[str, list[tuple[float, float, int]]] = {label: [] for label in COMMANDS}
    with tempfile.TemporaryDirectory() as home:
        env = {**os.environ, "ASSAY_HOME": home, "COLUMNS": "100"}
        run_once(COMMANDS["assay user list"], env)  # create and migrate the store once, outside the timings
        for _ in range(args.repeats):
            for label, command in COMMANDS.items():
                runs[label].append(run_once(command, env))
    print(f"load average after {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    base = min(t for t, _, _ in runs["python -c pass (baseline)"])
    header = "| command | min s | median s | min CPU s | x base (min) | peak MB | goal: min s < 0.3, 80 MB |"
    print(header + "\n|---|---:|---:|---:|---:|---:|---|")
    for label, timed in runs.items():
        fastest = min(t for t, _, _ in timed)
        median = statistics.median(t for t, _, _ in timed)
        cpu = min(c for _, c, _ in timed)
        memory = max(m for _, _, m in timed)
        met = "met" if fastest < 0.3 and memory < 80 * 2**20 else "not met"
        print(
            f"| `{label}` | {fastest:.3f} | {median:.3f} | {cpu:.3f} | {fastest / base:.1f} | "
            f"{memory / 2**20:.1f} | {met if 'baseline' not in label else ''} |"
        )


if __name__ == "__main__":
    main()
