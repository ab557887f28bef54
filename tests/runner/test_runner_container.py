"""assay.runner.container with real podman: an image built here (``tests/container_image.py``), run through
``run_task`` as the harness runs it, and hostile programs inside it checked from outside.

The image's own detector needs a module the host's virtual environment lacks, reads the model's weights and
its own ``/metaparameters.json``; ``--probe CODE`` runs a test's program in the image instead. Tests that
need podman skip where it is missing (``make install`` installs Debian's podman and runc).
"""

from __future__ import annotations

import contextlib
import errno
import importlib.util
import json
import os
import socket
import struct
import subprocess
import sys
import tarfile
import threading
import time
import uuid
from pathlib import Path

import pytest

from assay.errors import UserError
from assay.runner import Limits, LocalExecutor, Task, run_task
from assay.runner.container import (
    Image,
    ImageSpec,
    _image_stage,
    _podman,
    _Space,
    container_arguments,
    parse_image,
    podman_command,
    sif_missing,
)
from assay.runner.images import _streamed, read_archive
from assay.runner.seccomp import podman_profile
from container_image import METAPARAMETERS, WEIGHTSTAT, BuiltImage, build_image, podman_ready

MISSING = podman_ready()
LIMITS = Limits(wall_seconds=60, memory_bytes=1 * 2**30, scratch_bytes=64 * 2**20, max_processes=64)
TROJAI_ARGS = [
    *("--model_filepath", "{input}/model.pt", "--result_filepath", "{output}/result.txt"),
    *("--scratch_dirpath", "{scratch}", "--examples_dirpath", "{input}/clean-example-data"),
    *("--round_training_dataset_dirpath", "{scratch}"),
    *("--metaparameters_filepath", "{input}/detector/metaparameters.json"),
    *("--schema_filepath", "{input}/detector/metaparameters_schema.json"),
    *("--learned_parameters_dirpath", "{input}/detector/learned_parameters"),
]


@pytest.fixture(scope="session")
def image(tmp_path_factory: pytest.TempPathFactory) -> BuiltImage:
    """The test image, built once per session (a few seconds), as archives and as a local image."""
    if MISSING is not None:
        pytest.skip(f"podman: {MISSING}")
    return build_image(tmp_path_factory.mktemp("image"))


def write_safetensors(path: Path, values: list[float]) -> Path:
    """A one-tensor .safetensors file, written by hand as the format is specified."""
    header = json.dumps({"w": {"dtype": "F32", "shape": [len(values)], "data_offsets": [0, 4 * len(values)]}})
    path.write_bytes(
        struct.pack("<Q", len(header)) + header.encode() + struct.pack(f"<{len(values)}f", *values)
    )
    return path


def model_folder(tmp_path: Path, values: list[float] | None) -> Path:
    """A model as the harness stages it: model.pt, model.safetensors (when given weights), examples."""
    folder = tmp_path / f"model-{uuid.uuid4().hex[:6]}"
    (folder / "clean-example-data").mkdir(parents=True)
    (folder / "model.pt").write_bytes(struct.pack("<64f", *[0.01 * i for i in range(64)]))
    if values is not None:
        write_safetensors(folder / "model.safetensors", values)
    return folder


def detector_task(spec: str, model: Path, *, infer: bool = False, key: str = "m", **fields) -> Task:
    """The task a folder detector would get (interpreter, entrypoint.py, TrojAI arguments), for an image."""
    stage = {"detector": model, **{p.name: p for p in model.iterdir()}}
    argv = [sys.executable, "{input}/detector/entrypoint.py", *(["infer"] if infer else []), *TROJAI_ARGS]
    fields.setdefault("limits", LIMITS)
    return Task(key=key, argv=argv, stage=stage, image=spec, **fields)


def probe(spec: str, code: str, *args: str, stage: dict | None = None, key: str = "p", **fields) -> Task:
    """A task running ``code`` inside the image (``args`` as ``args``)."""
    fields.setdefault("limits", LIMITS)
    return Task(key=key, argv=["--probe", code, *args], stage=stage or {}, image=spec, **fields)


def expected(values: list[float]) -> float:
    """What the image's detector should answer: its own module's formula, run here from its source."""
    namespace: dict = {}
    exec(WEIGHTSTAT, namespace)
    return namespace["probability"](values, 40.0, METAPARAMETERS["centre"])


def containers_named(key: str) -> list[str]:
    """Containers of a task key still known to podman, in the host's storage or the runner's private one."""
    names = []
    for prefix in (["podman"], _podman(ImageSpec("archive", ""))):
        done = subprocess.run(
            [*prefix, "ps", "--all", "--format", "{{.Names}}"], capture_output=True, text=True
        )
        names += [name for name in done.stdout.split() if f"-{key}-" in name]
    return names


def podman_test(function):
    """Slow (containers start in a fraction of a second, but a module of them takes a while) and skipped
    where podman is missing."""
    function = pytest.mark.skipif(MISSING is not None, reason=f"podman: {MISSING}")(function)
    return pytest.mark.slow(function)


# --- without podman: specs, arguments, command lines, refusals ----------------------------------------------


def test_the_image_runs_its_own_entrypoint_with_the_trojai_arguments() -> None:
    argv = [sys.executable, "{input}/detector/entrypoint.py", "infer", *TROJAI_ARGS]
    args = container_arguments(argv)
    assert args[0] == "infer" and sys.executable not in args
    assert args[args.index("--metaparameters_filepath") + 1] == "/metaparameters.json"
    assert args[args.index("--schema_filepath") + 1] == "/metaparameters_schema.json"
    assert args[args.index("--learned_parameters_dirpath") + 1] == "/learned_parameters"
    assert args[args.index("--model_filepath") + 1] == "{input}/model.pt"  # filled in later: /task/input
    assert container_arguments(["--probe", "x"]) == ["--probe", "x"]  # no folder-detector prefix: as given


def test_podman_flags_carry_the_limits_and_the_view(tmp_path: Path) -> None:
    model = model_folder(tmp_path, [0.5])
    limits = Limits(wall_seconds=7.5, memory_bytes=2**28, scratch_bytes=2**24, max_processes=12)
    task = detector_task("podman:localhost/x:1", model, limits=limits, env={"ASSAY_MODEL_NAME": "id-1"})
    space = _Space(tmp_path / "run", bounded=True)
    private = tmp_path / "run" / "private"
    argv = podman_command(
        ImageSpec("local", "x"), task, Image("sha256:abc", ["python3", "/e.py"]), space, "n", 7.5
    )
    text = " ".join(argv)
    for flag in (
        "--runtime runc",
        "--rm",
        "--network none",
        "--read-only",
        "--cap-drop all",
        "--security-opt no-new-privileges",
        "--pids-limit 12",
        f"--memory {2**28} --memory-swap {2**28}",
        f"--user {os.getuid()}:{os.getgid()}",
        "--timeout 18",
        f"src={private / 'tmp'},dst=/tmp ",  # one tmpfs for /tmp, /dev/shm, scratch and output
        f"src={private / 'shm'},dst=/dev/shm ",
        f"src={private / 'scratch'},dst=/task/scratch ",
        f"src={tmp_path / 'run' / 'input'},dst=/task/input,ro=true",  # the run's copies
        "--env ASSAY_MODEL_NAME=id-1",
        "--env HOME=/task/scratch",
        '--entrypoint ["python3", "/e.py"] sha256:abc',
        "--model_filepath /task/input/model.pt",
        "--metaparameters_filepath /metaparameters.json",
    ):
        assert flag in text, flag
    assert "detector" in task.stage and set(_image_stage(task)) == set(task.stage) - {"detector"}
    assert str(model) not in text  # no host path of the model: the run's copies are bound
    unbounded = podman_command(
        ImageSpec("local", "x"), task, Image("i", ["e"]), _Space(tmp_path / "run", bounded=False), "n", 1
    )
    assert f"/tmp:rw,size={2**24},mode=1777" in unbounded and "--shm-size" in unbounded
    for flag, shell in (("nofile", "ulimit -Hn"), ("nproc", "ulimit -Hu")):  # runc may not raise hard limits
        value = int(text.split(f"--ulimit {flag}=")[1].split(":")[0])
        hard = subprocess.run(["bash", "-c", shell], capture_output=True, text=True).stdout.strip()
        assert value > 0 and (hard == "unlimited" or value <= int(hard)), flag
    allowed = Task(key="n", argv=["x"], image="podman:x", limits=Limits(network=True))
    assert "--network" not in podman_command(
        ImageSpec("local", "x"), allowed, Image("i", ["e"]), space, "n", 1
    )


def test_sif_images_need_no_engine_and_are_refused_in_one_line_without_unsquashfs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A .sif runs without apptainer or singularity (``test_runner_sif.py``); what it does need here is
    squashfs-tools, and where that is missing the job is refused in one line (this machine's fault)."""
    import shutil

    real_which = shutil.which
    monkeypatch.setattr(shutil, "which", lambda name: None if name == "unsquashfs" else real_which(name))
    sif = tmp_path / "detector.sif"
    sif.write_bytes(b"\0" * 64)
    with pytest.raises(UserError, match="unsquashfs not installed") as caught:
        run_task(Task(key="m", argv=["x"], image=str(sif)))
    assert "\n" not in str(caught.value)
    monkeypatch.setattr(shutil, "which", real_which)
    if sif_missing() is None:  # a file that is no SIF is the image's failure, in one line, not a crash
        result = run_task(Task(key="m", argv=["x"], image=str(sif)))
        assert result.exit_code is None and not result.ok
        assert result.stderr == "cannot start the container: not a SIF image (64 bytes; a SIF header is 128)"


def test_bad_specs_and_a_missing_podman_are_one_line_errors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for spec, message in (
        (str(tmp_path / "nothing.tar"), "no such image archive"),
        ("podman:", "name a local image"),
        (str(Path(__file__)), "not a docker-archive or oci-archive"),
    ):
        with pytest.raises(UserError, match=message):
            parse_image(spec)
    assert parse_image("podman:localhost/det:1") == ImageSpec("local", "localhost/det:1")
    import shutil

    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(UserError, match="podman and runc not installed"):
        run_task(Task(key="m", argv=["x"], image="podman:localhost/det:1"))


# --- with podman --------------------------------------------------------------------------------------------


@podman_test
@pytest.mark.parametrize("form", ["docker-archive", "oci-archive", "local"])
def test_image_detector_reads_the_weights_with_its_own_module(
    image: BuiltImage, tmp_path: Path, form: str
) -> None:
    assert importlib.util.find_spec("weightstat") is None  # the detector's dependency is the image's alone
    spec = {"docker-archive": str(image.docker_archive), "oci-archive": str(image.oci_archive)}.get(
        form, image.local
    )
    values = [0.1, -0.3, 0.25, 0.9, -0.7]
    result = run_task(detector_task(spec, model_folder(tmp_path, values), infer=form == "local"))
    assert result.ok, result.stderr
    assert float(result.outputs["result.txt"]) == pytest.approx(expected(values), abs=1e-12)
    assert "5 weights from safetensors" in result.stderr
    assert result.isolation.startswith(
        "podman (runc): image sha256:" + image.image_id.removeprefix("sha256:")[:12]
    )
    assert "no network" in result.isolation and "read-only root" in result.isolation
    # without model.safetensors the detector falls back to model.pt's bytes
    fallback = run_task(detector_task(spec, model_folder(tmp_path, None)))
    assert fallback.ok and "from model.pt bytes" in fallback.stderr, fallback.stderr


VIEW = """
import os, json
seen = []
for top in sorted(os.listdir("/")):
    if top in ("proc", "sys", "dev"):
        continue
    if not os.path.isdir("/" + top):
        seen.append("/" + top)
    for folder, dirs, files in os.walk("/" + top):
        seen += [os.path.join(folder, name) for name in files]
refused = []
for target in ("/task/input/model.pt", "/task/input/new", "/metaparameters.json", "/etc/x", "/usr/x"):
    try:
        open(target, "a").close()
    except OSError as err:
        refused.append(target)
open("/task/scratch/s", "w").write("s"); open("/tmp/t", "w").write("t")
status = open("/proc/self/status").read()
pids = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
found = {"seen": seen, "refused": refused, "uid": os.getuid(), "caps": status.split("CapEff:")[1].split()[0],
         "env": dict(os.environ), "pids": pids}
json.dump(found, open("/task/output/result.txt", "w"))
"""


IDENTITY = """
import json, os
seen = []
for path in ["/proc/self/mountinfo", "/etc/hostname", "/etc/hosts", "/run/.containerenv"] + [
    f"/proc/{pid}/{name}" for pid in os.listdir("/proc") if pid.isdigit() for name in ("cmdline", "environ")
]:
    try:
        seen.append(open(path, "rb").read().decode("latin-1"))
    except OSError:
        pass
info = os.stat("/task/input/model.pt")
seen.append(os.uname().nodename)
open("/task/output/result.txt", "w").write(json.dumps([seen, info.st_ino, info.st_mtime_ns]))
"""


@podman_test
def test_the_container_is_not_told_which_model_it_runs_on(image: BuiltImage, tmp_path: Path) -> None:
    model = tmp_path / "models" / "id-00000009"
    model.mkdir(parents=True)
    (model / "model.pt").write_bytes(b"weights")
    task = probe(
        str(image.docker_archive), IDENTITY, stage={"model.pt": model / "model.pt"}, key="id-00000009"
    )
    result = run_task(task)
    assert result.ok, result.stderr
    seen, inode, mtime_ns = json.loads(result.outputs["result.txt"])
    text = "\n".join(seen)
    assert "/task/input" in text  # mountinfo was read
    assert "id-00000009" not in text and str(model.parent) not in text
    host = (model / "model.pt").stat()
    assert inode != host.st_ino and mtime_ns != host.st_mtime_ns


@podman_test
def test_the_container_sees_only_its_staged_inputs_read_only(
    image: BuiltImage, tmp_path: Path, assay_home: Path
) -> None:
    secret = tmp_path / "secret-answer-key.csv"
    secret.write_text("id-1,1\n")
    model = model_folder(tmp_path, [0.5])
    stage = {"model.pt": model / "model.pt", "clean-example-data": model / "clean-example-data"}
    result = run_task(probe(str(image.docker_archive), VIEW, stage=stage, env={"ASSAY_MODEL_NAME": "id-1"}))
    assert result.ok, result.stderr
    found = json.loads(result.outputs["result.txt"])
    seen = set(found["seen"])
    assert (
        "/task/input/model.pt" in seen and "/metaparameters.json" in seen and "/opt/lib/weightstat.py" in seen
    )
    assert {p for p in seen if p.startswith("/task/")} == {"/task/input/model.pt"}, seen
    assert not [
        p
        for p in seen
        if str(tmp_path) in p or str(assay_home) in p or p.startswith(("/work", "/root", "/home"))
    ]
    assert not [p for p in seen if "secret" in p]
    assert set(found["refused"]) == {
        "/task/input/model.pt",
        "/task/input/new",
        "/metaparameters.json",
        "/etc/x",
        "/usr/x",
    }
    assert (
        found["uid"] == os.getuid() and found["caps"] == "0000000000000000"
    )  # the harness's user, powerless
    assert found["pids"] == [1]  # its own pid namespace: only itself
    env = found["env"]
    assert (
        env["HOME"] == "/task/scratch"
        and env["ASSAY_MODEL_NAME"] == "id-1"
        and env["PYTHONPATH"] == "/opt/lib"
    )
    assert not [name for name in env if name.startswith("ASSAY_") and name != "ASSAY_MODEL_NAME"]
    assert (model / "model.pt").read_bytes()[:4] == struct.pack("<f", 0.0)  # unchanged


NETWORK = """
import socket
answers = {}
for host, port in args_pairs:
    try:
        socket.create_connection((host, port), timeout=3).close()
        answers[f"{host}:{port}"] = "connected"
    except OSError as err:
        answers[f"{host}:{port}"] = type(err).__name__
interfaces = [line.split(":")[0].strip() for line in open("/proc/net/dev").read().splitlines()[2:]]
open("/task/output/result.txt", "w").write(repr((answers, interfaces)))
"""


def _host_address() -> str:
    """This machine's address on its default route (what a container on a bridge would reach)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe_socket:
        try:
            probe_socket.connect(("192.0.2.1", 9))  # no packet is sent for UDP connect
            return probe_socket.getsockname()[0]
        except OSError:
            return "127.0.0.1"


def _accept_all(server: socket.socket) -> None:
    with contextlib.suppress(OSError):  # until the test closes the server
        while True:
            server.accept()[0].close()


@podman_test
def test_the_container_has_no_network(image: BuiltImage) -> None:
    server = socket.create_server(("0.0.0.0", 0))
    server.listen()
    port = server.getsockname()[1]
    threading.Thread(target=_accept_all, args=(server,), daemon=True).start()
    try:
        pairs = [("127.0.0.1", port), (_host_address(), port), ("1.1.1.1", 53)]
        socket.create_connection(pairs[1], timeout=3).close()  # reachable from the host itself
        code = f"args_pairs = {pairs!r}\n" + NETWORK
        result = run_task(probe(str(image.docker_archive), code))
        assert result.ok, result.stderr
        answers, interfaces = eval(result.outputs["result.txt"])
        assert "connected" not in answers.values(), answers
        assert interfaces == ["lo"]
    finally:
        server.close()


@podman_test
def test_a_sleeper_is_stopped_at_the_wall_clock_and_its_container_removed(image: BuiltImage) -> None:
    key = f"sleep{uuid.uuid4().hex[:6]}"
    code = "import time\nprint('started', flush=True)\ntime.sleep(3600)\n"
    limits = Limits(wall_seconds=3, scratch_bytes=2**24)
    start = time.monotonic()
    result = run_task(probe(str(image.docker_archive), code, key=key, limits=limits))
    assert result.timed_out and not result.ok and not result.killed_for_memory
    assert 3 <= result.wall_seconds < 6 and time.monotonic() - start < 15
    assert result.stdout == "started\n"
    assert containers_named(key) == []
    # a shared deadline: one already past is not started; one coming stops the run before its own limit
    late = run_task(probe(str(image.docker_archive), code, key=key, deadline=time.time() - 1))
    assert late.exit_code is None and late.deadline_reached and late.isolation == "not started"
    cut = run_task(probe(str(image.docker_archive), code, key=key, deadline=time.time() + 3))
    assert cut.timed_out and cut.deadline_reached and cut.wall_seconds < 6


@podman_test
def test_a_memory_hog_is_killed_and_recorded(image: BuiltImage) -> None:
    code = "chunks = []\nwhile True:\n    chunks.append(bytearray(16 * 2**20))\n"
    limits = Limits(wall_seconds=60, memory_bytes=128 * 2**20, scratch_bytes=2**24)
    result = run_task(probe(str(image.docker_archive), code, limits=limits))
    assert result.killed_for_memory and not result.timed_out and result.exit_code == 137, result.stderr
    assert result.peak_memory_bytes == 128 * 2**20
    fine = run_task(
        probe(str(image.docker_archive), "x = bytearray(32 * 2**20)\nprint(len(x))", limits=limits)
    )
    assert fine.ok and fine.stdout == f"{32 * 2**20}\n"


FORKS = """
import os, time
born = 0
try:
    for _ in range(200):
        if os.fork() == 0:
            time.sleep(3600)
        born += 1
except OSError as err:
    failure = type(err).__name__
else:
    failure = "none"
open("/task/output/result.txt", "w").write(f"{born} {failure}")
"""


@podman_test
def test_processes_are_bounded_and_none_outlive_the_run(image: BuiltImage) -> None:
    key = f"forks{uuid.uuid4().hex[:6]}"
    limits = Limits(wall_seconds=60, max_processes=16, scratch_bytes=2**24)
    result = run_task(probe(str(image.docker_archive), FORKS, key=key, limits=limits))
    assert result.exit_code == 0, result.stderr
    born, failure = result.outputs["result.txt"].decode().split()
    assert int(born) < 16 and failure in ("BlockingIOError", "OSError", "PermissionError")
    assert "at most 16 processes" in result.isolation
    assert containers_named(key) == []
    stray = subprocess.run(["pgrep", "-f", "--probe"], capture_output=True, text=True)
    assert not [line for line in stray.stdout.split() if line], "a forked child outlived its container"


SPACE = """
import errno
def fill(path):
    written = 0
    try:
        with open(path, "wb") as handle:
            while written < 64 * 2**20:
                handle.write(b"x" * 2**20); handle.flush(); written += 2**20
    except OSError as err:
        return f"{written // 2**20}:{errno.errorcode[err.errno]}"
    return f"{written // 2**20}:ok"
import os
places = ("/task/scratch/big", "/tmp/big", "/dev/shm/big")
answers = [fill(place) for place in places]  # all held at once: one tmpfs bounds them together
for place in places:
    os.remove(place)
open("/task/output/result.txt", "w").write(" ".join(answers))
"""


@podman_test
def test_scratch_output_and_tmp_are_bounded(image: BuiltImage) -> None:
    limits = Limits(wall_seconds=60, memory_bytes=2**30, scratch_bytes=8 * 2**20)
    result = run_task(probe(str(image.docker_archive), SPACE, limits=limits))
    assert result.ok, result.stderr
    answers = result.outputs["result.txt"].decode().split()
    assert all(answer.endswith(":ENOSPC") for answer in answers), answers
    assert sum(int(answer.split(":")[0]) for answer in answers) <= 8, answers  # 24 before issue 25
    assert "8 MiB private scratch" in result.isolation and "not size-bounded" not in result.isolation


@podman_test
def test_results_are_read_back_like_a_folder_detectors(image: BuiltImage, tmp_path: Path) -> None:
    code = (
        "import os\nos.symlink('/metaparameters.json', '/task/output/result.txt')\n"
        "open('/task/output/big.txt', 'wb').write(b'x' * (17 * 2**20))\n"
        "open('/task/output/fine.txt', 'w').write('0.75')\nprint('out' * 40000)\n"
    )
    task = probe(str(image.docker_archive), code, outputs=["result.txt", "big.txt", "fine.txt", "absent.txt"])
    result = run_task(task, workdir=tmp_path / "work")
    assert result.ok, result.stderr
    assert result.outputs == {"result.txt": None, "big.txt": None, "fine.txt": b"0.75", "absent.txt": None}
    assert result.stdout.startswith("[first ") and len(result.stdout) < 70 * 1024
    assert list((tmp_path / "work").iterdir()) == []  # the task folder and its tmpfs are gone
    with open("/proc/self/mountinfo") as mounts:
        assert str(tmp_path / "work") not in mounts.read()


@podman_test
def test_a_broken_archive_is_the_detectors_failure_not_the_harness(image: BuiltImage, tmp_path: Path) -> None:
    """An archive whose manifest names a layer it lacks (under a config of its own, so its ID is new)."""
    import io
    import tarfile

    broken = tmp_path / "broken.tar"
    with tarfile.open(image.docker_archive) as source, tarfile.open(broken, "w") as target:
        manifest = json.loads(source.extractfile("manifest.json").read())
        config = json.loads(source.extractfile(manifest[0]["Config"]).read())
        config.setdefault("config", {})["Labels"] = {"broken": uuid.uuid4().hex}
        data = json.dumps(config).encode()
        manifest[0]["Config"] = "config.json"
        for name, content in (("config.json", data), ("manifest.json", json.dumps(manifest).encode())):
            info = tarfile.TarInfo(name)
            info.size = len(content)
            target.addfile(info, io.BytesIO(content))
    result = run_task(probe(str(broken), "print(1)"))
    assert result.exit_code is None and not result.ok
    assert "cannot start the container: podman could not load broken.tar" in result.stderr, result.stderr


@podman_test
def test_concurrent_models_share_one_load_and_see_only_their_own_files(
    image: BuiltImage, tmp_path: Path
) -> None:
    code = (
        "import os, time\nopen('/task/scratch/mine', 'w').write(os.environ['ASSAY_MODEL_NAME'])\n"
        "time.sleep(0.5)\n"
        "open('/task/output/result.txt', 'w').write(open('/task/scratch/mine').read() + ' ' + "
        "' '.join(sorted(os.listdir('/task/input'))))\n"
    )
    tasks = []
    for index in range(3):
        model = model_folder(tmp_path, [0.1 * index])
        tasks.append(
            probe(
                str(image.oci_archive),
                code,
                stage={"model.pt": model / "model.pt"},
                key=f"c{index}",
                env={"ASSAY_MODEL_NAME": f"id-{index}"},
            )
        )
    results = LocalExecutor(2).map(tasks)
    for index, result in enumerate(results):
        assert result.outputs["result.txt"] == f"id-{index} model.pt".encode(), result.stderr
    assert read_archive(image.oci_archive).image_id == read_archive(image.docker_archive).image_id


@podman_test
@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a task tmpfs needs root")
def test_a_killed_harness_leaves_no_tmpfs_behind(image: BuiltImage, tmp_path: Path) -> None:
    """A harness killed mid-task leaves its task's tmpfs mounted; the next task on the base unmounts it."""
    base = tmp_path / "work"
    stale = base / "m-dead" / "private"
    stale.mkdir(parents=True)
    (stale.parent / ".owner").write_text(f"{socket.gethostname()} 999999999 0")  # a pid that cannot exist
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "assay-task", str(stale)], check=True)
    assert str(stale) in Path("/proc/self/mountinfo").read_text()
    result = run_task(probe(str(image.docker_archive), "print('fine')"), workdir=base)
    assert result.ok and result.stdout == "fine\n", result.stderr
    assert str(stale) not in Path("/proc/self/mountinfo").read_text()
    assert list(base.iterdir()) == []  # swept, and this task's own folder gone too


def test_archives_are_streamed_without_keeping_every_header(tmp_path: Path) -> None:
    path = tmp_path / "many.tar"
    with tarfile.open(path, "w") as archive:
        for index in range(500):
            archive.addfile(tarfile.TarInfo(f"f{index}"))
    held = []
    with tarfile.open(path, "r|") as archive:
        for member in _streamed(archive):
            held.append((member.name, len(archive.members)))
    assert [name for name, _ in held] == [f"f{index}" for index in range(500)]
    assert max(count for _, count in held) == 1  # tarfile alone keeps all 500 headers


PROC_READER = """
import os
seen = {}
for path in ("/proc/meminfo", "/proc/loadavg", "/proc/stat", "/proc/uptime", "/proc/vmstat", "/proc/zoneinfo",
             "/proc/diskstats", "/proc/pressure/cpu", "/proc/sys/fs/file-nr"):
    try:
        seen[path] = open(path).read()
    except OSError as err:
        seen[path] = type(err).__name__
open(args[0] + "/result.txt", "w").write(repr(seen))
"""


@podman_test
def test_sysinfo_is_refused_in_the_container(image: BuiltImage) -> None:
    """Issue 44: podman's default profile allows sysinfo(2), so an image read the host's memory and load
    through it (glibc's ``sysconf(_SC_PHYS_PAGES)`` is sysinfo: the host's total pages before). With the
    profile that refuses it the call fails, and what glibc makes of that is no longer the host's."""
    code = "import os; open(args[0] + '/result.txt', 'w').write(str(os.sysconf('SC_PHYS_PAGES')))"
    result = run_task(probe(str(image.docker_archive), code, "{output}"))
    assert result.ok, result.stderr
    inside = int(result.outputs["result.txt"])
    print(f"\nSC_PHYS_PAGES inside: {inside}, on the host: {os.sysconf('SC_PHYS_PAGES')}")
    assert inside != os.sysconf("SC_PHYS_PAGES") and "sysinfo refused (seccomp)" in result.isolation
    profile = json.loads(Path(podman_profile() or "").read_text())
    refusing = [rule for rule in profile["syscalls"] if "sysinfo" in rule.get("names", [])]
    assert refusing == [{"names": ["sysinfo"], "action": "SCMP_ACT_ERRNO", "errnoRet": errno.EPERM}]


@podman_test
def test_the_container_sees_no_host_wide_counters(image: BuiltImage) -> None:
    """As for a folder detector (``test_runner_channels.py``): the host allocates 300 MiB and spins between
    two runs, and nothing the image reads in ``/proc`` moves; meminfo shows the run's own limit."""

    def read() -> dict[str, str]:
        result = run_task(probe(str(image.docker_archive), PROC_READER, "{output}"))
        assert result.ok, result.stderr
        return eval(result.outputs["result.txt"])

    before = read()
    hog = bytearray(300 * 2**20)
    for offset in range(0, len(hog), 4096):
        hog[offset] = 1
    deadline = time.monotonic() + 1.5
    while time.monotonic() < deadline:
        pass
    after = read()
    del hog
    changed = sorted(path for path in before if after[path] != before[path])
    print(f"changed: {changed}")
    assert changed == []
    total = next(line for line in after["/proc/meminfo"].splitlines() if line.startswith("MemTotal:"))
    assert int(total.split()[1]) * 1024 == LIMITS.memory_bytes
