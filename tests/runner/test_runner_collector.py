"""A detector against its result collector (``assay.runner.collect``): it must never get a forged answer
scored, and a collector it cannot reach is reported as lost, never as the detector's answer or a memory kill.

The collector runs in the sandbox as the detector's parent, as the same user. Before: a detector could open
``/proc/<collector>/fd/<FD>`` (the side pipe, its number on the collector's command line), write a valid
answer of its own there and SIGTERM the collector, and the forged answer was scored with no note.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import sys
import textwrap
import threading
import time
import uuid
from pathlib import Path

import pytest

from assay.runner import Limits, Task, collect, isolation_available, run_task
from host_processes import processes_with

LEVEL = isolation_available()
needs_bwrap = pytest.mark.skipif(LEVEL != "bwrap", reason=f"needs bwrap; best isolation here is {LEVEL}")
FORGED, OWN = b"0.99", b"0.5"

FORGER = """
import os, signal, sys, time
output, mode, forged = sys.argv[1], sys.argv[2], bytes.fromhex(sys.argv[3])
open(output + "/result.txt", "wb").write(b"0.5")  # its own answer, the one that may be scored
collector = os.getppid()
log = {"collector": collector}
try:
    argv = open(f"/proc/{collector}/cmdline", "rb").read().split(b"\\0")
    fd = int(argv[argv.index(b"-S") + 2])  # python -I -S collect.py FD ...
    with open(f"/proc/{collector}/fd/{fd}", "wb") as pipe:
        pipe.write(forged)
    log["forged"] = "written"
except (OSError, ValueError, IndexError) as err:
    log["forged"] = type(err).__name__
signals = {"term": signal.SIGTERM, "kill": signal.SIGKILL, "stop": signal.SIGSTOP, "int": signal.SIGINT}
if mode in signals:
    try:
        os.kill(collector, signals[mode])
        log["signal"] = "sent"
    except OSError as err:
        log["signal"] = type(err).__name__
time.sleep(0.5)
print(log, flush=True)
"""


def forged_answer() -> bytes:
    """A valid answer in the collector's own wire format (the detector can read its source), giving 0.99."""
    files = {"result.txt": base64.b64encode(FORGED).decode()}
    frame = getattr(collect, "frame", None)
    return frame(0, files) if frame is not None else json.dumps(files).encode()


def forger_task(tmp_path: Path, mode: str, wall: float = 30) -> Task:
    script = tmp_path / f"forger-{uuid.uuid4().hex[:8]}.py"
    script.write_text(FORGER)
    argv = [sys.executable, "{input}/forger.py", "{output}", mode, forged_answer().hex()]
    limits = Limits(wall_seconds=wall, memory_bytes=2 * 2**30)
    return Task("forger", argv, stage={"forger.py": script}, limits=limits)


@needs_bwrap
@pytest.mark.parametrize("mode", ["term", "exit", "stop", "kill", "int"])
def test_a_forged_answer_is_never_scored(tmp_path: Path, mode: str) -> None:
    """Forge an answer into the side pipe, then SIGTERM, SIGSTOP, SIGKILL or SIGINT the collector, or
    exit so that the real collector writes too. Before: 'term' scored the forged 0.99 with no note and
    'stop' timed out with the forged answer attached. Now the pipe cannot be opened and the collector
    (the sandbox's pid 1) takes no signal from inside: the detector's own answer comes back, or the run is
    lost; never the forged one."""
    result = run_task(forger_task(tmp_path, mode, wall=10))
    print(mode, result.stdout.strip(), result.outputs, result.collector_lost, result.timed_out)
    assert result.outputs["result.txt"] != FORGED
    assert result.collector_lost or (result.ok and result.outputs == {"result.txt": OWN}), result.stderr
    assert not result.killed_for_memory and not result.timed_out


@needs_bwrap
def test_the_collector_cannot_be_opened_or_signalled_from_inside(tmp_path: Path) -> None:
    result = run_task(forger_task(tmp_path, "term"))
    assert "'forged': 'PermissionError'" in result.stdout, result.stdout
    assert result.ok and result.outputs == {"result.txt": OWN} and not result.collector_lost


SLEEPER = "import sys, time\nopen(sys.argv[1] + '/result.txt', 'w').write('0.5')\ntime.sleep(30)\n"


@needs_bwrap
def test_a_collector_killed_from_outside_is_lost_not_memory(tmp_path: Path) -> None:
    """The kernel (out of memory) or an operator may kill the collector: lost, not a memory kill."""
    token = f"assay-collector-{uuid.uuid4().hex}"
    script = tmp_path / "sleeper.py"
    script.write_text(SLEEPER)
    task = Task(
        "sleeper",
        [sys.executable, "{input}/sleeper.py", "{output}", token],
        stage={"sleeper.py": script},
        limits=Limits(wall_seconds=30, memory_bytes=2 * 2**30),
    )

    def kill_the_collector() -> None:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            collectors = [pid for pid in processes_with(token) if b"collect.py" in _cmdline(pid)]
            if collectors:
                os.kill(collectors[0], signal.SIGKILL)
                return
            time.sleep(0.05)

    killer = threading.Thread(target=kill_the_collector)
    killer.start()
    result = run_task(task)
    killer.join()
    assert result.collector_lost and not result.killed_for_memory and not result.ok
    assert result.outputs == {"result.txt": None}


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def test_the_host_takes_exactly_one_frame_then_end_of_file() -> None:
    """What the host accepts from the side pipe: one whole frame from a collector that exited 0."""
    from assay.runner.sandbox import collected

    files = {"result.txt": base64.b64encode(b"0.5").decode()}
    good = collect.frame(3, files)
    assert collected(good, 0, ["result.txt"]) == (3, {"result.txt": b"0.5"})
    for stream in (good + good, good[:-1], good + b" ", b"x" + good, forged_answer()[:10], b""):
        assert collected(stream, 0, ["result.txt"]) is None
    for status in (1, 128 + 9, 128 + 15, -9, None):
        assert collected(good, status, ["result.txt"]) is None
    assert collected(collect.frame(0, {"other": "eA=="}), 0, ["result.txt"]) == (0, {"result.txt": None})
    wrong = collect.frame(0, files).replace(b'"status": 0', b'"status": "0"')
    assert collected(wrong, 0, ["result.txt"]) is None


def test_the_collector_source_stays_standard_library_only() -> None:
    """It runs as ``python -I -S``: no site packages, no ``assay``."""
    source = Path(collect.__file__).read_text()
    assert "import assay" not in source and "from assay" not in source
    assert textwrap.dedent(source)
