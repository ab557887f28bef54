"""The sandbox works wherever the checkout and its environment lie (issue 36, item 1), and its refusals
name no model.

Before: a checkout or virtual environment under ``/tmp`` failed bubblewrap's probe ("Can't mkdir parents
for <clone>/.venv/bin"): the sandbox's ``/tmp`` was an absolute link to ``/task/tmp``, which bubblewrap
resolved against the host while it built the root, so no runtime mount point could be made below it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import assay
from assay.errors import UserError
from assay.runner import Task, isolation, isolation_available, run_task

needs_bwrap = pytest.mark.skipif(
    isolation_available() != "bwrap", reason=f"needs bwrap; best here is {isolation_available()}"
)
SEALED_RUN = textwrap.dedent(
    """
    import json, sys
    from assay.runner import Limits, Task, run_task
    from assay.runner.isolation import isolation_available, isolation_problem
    detector = "import sys; open(sys.argv[1] + '/result.txt', 'w').write(sys.prefix)"
    task = Task("k", [sys.executable, "-c", detector, "{output}"], require_isolation=True,
                limits=Limits(wall_seconds=60))
    problem = isolation_problem("bwrap")
    result = run_task(task) if problem is None else None
    print(json.dumps({
        "prefix": sys.prefix,
        "level": isolation_available(),
        "problem": problem,
        "ok": result is not None and result.ok,
        "inside": None if result is None else (result.outputs["result.txt"] or b"").decode(),
        "stderr": None if result is None else result.stderr[-300:],
    }))
    """
)


@needs_bwrap
def test_a_runtime_under_tmp_with_a_space_and_a_link_runs_sealed(tmp_path: Path) -> None:
    """This Python's prefix reached as ``<tmp>/x y/venv``: a link (to the real prefix) below a folder with
    a space in its name, under ``/tmp``. Before: isolation fell back to 'unshare' and bwrap's probe said
    "Can't mkdir parents for .../x y/venv/bin"."""
    assert str(tmp_path).startswith("/tmp/")
    folder = tmp_path / "x y"
    folder.mkdir()
    (folder / "venv").symlink_to(sys.prefix, target_is_directory=True)
    python = folder / "venv" / "bin" / Path(sys.executable).name
    env = {**os.environ, "PYTHONPATH": str(Path(assay.__file__).parents[1])}
    done = subprocess.run(
        [str(python), "-c", SEALED_RUN], capture_output=True, text=True, env=env, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    print(answer)
    assert answer["prefix"] == str(folder / "venv") or sys.prefix == sys.base_prefix
    assert answer["problem"] is None and answer["level"] == "bwrap"
    assert answer["ok"] and answer["inside"] == answer["prefix"], answer["stderr"]


def test_isolation_problem_keeps_the_probe_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """A failed probe keeps the failing command's own last stderr line, for a worker to log."""
    monkeypatch.setattr(isolation, "_PROBLEMS", {})
    monkeypatch.setattr(isolation, "_problem", lambda level: "bwrap: Can't mkdir parents for /x: oops")
    isolation._probe.cache_clear()
    try:
        assert isolation.isolation_problem("bwrap") == "bwrap: Can't mkdir parents for /x: oops"
        assert isolation._probe("bwrap") is False
    finally:
        isolation._probe.cache_clear()
    assert isolation.one_line("warning\n\nbwrap: No permissions to create new namespace\n") == (
        "bwrap: No permissions to create new namespace"
    )
    assert isolation._attempt(["false"]) == "false exited with status 1"


def test_the_refusal_of_a_sealed_task_names_no_model(monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: "task 'id-00000022' needs bwrap isolation ...", a test model's name in a line the team
    reads."""
    real = isolation._probe.__wrapped__
    monkeypatch.setattr(isolation, "_probe", lambda level: level != "bwrap" and real(level))
    with pytest.raises(UserError) as raised:
        run_task(Task("id-00000022", ["true"], require_isolation=True))
    line = str(raised.value)
    assert "id-00000022" not in line and "\n" not in line
    assert line.startswith("this job needs bwrap isolation and this machine offers")
