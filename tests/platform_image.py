"""The platform's image and the documented pod, built on this machine with no registry, for the deploy test.

No registry is reachable here, so the two images the Containerfile and the pod start FROM are made from
this host's own files, as ``container_image.py`` makes the detector image:

- ``assay-test-base``: Debian's ``/usr/bin/python3`` with its whole standard library (not its tests), the
  shared libraries ``ldd`` names for it and for every extension module of the wheels going in, ``/etc/passwd``
  and ``/pause`` (the pod's infra container). It stands in for ``python:3.11-slim``.
- ``assay-test-postgres``: Debian's PostgreSQL server binaries, libraries and share files, ``/bin/sh``
  (dash) and an entrypoint that honours the official image's ``POSTGRES_USER``/``PASSWORD``/``DB``/``PGDATA``.
- ``assay-test-pause``: the base with ``/pause`` as entrypoint, named as the pod's infra image (podman would
  otherwise pull ``k8s.gcr.io/pause`` or build one from catatonit, which is not installed).

The wheels: assay's own (``pip wheel --no-deps``) and, to keep the image small, only the distributions the
web server and the worker import (``SERVER_DISTRIBUTIONS`` and what they require), at the versions installed
here, fetched by ``pip download`` from this machine's package index (offline: ``/opt/pypi``). Torch and the
rest of the model stack are left out (``PARTIAL=1``), so the pod serves and queues but runs no detector.

Every image is tagged by a hash of what went in and reused while that is unchanged, so only the first run
pays for the build.
"""

from __future__ import annotations

import hashlib
import importlib.metadata as md
import os
import re
import shutil
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from container_image import _add_bytes, _add_file, _libraries

PROJECT = Path(__file__).resolve().parents[1]
# Building the images takes minutes on 2 cores (more than make test's whole budget allows): `make test-deploy`
# runs the image tests, with ASSAY_DEPLOY_TESTS=1.
DEPLOY_TESTS = [
    pytest.mark.slow,
    pytest.mark.skipif(
        os.environ.get("ASSAY_DEPLOY_TESTS") != "1", reason="image and pod test: run `make test-deploy`"
    ),
]
SERVER_DISTRIBUTIONS = (
    *("fastapi", "uvicorn", "uvloop", "httptools", "sqlalchemy", "alembic", "jinja2", "argon2-cffi"),
    *("python-multipart", "pydantic-settings", "typer", "rich", "psycopg", "psycopg-binary", "pyyaml"),
    *("fastapi-offline", "prometheus-client", "numpy", "scipy", "pandas", "krippendorff", "httpx"),
)
WORKER_DISTRIBUTIONS = ("torch",)  # what the worker image adds: the baselines' model stack
PYTHON = Path("/usr/bin/python3")
SHELL = Path("/bin/sh")
BWRAP = Path("/usr/bin/bwrap")
STDLIB_SKIP = {
    "test",
    "idlelib",
    "tkinter",
    "turtledemo",
    "ensurepip",
    "lib2to3",
    "pydoc_data",
    "__pycache__",
}
PG_VERSION_GLOB = "/usr/lib/postgresql/*/bin/postgres"
CONTAINERS_CONF = """[containers]
default_ulimits = ["nofile={nofile}:{nofile}", "nproc={nproc}:{nproc}"]
[engine]
runtime = "runc"
infra_image = "{infra}"
"""
PAUSE = b"""#!/usr/bin/python3
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


@dataclass(frozen=True)
class Images:
    base: str
    pause: str
    postgres: str
    assay: str
    containers_conf: Path  # CONTAINERS_CONF for `podman kube play`: runc, ulimits, the local infra image


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
    """Python with its full standard library and every library the interpreter and ``extensions`` link."""
    stdlib = Path(f"/usr/lib/python{sys.version_info.major}.{sys.version_info.minor}")
    seen: set[str] = set()
    with tarfile.open(folder / "base.tar", "w") as archive:
        _etc(archive, "")
        objects = _tree(archive, stdlib, seen, STDLIB_SKIP)
        _add_file(archive, PYTHON.resolve(), seen)
        if str(PYTHON) not in seen:
            info = tarfile.TarInfo(str(PYTHON).lstrip("/"))
            info.type, info.linkname = tarfile.SYMTYPE, PYTHON.resolve().name
            archive.addfile(info)
        extra = {
            Path(p)
            for p in ("/usr/lib/x86_64-linux-gnu/libstdc++.so.6", "/lib/x86_64-linux-gnu/libgcc_s.so.1")
        }
        for library in sorted(
            _libraries([PYTHON.resolve(), *objects, *extensions]) | {e for e in extra if e.exists()}
        ):
            if "/site-packages/" not in str(library) and "/.venv/" not in str(library):
                _add_file(archive, library, seen)
        for library in sorted(_libraries([SHELL.resolve()])):  # a shell for RUN lines, as python:slim has
            _add_file(archive, library, seen)
        _add_file(archive, SHELL, seen)
        _add_bytes(archive, "pause", PAUSE, 0o755)
    return _image(
        folder / "base.tar", "assay-test-base", ["ENV PATH=/usr/local/bin:/usr/bin:/bin", 'CMD ["python3"]']
    )


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


def _requires(name: str) -> list[str]:
    """A distribution's unconditional requirements (markers evaluated here, extras left out)."""
    from packaging.requirements import Requirement

    found = []
    for line in md.distribution(name).requires or []:
        requirement = Requirement(line)
        if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
            found.append(requirement.name)
    return found


def server_closure() -> dict[str, str]:
    """name -> installed version of ``SERVER_DISTRIBUTIONS`` and everything they require."""
    return closure_of(SERVER_DISTRIBUTIONS)


def closure_of(distributions: tuple[str, ...]) -> dict[str, str]:
    """name -> installed version of ``distributions`` and everything they require."""
    todo, found = list(distributions), {}
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


def wheels(context: Path) -> list[Path]:
    """assay's wheel in ``build/assay``; pip's and the server closure's, at the installed versions, in
    ``build/wheels`` (the Containerfile's layout)."""
    deps, own = context / "build" / "wheels", context / "build" / "assay"
    for folder in (deps, own):
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    build = [*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(own), str(PROJECT)]
    subprocess.run(build, check=True, capture_output=True)
    pins = [f"{n}=={v}" for n, v in sorted(server_closure().items())] + [f"pip=={md.version('pip')}"]
    fetch = [*pip, "download", "--no-deps", "--only-binary=:all:", "-d", str(deps), *pins]
    subprocess.run(fetch, check=True, capture_output=True)
    return sorted(deps.iterdir())


def extension_modules(names: list[str]) -> list[Path]:
    """The shared objects the installed distributions ship (their system libraries go in the base)."""
    found = []
    for name in names:
        dist = md.distribution(name)
        for file in dist.files or []:
            if ".so" in file.name:
                found.append(Path(str(dist.locate_file(file))))
    return found


def worker_wheels(context: Path) -> list[Path]:
    """torch and what it requires beyond the server's closure, at the installed versions, in
    ``build/worker-wheels`` (torch's CPU wheel comes from this machine's ``/opt/wheels``)."""
    folder = context / "build" / "worker-wheels"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    server = server_closure()
    pins = [f"{n}=={v}" for n, v in sorted(closure_of(WORKER_DISTRIBUTIONS).items()) if n not in server]
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q", "download", "--no-deps"]
    subprocess.run([*pip, "--only-binary=:all:", "-d", str(folder), *pins], check=True, capture_output=True)
    return sorted(folder.iterdir())


def worker_root(context: Path) -> list[Path]:
    """``build/worker-root``: bubblewrap and the libraries it links, at their own paths (the offline
    stand-in for the worker stage's ``apt-get install bubblewrap``)."""
    root = context / "build" / "worker-root"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    for path in sorted({BWRAP, *_libraries([BWRAP])}):
        target = root / str(path).lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, target)  # links followed: the loader finds the file under the linked name
    return sorted(p for p in root.rglob("*") if p.is_file())


def _context(folder: Path, worker: bool) -> tuple[Path, list[Path]]:
    """The build context (Containerfile, install script, wheels) and the files that decide the image."""
    context = folder / "context"
    inputs = wheels(context)
    for name in ("worker-wheels", "worker-root"):
        shutil.rmtree(context / "build" / name, ignore_errors=True)
        (context / "build" / name).mkdir(parents=True)
    if worker:
        inputs += worker_wheels(context) + worker_root(context)
    (context / "deploy").mkdir(exist_ok=True)
    shutil.copy(PROJECT / "Containerfile", context / "Containerfile")
    shutil.copy(PROJECT / "deploy" / "install_wheels.py", context / "deploy" / "install_wheels.py")
    return context, [*inputs, context / "Containerfile", context / "deploy" / "install_wheels.py"]


def _build(context: Path, inputs: list[Path], base: str, name: str, target: str | None = None) -> str:
    """``podman build`` of the context (``--target``), tagged by a hash of what went in, unless built."""
    digest = hashlib.sha256(base.encode() + _source_digest().encode())
    for path in inputs:
        digest.update(path.name.encode() + path.read_bytes())
    tag = f"localhost/{name}:test-{digest.hexdigest()[:12]}"
    if subprocess.run(["podman", "image", "exists", tag], check=False).returncode != 0:
        podman(
            *("build", "--runtime", "runc", *limits(), "--network", "none", "--pull=never", "--layers"),
            *(["--target", target] if target else []),
            *("--build-arg", f"BASE={base}", "--build-arg", "PARTIAL=1", "-t", tag, str(context)),
            timeout=900,
        )
    _forget_older(tag)
    return tag


def build(folder: Path) -> Images:
    """Every image the deploy test needs; reuses tags whose inputs are unchanged."""
    folder.mkdir(parents=True, exist_ok=True)
    base = _base(folder)
    tag = _build(*_context(folder, worker=False), base, "assay")
    conf = folder / "containers.conf"
    nofile, nproc = (opt.split(":")[-1] for opt in limits())
    conf.write_text(CONTAINERS_CONF.format(nofile=nofile, nproc=nproc, infra=pause_image(base)))
    return Images(base, pause_image(base), postgres_image(folder), tag, conf)


def build_worker(folder: Path) -> str:
    """The worker image (``--target worker``: the platform, torch, bubblewrap); its tag."""
    folder.mkdir(parents=True, exist_ok=True)
    return _build(*_context(folder, worker=True), _base(folder), "assay-worker", target="worker")


def _base(folder: Path) -> str:
    """One base for both images (so the worker build reuses the platform's layers): the libraries of the
    server's and the worker's extension modules."""
    closure = {**server_closure(), **closure_of(WORKER_DISTRIBUTIONS)}
    return base_image(folder, extension_modules(list(closure)))


def _forget_older(tag: str) -> None:
    """Remove earlier test builds of this image (another source tree), so they do not pile up."""
    repository = tag.split(":")[0]
    listed = podman("images", "--format", "{{.Repository}}:{{.Tag}}").split()
    older = [name for name in listed if name.startswith(f"{repository}:test-") and name != tag]
    if older:
        subprocess.run(["podman", "rmi", "--force", *older], capture_output=True, check=False)


def _source_digest() -> str:
    """What assay's wheel holds, by content (the wheel's own bytes carry times)."""
    digest = hashlib.sha256()
    for path in sorted((PROJECT / "src" / "assay").rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts:
            digest.update(str(path.relative_to(PROJECT)).encode() + path.read_bytes())
    digest.update((PROJECT / "pyproject.toml").read_bytes())
    return digest.hexdigest()


def image_bytes(tag: str) -> int:
    return int(podman("image", "inspect", "--format", "{{.Size}}", tag))
