"""No channel between runs through host-wide ``/proc`` counters (issue 35, item 3).

Two detectors on one machine share its kernel: without a mask, one could read ``/proc/meminfo`` (or
``loadavg``, ``stat``, ``vmstat``, ``pressure/``, ...) while another allocates or spins, and so receive bits
from it (a test-split run signalling its answers to a practice run, say). Each attack here is a detector run
twice while the host moves the counter in between; the sandbox must show the same bytes both times.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

from assay.runner import Limits, Task, isolation_available, run_task

LEVEL = isolation_available()
needs_bwrap = pytest.mark.skipif(LEVEL != "bwrap", reason=f"needs bwrap; best isolation here is {LEVEL}")
LIMITS = Limits(wall_seconds=60, memory_bytes=2 * 2**30)
MiB = 2**20

READER = """
import json, os, sys
seen = {}
for path in sys.argv[2:]:
    try:
        seen[path] = open(path).read()
    except OSError as err:
        seen[path] = type(err).__name__
open(sys.argv[1] + "/result.txt", "w").write(json.dumps(seen))
"""
COUNTERS = ["/proc/meminfo", "/proc/loadavg", "/proc/stat", "/proc/vmstat", "/proc/uptime"]


def read_in_sandbox(tmp_path: Path, paths: list[str]) -> dict[str, str]:
    """What a sealed run reads at ``paths``."""
    script = tmp_path / "reader.py"
    script.write_text(READER)
    task = Task(
        "reader",
        [sys.executable, "{input}/reader.py", "{output}", *paths],
        stage={"reader.py": script},
        limits=LIMITS,
    )
    result = run_task(task)
    assert result.ok, result.stderr
    return json.loads(result.outputs["result.txt"])


def meminfo_kib(text: str) -> dict[str, int]:
    return {line.split(":")[0]: int(line.split()[1]) for line in text.splitlines() if line.strip()}


def moved_mib(before: str, after: str) -> dict[str, float]:
    """How far each of MemFree, MemAvailable and Active moved between two reads, in MiB."""
    old, new = meminfo_kib(before), meminfo_kib(after)
    return {key: abs(new[key] - old[key]) / 1024 for key in ("MemFree", "MemAvailable", "Active")}


@needs_bwrap
def test_host_memory_use_is_not_seen_by_the_sandbox(tmp_path: Path) -> None:
    """The host allocates and touches 300 MiB between two runs: meminfo inside must not move at all
    (before the fix MemFree moved by about 300 MiB)."""
    before = read_in_sandbox(tmp_path, COUNTERS)
    hog = bytearray(300 * MiB)
    for offset in range(0, len(hog), 4096):
        hog[offset] = 1
    after = read_in_sandbox(tmp_path, COUNTERS)
    del hog
    moved = moved_mib(before["/proc/meminfo"], after["/proc/meminfo"])
    print(f"meminfo moved by {moved} MiB")
    assert moved == {"MemFree": 0, "MemAvailable": 0, "Active": 0}
    assert after["/proc/meminfo"] == before["/proc/meminfo"]


@needs_bwrap
def test_a_busy_host_is_not_seen_in_loadavg_or_stat(tmp_path: Path) -> None:
    """The host spins for 1.5 s between two runs: loadavg, stat, vmstat and uptime read the same."""
    before = read_in_sandbox(tmp_path, COUNTERS)
    deadline = time.monotonic() + 1.5
    while time.monotonic() < deadline:
        pass
    after = read_in_sandbox(tmp_path, COUNTERS)
    changed = [path for path in COUNTERS if before[path] != after[path]]
    print(f"changed: {changed}")
    assert changed == []


WALKER = """
import json, os, sys
seen = {}
skip = {"/proc/self", "/proc/thread-self", "/proc/sys/kernel/random/uuid", "/proc/sys/kernel/random/boot_id"}
for top, dirs, files in os.walk("/proc"):
    dirs[:] = [d for d in dirs if not d.isdigit() and os.path.join(top, d) not in skip]
    for name in files:
        path = os.path.join(top, name)
        if path in skip:
            continue
        try:
            with open(path, "rb") as handle:
                seen[path] = handle.read(2**16).decode("latin-1")
        except OSError:
            pass
open(sys.argv[1] + "/result.txt", "w").write(json.dumps(seen))
"""


def walk_in_sandbox(tmp_path: Path) -> dict[str, str]:
    script = tmp_path / "walker.py"
    script.write_text(WALKER)
    task = Task("walker", [sys.executable, "{input}/walker.py", "{output}"], stage={"walker.py": script})
    result = run_task(task)
    assert result.ok, result.stderr
    return json.loads(result.outputs["result.txt"])


@needs_bwrap
def test_nothing_host_wide_in_proc_moves_with_the_host(tmp_path: Path) -> None:
    """Every file under ``/proc`` (but the processes' own folders) reads the same in two runs around a
    host that allocates 300 MiB, spins and writes 64 MiB to disk."""
    before = walk_in_sandbox(tmp_path)
    hog = bytearray(300 * MiB)
    for offset in range(0, len(hog), 4096):
        hog[offset] = 1
    with open(tmp_path / "disk", "wb") as handle:
        handle.write(hog[: 64 * MiB])
        handle.flush()
        os.fsync(handle.fileno())
    deadline = time.monotonic() + 1.5
    while time.monotonic() < deadline:
        pass
    after = walk_in_sandbox(tmp_path)
    del hog
    changed = sorted(path for path in before if after.get(path) != before[path])
    print(f"changed: {changed}")
    assert changed == []


USER = """
import json, os, sys
import psutil
memory = psutil.virtual_memory()
answer = {
    "cpus": os.sysconf("SC_NPROCESSORS_ONLN"),
    "cpu_count": os.cpu_count(),
    "total": memory.total,
    "available": memory.available,
    "meminfo": len(open("/proc/meminfo").read()),
    "stat": len(open("/proc/stat").read()),
    "percent": psutil.cpu_percent(interval=0.1),
    "boot": psutil.boot_time(),
}
open(sys.argv[1] + "/result.txt", "w").write(json.dumps(answer))
"""


@needs_bwrap
def test_programs_that_read_proc_still_work(tmp_path: Path) -> None:
    """psutil and the C library still find the CPUs and the memory: the run's own limit."""
    pytest.importorskip("psutil")
    script = tmp_path / "user.py"
    script.write_text(USER)
    task = Task(
        "user", [sys.executable, "{input}/user.py", "{output}"], stage={"user.py": script}, limits=LIMITS
    )
    result = run_task(task)
    assert result.ok, result.stderr
    answer = json.loads(result.outputs["result.txt"])
    assert answer["cpus"] == answer["cpu_count"] == os.cpu_count()
    assert answer["total"] == answer["available"] == LIMITS.memory_bytes
    assert answer["meminfo"] > 0 and answer["stat"] > 0 and answer["boot"] > 0


def test_the_fixed_files_come_back_after_a_temp_cleaner(monkeypatch: pytest.MonkeyPatch) -> None:
    """A long-lived worker's views survive a cleaner of the temp dir: written again, in a fresh folder."""
    import shutil

    from assay.runner import procview

    monkeypatch.setattr(procview, "_HOMES", [])
    first = procview.view_folder(2**30)
    assert "MemTotal:" in (first / "meminfo").read_text()
    shutil.rmtree(first.parent)
    second = procview.view_folder(2**30)
    assert second.parent != first.parent
    assert (second / "meminfo").read_text() == procview.meminfo(2**30)
    shutil.rmtree(second.parent)


def test_views_of_a_killed_process_are_swept_and_a_live_ones_kept(tmp_path: Path) -> None:
    """A worker killed with SIGKILL runs no exit handler; the next process to make its views removes the
    dead one's folder (39 were left in this machine's /tmp before) and keeps a living one's."""
    import subprocess

    from assay.runner import procview

    script = (
        "import os, signal\nfrom assay.runner import procview\n"
        "print(procview.view_folder(2**30).parent, flush=True)\nos.kill(os.getpid(), signal.SIGKILL)\n"
    )
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True)
    dead = Path(done.stdout.strip())
    assert done.returncode == -9 and dead.parent == tmp_path and (dead / "host").exists() is False
    assert (dead / str(2**30) / "meminfo").is_file()
    living = tmp_path / f"{procview.PREFIX}living"
    living.mkdir()
    (living / procview.OWNER_FILE).write_text(procview.owner_line())
    assert procview.sweep_stale(tmp_path) == [dead]
    assert not dead.exists() and living.is_dir()
