"""The platform's and the worker's images, built the way docs/deploy.md says, and the pod's other images,
on this machine with no registry, for the deploy tests.

The images are built by running docs/deploy.md's own build commands (the ``bash`` blocks that end in
``podman build``), unchanged, in the project folder, so the documented build is the tested one (issue 36:
followed literally, the old one pulled torch into a 2.21 GB platform image that held assay three times).
``podman build`` is wrapped to add what this machine needs and the docs mention: ``--build-arg BASE=`` a
base made here, ``--runtime runc`` (cgroups v1) and ulimits within the host's, no network (everything
comes from the wheels). pip reads this machine's package index; ``PIP_RETRIES=0`` makes the unreachable
PyTorch index cost a second, not minutes. podman's layer cache keeps reruns short: the dependency layers
are rebuilt only when the downloaded wheels change.

No registry is reachable here, so the images the Containerfile and the pod start FROM are made from this
host's own files, as ``container_image.py`` makes the detector image:

- ``assay-test-base``: the Python running the tests (3.11.4 or newer: pyenv's here, not Debian's 3.11.2)
  laid out as ``python:3.11-slim`` has it, under ``/usr/local``, with its standard library (not its tests or
  site-packages), the shared libraries ``ldd`` names for it and for every extension module of what goes
  in, ``/etc/passwd``, ``/bin/sh`` and ``/pause`` (the pod's infra container).
- ``assay-test-postgres``: Debian's PostgreSQL server binaries, libraries and share files, ``/bin/sh``
  (dash) and an entrypoint that honours the official image's ``POSTGRES_USER``/``PASSWORD``/``DB``/``PGDATA``.
- ``assay-test-pause``: the base with ``/pause`` as entrypoint, named as the pod's infra image (podman would
  otherwise pull ``k8s.gcr.io/pause`` or build one from catatonit, which is not installed).

The worker image needs bubblewrap, which its build installs with apt-get when the image has none; with no
Debian mirror here, the test lays this host's ``bwrap`` and its libraries into ``build/worker-root`` first
(the folder the docs create empty), so that step finds it.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata as md
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from container_image import _add_bytes, _add_file, _libraries

PROJECT = Path(__file__).resolve().parents[1]
DOCS = PROJECT / "docs" / "deploy.md"
VENV_BIN = Path(sys.executable).parent
PLATFORM_TAG, WORKER_TAG = "localhost/assay:0.1.0", "localhost/assay-worker:0.1.0"  # the docs' tags
WORKER_EXTRAS = ("models", "ray", "trojai")  # what the worker image adds (docs/deploy.md)
# Building the images takes minutes on 2 cores (more than make test's whole budget allows): `make test-deploy`
# runs the image tests, with ASSAY_DEPLOY_TESTS=1.
DEPLOY_TESTS = [
    pytest.mark.slow,
    pytest.mark.skipif(
        os.environ.get("ASSAY_DEPLOY_TESTS") != "1", reason="image and pod test: run `make test-deploy`"
    ),
]
ZOO = {  # a round in seconds: 4 digits MLPs, half trojaned
    "models": 4,
    "seed": 5,
    "architectures": ["mlp"],
    "widths": [8],
    "epochs": 6,
    "trigger_kinds": ["solid_patch"],
    "source_specific_share": 0.0,
    "poison_fraction": [0.3, 0.3],
    "clean_accuracy_floor": 0.6,
    "asr_floor": 0.6,
    "max_attempts": 6,
}
FLOOR = (3, 11, 4)  # assay.pyfloor.FLOOR: the base's Python must be at least this
SHELL = Path("/bin/sh")
# what python:3.11-slim carries and manylinux wheels may link without shipping
RUNTIME_LIBRARIES = (
    Path("/usr/lib/x86_64-linux-gnu/libstdc++.so.6"),
    Path("/lib/x86_64-linux-gnu/libgcc_s.so.1"),
)
BWRAP = Path("/usr/bin/bwrap")
UNSQUASHFS = Path("/usr/bin/unsquashfs")  # SIF submissions (runner/squashfs.py)
STDLIB_SKIP = {
    "test",
    "idlelib",
    "tkinter",
    "turtledemo",
    "ensurepip",
    "lib2to3",
    "pydoc_data",
    "__pycache__",
    "site-packages",
}
PG_VERSION_GLOB = "/usr/lib/postgresql/*/bin/postgres"
CONTAINERS_CONF = """[containers]
default_ulimits = ["nofile={nofile}:{nofile}", "nproc={nproc}:{nproc}"]
[engine]
runtime = "runc"
infra_image = "{infra}"
"""
PAUSE = b"""#!/usr/local/bin/python3
import signal, sys
signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
signal.signal(signal.SIGINT, lambda *a: sys.exit(0))
while True:
    signal.pause()
"""
PG_ENTRYPOINT = b"""#!/bin/sh
# What the official postgres image's entrypoint does, for what the pod uses of it.
set -e
: "${PGDATA:=/var/lib/postgresql/data}"
if [ ! -s "$PGDATA/PG_VERSION" ]; then
    printf '%s\\n' "$POSTGRES_PASSWORD" > /tmp/pwfile
    initdb -D "$PGDATA" -U "${POSTGRES_USER:-postgres}" --pwfile=/tmp/pwfile -A scram-sha-256 \\
        --no-locale -E UTF8 --no-sync > /dev/null
    : > /tmp/pwfile
    echo "CREATE DATABASE \\"${POSTGRES_DB:-${POSTGRES_USER:-postgres}}\\";" \\
        | postgres --single -D "$PGDATA" -c fsync=off postgres > /dev/null
fi
exec postgres -D "$PGDATA" -c listen_addresses='*' "$@"
"""
# Runs a documented block unchanged: `podman build` gains this machine's options, everything else is as typed
WRAPPER = """set -euo pipefail
podman() {{
    if [ "$1" = build ]; then shift; command podman build {options} "$@"; else command podman "$@"; fi
}}
"""


@dataclass(frozen=True)
class Images:
    base: str
    pause: str
    postgres: str
    assay: str
    worker: str
    containers_conf: Path  # CONTAINERS_CONF for `podman kube play`: runc, ulimits, the local infra image


@dataclass(frozen=True)
class Build:
    """What one documented build did: the commands, the wheels it downloaded, how long it took."""

    commands: str
    wheels: int
    wheel_bytes: int
    seconds: float


def podman(*argv: str, timeout: float = 600) -> str:
    done = subprocess.run(["podman", *argv], capture_output=True, text=True, timeout=timeout, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"podman {' '.join(argv[:3])}...: {done.stderr.strip()[-3000:]}")
    return done.stdout.strip()


def limits() -> list[str]:
    """``--ulimit`` options within this host's hard limits (runc refuses to raise them)."""
    import resource

    nofile = min(resource.getrlimit(resource.RLIMIT_NOFILE)[1], 65536)
    nproc = min(resource.getrlimit(resource.RLIMIT_NPROC)[1], 32768)
    return [f"--ulimit=nofile={nofile}:{nofile}", f"--ulimit=nproc={nproc}:{nproc}"]


def documented(marker: str) -> str:
    """The ``bash`` block of docs/deploy.md that holds ``marker`` (a line of it), as written there."""
    blocks = re.findall(r"```bash\n(.*?)```", DOCS.read_text(), flags=re.S)
    found = [block for block in blocks if marker in block]
    assert len(found) == 1, f"docs/deploy.md: {len(found)} bash blocks hold {marker!r}"
    return found[0]


def run_documented(marker: str, base: str, log: Path) -> Build:
    """Run the documented block holding ``marker`` in the project folder, ``podman build`` on ``base``."""
    commands = documented(marker)
    options = [
        *("--runtime", "runc", *limits(), "--network", "none", "--pull=never"),
        *("--build-arg", f"BASE={base}"),
    ]
    script = WRAPPER.format(options=" ".join(options)) + commands
    env = {**os.environ, "PATH": f"{VENV_BIN}:{os.environ['PATH']}", "PIP_RETRIES": "0"}
    started = time.monotonic()
    with log.open("w") as out:
        done = subprocess.run(
            ["bash", "-c", script], cwd=PROJECT, env=env, stdout=out, stderr=subprocess.STDOUT, timeout=2400
        )
    assert done.returncode == 0, f"documented build failed (log {log}):\n{log.read_text()[-4000:]}"
    folder = PROJECT / "build" / ("worker-wheels" if "--target worker" in commands else "wheels")
    wheels = list(folder.glob("*.whl"))
    return Build(commands, len(wheels), sum(w.stat().st_size for w in wheels), time.monotonic() - started)


def _dir(archive: tarfile.TarFile, name: str, mode: int = 0o755, uid: int = 0) -> None:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.uid, info.gid = tarfile.DIRTYPE, mode, uid, uid
    archive.addfile(info)


def _tree(archive: tarfile.TarFile, root: Path, seen: set[str], skip: set[str] = frozenset()) -> list[Path]:
    """Add a host folder at its own path; returns its shared objects (for ldd)."""
    objects = []
    for parent, folders, names in os.walk(root):
        folders[:] = sorted(f for f in folders if f not in skip)
        for name in sorted(names):
            path = Path(parent) / name
            if name.endswith(".pyc") or name in skip:
                continue
            _add_file(archive, path, seen)
            if ".so" in name:
                objects.append(path)
    return objects


def _add_as(archive: tarfile.TarFile, path: Path, name: str, seen: set[str]) -> None:
    """Add a host file (links followed) as ``name``, parents first; ``seen`` holds absolute paths, as
    ``_add_file``'s does, so the two never add one path twice."""
    target = Path("/" + name)
    for parent in reversed(target.parents[:-1]):
        if str(parent) not in seen:
            seen.add(str(parent))
            _dir(archive, str(parent).lstrip("/"))
    if str(target) not in seen:
        seen.add(str(target))
        archive.add(str(path.resolve()), arcname=name, recursive=False)


def _relocated_stdlib(archive: tarfile.TarFile, stdlib: Path, seen: set[str]) -> list[Path]:
    """The standard library at ``usr/local/lib/pythonX.Y``; returns its extension modules (for ldd)."""
    objects = []
    for parent, folders, names in os.walk(stdlib):
        folders[:] = sorted(f for f in folders if f not in STDLIB_SKIP and not f.startswith("config-"))
        for name in sorted(n for n in names if not n.endswith(".pyc")):
            path = Path(parent) / name
            _add_as(archive, path, f"usr/local/lib/{stdlib.name}/{path.relative_to(stdlib)}", seen)
            objects += [path] if ".so" in name else []
    return objects


def _etc(archive: tarfile.TarFile, users: str) -> None:
    _add_bytes(archive, "etc/passwd", f"root:x:0:0:root:/root:/bin/sh\n{users}".encode())
    _add_bytes(archive, "etc/group", b"root:x:0:\n")
    _dir(archive, "tmp", 0o1777)


def _image(rootfs: Path, name: str, changes: list[str]) -> str:
    """``podman import`` the root file system under a tag from its hash, unless that tag exists."""
    digest = hashlib.sha256(rootfs.read_bytes() + repr(changes).encode()).hexdigest()[:12]
    tag = f"localhost/{name}:{digest}"
    if subprocess.run(["podman", "image", "exists", tag], check=False).returncode != 0:
        podman("import", "--quiet", *(f"--change={c}" for c in changes), str(rootfs), tag)
    return tag


def base_image(folder: Path, extensions: list[Path]) -> str:
    """This Python as ``python:3.11-slim`` lays it out (``/usr/local``), with every library the interpreter
    and ``extensions`` link. libpython goes where the loader looks without a cache (its RUNPATH names the
    host's pyenv folder, which the image has not)."""
    prefix = Path(sys.base_prefix)
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    interpreter = (prefix / "bin" / version).resolve()
    seen: set[str] = set()
    with tarfile.open(folder / "base.tar", "w") as archive:
        _etc(archive, "")
        objects = _relocated_stdlib(archive, prefix / "lib" / version, seen)
        _add_as(archive, interpreter, f"usr/local/bin/{version}", seen)
        for link in ("python3", "python"):
            info = tarfile.TarInfo(f"usr/local/bin/{link}")
            info.type, info.linkname = tarfile.SYMTYPE, version
            archive.addfile(info)
        libraries = _libraries([interpreter, *objects, *extensions]) | _libraries([SHELL.resolve()])
        extra = {
            Path("/usr/lib/x86_64-linux-gnu/libstdc++.so.6"),
            Path("/lib/x86_64-linux-gnu/libgcc_s.so.1"),
        }
        for library in sorted(libraries | {e for e in extra if e.exists()}):
            if library.is_relative_to(prefix):  # libpython
                _add_as(archive, library, f"usr/lib/x86_64-linux-gnu/{library.name}", seen)
            elif "/site-packages/" not in str(library) and "/.venv/" not in str(library):
                _add_file(archive, library, seen)
        _add_file(archive, SHELL, seen)
        _add_bytes(archive, "pause", PAUSE, 0o755)
    changes = ["ENV PATH=/usr/local/bin:/usr/bin:/bin", 'CMD ["python3"]']
    return _image(folder / "base.tar", "assay-test-base", changes)


def pause_image(base: str) -> str:
    tag = base.replace("assay-test-base", "assay-test-pause")
    if subprocess.run(["podman", "image", "exists", tag], check=False).returncode != 0:
        container = podman("create", base)
        try:
            podman("commit", "--quiet", "--change", 'ENTRYPOINT ["/pause"]', container, tag)
        finally:
            podman("rm", container)
    return tag


def postgres_image(folder: Path) -> str:
    """Debian's PostgreSQL server as an image (uid 999), initialised on first start like the official one."""
    server = Path(sorted(Path("/").glob(PG_VERSION_GLOB.lstrip("/")))[-1])
    version_dir = server.parents[1]  # /usr/lib/postgresql/15
    share = Path("/usr/share/postgresql") / version_dir.name
    seen: set[str] = set()
    with tarfile.open(folder / "postgres.tar", "w") as archive:
        _etc(archive, "postgres:x:999:999:postgres:/var/lib/postgresql:/bin/sh\n")
        binaries = [version_dir / "bin" / name for name in ("postgres", "initdb")]
        for binary in binaries:
            _add_file(archive, binary, seen)
        objects = _tree(archive, version_dir / "lib", seen, {"bitcode", "llvmjit.so", "llvmjit_types.bc"})
        _tree(archive, share, seen, {"man"})
        for path in (Path("/bin/sh"), Path("/usr/share/zoneinfo/UTC"), Path("/usr/share/zoneinfo/Etc/UTC")):
            _add_file(archive, path, seen)
        for library in sorted(_libraries([*binaries, *objects, Path("/bin/sh").resolve()])):
            _add_file(archive, library, seen)
        for name in ("var", "var/lib", "var/run"):
            _dir(archive, name)
        for name in ("var/lib/postgresql", "var/lib/postgresql/data", "var/run/postgresql"):
            _dir(archive, name, 0o700 if name.endswith("data") else 0o755, uid=999)
        _add_bytes(archive, "usr/local/bin/docker-entrypoint.sh", PG_ENTRYPOINT, 0o755)
    changes = [
        f"ENV PATH=/usr/local/bin:{version_dir}/bin:/usr/bin:/bin",
        "ENV TZ=UTC",
        "ENV PGDATA=/var/lib/postgresql/data",
        "USER 999:999",
        'ENTRYPOINT ["/usr/local/bin/docker-entrypoint.sh"]',
    ]
    return _image(folder / "postgres.tar", "assay-test-postgres", changes)


def _requires(name: str, extras: tuple[str, ...] = ()) -> list[str]:
    """A distribution's requirements (markers evaluated here) without extras, or with ``extras``."""
    from packaging.requirements import Requirement

    found = []
    for line in md.distribution(name).requires or []:
        requirement = Requirement(line)
        marker = requirement.marker
        if marker is None or any(marker.evaluate({"extra": extra}) for extra in ("", *extras)):
            found.append(requirement.name)
    return found


def closure_of(roots: list[str]) -> dict[str, str]:
    """name -> installed version of ``roots`` and everything they require (installed here)."""
    todo, found = list(roots), {}
    while todo:
        name = re.sub(r"[-_.]+", "-", todo.pop()).lower()
        if name in found:
            continue
        try:
            found[name] = md.version(name)
        except md.PackageNotFoundError:
            continue
        todo.extend(_requires(name))
    return found


def extension_modules(names: list[str]) -> list[Path]:
    """The shared objects the installed distributions ship (their system libraries go in the base)."""
    found = []
    for name in names:
        dist = md.distribution(name)
        for file in dist.files or []:
            if ".so" in file.name:
                found.append(Path(str(dist.locate_file(file))))
    return found


def worker_root() -> list[Path]:
    """``build/worker-root``: bubblewrap, unsquashfs and the libraries they link, at their own paths (the
    offline stand-in for the worker stage's ``apt-get install bubblewrap squashfs-tools``)."""
    root = PROJECT / "build" / "worker-root"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    for path in sorted({BWRAP, UNSQUASHFS, *_libraries([BWRAP, UNSQUASHFS])}):
        target = root / str(path).lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, target)  # links followed: the loader finds the file under the linked name
    return sorted(p for p in root.rglob("*") if p.is_file())


@functools.cache
def _base(folder: Path) -> str:
    """One base for both images (so the worker build reuses the platform's layers): the libraries of the
    extension modules of assay's closure with the worker's extras, as installed here."""
    if sys.version_info < FLOOR:
        pytest.skip(f"the test base is this Python ({sys.version.split()[0]}), older than assay's floor")
    closure = closure_of(_requires("assay", WORKER_EXTRAS))
    return base_image(folder, extension_modules(list(closure)))


@functools.cache
def _documented_build(folder: Path, marker: str, log: str) -> Build:
    """A documented block run once per test session (both deploy test files need the platform's)."""
    if "--target worker" in marker:
        _documented_build(folder, f"podman build -t {PLATFORM_TAG} .", "build-platform.log")
        worker_root()
    return run_documented(marker, _base(folder), folder / log)


def build(folder: Path) -> tuple[Images, Build, Build]:
    """Both images by the documented commands, and the pod's other images; what each build did."""
    folder.mkdir(parents=True, exist_ok=True)
    platform = _documented_build(folder, f"podman build -t {PLATFORM_TAG} .", "build-platform.log")
    worker = _documented_build(folder, "--target worker", "build-worker.log")
    base = _base(folder)
    conf = folder / "containers.conf"
    nofile, nproc = (opt.split(":")[-1] for opt in limits())
    conf.write_text(CONTAINERS_CONF.format(nofile=nofile, nproc=nproc, infra=pause_image(base)))
    images = Images(base, pause_image(base), postgres_image(folder), PLATFORM_TAG, WORKER_TAG, conf)
    return images, platform, worker


def build_worker(folder: Path) -> tuple[str, Build]:
    """The worker image by the documented commands (after the platform's); its tag, what the build did."""
    folder.mkdir(parents=True, exist_ok=True)
    return WORKER_TAG, _documented_build(folder, "--target worker", "build-worker.log")


def tiny_round(folder: Path) -> Path:
    """A tiny real round (4 digits MLPs: 2 train, 1 test, 1 holdout), split; its ``splits`` folder."""
    import torch

    from assay.zoo.config import RoundConfig
    from assay.zoo.round import generate_round
    from assay.zoo.split import split_round

    torch.set_num_threads(1)
    generate_round(RoundConfig.model_validate(ZOO), folder / "round", workers=1)
    split_round(folder / "round", {"train": 0.5, "test": 0.25, "holdout": 0.25}, seed=3)
    return folder / "round" / "splits"


def image_bytes(tag: str) -> int:
    return int(podman("image", "inspect", "--format", "{{.Size}}", tag))


def top_layer(tag: str) -> tuple[str, int]:
    """The instruction that made the image's last non-empty layer, and that layer's size in bytes."""
    for layer in json.loads(podman("history", "--format", "json", tag)):
        if layer["size"] > 0:
            return layer["CreatedBy"], layer["size"]
    raise AssertionError(f"{tag}: no layer with content")
