"""Start-up cost of everyday commands: wall time, CPU time and peak memory of a fresh process.

    python benchmarks/bench_cli_startup.py --repeats 15 [--every-help] [--before OLD/src]

Each command runs ``--repeats`` times in a fresh interpreter with its output discarded, the commands taking
turns (round-robin), so a burst of load from other processes hits them all alike. Reported: the fastest and
the median wall time, and the fastest and median CPU time (user + system of the child, from ``wait4``, which
other processes' load disturbs less than wall time: the machine is shared); peak memory is the child's
maximum resident set size. Ratios are against the ``python -c pass`` baseline run in the same process; the
machine facts (cores, CPU model, load average before and after) are printed with the table. Goal (issues 18
and 27): every ``--help``, ``dyepack fpr`` and ``user list`` under 0.3 s, and light commands under 80 MB,
on the 2-core machine. ``--every-help`` adds the help of every group and command, found by walking the
CLI. ``--before`` times an older source tree in turn with this one (each command run by both, one right
after the other), so a before/after comparison sees the same load. Commands that open the store run
against a fresh SQLite file under a temporary ``ASSAY_HOME``, holding 100 users (a page of `user list`).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SUBAPPS = ("user", "serve", "dyepack", "zoo", "leaderboard", "star", "admin")
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


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (Linux), else what ``platform`` says."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


WALK = """
import json
from assay.cli import SUBCOMMANDS, load_subcommand

def walk(command, path):
    yield path
    for name, sub in sorted(getattr(command, "commands", {}).items()):
        yield from walk(sub, [*path, name])

print(json.dumps([path for name in SUBCOMMANDS for path in walk(load_subcommand(name), [name])]))
"""


def every_help() -> dict[str, list[str]]:
    """``assay ... --help`` for every group and command of the CLI, found by walking the click tree.

    The walk runs in a child: imported here, the CLI would raise every later child's peak memory (a forked
    child's resident set counts until it execs).
    """
    paths = json.loads(subprocess.check_output([sys.executable, "-c", WALK], text=True))
    return {f"assay {' '.join(path)} --help": ["-m", "assay", *path, "--help"] for path in paths}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument(
        "--every-help", action="store_true", help="Time the --help of every group and command as well."
    )
    parser.add_argument(
        "--before",
        type=Path,
        help="Another source tree (e.g. `git archive OLD src | tar -x -C /tmp/old`, then /tmp/old/src) "
        "to time in turn with this one, each run of it right before this one's: a comparison on a "
        "shared machine under the same load.",
    )
    parser.add_argument(
        "--postgresql",
        action="store_true",
        help="Also time `user list` against a throwaway PostgreSQL server (tests/postgres.py).",
    )
    args = parser.parse_args()
    commands = {**COMMANDS, **(every_help() if args.every_help else {})}
    with contextlib.ExitStack() as stack:
        if args.postgresql:
            commands[PG_LIST] = COMMANDS["assay user list"]
            EXTRA_ENV[PG_LIST] = {"ASSAY_DB_URL": postgres_database(stack)}
        run_all(args, commands)


PG_LIST = "assay user list (PostgreSQL)"
EXTRA_ENV: dict[str, dict[str, str]] = {}  # label -> environment variables of that command alone


def postgres_database(stack: contextlib.ExitStack) -> str:
    """A fresh database on a throwaway server (tests/postgres.py), stopped when ``stack`` closes.

    The server's helper runs in a child that waits on its stdin: importing it here (psycopg) would grow
    this process, and a child's peak memory as ``wait4`` reports it starts at its parent's."""
    tests = Path(__file__).resolve().parents[1] / "tests"
    script = f"""
import sys
sys.path.insert(0, {str(tests)!r})
from postgres import postgres_server
with postgres_server() as server:
    print(server.new_database(), flush=True)
    sys.stdin.read()
"""
    child = subprocess.Popen(
        [sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    stack.callback(child.wait, 120)
    stack.callback(child.stdin.close)  # type: ignore[union-attr]
    url = child.stdout.readline().strip()  # type: ignore[union-attr]
    if not url:
        raise SystemExit("PostgreSQL did not start (is it installed? `make install` installs postgresql)")
    return url


def run_all(args: argparse.Namespace, commands: dict[str, list[str]]) -> None:
    trees = {"before": args.before, "after": None} if args.before else {"after": None}
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, Python {platform.python_version()}")
    print(f"{os.cpu_count()} CPUs ({cpu_model()}), load average {load()}")
    runs = {(tree, label): [] for tree in trees for label in commands}
    with tempfile.TemporaryDirectory() as home:
        envs = {tree: environment(home, src) for tree, src in trees.items()}
        for extra in [{}, *EXTRA_ENV.values()]:  # create, migrate, fill each store, outside the timings
            for env in envs.values():
                run_once(COMMANDS["assay user list"], {**env, **extra})
            add_users({**envs["after"], **extra}, USERS)  # a full first page for `user list` to print
        for _ in range(args.repeats):
            for label, command in commands.items():
                for tree, env in envs.items():
                    runs[tree, label].append(run_once(command, {**env, **EXTRA_ENV.get(label, {})}))
    print(f"load average after {load()}")
    if args.before:
        compare(runs, commands)
    else:
        table(runs, commands)


USERS = 100  # `user list` prints a page of them: its default --limit


def add_users(env: dict[str, str], count: int) -> None:
    """``count`` accounts in the store ``env`` names (in a child, so this process imports no store)."""
    script = f"""
from assay.store import open_store
from assay.web import accounts
with open_store().begin() as session:
    for i in range({count}):
        accounts.create_user(session, f"user{{i:03d}}", "a-long-password-1", ["annotator"])
"""
    subprocess.run([sys.executable, "-c", script], check=True, env=env)


def environment(home: str, src: Path | None) -> dict[str, str]:
    """The children's environment: a scratch ``ASSAY_HOME``, and ``src`` ahead of the installed package."""
    env = {**os.environ, "ASSAY_HOME": home, "COLUMNS": "100"}
    if src is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(src), *filter(None, [env.get("PYTHONPATH")])])
    return env


Runs = dict[tuple[str, str], list[tuple[float, float, int]]]


def table(runs: Runs, commands: dict[str, list[str]]) -> None:
    """One tree: wall and CPU times, peak memory, and the goal."""
    base = min(t for t, _, _ in runs["after", "python -c pass (baseline)"])
    print(
        "| command | min s | median s | min CPU s | median CPU s | x base (min) | peak MB "
        "| goal: 0.3 s (median CPU), 80 MB |\n|---|---:|---:|---:|---:|---:|---:|---|"
    )
    for label in commands:
        timed = runs["after", label]
        walls, cpus, memory = [t for t, _, _ in timed], [c for _, c, _ in timed], max(m for *_, m in timed)
        print(
            f"| `{label}` | {min(walls):.3f} | {statistics.median(walls):.3f} | {min(cpus):.3f} | "
            f"{statistics.median(cpus):.3f} | {min(walls) / base:.1f} | {memory / 2**20:.1f} | "
            f"{goal(label, cpus, memory)} |"
        )


def compare(runs: Runs, commands: dict[str, list[str]]) -> None:
    """Two trees, run in turn: medians before and after, and the CPU ratio."""
    print(
        "| command | median s before / after | median CPU s before / after | CPU after / before "
        "| peak MB before / after | goal: 0.3 s (median CPU), 80 MB |\n|---|---:|---:|---:|---:|---|"
    )
    for label in commands:
        before, after = runs["before", label], runs["after", label]
        wall = [statistics.median(t for t, _, _ in timed) for timed in (before, after)]
        cpu = [statistics.median(c for _, c, _ in timed) for timed in (before, after)]
        memory = [max(m for *_, m in timed) / 2**20 for timed in (before, after)]
        print(
            f"| `{label}` | {wall[0]:.3f} / {wall[1]:.3f} | {cpu[0]:.3f} / {cpu[1]:.3f} | "
            f"{cpu[1] / cpu[0]:.2f} | {memory[0]:.1f} / {memory[1]:.1f} | "
            f"{goal(label, [c for _, c, _ in after], memory[1] * 2**20)} |"
        )


def goal(label: str, cpus: list[float], memory: float) -> str:
    """Whether a command meets the goal, judged by its median CPU time (wall time is the load's)."""
    if "baseline" in label:
        return ""
    return "met" if statistics.median(cpus) < 0.3 and memory < 80 * 2**20 else "not met"


def load() -> str:
    """The 1, 5 and 15 minute load averages."""
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


if __name__ == "__main__":
    main()
