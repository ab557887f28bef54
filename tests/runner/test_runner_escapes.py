"""Attacks on the bwrap sandbox itself (issue 25): each test is a hostile detector checked from outside.

- identity: nothing inside a run names the model it runs on (no task key, no host path of an input, no
  inode or modification time of the host's file), in ``/proc``, the environment, any path or ``stat``;
- nested user namespaces: a detector cannot make one, so it cannot mount a tmpfs of its own;
- output folder: ``/task/output`` replaced by a link is not followed when the results are read;
- private pages: ``/tmp``, scratch, output and ``/dev/shm`` together hold at most ``scratch_bytes``;
- collector: a detector cannot kill the result collector (``test_runner_collector.py`` has the rest).
"""

from __future__ import annotations

import json
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

from assay.runner import Limits, Task, isolation_available, run_task
from assay.runner.isolation import runtime_paths

LEVEL = isolation_available()
needs_bwrap = pytest.mark.skipif(LEVEL != "bwrap", reason=f"needs bwrap; best isolation here is {LEVEL}")
SMALL = Limits(wall_seconds=30, memory_bytes=2 * 2**30)


def detector(tmp_path: Path, source: str) -> Path:
    """The script in a folder of its own, staged as ``program``."""
    folder = tmp_path / f"program-{uuid.uuid4().hex[:8]}"
    folder.mkdir()
    path = folder / "detector.py"
    path.write_text(textwrap.dedent(source))
    return path


def python_task(script: Path, *args: str, key: str = "t", **fields) -> Task:
    fields.setdefault("limits", SMALL)
    fields["stage"] = {"program": script.parent, **fields.get("stage", {})}
    return Task(key=key, argv=[sys.executable, "{input}/program/detector.py", *args], **fields)


IDENTITY_PROBE = """
import json, os, stat, sys
output, skip = sys.argv[1], {"/proc", "/sys", *sys.argv[2:]}
seen = []
def read(path):
    try:
        with open(path, "rb") as handle:
            seen.append(handle.read().decode("latin-1"))
    except OSError:
        pass
for pid in os.listdir("/proc"):
    if pid.isdigit() or pid in ("self", "thread-self"):
        for name in ("cmdline", "environ", "mountinfo", "cgroup", "cpuset", "stat", "status", "comm"):
            read(f"/proc/{pid}/{name}")
        try:
            seen.append(os.readlink(f"/proc/{pid}/cwd") + os.readlink(f"/proc/{pid}/exe"))
        except OSError:
            pass
seen.append(json.dumps(dict(os.environ)))
seen.append(os.uname().nodename)
stats = {}
for top, dirs, files in os.walk("/"):
    dirs[:] = [name for name in dirs if os.path.join(top, name) not in skip]
    for name in dirs + files:
        path = os.path.join(top, name)
        seen.append(path)
        if os.path.islink(path):
            seen.append(os.readlink(path))
        if path.startswith("/task/input/"):
            info = os.lstat(path)
            stats[path] = [info.st_ino, info.st_mtime_ns, info.st_atime_ns]
open(output + "/result.txt", "w").write(json.dumps({"seen": seen, "stats": stats}))
"""


@needs_bwrap
def test_identity_is_not_visible_inside_the_run(tmp_path: Path) -> None:
    model = tmp_path / "round" / "models" / "id-00000003"
    (model / "clean-example-data").mkdir(parents=True)
    (model / "model.pt").write_bytes(b"weights")
    (model / "clean-example-data" / "1.png").write_bytes(b"png")
    script = detector(tmp_path, IDENTITY_PROBE)
    skip = [str(path) for path in runtime_paths()]
    task = python_task(
        script, "{output}", *skip, key="id-00000003", stage={"model": model}, outputs=["result.txt"]
    )
    result = run_task(task)
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.outputs["result.txt"])
    text = "\n".join(report["seen"])
    assert "/task/input/model/model.pt" in text  # the probe did look
    for secret in ("id-00000003", str(model.parent), str(tmp_path / "round")):
        assert secret not in text, secret
    host = {path.relative_to(model): path.lstat() for path in [model, *model.rglob("*")]}
    staged = Path("/task/input/model")
    inside = {Path(p).relative_to(staged): v for p, v in report["stats"].items() if staged in Path(p).parents}
    assert set(inside) >= {Path("model.pt"), Path("clean-example-data/1.png")}
    for rel, (ino, mtime_ns, _) in inside.items():
        assert ino != host[rel].st_ino, rel  # a copy, not the host's inode (nor a hard link to it)
        assert mtime_ns != host[rel].st_mtime_ns, rel  # no modification time carried over


NESTED = """
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
uid, gid = os.getuid(), os.getgid()
report = {"unshare": libc.unshare(0x10000000 | 0x00020000) == 0}  # CLONE_NEWUSER | CLONE_NEWNS
for name, text in (("setgroups", "deny"), ("uid_map", f"0 {uid} 1"), ("gid_map", f"0 {gid} 1")):
    try:
        with open(f"/proc/self/{name}", "w") as handle:
            handle.write(text)
    except OSError:
        pass
report["mounted"] = libc.mount(b"none", b"/tmp", b"tmpfs", 0, None) == 0
open(sys.argv[1] + "/result.txt", "w").write(repr(report))
"""


@needs_bwrap
def test_no_nested_user_namespace_and_no_mount(tmp_path: Path) -> None:
    result = run_task(python_task(detector(tmp_path, NESTED), "{output}"))
    assert result.exit_code == 0, result.stderr
    report = eval(result.outputs["result.txt"])  # our own detector's repr of a dict
    assert report == {"unshare": False, "mounted": False}
    assert "no nested user namespaces" in result.isolation


OUTPUT_LINK = """
import os, sys
mode = sys.argv[1]
fake = "/task/scratch/fake"
os.makedirs(fake)
open(fake + "/result.txt", "w").write("0.987")
if mode == "rename":
    os.rename("/task/output", "/task/scratch/old")
else:
    os.rmdir("/task/output")
os.symlink(fake, "/task/output")
print(open("/task/output/result.txt").read())
"""


@needs_bwrap
@pytest.mark.parametrize("mode", ["rename", "rmdir"])
def test_output_folder_replaced_by_a_link_is_not_followed(tmp_path: Path, mode: str) -> None:
    result = run_task(python_task(detector(tmp_path, OUTPUT_LINK), mode))
    assert result.exit_code == 0, result.stderr
    assert result.stdout == "0.987\n"  # the link works inside
    assert result.outputs == {"result.txt": None}


def test_output_folder_link_at_the_weakest_level(tmp_path: Path) -> None:
    script = detector(
        tmp_path,
        """
        import os, sys
        output = sys.argv[1]
        fake = os.path.join(os.path.dirname(output), "scratch", "fake")
        os.makedirs(fake)
        open(fake + "/result.txt", "w").write("0.987")
        os.rmdir(output)
        os.symlink(fake, output)
        """,
    )
    result = run_task(python_task(script, "{output}"), isolation="none")
    # run by root, ``none`` runs it as a throwaway user who may not replace the folder at all
    assert result.exit_code == 0 or "PermissionError" in result.stderr, result.stderr
    assert result.outputs == {"result.txt": None}


FILLER = """
import os, sys
total = 0
for target in sys.argv[2:]:
    try:
        with open(target, "wb") as handle:
            while True:
                handle.write(b"x" * 2**20)
                handle.flush()
                total += 2**20
    except OSError:
        pass
print(total)
for target in sys.argv[2:]:
    os.remove(target)
open(sys.argv[1] + "/result.txt", "w").write(str(total))
"""


@needs_bwrap
def test_private_pages_are_bounded_by_the_scratch_size_in_total(tmp_path: Path) -> None:
    limits = Limits(wall_seconds=60, memory_bytes=2 * 2**30, scratch_bytes=16 * 2**20)
    targets = ["/tmp/fill", "{scratch}/fill", "/dev/shm/fill", "{output}/fill"]
    result = run_task(python_task(detector(tmp_path, FILLER), "{output}", *targets, limits=limits))
    assert result.exit_code == 0, result.stderr
    assert 8 * 2**20 <= int(result.outputs["result.txt"]) <= 16 * 2**20


KILL_COLLECTOR = """
import os, signal, sys
open(sys.argv[1] + "/result.txt", "w").write("0.5")
os.kill(os.getppid(), signal.SIGKILL)
"""


@needs_bwrap
def test_a_detector_cannot_kill_its_collector(tmp_path: Path) -> None:
    """Was: the SIGKILL lost the results (reported as lost, after having been taken for a memory kill).
    The collector is now the sandbox's pid 1, which takes no signal from inside; one killed from outside is
    still reported as lost (``test_runner_collector.py``)."""
    result = run_task(python_task(detector(tmp_path, KILL_COLLECTOR), "{output}"))
    assert result.ok and result.collector_lost is False, result.stderr
    assert result.outputs == {"result.txt": b"0.5"}


@needs_bwrap
def test_a_normal_run_has_its_collector(tmp_path: Path) -> None:
    script = detector(tmp_path, "import sys\nopen(sys.argv[1] + '/result.txt', 'w').write('0.5')\n")
    result = run_task(python_task(script, "{output}"))
    assert result.ok and result.collector_lost is False and result.outputs == {"result.txt": b"0.5"}


@pytest.mark.parametrize("version", [(0, 7, 0), (0, 8, 0)])
def test_an_older_bubblewrap_is_said_in_the_isolation_line(
    monkeypatch: pytest.MonkeyPatch, version: tuple[int, ...]
) -> None:
    from assay.runner import isolation

    monkeypatch.setattr(isolation, "bwrap_version", lambda: version)
    monkeypatch.setattr(isolation, "nested_userns_disabled", lambda: version >= (0, 8))
    argv, described = isolation.wrap("bwrap", ["true"], isolation.Mounts())
    if version < (0, 8):
        assert "--disable-userns" not in argv and "--unshare-user-try" in argv
        assert "nested user namespaces NOT disabled (bubblewrap 0.7.0; 0.8 or later can)" in described
    else:
        assert argv[argv.index("--disable-userns") - 1] == "--unshare-user"
        assert "no nested user namespaces" in described


@needs_bwrap
def test_the_sandbox_is_named_sandbox_where_it_may_be_and_says_so_where_not(
    tmp_path: Path, monkeypatch
) -> None:
    """On this host bubblewrap names the sandbox's host; under a container's seccomp profile (podman's
    default forbids sethostname) it keeps a private UTS namespace with the container's name, and the
    isolation line says so (the worker image's test runs that case for real)."""
    from assay.runner import isolation

    script = detector(
        tmp_path, "import os, sys\nopen(sys.argv[1] + '/name.txt', 'w').write(os.uname().nodename)\n"
    )
    result = run_task(python_task(script, "{output}", key="named", outputs=["name.txt"]))
    assert result.exit_code == 0 and result.outputs["name.txt"] == b"sandbox", result.stderr
    assert "hostname" not in result.isolation
    monkeypatch.setattr(isolation, "hostname_settable", lambda: False)
    argv, described = isolation.wrap("bwrap", ["true"], isolation.Mounts())
    assert "--hostname" not in argv and "--unshare-uts" in argv
    assert "the container's hostname" in described
