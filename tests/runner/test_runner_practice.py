"""Runs below bubblewrap (``unshare``, ``none``) cannot write outside their own folders (issue 35, item 4).

A round may let practice jobs run where bubblewrap does not work. Before, such a detector ran with the
worker's file system writable: as root it created ``/x`` and ``/usr/x``, could rewrite the installed
``assay`` package that the next sealed run imports, and append to any file. Now ``unshare`` gives it a
read-only view of this machine with only its scratch and output writable, and ``none`` run by root runs it as
a throwaway user that may read but not write the host's files.
"""

from __future__ import annotations

import json
import os
import sys
import uuid
from pathlib import Path

import pytest

import assay
from assay.runner import Limits, Task, levels_available, run_task
from assay.runner.isolation import host_view

WEAK = [level for level in levels_available() if level != "bwrap"]
PROBE = """
import json, os, sys
output, scratch, targets = sys.argv[1], sys.argv[2], sys.argv[3:]
done = {}
def attempt(path, mode):
    try:
        with open(path, mode) as handle:
            handle.write("assay probe\\n")
        return "written"
    except OSError as err:
        return type(err).__name__
for target in targets:
    done[target] = attempt(target, "a" if target.endswith("owned.txt") else "x")
done["scratch"] = attempt(scratch + "/mine", "w")
done["output"] = attempt(output + "/mine", "w")
done["read"] = open(targets[-1]).read()
open(output + "/result.txt", "w").write(json.dumps(done))
"""


def targets(tmp_path: Path) -> list[Path]:
    """Where the probe tries to write: the root, /usr, the installed assay package, a file of the test."""
    name = f"x_assay_probe_{uuid.uuid4().hex[:8]}"
    owned = tmp_path / "owned.txt"
    owned.write_text("the test's own\n")
    return [Path("/") / name, Path("/usr") / name, Path(assay.__file__).parent / name, owned]


@pytest.mark.skipif(os.geteuid() != 0 and "unshare" not in WEAK, reason="no read-only level below bwrap here")
@pytest.mark.parametrize("level", WEAK)
def test_a_practice_run_below_bwrap_writes_only_its_own_folders(tmp_path: Path, level: str) -> None:
    if level == "none" and os.geteuid() != 0:
        pytest.skip("'none' run by a user other than root writes as that user (the leaderboard refuses it)")
    paths = targets(tmp_path)
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    argv = [sys.executable, str(script), "{output}", "{scratch}", *map(str, paths)]
    try:
        result = run_task(Task("practice", argv, limits=Limits(wall_seconds=60)), isolation=level)
    finally:
        created = [path for path in paths[:3] if path.exists()]
        for path in created:
            path.unlink()
    assert result.exit_code == 0, result.stderr
    done = json.loads(result.outputs["result.txt"])
    print(level, done)
    assert created == []
    assert {done[str(path)] for path in paths} <= {"PermissionError", "OSError"}, done
    assert (tmp_path / "owned.txt").read_text() == "the test's own\n"
    assert done["scratch"] == done["output"] == "written"
    assert done["read"] == "the test's own\n"  # a read-only view: it reads what it cannot write
    assert host_view(level) in result.isolation


NESTED = """
import ctypes, json, os, sys
libc = ctypes.CDLL(None, use_errno=True)
done = {"unshare": libc.unshare(0x10000000 | 0x00020000)}  # a user and mount namespace of its own
done["remount"] = libc.mount(None, b"/", None, ctypes.c_ulong(0x20 | 0x1000 | 0x4000), None)  # rw again
attr = (ctypes.c_uint64 * 4)(0, 1, 0, 0)  # mount_setattr: clear read-only, recursively
size = ctypes.c_size_t(32)
done["setattr"] = libc.syscall(442, -100, b"/", ctypes.c_uint(0x8000), ctypes.byref(attr), size)
try:
    open(sys.argv[1], "x").close()
    done["write"] = "written"
except OSError as err:
    done["write"] = type(err).__name__
print(json.dumps(done))  # stdout: in a user namespace without a uid map it may create no file at all
"""


@pytest.mark.parametrize("level", WEAK)
def test_a_nested_user_namespace_does_not_make_the_host_writable(tmp_path: Path, level: str) -> None:
    """In a user namespace of its own the detector holds every capability again, but over copies of the
    mounts it was given, whose read-only flag the kernel locks: it still writes nothing outside."""
    if level == "none" and os.geteuid() != 0:
        pytest.skip("'none' run by a user other than root writes as that user (the leaderboard refuses it)")
    target = Path("/") / f"x_assay_probe_{uuid.uuid4().hex[:8]}"
    script = tmp_path / "nested.py"
    script.write_text(NESTED)
    argv = [sys.executable, str(script), str(target)]
    try:
        result = run_task(Task("nested", argv, limits=Limits(wall_seconds=60)), isolation=level)
    finally:
        created = target.exists()
        target.unlink(missing_ok=True)
    done = json.loads(result.stdout)
    print(level, done)
    assert not created and done["write"] != "written" and done["setattr"] != 0
