"""A fake NVIDIA host for tests, since no machine these tests run on has a GPU.

The device nodes are real: character devices with NVIDIA's major number (195) made with ``os.mknod`` in a
temp folder (root only; the tests skip otherwise), so discovery and bubblewrap treat them as they would
the driver's. The driver libraries are 64-bit ELF headers under the real names and nothing more, and
``nvidia-smi`` is a shell script. ``assay.runner.gpu.HOST`` is pointed at them. Nothing here can run CUDA:
what a real GPU does inside the sandbox is checked by ``benchmarks/gpu_sandbox_check.py`` alone.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from assay.runner import gpu

LIBRARIES = ("libcuda.so.1", "libnvidia-ml.so.1", "libnvidia-ptxjitcompiler.so.1", "libnvidia-nvvm.so.4")
CONTROL = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset")
ELF64 = b"\x7fELF\x02\x01\x01" + bytes(57)  # enough of an ELF header to tell its class


def can_make_nodes() -> bool:
    """Only root may make device nodes."""
    return os.geteuid() == 0


needs_root = pytest.mark.skipif(not can_make_nodes(), reason="making device nodes (os.mknod) needs root")


def make_node(path: Path, minor: int, major: int = gpu.NVIDIA_MAJOR) -> Path:
    """A character device at ``path`` (``major:minor``)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(major, minor))
    return path


def fake_host(
    root: Path,
    gpus: int = 2,
    control: tuple[str, ...] = CONTROL,
    libraries: tuple[str, ...] = LIBRARIES,
    smi_output: str | None = None,
    dri: bool = True,
) -> gpu.Host:
    """A dev folder with ``gpus`` GPU nodes, ``control`` nodes and (``dri``) a ``/dev/dri`` card a task
    must never get; a library folder with ``libraries``; ``nvidia-smi`` printing ``smi_output`` (None:
    no such command)."""
    dev, libs = root / "dev", root / "lib"
    dev.mkdir(parents=True)
    libs.mkdir(parents=True)
    for number in range(gpus):
        make_node(dev / f"nvidia{number}", number)
    for minor, name in zip((255, 254, 253, 252), control, strict=False):
        make_node(dev / name, minor, gpu.NVIDIA_MAJOR if name != "nvidia-uvm" else 511)
    if dri:
        make_node(dev / "dri" / "card0", 0, major=226)
    make_node(dev / "sda", 0, major=8)  # something else of /dev that no task gets
    for name in libraries:
        real = libs / f"{name.split('.so')[0]}.so.550.54.15"
        if not real.exists():
            real.write_bytes(ELF64)
        (libs / name).symlink_to(real.name)
    smi = root / "nvidia-smi"
    if smi_output is not None:
        smi.write_text(f"#!/bin/sh\ncat <<'EOF'\n{smi_output}\nEOF\n")
        smi.chmod(0o755)
    return gpu.Host(dev=dev, library_dirs=(libs,), smi=str(smi))


@pytest.fixture
def fake_gpus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> gpu.Host:
    """This machine as one with two NVIDIA GPUs (fake nodes and libraries, ``gpu.HOST``)."""
    if not can_make_nodes():
        pytest.skip("making device nodes (os.mknod) needs root")
    host = fake_host(tmp_path / "gpu-host")
    monkeypatch.setattr(gpu, "HOST", host)
    return host


@pytest.fixture
def no_gpus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> gpu.Host:
    """This machine as one without a GPU, whatever it really has: an empty dev folder, no libraries."""
    (tmp_path / "no-gpu" / "dev").mkdir(parents=True)
    (tmp_path / "no-gpu" / "lib").mkdir()
    host = gpu.Host(
        dev=tmp_path / "no-gpu" / "dev",
        library_dirs=(tmp_path / "no-gpu" / "lib",),
        smi=str(tmp_path / "no-gpu" / "nvidia-smi"),
    )
    monkeypatch.setattr(gpu, "HOST", host)
    return host
