"""Run a detector shipped as a container image, as NIST runs TrojAI submissions: the image's own entrypoint.

A ``Task`` whose ``image`` is set runs here instead of in ``sandbox.py``, under the same contract: the same
staged inputs (read-only, nothing else of the host), the same limits (wall clock and the job's deadline,
memory, processes and threads, a bounded scratch), no network, and the same ``TaskResult``. What differs is
what runs: the task's argv is a folder detector's (``python {input}/detector/entrypoint.py ARGS``), so the
interpreter and script are dropped and ARGS go to the image's own entrypoint (its command when it has no
entrypoint), as NIST's ``singularity run`` hands them to the ``%runscript``; ``{input}/detector/X``
becomes ``/X``, where NIST's harness looks for the metaparameters, schema and learned parameters that the
image carries.

Image specs (``Task.image``):

- ``PATH.tar`` (or ``docker-archive:PATH``, ``oci-archive:PATH``): an image archive from ``podman save``
  or ``docker save``, loaded once into a private podman storage (``storage_root()``; team-chosen tags never
  touch the host's own images) and run by its ID, so a job loads it for its first model only.
- ``podman:REF``: an image already in the host's podman storage (``podman:localhost/detector:1``).
- ``PATH.sif`` / ``PATH.simg``: a Singularity (SIF) image, run without apptainer or singularity: read
  by ``assay.runner.sif``, its primary SquashFS partition unpacked once per image into the node's cache
  (``assay.runner.squashfs``), and that root made bubblewrap's read-only ``/`` (``isolation.bwrap_argv``
  with ``image_root``) with the same staged inputs, limits, ``/proc`` view and namespaces as a folder
  detector. What runs is ``singularity run``'s: ``/.singularity.d/env/*.sh`` sourced in order by the
  image's ``/bin/sh``, then ``/.singularity.d/runscript`` with the TrojAI arguments. Its scratch, ``/tmp``
  and ``/dev/shm`` are bubblewrap's own tmpfs, as a folder detector's; with no Python of ours inside to
  collect them, its result files are written to the host tmpfs described below and read after the sandbox,
  and every process in it, is gone.

Podman runs with ``runc`` (``crun`` refuses cgroups v1 hybrid hosts). The detector runs as the harness's
own user, as ``singularity run`` runs an image as its caller and as a folder detector runs (so it reads the
staged files the harness can, however tightly they are shared), with no capabilities, ``no-new-privileges``,
a read-only root, ``--network none`` and a pids and memory cgroup of its own. Its scratch, output, ``/tmp``
and ``/dev/shm`` folders are one tmpfs of ``scratch_bytes`` mounted on the host for the task (so the result
files can be read back after the container is gone, and the run's private pages are bounded by that one
size; where the harness may not mount, scratch, ``/tmp`` and ``/dev/shm`` are the engine's tmpfs of that
size each). Its inputs are fresh copies in a folder of the run (``assay.runner.workspace.stage_in``), and
the container's name is random: nothing it is given names the model.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import re
import resource
import shlex
import shutil
import socket
import subprocess
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from assay.errors import UserError
from assay.runner.cgroup import joiner, task_cgroup
from assay.runner.collect import read_regular
from assay.runner.gpu import Passthrough
from assay.runner.images import DOCKER_ARCHIVE, OCI_ARCHIVE, ImageArchive, archive_format, read_archive
from assay.runner.isolation import (
    GPU_LIBS,
    Mounts,
    bwrap_argv,
    describe,
    gpu_line,
    isolation_problem,
    prepare_image_root,
)
from assay.runner.process import Finished, run_limited
from assay.runner.procview import podman_flags
from assay.runner.sandbox import (
    INSIDE_FOLDERS,
    environment,
    fill,
    gpu_passthrough,
    memory_killed,
    not_started,
    task_result,
    time_left,
)
from assay.runner.seccomp import podman_profile
from assay.runner.sif import (
    ENV_FOLDER,
    RUNSCRIPT,
    Partition,
    SifImage,
    check_arch,
    read_sif,
    system_partition,
)
from assay.runner.squashfs import file_digest, held_root, unsquashfs_missing
from assay.runner.task import Task, TaskResult
from assay.runner.workspace import (
    OWNER_FILE,
    check_sources,
    default_base,
    owner_is_dead,
    private_temp_folder,
    stage_in,
    workspace,
)

PODMAN_PREFIX = "podman:"
JOB_LABEL, WORKER_LABEL = "assay.job", "assay.worker"  # on each detector container (``owner_labels``)
ARCHIVE_PREFIXES = (f"{DOCKER_ARCHIVE}:", f"{OCI_ARCHIVE}:")
SIF_SUFFIXES = (".sif", ".simg")
RUNTIME = "runc"  # crun fails on cgroups v1 hybrid hosts ("cgroups in hybrid mode not supported")
DETECTOR_STAGE = "detector"  # the folder detector's own stage entry: an image carries its own files
_DETECTOR_ARG = "{input}/" + DETECTOR_STAGE + "/"
_ENTRYPOINT_ARG = _DETECTOR_ARG + "entrypoint.py"
_PRIVATE = "private"  # the task's tmpfs mount point inside its workspace folder
_FOLDERS = ("scratch", "output", "tmp", "shm")  # the folders on it
# RLIMIT_NPROC counts a user's processes host-wide (root is exempt), so it bounds nothing per task: the pids
# cgroup does. It must still be set, within what conmon passes on (32768 under podman 4.3), or runc fails.
_MAX_NPROC = 32768
_BACKSTOP_S = 10  # conmon kills the container this long after the harness should have, had it died
_LOAD_TIMEOUT_S = 600
_MAX_NOFILE = 65536
_DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"
OCI_GPU_LIBS = "/usr/local/nvidia/lib64"  # a GPU task's driver libraries in an OCI image (nvidia-docker's)


@functools.lru_cache(maxsize=64)
def _archive_kind(path: str, size: int, mtime_ns: int) -> str | None:
    """``archive_format`` once per archive version: a compressed archive is read whole to find its names."""
    return archive_format(Path(path))


@dataclass(frozen=True)
class ImageSpec:
    """A parsed ``Task.image``: ``kind`` is ``archive``, ``local`` or ``sif``; ``source`` a path or name."""

    kind: str
    source: str


@dataclass(frozen=True)
class Image:
    """An image ready to run: what the engine calls it and the command its arguments follow."""

    ref: str
    command: list[str]
    env: tuple[str, ...] = ()  # the image's own ``NAME=value`` variables (its LD_LIBRARY_PATH, say)


def parse_image(spec: str) -> ImageSpec:
    """Read an image spec (see the module docstring); a ``UserError`` says what form was expected."""
    if spec.startswith(PODMAN_PREFIX):
        ref = spec.removeprefix(PODMAN_PREFIX)
        if not ref or any(char.isspace() for char in ref) or ref.startswith("-"):
            raise UserError(
                f"image {spec!r}: name a local image after 'podman:', e.g. podman:localhost/det:1"
            )
        return ImageSpec("local", ref)
    path = next((spec.removeprefix(p) for p in ARCHIVE_PREFIXES if spec.startswith(p)), spec)
    if path.lower().endswith(SIF_SUFFIXES):
        return ImageSpec("sif", str(Path(path).resolve()))
    if not Path(path).is_file():
        raise UserError(
            f"image {spec!r}: no such image archive; give a podman/docker save .tar, podman:REF or a .sif"
        )
    info = Path(path).stat()
    if _archive_kind(str(Path(path).resolve()), info.st_size, info.st_mtime_ns) is None:
        raise UserError(f"image {spec!r}: not a docker-archive or oci-archive (podman save / docker save)")
    return ImageSpec("archive", str(Path(path).resolve()))


# --- engines ------------------------------------------------------------------------------------------------


def podman_missing() -> str | None:
    """Why podman cannot run images here, or None when it can (tests skip with this reason)."""
    missing = [tool for tool in ("podman", RUNTIME) if shutil.which(tool) is None]
    if missing:
        return f"{' and '.join(missing)} not installed (`make install` installs Debian's podman and runc)"
    return None


def sif_missing() -> str | None:
    """Why ``.sif`` images cannot run here (no unsquashfs, or no working bubblewrap: an image's root needs
    a sandbox of its own), or None when they can."""
    if reason := unsquashfs_missing():
        return reason
    if problem := isolation_problem("bwrap"):
        return f"a .sif image runs under bubblewrap, which does not work here ({problem})"
    return None


def storage_root() -> Path:
    """Podman's storage for submitted images: ``ASSAY_PODMAN_ROOT``, else ``assay-podman`` in the temp dir
    when it is this user's alone (``private_temp_folder``, as the task folders: whoever made a shared one
    first would choose the images every detector run starts from), else ``assay-podman-UID``.

    Apart from the host's own storage because loading an archive applies the tags inside it: a team's
    ``docker save`` of ``debian:latest`` must not retag the host's image. Images here are a cache: removed
    ones are loaded again from their archive when next needed.
    """
    chosen = os.environ.get("ASSAY_PODMAN_ROOT")
    return Path(chosen) if chosen else private_temp_folder("assay-podman", "podman's image storage")


def _podman(spec: ImageSpec) -> list[str]:
    """The podman command prefix: private storage for archives, the host's own for ``podman:`` images."""
    argv = ["podman", "--runtime", RUNTIME]
    if spec.kind == "archive":
        root = storage_root()
        argv += ["--root", str(root / "storage"), "--runroot", str(root / "run")]
    return argv


def _client_env() -> dict[str, str]:
    """What the podman program itself needs from the harness's environment (not the detector's)."""
    env = {"PATH": os.environ.get("PATH", _DEFAULT_PATH), "LANG": "C.UTF-8"}
    for name in ("HOME", "TMPDIR", "XDG_RUNTIME_DIR"):
        if name in os.environ:
            env[name] = os.environ[name]
    return env


def _call(argv: list[str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=_client_env(),
        check=False,
        stdin=subprocess.DEVNULL,
    )


def _error_line(done: subprocess.CompletedProcess[str]) -> str:
    lines = [line for line in (done.stderr or done.stdout).splitlines() if line.strip()]
    return lines[-1].strip() if lines else f"exit code {done.returncode}"


# --- images -------------------------------------------------------------------------------------------------

_loaded: dict[tuple, Image] = {}
_loading: dict[tuple, threading.Lock] = {}
_loading_guard = threading.Lock()


def _archive_image(spec: ImageSpec) -> Image:
    """Load the archive into the private storage once (per process, and not at all when the image is there
    from an earlier job); tasks running at once wait for one load."""
    path = Path(spec.source)
    info = path.stat()
    key = (str(storage_root()), spec.source, info.st_size, info.st_mtime_ns)
    with _loading_guard:
        lock = _loading.setdefault(key, threading.Lock())
    with lock:
        if key in _loaded:
            return _loaded[key]
        archive: ImageArchive = read_archive(path)
        prefix = _podman(spec)
        if _call([*prefix, "image", "exists", archive.image_id]).returncode != 0:
            done = _call([*prefix, "load", "--quiet", "--input", str(path)], _LOAD_TIMEOUT_S)
            if done.returncode != 0:
                raise _ImageError(f"podman could not load {path.name}: {_error_line(done)}")
            if _call([*prefix, "image", "exists", archive.image_id]).returncode != 0:
                raise _ImageError(f"podman loaded {path.name} but not as image {archive.image_id}")
        _loaded[key] = image = Image(archive.image_id, archive.command, tuple(archive.env))
        return image


def _local_image(spec: ImageSpec) -> Image:
    """An image of the host's storage, by its ID at this moment (a tag moved mid-job changes nothing)."""
    done = _call([*_podman(spec), "image", "inspect", "--format", "json", spec.source])
    if done.returncode != 0:
        raise _ImageError(f"no image {spec.source!r} in podman's storage: {_error_line(done)}")
    try:
        found = json.loads(done.stdout)[0]
        config = found.get("Config") or {}
        command = config.get("Entrypoint") or config.get("Cmd") or []
        env = tuple(str(item) for item in config.get("Env") or ())
        return Image(str(found["Id"]), [str(part) for part in command], env)
    except (ValueError, KeyError, IndexError, TypeError, AttributeError):
        raise _ImageError(f"podman image inspect {spec.source!r} gave no image") from None


class _ImageError(Exception):
    """The image cannot be run (a broken archive, a vanished local image): the detector's failure."""


def load_image(spec: ImageSpec) -> Image:
    """The image of an archive or ``podman:`` spec, ready for ``podman run``; ``_ImageError`` if not."""
    image = _archive_image(spec) if spec.kind == "archive" else _local_image(spec)
    if not image.command:
        raise _ImageError("the image has neither an ENTRYPOINT nor a CMD to run")
    return image


def save_local(ref: str, target: Path, max_bytes: int) -> None:
    """Export ``podman:REF`` from the host's storage to a docker-archive (how a local image is submitted),
    refused before exporting when the image is larger than ``max_bytes``."""
    if reason := podman_missing():
        raise UserError(f"podman:{ref}: {reason}")
    done = _call(["podman", "image", "inspect", "--format", "{{.Size}}", ref])
    if done.returncode != 0:
        raise UserError(f"podman:{ref}: no such image in podman's storage ({_error_line(done)})")
    if done.stdout.strip().isdigit() and int(done.stdout) > max_bytes:
        raise UserError(f"podman:{ref}: the image holds {int(done.stdout)} bytes; the limit is {max_bytes}")
    done = _call(
        ["podman", "image", "save", "--quiet", "--format", DOCKER_ARCHIVE, "--output", str(target), ref]
    )
    if done.returncode != 0:
        raise UserError(f"podman:{ref}: cannot export it ({_error_line(done)})")


# --- what runs inside ---------------------------------------------------------------------------------------


def container_arguments(argv: list[str]) -> list[str]:
    """The arguments for the image's entrypoint: a folder detector's argv without its interpreter and
    ``{input}/detector/entrypoint.py``, with ``{input}/detector/X`` as ``/X`` (the image's own files)."""
    if _ENTRYPOINT_ARG in argv:
        argv = argv[argv.index(_ENTRYPOINT_ARG) + 1 :]
    return ["/" + arg.removeprefix(_DETECTOR_ARG) if arg.startswith(_DETECTOR_ARG) else arg for arg in argv]


def _container_environment(task: Task, gpus: Passthrough | None = None) -> dict[str, str]:
    """The detector's variables, built from scratch as for a folder detector, less ``PATH``: the image's
    own (and its ``PYTHONPATH`` and the like) stay, since the image was built around them."""
    env = environment(task, INSIDE_FOLDERS, gpus)
    del env["PATH"]
    return env


def library_path(image_env: tuple[str, ...], folder: str) -> str:
    """The image's ``LD_LIBRARY_PATH`` with ``folder`` (where a GPU task's driver libraries are bound) last,
    as apptainer's ``--nv`` appends its folder: what the image put first still wins."""
    own = next((item.split("=", 1)[1] for item in image_env if item.startswith("LD_LIBRARY_PATH=")), "")
    parts = [part for part in own.split(":") if part]
    return ":".join(parts if folder in parts else [*parts, folder])


def podman_gpu_flags(gpus: Passthrough | None, image_env: tuple[str, ...]) -> list[str]:
    """A GPU task's NVIDIA nodes (``--device``: the control nodes and the GPUs it holds, nothing else of
    /dev) and the driver's libraries, read-only in ``OCI_GPU_LIBS`` on the image's ``LD_LIBRARY_PATH``
    (nvidia-docker's folder, already on it in CUDA and PyTorch images); nothing for a CPU task."""
    if gpus is None:
        return []
    argv = []
    for source, name in gpus.nodes:
        argv += ["--device", f"{source}:/dev/{name}"]
    for name, source in gpus.libraries:
        argv += ["--mount", f"type=bind,src={_mount_source(source)},dst={OCI_GPU_LIBS}/{name},ro=true"]
    if gpus.libraries:
        argv += ["--env", f"LD_LIBRARY_PATH={library_path(image_env, OCI_GPU_LIBS)}"]
    return argv


def _mount_source(path: Path) -> str:
    """A host path for ``--mount``/``--bind``, whose options are comma- (and colon-) separated."""
    text = str(Path(path).resolve())
    if "," in text or ":" in text:
        raise UserError(f"{text}: a container cannot mount a path holding ',' or ':'; move or rename it")
    return text


def _binds(task: Task, space: _Space | None = None) -> list[tuple[str, str]]:
    """(host source, container path) of every read-only input: the run's input folder (``space``) and the
    ``readonly`` paths."""
    binds = [(_mount_source(space.input), str(INSIDE_FOLDERS.input))] if space is not None else []
    binds += [
        (_mount_source(path), str(Path(path).resolve())) for path in task.readonly if Path(path).exists()
    ]
    return binds


def _image_stage(task: Task) -> dict[str, Path]:
    """The stage entries a container gets: all but the folder detector's own files (the image has its own)."""
    return {name: path for name, path in task.stage.items() if name != DETECTOR_STAGE}


# --- the task's own folders ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Space:
    """Host folders bound into the container, below the run's ``root``; ``bounded``: all but ``input``
    sit on the task's own tmpfs (``root/private``)."""

    root: Path
    bounded: bool

    @property
    def input(self) -> Path:
        return self.root / "input"

    def private(self, name: str) -> Path:
        """``scratch``, ``output``, ``tmp`` or ``shm`` on the task's tmpfs."""
        return self.root / _PRIVATE / name


def _unescape(field: str) -> str:
    """A mountinfo path (spaces and the like are octal escapes)."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def _sweep_mounts(base: Path) -> None:
    """Unmount task tmpfs left by a harness that was killed (its workspace folder is then swept)."""
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return
    for line in lines:
        point = Path(_unescape(line.split()[4]))
        if point.name != _PRIVATE or point.parent.parent != base:
            continue
        try:
            stale = owner_is_dead((point.parent / OWNER_FILE).read_text())
        except OSError:
            stale = True
        if stale:
            subprocess.run(["umount", "--lazy", str(point)], capture_output=True, check=False)


def _mount_tmpfs(folder: Path, size: int) -> bool:
    """A private tmpfs of ``size`` bytes on ``folder``; False where this process may not mount."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        return False
    options = f"size={size},mode=0700,nosuid,nodev"
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "assay-task", str(folder)], capture_output=True, check=False
    )
    return done.returncode == 0


@contextlib.contextmanager
def _task_space(task: Task, workdir: Path | None) -> Iterator[_Space]:
    """The task's scratch and output on a tmpfs of its own, unmounted (and so emptied) afterwards."""
    base = (workdir or default_base()).resolve()
    base.mkdir(parents=True, exist_ok=True)
    _sweep_mounts(base)
    with workspace(workdir) as space:
        private = space.root / _PRIVATE
        private.mkdir()
        bounded = _mount_tmpfs(private, task.limits.scratch_bytes)
        try:
            for name in _FOLDERS:
                (private / name).mkdir()  # the container runs as the harness's user, their owner
            stage_in(space, _image_stage(task), task.shared_stage)
            yield _Space(space.root, bounded)
        finally:
            if bounded:
                subprocess.run(["umount", "--lazy", str(private)], capture_output=True, check=False)


# --- command lines ------------------------------------------------------------------------------------------


def _hard_limit(kind: int, wanted: int) -> int:
    """``wanted``, lowered to the harness's own hard limit (a container may not raise it: runc fails)."""
    hard = resource.getrlimit(kind)[1]
    return wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)


def ulimit_flags() -> list[str]:
    """``--ulimit`` flags for open files and processes within this host's hard limits: every container
    podman starts here needs them (detector runs, and image builds' ``RUN`` steps)."""
    nofile = _hard_limit(resource.RLIMIT_NOFILE, _MAX_NOFILE)
    nproc = _hard_limit(resource.RLIMIT_NPROC, _MAX_NPROC)
    return ["--ulimit", f"nofile={nofile}:{nofile}", "--ulimit", f"nproc={nproc}:{nproc}"]


def podman_command(
    spec: ImageSpec, task: Task, image: Image, space: _Space, name: str, wall: float
) -> list[str]:
    """``podman run`` for one task: the flags that give it a folder detector's view and limits."""
    limits, inside = task.limits, INSIDE_FOLDERS
    argv = [*_podman(spec), "run", "--rm", "--name", name, "--pull", "never", "--systemd", "false"]
    if not limits.network:  # no interface but loopback, and no copy of the host's /etc/hosts
        argv += ["--network", "none", "--no-hosts"]
    argv += ["--hostname", "sandbox", "--ipc", "private", "--read-only", "--read-only-tmpfs=false"]
    argv += ["--cap-drop", "all", "--security-opt", "no-new-privileges"]
    profile = podman_profile()  # sysinfo refused, as in a bwrap sandbox (``seccomp``)
    argv += ["--security-opt", f"seccomp={profile}"] if profile is not None else []
    argv += ["--user", f"{os.getuid()}:{os.getgid()}"]
    argv += ["--pids-limit", str(limits.max_processes), "--ulimit", "core=0:0", *ulimit_flags()]
    if limits.memory_bytes is not None:
        argv += ["--memory", str(limits.memory_bytes), "--memory-swap", str(limits.memory_bytes)]
    argv += ["--log-driver", "passthrough", "--timeout", str(math.ceil(wall) + _BACKSTOP_S)]
    for label, value in sorted(task.labels.items()):  # its job and worker: who removes it (remove_labelled)
        argv += ["--label", f"{label}={value}"]
    argv += podman_flags(limits.memory_bytes)  # no host-wide /proc counter: no channel between runs
    size = limits.scratch_bytes
    if space.bounded:  # one tmpfs of ``size`` holds them all
        for source, target in (("scratch", inside.scratch), ("tmp", "/tmp"), ("shm", "/dev/shm")):
            argv += ["--mount", f"type=bind,src={space.private(source)},dst={target}"]
    else:  # no tmpfs of our own: the engine's, bounded each; only the output folder is not
        argv += ["--tmpfs", f"/tmp:rw,size={size},mode=1777", "--shm-size", str(size)]
        argv += ["--tmpfs", f"{inside.scratch}:rw,exec,size={size},mode=1777"]
    argv += ["--mount", f"type=bind,src={space.private('output')},dst={inside.output}"]
    for source, target in _binds(task, space):
        argv += ["--mount", f"type=bind,src={source},dst={target},ro=true"]
    gpus = gpu_passthrough(task)
    argv += podman_gpu_flags(gpus, image.env)
    for variable, value in _container_environment(task, gpus).items():
        argv += ["--env", f"{variable}={value}"]
    argv += ["--entrypoint", json.dumps(image.command), image.ref]
    return [*argv, *(fill(arg, inside) for arg in container_arguments(task.argv))]


def _describe(spec: ImageSpec, image_ref: str, task: Task, space: _Space) -> str:
    """The one line the job log keeps about how the container ran."""
    limits = task.limits
    shown = "sha256:" + image_ref.removeprefix("sha256:")[:12]
    parts = [f"podman ({RUNTIME}): image {shown}", "read-only root with staged inputs only"]
    parts.append("network allowed" if limits.network else "no network")
    parts.append(f"{limits.scratch_bytes / 2**20:.0f} MiB private scratch")
    parts.append("host-wide /proc counters hidden")
    parts.append("sysinfo refused (seccomp)" if podman_profile() is not None else "sysinfo NOT refused")
    parts.append(gpu_line(gpu_passthrough(task)))
    if not space.bounded:
        parts.append("output folder not size-bounded (no tmpfs could be mounted)")
    parts += ["no capabilities", f"the harness's user ({os.getuid()})"]
    parts.append(f"at most {limits.max_processes} processes")
    if limits.memory_bytes is not None:
        parts.append(f"memory cgroup of {limits.memory_bytes / 2**20:.0f} MiB")
    return ", ".join(parts)


# --- running ------------------------------------------------------------------------------------------------


def _remove(spec: ImageSpec, name: str) -> None:
    """Kill and remove the container if it is still there (the harness stopped waiting, or was interrupted):
    killing the podman client leaves the container running under conmon."""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        _call([*_podman(spec), "rm", "--force", "--ignore", "--time", "0", name], timeout=60)


def owner_labels(job: int, worker: str) -> dict[str, str]:
    """The labels of a job's containers (``Task.labels``): which job, and which worker (``host:pid``) ran
    them, so the worker removes its own when stopped and the next one a dead one's before it reruns the
    job."""
    return {JOB_LABEL: str(job), WORKER_LABEL: worker}


def _storages() -> list[list[str]]:
    """The podman command prefixes of every storage a detector's container may live in: the private one
    for submitted archives (where it exists) and the host's own (``podman:`` images)."""
    private = _podman(ImageSpec("archive", ""))
    found = [["podman", "--runtime", RUNTIME]]
    return [private, *found] if (storage_root() / "storage").is_dir() else found


def remove_labelled(labels: dict[str, str], spare_worker: str | None = None) -> int:
    """Kill and remove every container on this host carrying all of ``labels`` (``Task.labels``: the job
    and worker it runs for), in every storage, but those of ``spare_worker``; how many went. A stopped
    worker's leftovers, or a dead one's before its job runs again: podman finds them by label, so nothing
    of ours tracks processes, and each still has podman's own ``--timeout`` as a backstop where nobody
    comes (a lost node)."""
    if podman_missing() is not None or not labels:
        return 0
    filters = [f"--filter=label={label}={value}" for label, value in sorted(labels.items())]
    owner = f'{{{{.ID}}}} {{{{index .Labels "{WORKER_LABEL}"}}}}'
    removed = 0
    for prefix in _storages():
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            listed = _call([*prefix, "ps", "--all", "--no-trunc", *filters, "--format", owner], timeout=60)
            rows = [line.split() for line in listed.stdout.splitlines() if line.strip()]
            found = [row[0] for row in rows if spare_worker is None or row[1:] != [spare_worker]]
            if found:
                _call([*prefix, "rm", "--force", "--ignore", "--time", "0", *found], timeout=60)
                removed += len(found)
    return removed


_SWEPT: set[tuple[str, str]] = set()  # (job, worker) pairs this process has swept for (``remove_other_runs``)


def remove_other_runs(labels: dict[str, str]) -> int:
    """Kill and remove this host's containers of the same job started for another worker; how many went.

    A job has one holder at a time, so such a container is a dead holder's: a worker killed outright, or a
    lost driver whose Ray tasks ran on. The reclaiming worker's harness clears its own host
    (``remove_labelled``); this clears each node a task of the job reaches, before the task starts there,
    so one job never runs twice at once on any host, not only until podman's ``--timeout``. Once per job,
    worker and process: the sweep costs a ``podman ps``.
    """
    job, worker = labels.get(JOB_LABEL), labels.get(WORKER_LABEL)
    if not job or not worker or (job, worker) in _SWEPT:
        return 0
    _SWEPT.add((job, worker))
    return remove_labelled({JOB_LABEL: job}, spare_worker=worker)


def _result(
    task: Task, finished: Finished, outputs: dict, described: str, worker: str, wall: float
) -> TaskResult:
    """``task_result`` with the container's peak: a cgroup kill happens at the limit, and the container's own
    peak is gone with its cgroup."""
    peak = (task.limits.memory_bytes or 0) if memory_killed(task.limits, finished) else 0
    return task_result(task, finished, outputs, described, worker, wall, peak)


def _unstarted(task: Task, why: str, worker: str, described: str) -> TaskResult:
    """The record of a task whose image could not be made ready: the detector's failure, not the caller's."""
    finished = Finished(None, False, 0.0, b"", b"", start_error=f"cannot start the container: {why}")
    return _result(task, finished, dict.fromkeys(task.outputs), described, worker, task.limits.wall_seconds)


def run_container(task: Task, workdir: Path | None = None) -> TaskResult:
    """Run ``task`` in its container image and record what happened (``run_task`` hands image tasks here).

    Raises only for the caller's mistakes and this machine's faults: a malformed spec, a missing stage
    source, no engine (or no unsquashfs and bubblewrap) for the image. Whatever the image does, a broken
    archive or SIF file included, ends up in the ``TaskResult``.
    """
    assert task.image is not None
    spec = parse_image(task.image)
    if spec.kind == "sif":
        return _run_sif(task, Path(spec.source), workdir)
    if reason := podman_missing():
        raise UserError(f"this job runs an OCI image and {reason}")  # no task key: it names the model
    check_sources(_image_stage(task))
    _binds(task)  # refuse unmountable paths before anything starts
    remove_other_runs(task.labels)  # a dead holder's containers of this job, on this host
    worker = f"{socket.gethostname()}:{os.getpid()}"
    wall = time_left(task)
    if wall <= 0:
        return not_started(task, worker)
    try:
        image = load_image(spec)
    except (_ImageError, UserError) as exc:
        return _unstarted(task, str(exc), worker, f"podman ({RUNTIME}): image not loaded")
    if task.deadline is not None:  # loading a large archive takes time off the job, not off the model
        wall = min(wall, time_left(task))
        if wall <= 0:
            return not_started(task, worker)
    name = f"assay-{uuid.uuid4().hex}"  # nothing of the task's key, which names the model
    with _task_space(task, workdir) as space:
        argv = podman_command(spec, task, image, space, name, wall)
        described = _describe(spec, image.ref, task, space)
        finished = None
        try:
            # on timeout the container goes before the pipes it holds are drained
            finished = run_limited(
                argv, _client_env(), "/", wall, None, on_timeout=lambda: _remove(spec, name)
            )
        finally:
            # ``--rm`` removed a container that ended by itself, and ``on_timeout`` one out of time; an
            # interrupted harness, or a podman client killed by a stopping worker (a negative exit code:
            # a signal), leaves it running under conmon
            if finished is None or finished.exit_code is None or finished.exit_code < 0:
                _remove(spec, name)
        outputs = {output: read_regular(space.root, _PRIVATE, "output", output) for output in task.outputs}
    return _result(task, finished, outputs, described, worker, wall)


# --- .sif images: no engine, the image's root under bubblewrap ---------------------------------------------

SIF_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"  # apptainer's PATH before env/*.sh
_SHELL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def sif_environment(task: Task, name: str, gpus: Passthrough | None = None) -> dict[str, str]:
    """The variables a ``.sif`` detector starts with: a folder detector's, built from scratch, with
    apptainer's default ``PATH`` and the container variables runscripts look at (the image's file name,
    never a host path)."""
    env = _container_environment(task, gpus)
    env["PATH"] = SIF_PATH
    for prefix in ("APPTAINER", "SINGULARITY"):
        env[f"{prefix}_CONTAINER"] = env[f"{prefix}_NAME"] = name
    return env


def sif_script(env: dict[str, str], gpu_libraries: bool = False) -> str:
    """What ``/bin/sh -c`` runs in the image, as ``singularity run`` does: every ``/.singularity.d/env/*.sh``
    sourced in name order, then the runscript with the arguments. The harness's own variables (``HOME``
    and ``TMPDIR`` on scratch, thread counts, hidden GPUs) are set again after the scripts, as apptainer's
    ``--env`` wins over an image's ``%environment``; ``PATH`` and the rest stay the image's. With
    ``gpu_libraries``, ``/.singularity.d/libs`` is appended to the image's ``LD_LIBRARY_PATH``, as ``--nv``
    does."""
    lines = [f'for script in {ENV_FOLDER}/*.sh; do if [ -f "$script" ]; then . "$script"; fi; done']
    lines += [
        f"export {variable}={shlex.quote(value)}"
        for variable, value in env.items()
        if variable != "PATH" and _SHELL_NAME.fullmatch(variable)
    ]
    if gpu_libraries:
        lines.append(f'export LD_LIBRARY_PATH="${{LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}}{GPU_LIBS}"')
    lines.append(f'exec {RUNSCRIPT} "$@"')
    return "\n".join(lines) + "\n"


def _check_readonly(task: Task, root: Path) -> None:
    """A ``.sif`` run's read-only root has no room for new mount points: an extra host path (``readonly``)
    is shown only where the image has a folder or file of that name."""
    for path in task.readonly:
        place = root / Path(path).resolve().relative_to("/")
        if place.is_symlink() or not place.exists():
            raise UserError(
                f"{path}: a .sif image run shows host paths only where the image has a place for them"
            )


def _describe_sif(image: SifImage, partition: Partition, mounts: Mounts, space: _Space) -> str:
    """The one line the job log keeps about how a ``.sif`` ran: the image, its signatures as read (never
    verified), and the sandbox."""
    signatures = "; ".join(s.describe() for s in image.signatures())
    parts = [
        f"sif, no engine (unsquashfs, bubblewrap): image sha256:{file_digest(image.path)[:12]}",
        f"{partition.fs_name} {partition.arch} primary partition",
        f"{signatures}, not verified" if signatures else "unsigned",
        describe("bwrap", mounts),
    ]
    if not space.bounded:
        parts.append("output folder not size-bounded (no tmpfs could be mounted)")
    return "; ".join(parts)


def _run_sif(task: Task, source: Path, workdir: Path | None) -> TaskResult:
    """Run ``task`` from the ``.sif`` at ``source``: its primary partition unpacked once into the node's
    cache, that root bubblewrap's read-only ``/``, the runscript the detector, read back like a folder's."""
    if reason := sif_missing():
        raise UserError(f"this job runs a .sif image and {reason}")
    check_sources(_image_stage(task))
    worker = f"{socket.gethostname()}:{os.getpid()}"
    limits = task.limits
    wall = time_left(task)
    if wall <= 0:
        return not_started(task, worker)
    with contextlib.ExitStack() as stack:
        try:
            image = read_sif(source)
            partition = system_partition(image)
            check_arch(image, partition)
            root = stack.enter_context(held_root(source, partition.offset, prepare_image_root, source.name))
        except UserError as exc:
            why = str(exc).replace(f"{source}: ", "")
            return _unstarted(task, why, worker, "sif: image not unpacked")
        _check_readonly(task, root)
        gpus = gpu_passthrough(task)
        wall = min(wall, time_left(task))  # unpacking takes time off the job, not off the model
        if wall <= 0:
            return not_started(task, worker)
        space = stack.enter_context(_task_space(task, workdir))
        group = stack.enter_context(task_cgroup(limits.max_processes))
        mounts = Mounts(
            readonly=list(task.readonly),
            input=space.input,
            private_bytes=limits.scratch_bytes,
            memory_bytes=limits.memory_bytes,
            network=limits.network,
            gpus=gpus,
            image_root=root,
            output=space.private("output"),
        )
        env = sif_environment(task, source.name, gpus)
        inside = [fill(arg, INSIDE_FOLDERS) for arg in container_arguments(task.argv)]
        script = sif_script(env, gpu_libraries=gpus is not None and bool(gpus.libraries))
        argv = [*bwrap_argv(mounts), "/bin/sh", "-c", script, "runscript", *inside]
        join = joiner(group) if group else None
        finished = run_limited(argv, env, "/", wall, limits.memory_bytes, limits.gpus > 0, join=join)
        outputs = {output: read_regular(space.root, _PRIVATE, "output", output) for output in task.outputs}
        described = _describe_sif(image, partition, mounts, space)
    if group is None:
        described += "; process count not bounded (no pids cgroup)"
    else:
        described += f"; at most {limits.max_processes} processes"
    return task_result(task, finished, outputs, described, worker, wall)
