"""assay.runner with real processes: tiny hostile detectors written to tmp_path and run through the sandbox.

Assertions about what the sandbox hides or cuts off need bwrap (or ``unshare`` for the network); they skip
where this machine lacks it, while the limit and bookkeeping checks run at any isolation level.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from pathlib import Path

import pytest

from assay.errors import UserError
from assay.runner import (
    Limits,
    LocalExecutor,
    Task,
    TaskResult,
    isolation_available,
    levels_available,
    make_executor,
    run_task,
)
from host_processes import processes_with

PROJECT = Path(__file__).resolve().parents[2]
CONSTANT = PROJECT / "detectors" / "constant"
LEVEL = isolation_available()
needs_bwrap = pytest.mark.skipif(LEVEL != "bwrap", reason=f"needs bwrap; best isolation here is {LEVEL}")
SMALL = Limits(wall_seconds=30, memory_bytes=2 * 2**30)


def detector(tmp_path: Path, source: str, name: str = "detector.py") -> Path:
    """The script in a folder of its own, which ``python_task`` stages: nothing else of the host is seen."""
    folder = tmp_path / f"program-{uuid.uuid4().hex[:8]}"
    folder.mkdir()
    path = folder / name
    path.write_text(textwrap.dedent(source))
    return path


def python_task(script: Path, *args: str, key: str = "t", **fields) -> Task:
    fields.setdefault("limits", SMALL)
    fields["stage"] = {"program": script.parent, **fields.get("stage", {})}
    return Task(key=key, argv=[sys.executable, f"{{input}}/program/{script.name}", *args], **fields)


def test_normal_detector_outputs_and_streams_are_read_back(tmp_path: Path) -> None:
    script = detector(
        tmp_path,
        """
        import sys
        open(sys.argv[1] + "/result.txt", "w").write("0.7")
        print("to stdout"); print("to stderr", file=sys.stderr)
        """,
    )
    result = run_task(python_task(script, "{output}", key="normal"))
    assert isinstance(result, TaskResult) and result.ok
    assert (result.key, result.exit_code, result.timed_out, result.killed_for_memory) == (
        "normal",
        0,
        False,
        False,
    )
    assert result.outputs == {"result.txt": b"0.7"}
    assert result.stdout == "to stdout\n" and result.stderr == "to stderr\n"
    assert result.isolation.startswith(LEVEL + ":") or result.isolation.startswith("none:")
    assert result.worker == f"{socket.gethostname()}:{os.getpid()}"
    assert 0 < result.wall_seconds < 30


HIDDEN_READER = """
import ctypes, os, sys
ground_truth, answers, outside, output = sys.argv[1:5]

def attempt(read):
    try:
        return repr(read())
    except OSError as err:
        return type(err).__name__
def write_outside():
    with open(outside, "w") as handle:
        handle.write("x")
    return "written"

libc = ctypes.CDLL(None, use_errno=True)
report = {
    "ground_truth": attempt(lambda: open(ground_truth).read()),
    "answers": attempt(lambda: open(answers).read()),
    "umount": libc.umount2(os.path.dirname(ground_truth).encode(), 2),  # MNT_DETACH: needs CAP_SYS_ADMIN
    "after_umount": attempt(lambda: open(ground_truth).read()),
    "model": attempt(lambda: open(sys.argv[5] + "/model/model.pt").read()),
    "write_outside": attempt(write_outside),
}
open(output + "/result.txt", "w").write(repr(report))
"""


@needs_bwrap
def test_hidden_paths_stay_hidden_even_from_root(tmp_path: Path) -> None:
    round_dir = tmp_path / "round"
    model = round_dir / "models" / "id-00000003"
    model.mkdir(parents=True)
    (model / "model.pt").write_text("weights")
    (round_dir / "ground_truth.csv").write_text("model,poisoned\nid-00000003,1\n")
    answers = tmp_path / "answers.txt"
    answers.write_text("SECRET")
    script = detector(tmp_path, HIDDEN_READER)
    outside = tmp_path / "outside.txt"
    task = python_task(
        script,
        *(str(round_dir / "ground_truth.csv"), str(answers), str(outside), "{output}", "{input}"),
        stage={"model": model},  # staged from inside the round folder, which itself is not there
    )
    result = run_task(task)
    assert result.exit_code == 0, result.stderr
    report = eval(result.outputs["result.txt"])  # our own detector's repr of a dict
    assert report["ground_truth"] == "FileNotFoundError"  # never bound into the empty root
    assert report["answers"] == "FileNotFoundError"
    assert report["umount"] == -1  # no capabilities, so no mount can be removed
    assert report["after_umount"] == "FileNotFoundError"
    assert report["model"] == repr("weights")  # the staged entry is visible
    assert report["write_outside"] in ("FileNotFoundError", "OSError")  # not there, and the root is read-only
    assert not outside.exists()
    assert "empty read-only root" in result.isolation and "no network" in result.isolation


def test_environment_is_built_from_scratch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ASSAY_FAKE_API_KEY", "s3cret")
    script = detector(
        tmp_path,
        "import json, os, sys\nopen(sys.argv[1] + '/env.json', 'w').write(json.dumps(dict(os.environ)))\n",
    )
    limits = Limits(wall_seconds=30, cpus=1.5)
    task = python_task(
        script, "{output}", limits=limits, env={"CACHE": "{scratch}/cache"}, outputs=["env.json"]
    )
    result = run_task(task)
    env = json.loads(result.outputs["env.json"])
    assert "ASSAY_FAKE_API_KEY" not in env and "ASSAY_HOME" not in env
    assert env["OMP_NUM_THREADS"] == env["MKL_NUM_THREADS"] == "2"  # ceil(1.5)
    assert env["CACHE"] == env["HOME"] + "/cache" and env["HOME"].endswith("/scratch")
    assert env["CUDA_VISIBLE_DEVICES"] == ""


@pytest.mark.slow
@needs_bwrap
def test_concurrent_tasks_cannot_see_each_other(tmp_path: Path) -> None:
    script = detector(
        tmp_path,
        """
        import os, sys, time
        output, scratch, key = sys.argv[1:4]
        open(f"{scratch}/marker-{key}", "w").write(key)
        time.sleep(0.5)  # both tasks are running now
        found = [name for root, dirs, files in os.walk("/") if not root.startswith(("/proc", "/usr"))
                 for name in files if name.startswith("marker-")]
        open(output + "/result.txt", "w").write(",".join(sorted(found)))
        """,
    )
    tasks = [python_task(script, "{output}", "{scratch}", f"m{i}", key=f"m{i}") for i in range(2)]
    results = LocalExecutor(2).map(tasks, on_result=None)
    for result in results:
        assert result.outputs["result.txt"].decode() == f"marker-{result.key}", result.stderr


@pytest.mark.parametrize("level", levels_available())
def test_sleeper_is_stopped_at_the_wall_clock_limit(tmp_path: Path, level: str) -> None:
    script = detector(tmp_path, "import time\nprint('started', flush=True)\ntime.sleep(3600)\n")
    start = time.monotonic()
    task = python_task(script, limits=Limits(wall_seconds=1.0))
    result = run_task(task, workdir=tmp_path / "work", isolation=level)
    assert result.timed_out and not result.ok and not result.killed_for_memory
    assert 1.0 <= result.wall_seconds < 5
    assert time.monotonic() - start < 10
    assert result.stdout == "started\n"
    assert list((tmp_path / "work").iterdir()) == []  # temp folder removed after a timeout too


def test_memory_hog_is_contained_and_recorded(tmp_path: Path) -> None:
    script = detector(tmp_path, "import sys\ndata = bytearray(int(sys.argv[1]))\nprint(len(data))\n")
    limits = Limits(wall_seconds=30, memory_bytes=512 * 2**20)
    result = run_task(python_task(script, str(2 * 2**30), limits=limits))
    assert result.exit_code not in (0, None) and result.killed_for_memory and not result.timed_out
    assert "MemoryError" in result.stderr
    fine = run_task(python_task(script, str(128 * 2**20), limits=limits))  # the same program, within bounds
    assert fine.ok and fine.stdout == f"{128 * 2**20}\n"
    # a GPU task's RLIMIT_DATA in place of RLIMIT_AS: tests/runner/test_runner_gpu.py


@pytest.mark.slow
def test_torch_imports_under_the_default_memory_limit(tmp_path: Path) -> None:
    script = detector(tmp_path, "import torch\nprint(torch.ones(3).sum().item())\n")
    result = run_task(python_task(script, limits=Limits(wall_seconds=120)))
    assert result.exit_code == 0, result.stderr
    assert result.stdout == "3.0\n"
    # torch needs about 768 MiB of address space just to load; below that the loader's error is recognised
    starved = run_task(python_task(script, limits=Limits(wall_seconds=120, memory_bytes=256 * 2**20)))
    assert starved.exit_code != 0 and starved.killed_for_memory, starved.stderr


CHILD_LEFT_BEHIND = """
import os, subprocess, sys, time
token, escape, output = sys.argv[1:4]
child = "import os, sys, time; os.setsid() if sys.argv[2] == 'yes' else None; time.sleep(3600)"
subprocess.Popen([sys.executable, "-c", child, token, escape])  # keeps our stdout pipe open, too
time.sleep(0.3)  # long enough for the child to have left the process group
open(output + "/result.txt", "w").write("0.5")
"""


@pytest.mark.parametrize(
    ("level", "escape"),
    [(level, "no") for level in levels_available()]
    + [(level, "yes") for level in levels_available() if level != "none"],
)
def test_children_do_not_outlive_the_detector(tmp_path: Path, level: str, escape: str) -> None:
    """A child in the detector's process group dies at every level; one that calls setsid needs a pid
    namespace (bwrap or unshare)."""
    token = f"assay-orphan-{uuid.uuid4().hex}"
    script = detector(tmp_path, CHILD_LEFT_BEHIND)
    start = time.monotonic()
    result = run_task(python_task(script, token, escape, "{output}"), isolation=level)
    assert result.exit_code == 0 and result.outputs["result.txt"] == b"0.5", result.stderr
    assert time.monotonic() - start < 10  # the open pipe did not make the harness wait
    deadline = time.monotonic() + 5
    while processes_with(token) and time.monotonic() < deadline:
        time.sleep(0.05)  # SIGKILL is delivered asynchronously
    assert processes_with(token) == []


NETWORK_CLIENT = """
import socket, sys
try:
    socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=3).close()
    answer = "connected"
except OSError as err:
    answer = type(err).__name__
open(sys.argv[2] + "/result.txt", "w").write(answer)
"""


@pytest.mark.skipif(LEVEL == "none", reason="no network isolation on this machine")
def test_network_is_cut_off_unless_allowed(tmp_path: Path) -> None:
    server = socket.create_server(("127.0.0.1", 0))
    server.listen()
    port = str(server.getsockname()[1])
    accepting = threading.Thread(target=lambda: [server.accept() for _ in range(3)], daemon=True)
    accepting.start()
    try:
        socket.create_connection(("127.0.0.1", int(port)), timeout=3).close()  # reachable from outside
        script = detector(tmp_path, NETWORK_CLIENT)
        allowed = Limits(wall_seconds=30, network=True)
        for level in (level for level in levels_available() if level != "none"):
            cut = run_task(python_task(script, port, "{output}"), isolation=level)
            assert cut.exit_code == 0, cut.stderr
            assert cut.outputs["result.txt"] in (b"OSError", b"ConnectionRefusedError")
            assert "no network" in cut.isolation
            open_ = run_task(python_task(script, port, "{output}", limits=allowed), isolation=level)
            assert open_.outputs["result.txt"] == b"connected", open_.stderr
            assert "no network" not in open_.isolation
    finally:
        server.close()


@pytest.mark.parametrize("written", [b"nan", b"2.0", b"not a number\n", b"\xff\xfe"])
def test_garbage_results_come_back_as_bytes(tmp_path: Path, written: bytes) -> None:
    script = detector(
        tmp_path, "import sys\nopen(sys.argv[1] + '/result.txt', 'wb').write(eval(sys.argv[2]))\n"
    )
    result = run_task(python_task(script, "{output}", repr(written), outputs=["result.txt", "extra.json"]))
    assert result.exit_code == 0
    assert result.outputs == {"result.txt": written, "extra.json": None}


def test_oversized_output_is_dropped(tmp_path: Path) -> None:
    script = detector(
        tmp_path, "import sys\nopen(sys.argv[1] + '/result.txt', 'wb').write(b'1' * (17 * 2**20))\n"
    )
    result = run_task(python_task(script, "{output}"))
    assert result.exit_code == 0 and result.outputs == {"result.txt": None}


def test_symlinked_output_is_not_followed(tmp_path: Path) -> None:
    secret = tmp_path / "ground_truth.csv"
    secret.write_text("id-00000003,1\n")
    script = detector(tmp_path, "import os, sys\nos.symlink(sys.argv[1], sys.argv[2] + '/result.txt')\n")
    result = run_task(python_task(script, str(secret), "{output}"))
    assert result.exit_code == 0, result.stderr
    assert result.outputs == {"result.txt": None}


def test_long_output_keeps_the_last_64_kib_and_the_folder_goes(tmp_path: Path) -> None:
    script = detector(
        tmp_path,
        """
        import sys
        for i in range(20000):
            print(f"line {i:06d}")
        sys.stderr.write("e" * 100000 + "END")
        sys.exit(3)
        """,
    )
    work = tmp_path / "work"
    result = run_task(python_task(script), workdir=work)
    assert result.exit_code == 3 and not result.ok and not result.killed_for_memory
    assert result.stdout.endswith("line 019999\n") and result.stdout.startswith("[first ")
    assert "line 000000" not in result.stdout
    assert len(result.stdout.encode()) <= 64 * 1024 + 40
    assert result.stderr.endswith("END") and len(result.stderr.encode()) <= 64 * 1024 + 40
    assert list(work.iterdir()) == []


def test_local_executor_keeps_task_order_and_reports_each_once(tmp_path: Path) -> None:
    script = detector(
        tmp_path,
        """
        import sys, time
        time.sleep(float(sys.argv[1]))
        open(sys.argv[2] + "/result.txt", "w").write(sys.argv[1])
        """,
    )
    delays = ["0.6", "0.0", "0.3", "0.1"]
    tasks = [python_task(script, delay, "{output}", key=f"m{i}") for i, delay in enumerate(delays)]
    seen: list[tuple[str, int]] = []
    results = LocalExecutor(2).map(tasks, on_result=lambda r: seen.append((r.key, threading.get_ident())))
    assert [r.key for r in results] == ["m0", "m1", "m2", "m3"]
    assert [r.outputs["result.txt"] for r in results] == [d.encode() for d in delays]
    assert sorted(key for key, _ in seen) == ["m0", "m1", "m2", "m3"]
    assert {ident for _, ident in seen} == {threading.get_ident()}  # called in the calling thread
    assert seen[0][0] != "m0"  # reported as finished, not in task order


def test_constant_detector_runs_inside_the_sandbox(tmp_path: Path) -> None:
    model = tmp_path / "round" / "models" / "id-00000003"
    (model / "clean-example-data").mkdir(parents=True)
    (model / "model.pt").write_bytes(b"not read by the constant detector")
    argv = [sys.executable, str(CONSTANT / "entrypoint.py"), "infer"]
    argv += ["--model_filepath", "{input}/model/model.pt", "--result_filepath", "{output}/result.txt"]
    argv += ["--scratch_dirpath", "{scratch}", "--examples_dirpath", "{input}/model/clean-example-data"]
    argv += ["--metaparameters_filepath", str(CONSTANT / "metaparameters.json")]
    argv += ["--schema_filepath", str(CONSTANT / "metaparameters_schema.json")]
    argv += ["--learned_parameters_dirpath", str(CONSTANT / "learned_parameters")]
    task = Task(
        "id-00000003",
        argv,
        stage={"model": model},
        limits=Limits(wall_seconds=60),
        readonly=[CONSTANT],
    )
    result = run_task(task)
    assert result.exit_code == 0, result.stderr
    assert float(result.outputs["result.txt"]) == 0.5


def test_every_available_level_runs_a_task_with_staged_files_and_folders(tmp_path: Path) -> None:
    (tmp_path / "in.txt").write_text("staged")
    (tmp_path / "folder" / "sub").mkdir(parents=True)
    (tmp_path / "folder" / "sub" / "f.txt").write_text("deep")
    stage = {"in.txt": tmp_path / "in.txt", "folder": tmp_path / "folder"}
    script = detector(
        tmp_path,
        """
        import sys
        text = open(sys.argv[3] + "/in.txt").read() + open(sys.argv[3] + "/folder/sub/f.txt").read()
        open(sys.argv[1] + "/result.txt", "w").write(sys.argv[2] + ":" + text)
        """,
    )
    for level in levels_available():
        task = python_task(script, "{output}", level, "{input}", stage=stage)
        result = run_task(task, isolation=level)
        assert result.outputs == {"result.txt": f"{level}:stageddeep".encode()}, result.stderr
        assert result.isolation.startswith(level + ":")


def test_callers_mistakes_raise_and_detector_failures_do_not(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="does not exist"):
        run_task(Task("k", ["true"], stage={"model": tmp_path / "missing"}))
    with pytest.raises(UserError, match="unknown isolation"):
        run_task(Task("k", ["true"]), isolation="chroot")
    with pytest.raises(ValueError, match="one plain file name"):
        Task("k", ["true"], outputs=["../escape.txt"])
    with pytest.raises(ValueError, match="wall_seconds"):
        Limits(wall_seconds=0)
    missing = run_task(Task("k", [str(tmp_path / "no-such-program")]), isolation="none")
    # None: the harness could not start it; 127: readonly.py could not (``none`` run by root)
    assert missing.exit_code in (None, 127) and "cannot start" in missing.stderr
    with pytest.raises(UserError, match="unknown executor"):
        make_executor("slurm", 1, None)
    assert isinstance(make_executor("local", 2, None), LocalExecutor)


def test_ray_executor_without_ray_is_a_user_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from assay.runner import RayExecutor

    monkeypatch.setitem(sys.modules, "ray", None)  # makes ``import ray`` fail as if it were not installed
    with pytest.raises(UserError, match=r"pip install 'ray\[default\]'"):
        RayExecutor()
    with pytest.raises(UserError, match="needs ray"):
        make_executor("ray", 1, "auto")


@pytest.mark.slow
def test_ray_executor_matches_local(tmp_path: Path) -> None:
    ray = pytest.importorskip("ray")
    from assay.runner import RayExecutor

    script = detector(
        tmp_path,
        "import sys\nprint(sys.argv[1])\nopen(sys.argv[2] + '/result.txt', 'w').write(sys.argv[1])\n",
    )
    tasks = [
        python_task(script, str(i / 10), "{output}", key=f"m{i}", limits=Limits(30, 2**30)) for i in range(3)
    ]
    local = LocalExecutor(2).map(tasks)
    seen: list[str] = []
    executor = RayExecutor(init_kwargs={"num_cpus": 2, "include_dashboard": False, "log_to_driver": False})
    try:
        remote = executor.map(tasks, on_result=lambda r: seen.append(r.key))
        assert {r.node for r in remote} == {ray.get_runtime_context().get_node_id()}  # the one node here
        assert {r.node for r in local} == {""}
        # A caller's mistake on a node comes back as the same one-line UserError as on this machine.
        sealed = python_task(script, "1", "{output}", key="sealed", require_isolation=True)
        executor.isolation = "none"
        with pytest.raises(UserError) as refused:
            executor.map([sealed])
        assert "\n" not in str(refused.value) and "needs bwrap isolation" in str(refused.value)
    finally:
        ray.shutdown()
    assert sorted(seen) == ["m0", "m1", "m2"]

    def same(result: TaskResult) -> tuple:
        return (
            result.key,
            result.exit_code,
            result.timed_out,
            result.stdout,
            result.outputs,
            result.isolation,
        )

    assert [same(r) for r in remote] == [same(r) for r in local]


@pytest.mark.slow
def test_a_shared_deadline_stops_a_run_and_skips_a_late_start(tmp_path: Path) -> None:
    script = detector(tmp_path, "import time\ntime.sleep(3600)\n")
    start = time.monotonic()
    cut = run_task(python_task(script, deadline=time.time() + 1.5, limits=Limits(wall_seconds=60)))
    assert cut.timed_out and cut.deadline_reached and cut.exit_code is not None
    assert time.monotonic() - start < 6  # the per-model limit was 60 s: the shared deadline came first
    late = run_task(python_task(script, deadline=time.time() - 1))
    assert late.deadline_reached and late.exit_code is None and "not started" in late.stderr
    own = run_task(python_task(script, deadline=time.time() + 60, limits=Limits(wall_seconds=1)))
    assert own.timed_out and not own.deadline_reached  # its own limit, not the job's


def test_sealed_tasks_refuse_weaker_isolation(tmp_path: Path) -> None:
    script = detector(tmp_path, "print('ran')\n")
    with pytest.raises(UserError, match="needs bwrap isolation"):
        run_task(python_task(script, require_isolation=True), isolation="none")
    if LEVEL == "bwrap":
        assert run_task(python_task(script, require_isolation=True)).stdout == "ran\n"


SPACE_FILLER = """
import os, sys
output, target = sys.argv[1:3]
written = 0
try:
    with open(target, "wb") as handle:
        for _ in range(4096):
            handle.write(b"x" * 2**20)
            handle.flush()
            written += 2**20
except OSError as err:
    print(type(err).__name__, err.errno)
os.remove(target)  # room for the answer again
open(output + "/result.txt", "w").write(str(written))
"""


@needs_bwrap
@pytest.mark.parametrize("target", ["{scratch}/fill", "/tmp/fill", "/dev/shm/fill", "{output}/fill"])
def test_private_space_is_bounded(tmp_path: Path, target: str) -> None:
    script = detector(tmp_path, SPACE_FILLER)
    limits = Limits(wall_seconds=60, scratch_bytes=32 * 2**20)
    result = run_task(python_task(script, "{output}", target, limits=limits))
    assert "OSError 28" in result.stdout, result.stderr  # ENOSPC
    assert int(result.outputs["result.txt"]) <= 32 * 2**20
    assert "32 MiB private scratch" in result.isolation


FORK_BOMB = """
import os, sys, time
token, output = sys.argv[1:3]
children = 0
try:
    for _ in range(200):
        if os.fork() == 0:
            os.setsid()
            time.sleep(3600)
            os._exit(0)
        children += 1
except OSError as err:
    print("fork failed:", type(err).__name__)
open(output + "/result.txt", "w").write(str(children))
"""


@pytest.mark.slow
@pytest.mark.skipif(not Path("/sys/fs/cgroup/pids/cgroup.procs").exists(), reason="no pids cgroup here")
@pytest.mark.parametrize("level", levels_available())
def test_process_count_is_bounded_and_every_process_dies(tmp_path: Path, level: str) -> None:
    token = f"assay-bomb-{uuid.uuid4().hex}"
    script = detector(tmp_path, FORK_BOMB)
    limits = Limits(wall_seconds=60, max_processes=32)
    result = run_task(python_task(script, token, "{output}", limits=limits), isolation=level)
    assert "fork failed" in result.stdout, result.stderr
    assert int(result.outputs["result.txt"]) < 32
    assert "at most 32 processes" in result.isolation
    assert processes_with(token) == []  # the cgroup is emptied even where no pid namespace is


def test_folders_of_dead_workers_are_swept(tmp_path: Path) -> None:
    from assay.runner.workspace import OWNER_FILE, _start_time

    work = tmp_path / "work"
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale, foreign, live = work / "stale-1", work / "other-host-1", work / "live-1"
    other_ns = work / "other-pid-namespace-1"  # same host and /tmp, another container or Ray node
    for folder, owner in (
        (stale, f"{socket.gethostname()} {dead.pid} 1"),
        (foreign, f"another-host {os.getpid()} 1"),
        (other_ns, f"{socket.gethostname()} {dead.pid} 1 pid:[1]"),
        (
            live,
            f"{socket.gethostname()} {os.getpid()} {_start_time(os.getpid())}",
        ),
    ):
        (folder / "scratch").mkdir(parents=True)
        (folder / OWNER_FILE).write_text(owner)
    script = detector(tmp_path, "print('ok')\n")
    assert run_task(python_task(script), workdir=work).stdout == "ok\n"
    assert sorted(p.name for p in work.iterdir()) == ["live-1", "other-host-1", "other-pid-namespace-1"]


def test_the_shared_task_folder_is_used_only_when_it_is_this_users_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 47: ``/tmp/assay-runner`` was used whoever had made it, so another user's process (or an
    unisolated practice run) that made it first owned every later task folder. Now a shared folder that is
    writable by others, a link, or another user's is passed over for a private ``assay-runner-UID``."""
    from assay.runner.workspace import default_base, workspace

    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setattr("tempfile.gettempdir", lambda: str(temp))
    shared, private = temp / "assay-runner", temp / f"assay-runner-{os.geteuid()}"
    assert default_base() == shared and oct(shared.stat().st_mode & 0o777) == "0o700"  # made private
    shared.chmod(0o777)  # made first by someone for everyone
    assert default_base() == private and oct(private.stat().st_mode & 0o777) == "0o700"
    with workspace() as space:
        assert space.root.parent == private
    shared.rmdir()
    (temp / "elsewhere").mkdir()
    shared.symlink_to(temp / "elsewhere")  # a link is never followed, even to a folder of ours
    assert default_base() == private
    private.chmod(0o775)
    with pytest.raises(UserError) as caught:
        default_base()
    message = str(caught.value)
    assert "\n" not in message and f"{shared} is not a folder (a symbolic link)" in message
    assert f"{private} may be written by other users (mode 0775)" in message
    if os.geteuid() == 0:  # another user's folder: only root can make one here
        private.chmod(0o700)
        os.chown(private, 65534, 65534)
        with pytest.raises(UserError, match=f"{private} belongs to uid 65534, not to this user"):
            default_base()


def test_podmans_private_storage_is_used_only_when_it_is_this_users_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 47's leftover: ``/tmp/assay-podman`` (the storage submitted images load into and every image
    detector starts from) was used whoever had made it. Now it follows the task folders' rule."""
    from assay.runner.container import storage_root

    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setattr("tempfile.gettempdir", lambda: str(temp))
    monkeypatch.delenv("ASSAY_PODMAN_ROOT", raising=False)
    shared, private = temp / "assay-podman", temp / f"assay-podman-{os.geteuid()}"
    assert storage_root() == shared and oct(shared.stat().st_mode & 0o777) == "0o700"
    shared.chmod(0o777)  # made first by someone for everyone
    assert storage_root() == private and oct(private.stat().st_mode & 0o777) == "0o700"
    private.chmod(0o775)
    with pytest.raises(UserError, match="no private folder for podman's image storage: ") as caught:
        storage_root()
    assert "\n" not in str(caught.value)
    monkeypatch.setenv("ASSAY_PODMAN_ROOT", str(tmp_path / "chosen"))  # the operator's choice stands
    assert storage_root() == tmp_path / "chosen"
