"""GPU tasks get exactly what a CUDA program needs of the host, and CPU tasks get none of it.

No machine these tests run on has a GPU, so the host is a fake (``tests/fake_gpu.py``): real character
devices with NVIDIA's major number made with ``os.mknod`` in a temp folder, ELF headers under the driver
libraries' names, a shell script as ``nvidia-smi``. The command lines (bubblewrap's and podman's) are
checked argument by argument, and bubblewrap really runs: a program inside lists ``/dev`` and the library
folder. Whether CUDA itself then works inside is not shown here: ``benchmarks/gpu_sandbox_check.py`` does
that on a machine with a GPU, and has not been run in this project yet (docs/leaderboard.md, "GPU rounds").
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from test_runner import detector, python_task
from test_runner_sif import LIMITS as SIF_LIMITS
from test_runner_sif import built, probe, sif_cache  # noqa: F401

from assay.errors import UserError
from assay.runner import Limits, Task, gpu, run_task
from assay.runner.container import (
    OCI_GPU_LIBS,
    Image,
    ImageSpec,
    _Space,
    library_path,
    podman_command,
    podman_gpu_flags,
)
from assay.runner.isolation import GPU_LIBS, Mounts, bwrap_argv, isolation_available, prepare_image_root
from fake_gpu import ELF64, fake_gpus, fake_host, make_node, needs_root, no_gpus  # noqa: F401

STANDARD_DEV = ["fd", "full", "null", "random", "shm", "stderr", "stdin", "stdout", "urandom", "zero"]
CONTROL_DEV = ["nvidia-modeset", "nvidia-uvm", "nvidia-uvm-tools", "nvidiactl"]
GIVEN_CONTROL = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset")  # in the order given
SMI_TWO = "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-a)\nGPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-b)"

needs_bwrap = pytest.mark.skipif(isolation_available() != "bwrap", reason="bubblewrap does not work here")


def pairs(argv: list[str], flag: str) -> list[tuple[str, str]]:
    """(source, target) of every ``flag SOURCE TARGET`` in a bubblewrap command line."""
    return [(argv[i + 1], argv[i + 2]) for i, arg in enumerate(argv) if arg == flag]


# --- discovery --------------------------------------------------------------------------------------------


@needs_root
def test_discovery_counts_character_devices_only(tmp_path: Path) -> None:
    host = fake_host(tmp_path, gpus=2, smi_output=SMI_TWO)
    make_node(host.dev / "nvidia10", 10)
    (host.dev / "nvidia3").write_text("a plain file is no GPU")
    (host.dev / "nvidia4").symlink_to("nvidia0")  # nor is a link to one
    found = gpu.discover(host)
    assert [path.name for path in found.gpus] == ["nvidia0", "nvidia1", "nvidia10"]  # by number
    assert [path.name for path in found.control] == [
        "nvidiactl",
        "nvidia-uvm",
        "nvidia-uvm-tools",
        "nvidia-modeset",
    ]
    assert found.libraries["libcuda.so.1"] == host.library_dirs[0] / "libcuda.so.550.54.15"
    assert found.smi_count == 2 and found.smi_error is None
    assert gpu.problem(found, 2) is None and gpu.problem(found, 0) is None
    assert gpu.problem(found, 3) == "nvidia-smi -L lists 2 GPUs"


@needs_root
def test_each_missing_piece_is_named_in_one_line(tmp_path: Path) -> None:
    empty = fake_host(tmp_path / "empty", gpus=0, control=(), libraries=(), dri=False)
    assert gpu.problem(gpu.discover(empty), 1) == f"no NVIDIA device here ({empty.dev}/nvidia0 missing)"
    (empty.dev / "nvidia0").write_text("")
    assert gpu.problem(gpu.discover(empty), 1) == (
        f"no NVIDIA device here ({empty.dev}/nvidia0 is not a character device)"
    )
    one = fake_host(tmp_path / "one", gpus=1)
    assert gpu.problem(gpu.discover(one), 2) == f"only 1 NVIDIA device here ({one.dev}/nvidia0)"
    no_uvm = fake_host(tmp_path / "uvm", gpus=1, control=("nvidiactl",))
    assert gpu.problem(gpu.discover(no_uvm), 1) == (
        f"{no_uvm.dev}/nvidia-uvm missing (the nvidia-uvm module is not loaded)"
    )
    no_ml = fake_host(tmp_path / "ml", gpus=1, libraries=("libcuda.so.1",))
    assert gpu.problem(gpu.discover(no_ml), 1).startswith("driver library libnvidia-ml.so.1 not found")
    broken = fake_host(tmp_path / "smi", gpus=1, smi_output="")
    Path(broken.smi).write_text(
        "#!/bin/sh\necho 'NVIDIA-SMI has failed because it could not communicate'\nexit 9\n"
    )
    assert gpu.problem(gpu.discover(broken), 1) == (
        "nvidia-smi -L: NVIDIA-SMI has failed because it could not communicate"
    )


def test_only_64_bit_elf_files_count_as_driver_libraries(tmp_path: Path) -> None:
    (tmp_path / "libcuda.so.1").write_bytes(b"\x7fELF\x01" + bytes(59))  # a 32-bit build
    (tmp_path / "libnvidia-ml.so.1").write_text("not ELF at all")
    (tmp_path / "libnvidia-nvvm.so.4").write_bytes(ELF64)
    (tmp_path / "libnvidia-nvvm.so").symlink_to("libnvidia-nvvm.so.4")
    (tmp_path / "libGLX_nvidia.so.0").write_bytes(ELF64)  # graphics: no detector needs it
    (tmp_path / "libcudart.so.12").write_bytes(ELF64)  # the CUDA runtime is the image's own, not the driver's
    assert gpu.driver_libraries((tmp_path,)) == {
        "libnvidia-nvvm.so": tmp_path / "libnvidia-nvvm.so.4",
        "libnvidia-nvvm.so.4": tmp_path / "libnvidia-nvvm.so.4",
    }


@needs_root
def test_a_gpu_task_without_gpus_is_the_platforms_fault(no_gpus, tmp_path: Path) -> None:  # noqa: F811
    script = detector(tmp_path, "print('never runs')")
    with pytest.raises(
        UserError, match=r"this job needs 1 GPU: no NVIDIA device here \(.*/nvidia0 missing\)"
    ):
        run_task(python_task(script, limits=Limits(wall_seconds=30, gpus=1)))


# --- the command lines ------------------------------------------------------------------------------------


@needs_root
@pytest.mark.parametrize("count", [0, 1, 2])
def test_bwrap_gets_the_held_gpus_the_control_nodes_and_the_libraries_only(fake_gpus, count: int) -> None:  # noqa: F811
    given = gpu.passthrough(count)
    argv = bwrap_argv(Mounts(gpus=given))
    devices = [target for _, target in pairs(argv, "--dev-bind")]
    standard = ["/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom"]
    libraries = [(s, t) for s, t in pairs(argv, "--ro-bind") if t.startswith(f"{GPU_LIBS}/")]
    if count == 0:
        assert given is None and devices == standard and libraries == []
        assert str(GPU_LIBS) not in " ".join(argv)
        return
    control = ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia-modeset"]
    assert devices == standard + control + [f"/dev/nvidia{n}" for n in range(count)]
    assert all(
        source == str(fake_gpus.dev / target.removeprefix("/dev/"))
        for source, target in pairs(argv, "--dev-bind")[5:]
    )
    assert not any("dri" in arg or "sda" in arg for arg in argv)
    lib = fake_gpus.library_dirs[0]
    assert ("/.singularity.d/libs/libcuda.so.1", str(lib / "libcuda.so.550.54.15")) in [
        (target, source) for source, target in libraries
    ]
    assert {target.rsplit("/", 1)[0] for _, target in libraries} == {str(GPU_LIBS)}
    assert given.visible == ",".join(str(n) for n in range(count))


@needs_root
def test_the_gpus_ray_reserved_are_the_ones_passed(fake_gpus, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    given = gpu.passthrough(1, visible="1")
    assert [name for _, name in given.nodes][-1] == "nvidia1" and "nvidia0" not in [n for _, n in given.nodes]
    assert given.visible == "0"  # inside, the one GPU it holds is the first
    with pytest.raises(UserError, match="CUDA_VISIBLE_DEVICES=5 names GPUs not here"):
        gpu.passthrough(1, visible="5")


@needs_root
def test_an_image_root_gets_the_libraries_on_a_tmpfs_of_their_own(fake_gpus, tmp_path: Path) -> None:  # noqa: F811
    root = tmp_path / "root"
    (root / "usr").mkdir(parents=True)
    prepare_image_root(root)
    assert (root / ".singularity.d" / "libs").is_dir()
    argv = bwrap_argv(Mounts(gpus=gpu.passthrough(1), image_root=root))
    tmpfs = [i for i in range(len(argv) - 1) if argv[i : i + 2] == ["--tmpfs", str(GPU_LIBS)]]
    first_library = argv.index(f"{GPU_LIBS}/libcuda.so.1") - 2
    assert len(tmpfs) == 1 and tmpfs[0] < first_library  # the tmpfs first, then the files on it
    assert argv[-7:] == ["--remount-ro", str(GPU_LIBS), "--remount-ro", "/dev", "--remount-ro", "/", "--"]
    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / ".singularity.d").symlink_to(tmp_path / "elsewhere")
    prepare_image_root(linked)  # never made through the image's link
    assert not (tmp_path / "elsewhere").exists()


@needs_root
@pytest.mark.parametrize("count", [0, 1, 2])
def test_podman_gets_the_same_devices_and_libraries(fake_gpus, count: int) -> None:  # noqa: F811
    image_env = ("PATH=/usr/bin", "LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/nvidia/lib")
    argv = podman_gpu_flags(gpu.passthrough(count), image_env)
    if count == 0:
        assert argv == []
        return
    devices = [argv[i + 1] for i, arg in enumerate(argv) if arg == "--device"]
    expected = [*GIVEN_CONTROL, *(f"nvidia{n}" for n in range(count))]
    assert devices == [f"{fake_gpus.dev / name}:/dev/{name}" for name in expected]
    mounts = [argv[i + 1] for i, arg in enumerate(argv) if arg == "--mount"]
    assert all(m.startswith("type=bind,src=") and m.endswith(",ro=true") for m in mounts)
    assert f"dst={OCI_GPU_LIBS}/libcuda.so.1" in " ".join(mounts)
    assert argv[-2:] == [
        "--env",
        f"LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/nvidia/lib:{OCI_GPU_LIBS}",
    ]
    assert not any("dri" in arg for arg in argv)


@needs_root
def test_podman_run_carries_them_for_a_gpu_task_only(fake_gpus, tmp_path: Path) -> None:  # noqa: F811
    space = _Space(tmp_path / "run", bounded=True)
    image = Image("sha256:abc", ["python3", "/e.py"], ("LD_LIBRARY_PATH=/opt/lib",))
    for count in (0, 1):
        task = Task(key="n", argv=["x"], image="podman:x", limits=Limits(gpus=count))
        argv = podman_command(ImageSpec("local", "x"), task, image, space, "n", 1)
        devices = [argv[i + 1].split(":")[1] for i, arg in enumerate(argv) if arg == "--device"]
        env = [argv[i + 1] for i, arg in enumerate(argv) if arg == "--env"]
        if count:
            assert devices == [f"/dev/{name}" for name in (*GIVEN_CONTROL, "nvidia0")]
            assert "CUDA_VISIBLE_DEVICES=0" in env and f"LD_LIBRARY_PATH=/opt/lib:{OCI_GPU_LIBS}" in env
        else:
            assert devices == [] and "CUDA_VISIBLE_DEVICES=" in env
            assert not any(item.startswith("LD_LIBRARY_PATH") for item in env)
            assert not any("nvidia" in arg for arg in argv)


def test_the_image_library_path_keeps_its_order() -> None:
    assert library_path((), "/x") == "/x"
    assert library_path(("LD_LIBRARY_PATH=/a:/x:/b",), "/x") == "/a:/x:/b"
    assert library_path(("LD_LIBRARY_PATH=",), "/x") == "/x"


# --- real runs under bubblewrap ---------------------------------------------------------------------------

LOOK = """
import json, os, stat, sys
names = ("CUDA_VISIBLE_DEVICES", "LD_LIBRARY_PATH")
seen = {"dev": sorted(os.listdir("/dev")), "env": {k: os.environ.get(k) for k in names}}
seen["majors"] = {n: os.major(os.stat("/dev/" + n).st_rdev) for n in seen["dev"] if n.startswith("nvidia")}
seen["chr"] = {n: stat.S_ISCHR(os.stat("/dev/" + n).st_mode) for n in seen["dev"] if n.startswith("nvidia")}
seen["libs"] = sorted(os.listdir("/.singularity.d/libs")) if os.path.isdir("/.singularity.d/libs") else None
tried = {}
for place in ("/dev/nvidia0", "/dev/nvidia1", "/dev/dri/card0", "/dev/sda"):
    try:
        os.close(os.open(place, os.O_RDWR)); tried[place] = "opened"
    except OSError as err:
        tried[place] = type(err).__name__
seen["tried"] = tried
try:
    seen["dri"] = os.listdir("/dev/dri")
except OSError as err:
    seen["dri"] = type(err).__name__
open(sys.argv[1] + "/seen.json", "w").write(json.dumps(seen))
"""


def look(tmp_path: Path, gpus: float) -> dict:
    script = detector(tmp_path, LOOK)
    limits = Limits(wall_seconds=60, memory_bytes=None, gpus=gpus)
    result = run_task(
        python_task(script, "{output}", limits=limits, outputs=["seen.json"]), isolation="bwrap"
    )
    assert result.ok, result.stderr
    return {**json.loads(result.outputs["seen.json"]), "isolation": result.isolation}


@needs_root
@needs_bwrap
def test_a_gpu_task_sees_exactly_its_gpu_and_the_control_nodes(fake_gpus, tmp_path: Path) -> None:  # noqa: F811
    """Was: every /dev/nvidia* and /dev/dri was bound into a GPU task, the GPUs of other tasks included."""
    seen = look(tmp_path, gpus=1)
    assert seen["dev"] == sorted([*STANDARD_DEV, *CONTROL_DEV, "nvidia0"])
    assert seen["chr"] == dict.fromkeys([*CONTROL_DEV, "nvidia0"], True)
    assert seen["majors"]["nvidia0"] == seen["majors"]["nvidiactl"] == gpu.NVIDIA_MAJOR
    assert seen["tried"]["/dev/nvidia1"] == seen["tried"]["/dev/dri/card0"] == "FileNotFoundError"
    assert seen["tried"]["/dev/sda"] == "FileNotFoundError" and seen["dri"] == "FileNotFoundError"
    assert "libcuda.so.1" in seen["libs"] and "libnvidia-ml.so.1" in seen["libs"]
    assert seen["env"] == {"CUDA_VISIBLE_DEVICES": "0", "LD_LIBRARY_PATH": str(GPU_LIBS)}
    assert "GPU devices /dev/nvidiactl" in seen["isolation"] and "/dev/nvidia0 and" in seen["isolation"]


@needs_root
@needs_bwrap
def test_a_cpu_task_finds_no_gpu_node_and_no_driver_library(fake_gpus, tmp_path: Path) -> None:  # noqa: F811
    """The attack: a CPU round's detector on a GPU machine tries /dev/nvidia0 and /dev/dri: not there."""
    seen = look(tmp_path, gpus=0)
    assert seen["dev"] == STANDARD_DEV and seen["majors"] == {}
    assert set(seen["tried"].values()) == {"FileNotFoundError"} and seen["dri"] == "FileNotFoundError"
    assert seen["libs"] is None
    assert seen["env"] == {"CUDA_VISIBLE_DEVICES": "", "LD_LIBRARY_PATH": None}
    assert "no GPU device" in seen["isolation"]


@needs_root
@needs_bwrap
def test_a_gpu_task_has_a_data_limit_in_place_of_an_address_space_one(fake_gpus, tmp_path: Path) -> None:  # noqa: F811
    """The CUDA driver reserves huge address ranges, so a GPU task's memory limit is RLIMIT_DATA; a hog
    is still stopped and recorded as a memory kill."""
    script = detector(tmp_path, "import sys\ndata = bytearray(int(sys.argv[1]))\nprint(len(data))\n")
    limits = Limits(wall_seconds=30, memory_bytes=512 * 2**20, gpus=1)
    hog = run_task(python_task(script, str(2 * 2**30), limits=limits))
    assert hog.killed_for_memory and "MemoryError" in hog.stderr
    fine = run_task(python_task(script, str(64 * 2**20), limits=dataclasses.replace(limits, gpus=1)))
    assert fine.ok and fine.stdout == f"{64 * 2**20}\n"


@needs_root
@pytest.mark.slow
def test_a_sif_gpu_task_gets_its_gpu_and_the_libraries_on_its_library_path(
    fake_gpus,  # noqa: F811
    built: Path,  # noqa: F811
    tmp_path: Path,
) -> None:
    """The ``.sif`` runner (an image root under bubblewrap) passes what the folder runner does, with the
    libraries in ``/.singularity.d/libs`` appended to the image's ``LD_LIBRARY_PATH``, as ``--nv`` does;
    the same image as a CPU task gets none of it."""
    code = LOOK.replace('sys.argv[1] + "/seen.json"', '"/task/output/result.txt"')
    for gpus, dev, libs in ((1, [*STANDARD_DEV, *CONTROL_DEV, "nvidia0"], True), (0, STANDARD_DEV, False)):
        result = run_task(probe(built, code, limits=dataclasses.replace(SIF_LIMITS, gpus=gpus)))
        assert result.ok, result.stderr
        seen = json.loads(result.outputs["result.txt"])
        assert seen["dev"] == sorted(dev) and seen["dri"] == "FileNotFoundError"
        assert seen["tried"]["/dev/nvidia1"] == "FileNotFoundError"
        if libs:
            assert "libcuda.so.1" in seen["libs"]
            assert seen["env"] == {"CUDA_VISIBLE_DEVICES": "0", "LD_LIBRARY_PATH": str(GPU_LIBS)}
        else:
            assert seen["libs"] == [] and seen["env"]["CUDA_VISIBLE_DEVICES"] == ""
            assert seen["env"]["LD_LIBRARY_PATH"] is None
