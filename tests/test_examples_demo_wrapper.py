"""``examples/demo.sh``, what ``make demo`` runs: one progress line per step of each part, the parts' whole
output in ``OUT/logs/``, a summary with the total time; a failing part stops the demo with exit 2 and its
log's last lines, and the parts after it do not run. The three parts are stand-ins that print steps the way
the real scripts do (``== N. ...``), so this runs in a second; the real parts run in ``make demo``."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _stand_ins(tmp_path: Path, failing: str | None = None) -> Path:
    """A folder laid out like the project's root: examples/demo.sh, three part scripts and a checker."""
    examples = tmp_path / "examples"
    examples.mkdir()
    shutil.copy(ROOT / "examples" / "demo.sh", examples / "demo.sh")
    for part in ("zoo", "dyepack", "star"):
        script = f'echo "== 1. {part} first step"\necho "detail {part}"\necho "noise on stderr" >&2\n'
        script += f'echo "== 2. {part} second step"\n'
        script += f'echo "{part} broke here"; exit 3\n' if part == failing else f'touch "$1/{part}.done"\n'
        (examples / f"{part}-demo.sh").write_text(script)
    (examples / "check_demo.py").write_text("import sys; print('demo check: all parts as expected')\n")
    return tmp_path


def _demo(root: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", "examples/demo.sh", "out"], cwd=root, capture_output=True, text=True, timeout=60
    )


def test_the_demo_prints_a_line_per_step_keeps_the_logs_and_ends_with_the_total_time(tmp_path):
    root = _stand_ins(tmp_path)
    done = _demo(root)
    assert done.returncode == 0, done.stdout + done.stderr
    steps = [line for line in done.stdout.splitlines() if re.match(r"\[ ?\d+:\d\d\] \w+ \d\. ", line)]
    assert [s.split("] ", 1)[1] for s in steps] == [
        f"{part} {n}. {part} {word} step"
        for part in ("zoo", "dyepack", "star")
        for n, word in ((1, "first"), (2, "second"))
    ]
    assert "detail zoo" not in done.stdout and "noise on stderr" not in done.stdout + done.stderr
    log = (root / "out" / "logs" / "zoo.log").read_text()
    assert "detail zoo" in log and "noise on stderr" in log
    assert "demo check: all parts as expected" in done.stdout
    assert re.search(
        r"^  total\s+\d+ s \(0 min \d\d s\); outputs in out/, logs in out/logs/$", done.stdout, re.M
    )
    assert all((root / "out" / f"{part}.done").is_file() for part in ("zoo", "dyepack", "star"))


def test_a_failing_part_stops_the_demo_with_exit_2_and_its_logs_last_lines(tmp_path):
    root = _stand_ins(tmp_path, failing="dyepack")
    done = _demo(root)
    assert done.returncode == 2
    assert "dyepack FAILED; the last lines of out/logs/dyepack.log:" in done.stdout
    assert "    dyepack broke here" in done.stdout
    assert (
        not (root / "out" / "star.done").exists()
        and "star" not in (root / "out" / "logs").iterdir().__str__()
    )
    assert "total" not in done.stdout
