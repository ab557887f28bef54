"""Which sandbox this machine offers, and the command line that puts a detector inside it.

Three levels, best first, detected at run time by trying them once:

- ``bwrap``: bubblewrap. An empty root (deny by default) into which only an allow-list is bound read-only: the
  system libraries, this Python and ``assay``, and the task's input folder (copies under neutral names, see
  ``assay.runner.workspace``); the task's scratch, output, ``/dev/shm`` and ``/tmp`` are folders of one
  size-bounded tmpfs of its own (``/dev/shm`` and ``/tmp`` are links into it), so a run's private pages are
  bounded by that one size; it vanishes with the run. Host-wide ``/proc`` counters (free memory, load, CPU
  time, ...) are hidden behind fixed files (``procview``), so two runs cannot signal each other through them.
  No network, own pid namespace (everything dies with the detector), all capabilities dropped (as root,
  capabilities would let it mount the host's disk), and, with bubblewrap 0.8 or later, no nested user
  namespaces (in one of its own a detector would hold every capability again: it could mount a tmpfs outside
  the size bound, or probe the kernel).
- ``unshare``: ``unshare --user --mount --pid --net`` and ``readonly.py``: a read-only view of this machine's
  files (all of them can be read, none written) with only the run's scratch and output folders and a
  private ``/dev/shm`` writable, no capabilities, no network and an own pid namespace (so a child that calls
  ``setsid`` still dies with the detector). Paths are not hidden. The detector is pid 1 there, so signals
  it sends itself without a handler are ignored.
- ``none``: a plain subprocess in its own process group. Run by root, it runs as a throwaway uid that may
  read every file but write only its own folders and world-writable ones (``readonly.py``); run by anyone
  else, it runs as that user and may write what they may (``host_view`` says so: the leaderboard refuses
  it for practice jobs).

``isolation_problem`` keeps the failing probe's own error (bubblewrap's, say) for a worker to log.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from assay.errors import UserError
from assay.runner.gpu import Passthrough
from assay.runner.procview import proc_binds
from assay.runner.seccomp import SECCOMP_FD, refuse_sysinfo
from assay.runner.seccomp import filled as seccomp_filled

LEVELS = ("bwrap", "unshare", "none")
_UNSHARE_FLAGS = ("--user", "--map-root-user", "--mount", "--propagation", "private", "--pid", "--fork")
READONLY = str(Path(__file__).with_name("readonly.py"))


INSIDE = Path("/task")  # the task's own tmpfs inside a bwrap sandbox: input/, scratch/, output/, shm/, tmp/
_TMP_LINK = str(INSIDE.relative_to("/") / "tmp")  # /tmp, relative: see ``bwrap_argv``
_DISABLE_USERNS = (0, 8)  # the bubblewrap release that added --disable-userns
_SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
# The dynamic loader's cache and time zone; no passwd, hosts or ssl: nothing a sealed detector needs.
_ETC = ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/localtime", "/etc/alternatives")
_DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom")
# where a GPU task finds the driver's libraries (apptainer's ``--nv`` folder), put on its LD_LIBRARY_PATH
GPU_LIBS = Path("/.singularity.d/libs")


@dataclass(frozen=True)
class Mounts:
    """What a bwrap sandbox is built from, on an empty root: nothing else of the host exists inside.

    ``readonly``: host paths shown read-only at the same place (the runtime, extra inputs).
    ``input``: the host folder shown read-only as ``/task/input`` (the task's staged copies).
    ``private_bytes``: the size of the task's own tmpfs (scratch, output, /dev/shm and /tmp together).
    ``memory_bytes``: the run's memory limit, shown as its total, free and available memory in
    ``/proc/meminfo`` (``assay.runner.procview``; None: this machine's total).
    ``writable``: at the ``unshare`` and ``none`` levels, the host folders the run may write (its scratch
    and output); ``private_bytes`` is then the size of its own ``/dev/shm``.
    ``image_root``: an unpacked container image (a ``.sif``'s root, ``prepare_image_root``d) bound read-only
    as ``/`` instead of the empty root and this host's runtime: the detector sees its own image only.
    ``output``: a host folder bound as ``/task/output``, read back after the sandbox is gone (an image run
    has no Python of ours for ``collect.py``, so it is not pid 1 either: bubblewrap's own init is).
    ``gpus``: a GPU task's device nodes and driver libraries (``gpu.passthrough``); None for a CPU task,
    which gets no NVIDIA node and no driver library of ours.
    """

    readonly: list[Path] = field(default_factory=list)
    input: Path | None = None
    private_bytes: int = 2**30
    memory_bytes: int | None = None
    network: bool = False
    gpus: Passthrough | None = None
    writable: list[Path] = field(default_factory=list)
    image_root: Path | None = None
    output: Path | None = None


def _attempt(argv: list[str]) -> str | None:
    """None when a sandbox command runs this Python here, else its error as one line: installed is not
    enough (containers may forbid it). Python, not ``true``: the runtime is all a slim image is sure to hold
    (ours has no coreutils)."""
    try:
        with seccomp_filled([*argv, sys.executable, "-c", ""]) as (command, fds):
            done = subprocess.run(command, capture_output=True, timeout=30, check=False, pass_fds=fds)
    except (OSError, subprocess.SubprocessError) as err:
        return one_line(str(err)) or type(err).__name__
    if done.returncode == 0:
        return None
    return one_line(done.stderr.decode(errors="replace")) or f"{argv[0]} exited with status {done.returncode}"


def one_line(text: str) -> str:
    """A command's error as one line: its last non-blank line (a command's own message ends its stderr)."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""


def _works(argv: list[str]) -> bool:
    return _attempt(argv) is None


def _problem(level: str) -> str | None:
    """Why ``level`` does not work here (one line), probed with the very command line tasks get."""
    if level == "bwrap":
        # The very sandbox tasks get, so a machine that allows bwrap but not, say, its tmpfs size is caught.
        return "bwrap not found on PATH" if shutil.which("bwrap") is None else _attempt(bwrap_argv(Mounts()))
    if level == "unshare" and shutil.which("unshare") is None:
        return "unshare not found on PATH"
    if level in ("unshare", "none"):
        with tempfile.TemporaryDirectory(prefix="assay-probe-") as folder:
            return _attempt(command(level, [], Mounts(writable=[Path(folder)], private_bytes=2**20)))
    return f"unknown isolation {level!r}"


_PROBLEMS: dict[str, str | None] = {}


@functools.cache
def _probe(level: str) -> bool:
    _PROBLEMS[level] = _problem(level)
    return _PROBLEMS[level] is None


def isolation_problem(level: str) -> str | None:
    """Why ``level`` does not work on this machine, as one line (the failing command's own error, such as
    bubblewrap's ``Can't mkdir parents for ...``), or None when it works. Probed once per process with
    ``_probe`` (clearing ``_probe``'s cache probes again), so a worker's pre-flight check can log it."""
    if _probe(level):
        return None
    return _PROBLEMS.get(level) or f"isolation {level!r} does not work on this machine"


def isolation_available() -> str:
    """The best isolation level this machine supports: ``bwrap``, ``unshare`` or ``none`` (``none`` also
    when its own probe fails: a run then fails with the reason)."""
    return next((level for level in LEVELS if _probe(level)), "none")


def levels_available() -> list[str]:
    """Every level that works here, best first (the benchmark compares them)."""
    return [level for level in LEVELS if _probe(level)]


def choose(level: str | None) -> str:
    """``level`` if it works here, the best available when None; a UserError names what is missing."""
    if level is None:
        return isolation_available()
    if level not in LEVELS:
        raise UserError(f"unknown isolation {level!r}; choose one of {', '.join(LEVELS)}")
    if not _probe(level):
        best = isolation_available()
        raise UserError(f"isolation {level!r} is not available on this machine (best: {best})")
    return level


def _existing(paths: list[Path]) -> list[Path]:
    """De-duplicated absolute paths that exist, outermost first: bwrap refuses to mount over nothing."""
    seen = {Path(os.path.abspath(path)): None for path in paths if os.path.lexists(path)}
    return sorted(seen, key=lambda path: len(path.parts))


def runtime_paths() -> list[Path]:
    """What a detector needs to run: system libraries and this Python (interpreter, its libraries, assay).

    Only ``bin``, ``lib`` and ``pyvenv.cfg`` of each prefix, never a prefix itself: a virtual environment
    may sit inside a checkout or a home folder that holds other things. ``assay`` goes in by its package
    folder alone, since an editable install points into the project checkout.
    """
    import assay

    prefixes = {Path(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    parts = [prefix / name for prefix in sorted(prefixes) for name in ("bin", "lib", "lib64", "pyvenv.cfg")]
    return _existing([*map(Path, _SYSTEM_DIRS), *map(Path, _ETC), *parts, Path(assay.__file__).parent])


def _show(path: Path) -> list[str]:
    """Bind ``path`` read-only, or recreate it as a link when it is one (``/lib -> usr/lib``)."""
    if path.is_symlink():
        return ["--symlink", os.readlink(path), str(path)]
    return ["--ro-bind", str(path), str(path)]


def _devices(gpus: Passthrough | None) -> list[str]:
    """A minimal read-only /dev; /dev/shm points into the task's bounded tmpfs. A GPU task also gets its
    NVIDIA nodes (the control nodes and the GPUs it holds), and nothing else: no ``/dev/dri``."""
    argv = ["--tmpfs", "/dev"]
    for node in _DEVICES:
        argv += ["--dev-bind", node, node]
    for number, name in enumerate(("stdin", "stdout", "stderr")):
        argv += ["--symlink", f"/proc/self/fd/{number}", f"/dev/{name}"]
    argv += ["--symlink", "/proc/self/fd", "/dev/fd", "--symlink", str(INSIDE / "shm"), "/dev/shm"]
    for source, name in gpus.nodes if gpus is not None else ():
        argv += ["--dev-bind", str(source), f"/dev/{name}"]
    return argv


def _gpu_libraries(gpus: Passthrough | None, image: bool) -> list[str]:
    """The driver's libraries, read-only, in ``GPU_LIBS``: on an image root a tmpfs of their own over the
    folder ``prepare_image_root`` made (the image cannot take new mount points), made read-only again."""
    if gpus is None or not gpus.libraries:
        return []
    argv = ["--tmpfs", str(GPU_LIBS)] if image else []
    for name, source in gpus.libraries:
        argv += ["--ro-bind", str(source), str(GPU_LIBS / name)]
    return [*argv, "--remount-ro", str(GPU_LIBS)] if image else argv


@functools.cache
def bwrap_version() -> tuple[int, ...]:
    """The installed bubblewrap's version, e.g. (0, 8, 0); () when it cannot be told."""
    try:
        done = subprocess.run(["bwrap", "--version"], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.SubprocessError):
        return ()
    found = re.search(r"(\d+)\.(\d+)(?:\.(\d+))?", done.stdout)
    return tuple(int(part) for part in found.groups() if part is not None) if found else ()


@functools.cache
def nested_userns_disabled() -> bool:
    """Whether bwrap here can forbid nested user namespaces (0.8+, and a user namespace of its own works)."""
    if bwrap_version() < _DISABLE_USERNS:
        return False
    return _works(["bwrap", "--unshare-user", "--disable-userns", "--ro-bind", "/", "/", "--"])


@functools.cache
def hostname_settable() -> bool:
    """Whether bubblewrap may name the sandbox's host. In a container under podman's default seccomp
    profile it may not (``sethostname`` is allowed only with CAP_SYS_ADMIN, which the container's user
    lacks), though it may do all else the sandbox needs; the sandbox then keeps its own UTS namespace with
    the container's hostname, which names the container, not the machine."""
    return _works(["bwrap", *_namespaces(), "--hostname", "sandbox", "--ro-bind", "/", "/", "--"])


def _namespaces() -> list[str]:
    """Own user (without nested ones where bwrap can), pid, ipc, uts and cgroup namespaces."""
    user = ["--unshare-user", "--disable-userns"] if nested_userns_disabled() else ["--unshare-user-try"]
    return [*user, "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]


def bwrap_argv(mounts: Mounts) -> list[str]:
    """The bubblewrap prefix: an empty, read-only root with only the allow-listed paths bound into it.

    Order matters: later mounts sit on top of earlier ones, and the remounts come last. ``/proc`` is fresh,
    with fixed files over its host-wide counters (``procview``). The ``/tmp`` link is relative
    (``task/tmp``): bubblewrap builds the root below a folder of its own, where an absolute link would lead
    to the host's ``/task/tmp``, so no mount point for a runtime path under ``/tmp`` (a checkout or virtual
    environment there, reached through links or not) could be made; the relative link puts them on the
    task's tmpfs. The command is pid 1 (``--as-pid-1``): the collector, which then takes no signal from the
    detector (``collect.py``).
    """
    image = mounts.image_root
    root = ["--ro-bind", str(Path(image).resolve()), "/"] if image is not None else ["--tmpfs", "/"]
    argv = ["bwrap", *root, "--proc", "/proc", *proc_binds(mounts.memory_bytes)]
    argv += _devices(mounts.gpus)
    argv += ["--size", str(mounts.private_bytes), "--tmpfs", str(INSIDE)]
    argv += [arg for name in ("input", "scratch", "output") for arg in ("--dir", str(INSIDE / name))]
    argv += [arg for name in ("shm", "tmp") for arg in ("--perms", "1777", "--dir", str(INSIDE / name))]
    if image is None:  # an image root has the link already (``prepare_image_root``)
        argv += ["--symlink", _TMP_LINK, "/tmp"]
    argv += _namespaces()
    argv += ["--as-pid-1"] if image is None else []  # the collector; an image run has bubblewrap's init
    argv += ["--die-with-parent", "--new-session", "--cap-drop", "ALL"]
    argv += ["--seccomp", SECCOMP_FD] if refuse_sysinfo() is not None else []  # run_limited fills it in
    argv += ["--hostname", "sandbox"] if hostname_settable() else []
    if not mounts.network:
        argv.append("--unshare-net")
    runtime = runtime_paths() if image is None else []
    for path in _existing([*runtime, *mounts.readonly]):
        argv += _show(path)
    if mounts.input is not None:
        argv += ["--ro-bind", str(Path(mounts.input).resolve()), str(INSIDE / "input")]
    if mounts.output is not None:
        argv += ["--bind", str(Path(mounts.output).resolve()), str(INSIDE / "output")]
    argv += _gpu_libraries(mounts.gpus, image is not None)
    argv += ["--remount-ro", "/dev", "--remount-ro", "/"]
    return [*argv, "--"]


def prepare_image_root(root: Path) -> None:
    """Make an unpacked image root ready to be ``bwrap_argv``'s read-only ``/``: bubblewrap can make no
    mount point on it, so ``/proc``, ``/dev`` and ``/task`` become empty folders of their own and ``/tmp``
    the same link into the task's tmpfs a folder detector gets (apptainer mounts over all four too, so
    nothing the image kept there was ever seen by a detector); ``/.singularity.d/libs`` is made where the
    image lacks it, for a GPU task's driver libraries (``GPU_LIBS``, apptainer's ``--nv`` folder)."""
    for name in ("proc", "dev", INSIDE.name, "tmp"):
        place = root / name
        if place.is_symlink() or place.is_file():
            place.unlink()
        elif place.is_dir():
            shutil.rmtree(place)
    for name in ("proc", "dev", INSIDE.name):
        (root / name).mkdir(mode=0o755)
    (root / "tmp").symlink_to(_TMP_LINK)
    _plain_folder(root, GPU_LIBS.relative_to("/"))


def _plain_folder(root: Path, relative: Path) -> None:
    """Make ``root / relative`` a folder, one part at a time, never through a link (an image's link could
    point anywhere on this host); a part that is a link or a file leaves it be (a GPU task then fails to
    start, the image's fault)."""
    place = root
    for part in relative.parts:
        place = place / part
        if place.is_symlink() or (place.exists() and not place.is_dir()):
            return
        if not place.exists():
            place.mkdir(mode=0o755)


def wrap(level: str, argv: list[str], mounts: Mounts) -> tuple[list[str], str]:
    """The full command line for ``level`` and a one-line description of what it protects."""
    return command(level, argv, mounts), describe(level, mounts)


def command(level: str, argv: list[str], mounts: Mounts) -> list[str]:
    """``argv`` run at ``level``."""
    if level == "bwrap":
        return bwrap_argv(mounts) + argv
    if level == "unshare":
        flags = [*_UNSHARE_FLAGS, "--kill-child", *([] if mounts.network else ["--net"])]
        return ["unshare", *flags, "--", *_readonly("namespace", mounts, argv)]
    return _readonly("user", mounts, argv) if os.geteuid() == 0 else argv


def describe(level: str, mounts: Mounts) -> str:
    """What a run at ``level`` with ``mounts`` is protected by, in one line (the job log shows it)."""
    network = "network allowed" if mounts.network else "no network"
    if level == "unshare":
        return f"unshare: {network}, own pid namespace, {host_view(level)}; paths not hidden"
    if level == "none":
        why = "neither bwrap nor unshare is available" if isolation_available() == "none" else "chosen"
        view = host_view(level) or "it could write whatever this user may"
        return f"none: {why}; {view}; network not cut off, paths not hidden"
    if mounts.image_root is not None:
        parts = ["the image's own root read-only, with inputs only"]
    else:
        parts = ["empty read-only root with inputs and runtime only"]
    parts.append(f"{mounts.private_bytes / 2**20:.0f} MiB private scratch")
    parts += ["host-wide /proc counters hidden", network, "own pid namespace", "no capabilities"]
    if refuse_sysinfo() is not None:
        parts.append("sysinfo refused (seccomp)")
    parts.append(gpu_line(mounts.gpus))
    if not hostname_settable():
        parts.append("the container's hostname (its seccomp profile forbids naming the sandbox)")
    if nested_userns_disabled():
        parts.append("no nested user namespaces")
    else:
        shown = ".".join(map(str, bwrap_version())) or "unknown"
        parts.append(f"nested user namespaces NOT disabled (bubblewrap {shown}; 0.8 or later can)")
    return "bwrap: " + ", ".join(parts)


def gpu_line(gpus: Passthrough | None) -> str:
    """What of the host's GPUs a run got, for the job log."""
    if gpus is None:
        return "no GPU device"
    nodes = ", ".join(f"/dev/{name}" for _, name in gpus.nodes)
    return f"GPU devices {nodes} and {len(gpus.libraries)} driver libraries"


def _readonly(mode: str, mounts: Mounts, argv: list[str]) -> list[str]:
    """``argv`` run through ``readonly.py`` in ``mode``, with the run's own folders writable."""
    folders = [str(Path(folder).resolve()) for folder in mounts.writable]
    return [sys.executable, "-I", "-S", READONLY, mode, str(mounts.private_bytes), *folders, "--", *argv]


def host_view(level: str) -> str | None:
    """What a run at ``level`` could read and write of this machine's files, for the job log; None when it
    could write outside its own folders (``none`` run by a user other than root)."""
    if level == "bwrap":
        return "only its inputs and the runtime, read-only; wrote only its own private scratch"
    if level == "unshare":
        return (
            "a read-only view of this machine's files (it could read them, including other rounds' data); "
            "it wrote only its scratch and output"
        )
    if os.geteuid() == 0:
        return (
            "this machine's files read-only, as a throwaway user (it could read them, including other "
            "rounds' data); it wrote only its scratch, its output and world-writable folders such as /tmp"
        )
    return None
