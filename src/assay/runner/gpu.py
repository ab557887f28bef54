"""NVIDIA GPUs on this machine, and exactly what of them one task is given.

A CUDA program needs three things from the host: the device nodes (``/dev/nvidiactl``, ``/dev/nvidia-uvm``
and one ``/dev/nvidiaN`` per GPU; ``/dev/nvidia-uvm-tools`` and ``/dev/nvidia-modeset`` where they exist),
the driver's user-space libraries (``libcuda.so.1``, ``libnvidia-ml.so.1`` and the few they load, which must
match the kernel module, so an image cannot ship its own), and nothing else: no ``/dev/dri``, no other
node. ``discover`` finds them under roots given as parameters (``Host``: a dev folder, library folders or
``ldconfig -p``, the ``nvidia-smi`` command), so tests point it at fake nodes made with ``os.mknod``;
``HOST`` holds the real defaults. ``problem`` is the one line a worker logs when it cannot serve a round
that needs N GPUs; ``passthrough`` is what the sandbox binds for one task: the control nodes, the nodes of
the GPUs the task holds (Ray's ``CUDA_VISIBLE_DEVICES``, else the first N) and the libraries.

The library names are the compute and utility part of apptainer's ``etc/nvliblist.conf`` (what ``--nv``
binds), without its graphics, video and X libraries, which no detector needs, plus ``libnvidia-nvvm`` and
``libcudadebugger``, which newer drivers split out of ``libcuda`` (libnvidia-container binds them too).
Nothing here has run on real NVIDIA hardware so far (see docs/leaderboard.md, "GPU rounds").
"""

from __future__ import annotations

import math
import os
import re
import shutil
import stat
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from assay.errors import UserError

NVIDIA_MAJOR = 195  # the character-device major of /dev/nvidiaN and /dev/nvidiactl
CONTROL = ("nvidiactl", "nvidia-uvm")  # without them no CUDA context can be made
OPTIONAL = ("nvidia-uvm-tools", "nvidia-modeset")  # passed when present
REQUIRED_LIBRARIES = ("libcuda.so.1", "libnvidia-ml.so.1")
# the driver's compute and utility libraries (prefixes: every versioned name of each is bound)
LIBRARIES = (
    "libcuda.so",
    "libcudadebugger.so",
    "libnvidia-ml.so",
    "libnvidia-ptxjitcompiler.so",
    "libnvidia-nvvm.so",
    "libnvidia-gpucomp.so",
    "libnvidia-fatbinaryloader.so",
    "libnvidia-compiler.so",
    "libnvidia-cfg.so",
    "libnvidia-opencl.so",
)
# where drivers put them when ``ldconfig -p`` does not list them
LIBRARY_DIRS = (
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/lib64",
    "/usr/lib",
    "/usr/local/nvidia/lib64",
    "/usr/lib/wsl/lib",
)
_GPU_NODE = re.compile(r"nvidia(\d+)")
_LDCONFIG_LINE = re.compile(r"^\s*(\S+)\s+\(([^)]*)\)\s+=>\s+(\S+)\s*$")
_SMI_GPU = re.compile(r"^GPU \d+:", re.MULTILINE)


@dataclass(frozen=True)
class Host:
    """Where to look: the dev folder, the library folders (None: ``ldconfig -p``, then ``LIBRARY_DIRS``)
    and the ``nvidia-smi`` command (asked only when it exists)."""

    dev: Path = Path("/dev")
    library_dirs: tuple[Path, ...] | None = None
    smi: str = "nvidia-smi"


HOST = Host()  # this machine; tests put a Host over fake roots here


@dataclass(frozen=True)
class Inventory:
    """What ``discover`` found: GPU nodes by number, the control nodes present, the driver libraries
    (name as the loader asks for it -> host file) and, when ``nvidia-smi`` exists, its count or error."""

    dev: Path
    gpus: tuple[Path, ...] = ()
    control: tuple[Path, ...] = ()
    libraries: dict[str, Path] = field(default_factory=dict)
    smi_count: int | None = None
    smi_error: str | None = None


@dataclass(frozen=True)
class Passthrough:
    """What one GPU task is given: ``nodes`` (host path -> its name under ``/dev``), ``libraries`` (name ->
    host file) and ``visible``, its ``CUDA_VISIBLE_DEVICES`` inside, where only the held GPUs exist
    (numbered from 0, as under nvidia-docker)."""

    nodes: tuple[tuple[Path, str], ...] = ()
    libraries: tuple[tuple[str, Path], ...] = ()
    visible: str = ""


def is_char_device(path: Path) -> bool:
    """A character device (a plain file or a link of that name does not count)."""
    try:
        return stat.S_ISCHR(os.lstat(path).st_mode)
    except OSError:
        return False


def gpu_nodes(dev: Path) -> tuple[Path, ...]:
    """``dev``'s ``nvidiaN`` character devices, by N."""
    try:
        names = os.listdir(dev)
    except OSError:
        return ()
    found = [(int(m.group(1)), dev / name) for name in names if (m := _GPU_NODE.fullmatch(name))]
    return tuple(path for _, path in sorted(found) if is_char_device(path))


def control_nodes(dev: Path) -> tuple[Path, ...]:
    """The control nodes present in ``dev``: the required ones first, then the optional ones."""
    return tuple(dev / name for name in (*CONTROL, *OPTIONAL) if is_char_device(dev / name))


def _elf64(path: Path) -> bool:
    """Whether ``path`` is a 64-bit ELF file (``ldconfig -p`` lists 32-bit builds under the same name)."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(5)
    except OSError:
        return False
    return head[:4] == b"\x7fELF" and head[4:5] == b"\x02"


def _wanted(name: str) -> bool:
    return any(name == prefix or name.startswith(prefix + ".") for prefix in LIBRARIES)


def _ldconfig_listing() -> list[tuple[str, Path]]:
    """(name, path) of every library ``ldconfig -p`` lists; empty when it cannot be asked."""
    command = shutil.which("ldconfig") or ("/sbin/ldconfig" if os.path.exists("/sbin/ldconfig") else None)
    if command is None:
        return []
    try:
        done = subprocess.run([command, "-p"], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.SubprocessError):
        return []
    found = []
    for line in done.stdout.splitlines():
        if m := _LDCONFIG_LINE.match(line):
            found.append((m.group(1), Path(m.group(3))))
    return found


def _folder_listing(folders: tuple[Path, ...]) -> list[tuple[str, Path]]:
    found = []
    for folder in folders:
        try:
            names = sorted(os.listdir(folder))
        except OSError:
            continue
        found += [(name, folder / name) for name in names]
    return found


def driver_libraries(library_dirs: tuple[Path, ...] | None = None) -> dict[str, Path]:
    """The driver's libraries: name (``libcuda.so.1``) -> the 64-bit host file it resolves to. From
    ``library_dirs`` when given, else from ``ldconfig -p`` and then ``LIBRARY_DIRS`` (the first of a
    name wins)."""
    if library_dirs is not None:
        listing = _folder_listing(library_dirs)
    else:
        listing = _ldconfig_listing() + _folder_listing(tuple(map(Path, LIBRARY_DIRS)))
    found: dict[str, Path] = {}
    for name, path in listing:
        if name in found or not _wanted(name):
            continue
        real = Path(os.path.realpath(path))
        if real.is_file() and _elf64(real):
            found[name] = real
    return found


def _smi(command: str) -> tuple[int | None, str | None]:
    """``nvidia-smi -L``'s GPU count, or its own error; (None, None) when there is no such command."""
    found = shutil.which(command)
    if found is None:
        return None, None
    try:
        done = subprocess.run([found, "-L"], capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.SubprocessError) as err:
        return None, f"nvidia-smi -L: {err}"
    if done.returncode != 0:
        lines = [line.strip() for line in (done.stderr + done.stdout).splitlines() if line.strip()]
        why = lines[-1][:300] if lines else f"exit status {done.returncode}"
        return None, f"nvidia-smi -L: {why}"
    return len(_SMI_GPU.findall(done.stdout)), None


def discover(host: Host | None = None, smi: bool = True) -> Inventory:
    """What this machine (``host``'s roots; None: ``HOST``) offers a CUDA program; ``smi`` False skips
    ``nvidia-smi`` (a task's run needs only the nodes and libraries)."""
    host = host or HOST
    count, error = _smi(host.smi) if smi else (None, None)
    return Inventory(
        dev=host.dev,
        gpus=gpu_nodes(host.dev),
        control=control_nodes(host.dev),
        libraries=driver_libraries(host.library_dirs),
        smi_count=count,
        smi_error=error,
    )


def needed(gpus: float) -> int:
    """Whole GPUs a task or round asks for (a fraction of one still needs its node)."""
    return math.ceil(gpus) if gpus > 0 else 0


def _nodes_problem(found: Inventory, count: int) -> str | None:
    if len(found.gpus) >= count:
        return None
    if not found.gpus:
        first = found.dev / "nvidia0"
        why = "is not a character device" if os.path.lexists(first) else "missing"
        return f"no NVIDIA device here ({first} {why})"
    shown = ", ".join(str(path) for path in found.gpus)
    return f"only {len(found.gpus)} NVIDIA device{'s' if len(found.gpus) > 1 else ''} here ({shown})"


def problem(found: Inventory, gpus: float) -> str | None:
    """Why ``found`` cannot run a task that needs ``gpus`` GPUs, as one line; None when it can (or needs
    none)."""
    count = needed(gpus)
    if count == 0:
        return None
    if why := _nodes_problem(found, count):
        return why
    present = {path.name for path in found.control}
    for name in CONTROL:
        if name not in present:
            hint = " (the nvidia-uvm module is not loaded)" if name == "nvidia-uvm" else ""
            return f"{found.dev / name} missing{hint}"
    for name in REQUIRED_LIBRARIES:
        if name not in found.libraries:
            return f"driver library {name} not found (ldconfig -p, {', '.join(LIBRARY_DIRS)})"
    if found.smi_error is not None:
        return found.smi_error
    if found.smi_count is not None and found.smi_count < count:
        return f"nvidia-smi -L lists {found.smi_count} GPU{'' if found.smi_count == 1 else 's'}"
    return None


def held(found: Inventory, gpus: float, visible: str | None) -> tuple[Path, ...]:
    """The GPU nodes a task holds: those Ray named in ``CUDA_VISIBLE_DEVICES`` (``visible``) when it names
    them by number, else the first ones present."""
    count = needed(gpus)
    if visible:
        parts = [part.strip() for part in visible.split(",") if part.strip()]
        if parts and all(part.isdigit() for part in parts):
            by_number = {int(path.name.removeprefix("nvidia")): path for path in found.gpus}
            return tuple(by_number[int(part)] for part in parts if int(part) in by_number)
    return found.gpus[:count]


def _held_problem(found: Inventory, nodes: tuple[Path, ...], count: int, visible: str | None) -> str | None:
    """Why the GPUs Ray named are not all here (a node of theirs missing); None when they are."""
    if len(nodes) >= count:
        return None
    present = ", ".join(str(path) for path in found.gpus)
    return f"CUDA_VISIBLE_DEVICES={visible} names GPUs not here (present: {present})"


def passthrough(gpus: float, visible: str | None = None, host: Host | None = None) -> Passthrough | None:
    """What a task that needs ``gpus`` GPUs is given (None for a CPU task: nothing, not even a library).
    A ``UserError`` when this machine cannot give it: the runner's, so a fault of the platform (the job is
    requeued), never the detector's."""
    count = needed(gpus)
    if count == 0:
        return None
    found = discover(host, smi=False)
    nodes = held(found, gpus, visible)
    why = problem(found, gpus) or _held_problem(found, nodes, count, visible)
    if why:
        raise UserError(f"this job needs {count} GPU{'s' if count > 1 else ''}: {why}")
    return Passthrough(
        nodes=tuple((path, path.name) for path in (*found.control, *nodes)),
        libraries=tuple(sorted(found.libraries.items())),
        visible=",".join(str(number) for number in range(len(nodes))),
    )
