"""The two images assay's images and pod start from, under fixed local names, with or without a registry.

    python3 deploy/base_images.py                  # pull them; where no registry answers, make them here
    python3 deploy/base_images.py --from host      # make them here, even where a registry answers

- ``localhost/assay-base:3.11``: the Containerfile's ``BASE``. From a registry, ``python:3.11-slim-bookworm``.
  Made here: the Python running this script (3.11.4 or newer: tar's extraction filters) laid out as that
  image has it, under ``/usr/local``: its standard library (no tests, no site-packages), the shared
  libraries ldd names for it, those manylinux wheels may link without shipping, and ``/bin/sh``. Such a
  base has no apt-get, so this also puts bubblewrap, unsquashfs and their libraries in
  ``build/worker-root``, which the worker stage lays over its image (it installs them with apt-get otherwise).
- ``localhost/assay-postgres:15``: the pod's database. From a registry, ``postgres:15-bookworm``. Made
  here: Debian's PostgreSQL 15 server and client programs, with an entrypoint that honours the official
  image's ``POSTGRES_USER``, ``POSTGRES_PASSWORD``, ``POSTGRES_DB`` and ``PGDATA`` (password over TCP, trust
  on the container's own socket, as the official image).

Why a script and fixed names: ``podman build`` and ``podman kube play`` pull what they start from, and with
no registry both fail at once. A made image is tagged with the hash of its files (label ``assay.rootfs``),
so a second run changes nothing, and a changed one replaces the old image instead of leaving it dangling.
Standard library only, so any Python 3.11.4+ runs it (the project's ``.venv`` does). Errors are one line,
exit code 2.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

BASE, POSTGRES = "localhost/assay-base:3.11", "localhost/assay-postgres:15"
UPSTREAM = {
    BASE: "docker.io/library/python:3.11-slim-bookworm",
    POSTGRES: "docker.io/library/postgres:15-bookworm",
}
FLOOR = (3, 11, 4)  # assay.pyfloor.FLOOR
PG_MAJOR = "15"
WORKER_ROOT = Path(__file__).resolve().parents[1] / "build" / "worker-root"  # what the worker stage lays over
WORKER_TOOLS = (Path("/usr/bin/bwrap"), Path("/usr/bin/unsquashfs"))
SHELL = Path("/bin/sh")
# what manylinux wheels may link without shipping, as python:3.11-slim carries them
MANYLINUX = (
    "libstdc++.so.6",
    "libgcc_s.so.1",
    "libm.so.6",
    "libdl.so.2",
    "librt.so.1",
    "libpthread.so.0",
    "libutil.so.1",
    "libresolv.so.2",
    "libz.so.1",
)
LIBRARY_DIRS = (
    Path("/lib/x86_64-linux-gnu"),
    Path("/usr/lib/x86_64-linux-gnu"),
    Path("/lib64"),
    Path("/lib"),
)
STDLIB_SKIP = {"test", "idlelib", "tkinter", "turtledemo", "ensurepip", "lib2to3", "pydoc_data"}
STDLIB_SKIP |= {"__pycache__", "site-packages"}
PG_ENTRYPOINT = b"""#!/bin/sh
# What the official postgres image's entrypoint does, for what the pod uses of it.
set -e
: "${PGDATA:=/var/lib/postgresql/data}"
if [ ! -s "$PGDATA/PG_VERSION" ]; then
    printf '%s\\n' "$POSTGRES_PASSWORD" > /tmp/pwfile
    initdb -D "$PGDATA" -U "${POSTGRES_USER:-postgres}" --pwfile=/tmp/pwfile --auth-host=scram-sha-256 \\
        --auth-local=trust --no-locale -E UTF8 > /dev/null
    : > /tmp/pwfile
    echo "CREATE DATABASE \\"${POSTGRES_DB:-${POSTGRES_USER:-postgres}}\\";" \\
        | postgres --single -D "$PGDATA" postgres > /dev/null
fi
exec postgres -D "$PGDATA" -c listen_addresses='*' "$@"
"""


class Refused(Exception):
    """One line for the operator; exit code 2."""


def podman(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["podman", *argv], capture_output=True, text=True, check=False)
    if check and done.returncode != 0:
        lines = done.stderr.strip().splitlines() or ["(no message)"]
        raise Refused(f"podman {argv[0]} failed: {lines[-1]}")
    return done


# ---- tar helpers: host files at their own paths -------------------------------------------------------


def libraries(binaries: list[Path]) -> set[Path]:
    """The shared libraries (and the loader) these binaries link, as ldd finds them."""
    found: set[Path] = set()
    for binary in binaries:
        done = subprocess.run(["ldd", str(binary)], capture_output=True, text=True, check=False)
        for word in done.stdout.split():
            if word.startswith("/") and Path(word).exists():
                found.add(Path(word))
    return found


def add_dir(archive: tarfile.TarFile, name: str, mode: int = 0o755, uid: int = 0) -> None:
    info = tarfile.TarInfo(name.lstrip("/"))
    info.type, info.mode, info.uid, info.gid, info.mtime = tarfile.DIRTYPE, mode, uid, uid, 0
    archive.addfile(info)


def add_bytes(archive: tarfile.TarFile, name: str, data: bytes, mode: int = 0o644) -> None:
    info = tarfile.TarInfo(name.lstrip("/"))
    info.size, info.mode, info.mtime = len(data), mode, 0
    archive.addfile(info, io.BytesIO(data))


def add_file(archive: tarfile.TarFile, path: Path, seen: set[str], name: str | None = None) -> None:
    """A host file at ``name`` (default: its own path), parents first; a link is added with its target.
    ``seen`` holds the paths added, so none goes in twice."""
    target = Path(name or str(path))
    for parent in reversed(target.parents[:-1]):
        if str(parent) not in seen:
            seen.add(str(parent))
            add_dir(archive, str(parent))
    if str(target) in seen:
        return
    seen.add(str(target))
    if name is None and path.is_symlink():
        info = tarfile.TarInfo(str(path).lstrip("/"))
        info.type, info.linkname, info.mtime = tarfile.SYMTYPE, os.readlink(path), 0
        archive.addfile(info)
        add_file(archive, Path(os.path.normpath(path.parent / os.readlink(path))), seen)
        return
    archive.add(str(path.resolve()), arcname=str(target).lstrip("/"), recursive=False)


def add_tree(
    archive: tarfile.TarFile, root: Path, seen: set[str], skip: frozenset[str] = frozenset()
) -> list[Path]:
    """A host folder at its own path, without compiled files; returns its shared objects (for ldd)."""
    objects = []
    for parent, folders, names in os.walk(root):
        folders[:] = sorted(f for f in folders if f not in skip)
        for file in sorted(n for n in names if not n.endswith(".pyc") and n not in skip):
            add_file(archive, Path(parent) / file, seen)
            objects += [Path(parent) / file] if ".so" in file else []
    return objects


def add_etc(archive: tarfile.TarFile, user: tuple[str, int, str] | None = None) -> None:
    """/etc/passwd and /etc/group with root and ``user`` (name, id, home), and /tmp."""
    passwd, group = "root:x:0:0:root:/root:/bin/sh\n", "root:x:0:\n"
    if user is not None:
        name, uid, home = user
        passwd += f"{name}:x:{uid}:{uid}:{name}:{home}:/bin/sh\n"
        group += f"{name}:x:{uid}:\n"
    add_bytes(archive, "etc/passwd", passwd.encode())
    add_bytes(archive, "etc/group", group.encode())
    add_dir(archive, "tmp", 0o1777)


def system_library(name: str) -> Path | None:
    return next((d / name for d in LIBRARY_DIRS if (d / name).exists()), None)


# ---- the images -----------------------------------------------------------------------------------------


def base_rootfs(target: Path) -> None:
    """This Python as python:3.11-slim lays it out: /usr/local/bin/python3.11, /usr/local/lib/python3.11."""
    prefix, version = Path(sys.base_prefix), f"python{sys.version_info.major}.{sys.version_info.minor}"
    interpreter = (prefix / "bin" / version).resolve()
    stdlib = prefix / "lib" / version
    seen: set[str] = set()
    objects: list[Path] = []
    with tarfile.open(target, "w") as archive:
        add_etc(archive)
        for parent, folders, names in os.walk(stdlib):
            folders[:] = sorted(f for f in folders if f not in STDLIB_SKIP and not f.startswith("config-"))
            for file in sorted(n for n in names if not n.endswith(".pyc")):
                path = Path(parent) / file
                add_file(archive, path, seen, f"/usr/local/lib/{version}/{path.relative_to(stdlib)}")
                objects += [path] if ".so" in file else []
        add_file(archive, interpreter, seen, f"/usr/local/bin/{version}")
        for link in ("python3", "python"):
            info = tarfile.TarInfo(f"usr/local/bin/{link}")
            info.type, info.linkname = tarfile.SYMTYPE, version
            archive.addfile(info)
        wanted = [p for p in map(system_library, MANYLINUX) if p is not None]
        for library in sorted(libraries([interpreter, *objects, SHELL.resolve()]) | set(wanted)):
            if library.is_relative_to(prefix):  # libpython: where the loader looks without its RUNPATH
                add_file(archive, library, seen, f"/usr/lib/x86_64-linux-gnu/{library.name}")
            else:
                add_file(archive, library, seen)
        add_file(archive, SHELL, seen)


def postgres_rootfs(target: Path) -> None:
    """Debian's PostgreSQL server (uid 999) and its client programs, initialised like the official image."""
    version_dir = Path(f"/usr/lib/postgresql/{PG_MAJOR}")
    if not (version_dir / "bin" / "postgres").exists():
        raise Refused(f"{version_dir}/bin/postgres: missing (apt-get install postgresql-{PG_MAJOR})")
    share = Path(f"/usr/share/postgresql/{PG_MAJOR}")
    seen: set[str] = set()
    with tarfile.open(target, "w") as archive:
        add_etc(archive, ("postgres", 999, "/var/lib/postgresql"))
        programs = [version_dir / "bin" / n for n in ("postgres", "initdb", "createdb", "psql", "pg_isready")]
        for program in programs:
            add_file(archive, program, seen)
        objects = add_tree(archive, version_dir / "lib", seen, frozenset({"bitcode", "llvmjit.so"}))
        add_tree(archive, share, seen, frozenset({"man"}))
        for path in (SHELL, Path("/usr/share/zoneinfo/UTC"), Path("/usr/share/zoneinfo/Etc/UTC")):
            add_file(archive, path, seen)
        for library in sorted(libraries([*programs, *objects, SHELL.resolve()])):
            add_file(archive, library, seen)
        for name in ("/var", "/var/lib", "/var/run"):
            if name not in seen:
                seen.add(name)
                add_dir(archive, name)
        for name in ("/var/lib/postgresql", "/var/lib/postgresql/data", "/var/run/postgresql"):
            add_dir(archive, name, 0o700 if name.endswith("data") else 0o775, uid=999)
        add_bytes(archive, "usr/local/bin/docker-entrypoint.sh", PG_ENTRYPOINT, 0o755)


def label_of(tag: str) -> str:
    done = podman("image", "inspect", "--format", '{{index .Labels "assay.rootfs"}}', tag, check=False)
    return done.stdout.strip() if done.returncode == 0 else ""


def import_image(rootfs: Path, tag: str, changes: list[str]) -> str:
    """``podman import`` under ``tag``, unless the image there was made from the same files; an older one
    it replaces is removed, not left dangling."""
    digest = hashlib.sha256(rootfs.read_bytes() + repr(changes).encode()).hexdigest()
    if label_of(tag) == digest:
        return f"{tag}: up to date"
    old = podman("image", "inspect", "--format", "{{.Id}}", tag, check=False).stdout.strip()
    podman(
        "import",
        "--quiet",
        *(f"--change={c}" for c in [*changes, f"LABEL assay.rootfs={digest}"]),
        str(rootfs),
        tag,
    )
    if old:
        podman("rmi", old, check=False)  # refused while containers or images use it: then it stays
    return f"{tag}: made from this machine"


def make_base(folder: Path) -> str:
    if sys.version_info < FLOOR:
        raise Refused(
            f"{sys.executable} is Python {sys.version.split()[0]}; the base needs 3.11.4 or newer "
            "(run this with such a python3, e.g. the project's .venv/bin/python3)"
        )
    base_rootfs(folder / "base.tar")
    return import_image(
        folder / "base.tar", BASE, ["ENV PATH=/usr/local/bin:/usr/bin:/bin", 'CMD ["python3"]']
    )


def make_postgres(folder: Path) -> str:
    postgres_rootfs(folder / "postgres.tar")
    changes = [
        f"ENV PATH=/usr/local/bin:/usr/lib/postgresql/{PG_MAJOR}/bin:/usr/bin:/bin",
        "ENV TZ=UTC",
        "ENV PGDATA=/var/lib/postgresql/data",
        "USER 999:999",
        'ENTRYPOINT ["/usr/local/bin/docker-entrypoint.sh"]',
    ]
    return import_image(folder / "postgres.tar", POSTGRES, changes)


def worker_root(root: Path) -> str:
    """bubblewrap, unsquashfs and their libraries at their own paths, for a base without apt-get."""
    missing = [str(tool) for tool in WORKER_TOOLS if not tool.exists()]
    if missing:
        raise Refused(f"{', '.join(missing)}: missing (apt-get install bubblewrap squashfs-tools)")
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    for path in sorted({*WORKER_TOOLS, *libraries(list(WORKER_TOOLS))}):
        target = root / str(path).lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, target)  # links followed: the loader finds the file under the linked name
    return f"{root}: bubblewrap and unsquashfs from this machine (the base has no apt-get)"


def pulled(tag: str) -> str | None:
    """The upstream image pulled and named ``tag``; None when no registry answers."""
    done = podman("pull", "--quiet", UPSTREAM[tag], check=False)
    if done.returncode != 0:
        return None
    podman("tag", UPSTREAM[tag], tag)
    return f"{tag}: {UPSTREAM[tag]}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--from",
        dest="source",
        choices=("auto", "registry", "host"),
        default="auto",
        help="auto: pull, or make here where no registry answers (default)",
    )
    args = parser.parse_args(argv)
    try:
        if shutil.which("podman") is None:
            raise Refused("podman: not installed (apt-get install podman)")
        with tempfile.TemporaryDirectory(prefix="assay-base-") as scratch:
            for tag, make in ((BASE, make_base), (POSTGRES, make_postgres)):
                said = pulled(tag) if args.source != "host" else None
                if said is None and args.source == "registry":
                    raise Refused(f"{UPSTREAM[tag]}: no registry answered")
                if said is None:
                    said = make(Path(scratch))
                    if tag == BASE:
                        print(worker_root(WORKER_ROOT))
                print(said)
    except Refused as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
