"""A SquashFS file system (a SIF image's root) listed, read and unpacked safely with ``unsquashfs``.

Why ``unsquashfs`` (squashfs-tools): mounting needs privileges a worker does not have, and SquashFS's
compressors (gzip, xz, zstd, lz4, lzo) are not worth writing again. The file system may sit inside a larger
file (a SIF partition): every call takes its byte offset (``unsquashfs -o``).

Nothing here trusts the image. Before anything is written, its listing (``unsquashfs -lln``, streamed
line by line, so memory stays flat however many files it holds) is checked: no device nodes, no link
leading out of the root (a relative target climbing above ``/``; an absolute target is fine, since the
sandbox resolves it inside the image), a total of file sizes within the limit (the same ``image_bytes``
limit an OCI image archive's layers must unpack within), and a listing that parses (a name holding a line
break is refused, not guessed at). ``unpack`` then writes into a fresh folder with no extended attributes
(no file capabilities), checks the tree it got the same way with ``lstat`` (never following a link), and
clears set-user-ID and set-group-ID bits. ``held_root`` keeps one unpacked root per image in the node's
cache (``assay.runner.nodecache``: bounded, nothing in use removed), keyed by the image's SHA-256, so a job
unpacks its image once, not once per model.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import hashlib
import os
import re
import shutil
import stat
import subprocess
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from assay.errors import UserError, shown
from assay.runner.nodecache import cached, hold, node_cache, trim

ROOT_FILE_BYTES = 1 * 2**20  # a metaparameters file larger than this is not read (as for OCI images)
UNPACK_TIMEOUT_S = 1800
LIST_TIMEOUT_S = 600
_RESERVE_BYTES = 256 * 2**20  # free space an unpack leaves on the cache's disk
_KEY_VERSION = b"assay-squashfs-root/1\0"  # bump when what an unpacked root holds changes
# ``unsquashfs -lln``: mode, uid/gid, size (or "major, minor" of a device), date and time, the name under
# ``squashfs-root`` (a link's with " -> target")
_LINE = re.compile(r"([-dlcbps])(\S{9}) +\d+/\d+ +(\d+|\d+, *\d+) +\S+ \S+ squashfs-root(/.*)?")
_LINK = " -> "
_PROGRAM = "unsquashfs"


@dataclass(frozen=True)
class Entry:
    """One listed file: its type letter as ``ls`` shows it (``-`` file, ``d``, ``l``, ``c``, ``b``, ``p``,
    ``s``), its size, its path inside the image (``/`` is the root) and a link's target."""

    kind: str
    size: int
    path: str
    target: str | None = None


@dataclass(frozen=True)
class Survey:
    """What the listing showed: the bytes its files hold, how many entries, and the ``wanted`` paths."""

    unpacked_bytes: int
    entries: int
    found: dict[str, Entry] = field(default_factory=dict)


def unsquashfs_missing() -> str | None:
    """Why SquashFS roots cannot be unpacked here, or None when they can."""
    if shutil.which(_PROGRAM) is None:
        return "unsquashfs not installed (`make install` installs Debian's squashfs-tools)"
    return None


def _program() -> str:
    if reason := unsquashfs_missing():
        raise UserError(f"a .sif image cannot be read here: {reason}")
    return _PROGRAM


def _unsquashfs(argv: list[str], timeout: float) -> subprocess.CompletedProcess[bytes]:
    """One ``unsquashfs`` run to its end: no input, its output kept, the cleaned environment."""
    return subprocess.run(
        argv, capture_output=True, timeout=timeout, env=_env(), stdin=subprocess.DEVNULL, check=False
    )


def _env() -> dict[str, str]:
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C", "LC_ALL": "C"}


def escapes(where: str, target: str) -> bool:
    """Whether the link at ``where`` (a path inside the image) to ``target`` climbs above the root when
    read as written; an absolute target never does (the sandbox resolves it inside the image)."""
    if target.startswith("/"):
        return False
    depth = len([part for part in where.split("/")[:-1] if part])
    for part in target.split("/"):
        if part in ("", "."):
            continue
        depth += -1 if part == ".." else 1
        if depth < 0:
            return True
    return False


def _device(label: str, path: str) -> UserError:
    return UserError(f"{label}: {_where(path)}: a device node in the image; images may not carry devices")


def _link_out(label: str, path: str, target: str) -> UserError:
    return UserError(f"{label}: {_where(path)}: a link leading out of the image ({shown(target)})")


def _where(path: str) -> str:
    """A path inside the image as a message shows it: as it is, or quoted when it could break the line."""
    return path if path.isprintable() and len(path) <= 200 else shown(path)


def _entry(line: str, label: str) -> Entry:
    found = _LINE.fullmatch(line)
    if found is None:
        raise UserError(f"{label}: the image's file list cannot be read (a file name with a line break?)")
    kind, _, size, name = found.groups()
    name = name or "/"
    target = None
    if kind == "l":
        if name.count(_LINK) != 1:
            raise UserError(f"{label}: the image holds a link whose name cannot be told from its target")
        name, target = name.split(_LINK)
    return Entry(kind, 0 if "," in size else int(size), name, target)


def _check(entry: Entry, label: str) -> None:
    """Refuse what no detector needs and the host must not get: device nodes and links out of the root."""
    if entry.kind in "cb":
        raise _device(label, entry.path)
    if entry.kind == "l" and entry.target is not None and escapes(entry.path, entry.target):
        raise _link_out(label, entry.path, entry.target)


def _over(limit: int, label: str) -> UserError:
    return UserError(f"{label}: the image unpacks to more than {limit} bytes; the limit is {limit}")


def survey(
    source: Path, offset: int, max_bytes: int | None, wanted: Iterable[str] = (), label: str | None = None
) -> Survey:
    """List the file system at ``offset`` of ``source`` without unpacking it: refused in one line (a
    ``UserError`` starting with ``label``, default the path) for a device node, a link out of the root, a
    listing that does not parse, or files holding more than ``max_bytes`` (None: no limit). The ``wanted``
    paths (``/metaparameters.json``) come back as they are listed."""
    label = label or str(source)
    wanted = frozenset(wanted)
    argv = [_program(), "-lln", "-o", str(offset), str(source)]
    total = count = 0
    found: dict[str, Entry] = {}
    with tempfile.TemporaryFile() as errors:
        proc = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=errors, stdin=subprocess.DEVNULL, env=_env()
        )
        assert proc.stdout is not None
        timer = threading.Timer(LIST_TIMEOUT_S, proc.kill)
        timer.start()
        try:
            for raw in proc.stdout:
                entry = _entry(raw.decode("utf-8", errors="surrogateescape").rstrip("\n"), label)
                _check(entry, label)
                count += 1
                total += entry.size if entry.kind == "-" else 0
                if max_bytes is not None and total > max_bytes:
                    raise _over(max_bytes, label)
                if entry.path in wanted:
                    found[entry.path] = entry
        except BaseException:
            proc.kill()  # refused half way: the rest of the listing is not wanted
            raise
        finally:
            timer.cancel()
            proc.stdout.close()
            code = proc.wait()
        if code != 0 or count == 0:
            errors.seek(0)
            raise UserError(f"{label}: the image's file system cannot be read ({_last_line(errors.read())})")
    return Survey(total, count, found)


def _last_line(data: bytes) -> str:
    lines = [line.strip() for line in data.decode(errors="replace").splitlines() if line.strip()]
    return lines[-1][:200] if lines else "unsquashfs failed"


def read_files(source: Path, offset: int, listed: Survey, paths: Iterable[str]) -> dict[str, bytes | None]:
    """The bytes of ``paths`` (absolute, inside the image) that ``listed`` found: None for one that is not a
    regular file of at most ``ROOT_FILE_BYTES``; absent paths are left out."""
    files: dict[str, bytes | None] = {}
    for path in paths:
        entry = listed.found.get(path)
        if entry is None:
            continue
        if entry.kind != "-" or entry.size > ROOT_FILE_BYTES:
            files[path] = None
            continue
        argv = [_program(), "-no-wildcards", "-cat", "-o", str(offset), str(source), path]
        done = _unsquashfs(argv, LIST_TIMEOUT_S)
        files[path] = done.stdout if done.returncode == 0 and len(done.stdout) == entry.size else None
    return files


def _settle(root: Path, label: str) -> int:
    """Check the unpacked tree as it is on disk (``lstat``, no link followed) and make it safe to keep: no
    device, no link out, no set-ID bit, every folder the owner's to remove later. Its files' bytes."""
    total = 0
    os.chmod(root, stat.S_IMODE(os.lstat(root).st_mode) | stat.S_IRWXU)
    for top, folders, files in os.walk(root):
        for name in [*folders, *files]:
            full = os.path.join(top, name)
            inside = "/" + os.path.relpath(full, root)
            info = os.lstat(full)
            mode = info.st_mode
            if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
                raise _device(label, inside)
            if stat.S_ISLNK(mode):
                target = os.readlink(full)
                if escapes(inside, target):
                    raise _link_out(label, inside, target)
                continue
            bits = stat.S_IMODE(mode)
            wanted = bits & ~(stat.S_ISUID | stat.S_ISGID)
            if stat.S_ISDIR(mode):
                wanted |= stat.S_IRWXU  # os.walk goes in after this loop: it can list what it enters
            if wanted != bits:
                os.chmod(full, wanted)
            if stat.S_ISREG(mode):
                total += info.st_size
    return total


def remove_tree(path: Path) -> None:
    """Remove an unpacked (or half-unpacked) tree, whose folders may not be writable by their owner."""
    for top, folders, _ in os.walk(path):
        for name in folders:
            with contextlib.suppress(OSError):
                full = os.path.join(top, name)
                if not os.path.islink(full):
                    os.chmod(full, stat.S_IRWXU)
    shutil.rmtree(path, ignore_errors=True)


def unpack(source: Path, offset: int, dest: Path, max_bytes: int | None, label: str | None = None) -> Survey:
    """Unpack the file system at ``offset`` of ``source`` into ``dest`` (which must not exist yet), after
    ``survey`` passed it; a ``UserError`` (``dest`` then removed) for what the image got wrong, an
    ``OSError`` (ENOSPC) when this machine's disk cannot hold it."""
    label = label or str(source)
    listed = survey(source, offset, max_bytes, (), label)
    free = shutil.disk_usage(dest.parent).free
    if listed.unpacked_bytes + _RESERVE_BYTES > free:
        raise OSError(
            errno.ENOSPC,
            f"unpacking a .sif image needs {listed.unpacked_bytes} bytes; {free} are free",
            str(dest),
        )
    argv = [_program(), "-n", "-no-xattrs", "-d", str(dest), "-o", str(offset), str(source)]
    try:
        done = _unsquashfs(argv, UNPACK_TIMEOUT_S)
        if done.returncode != 0:
            raise UserError(
                f"{label}: the image's file system cannot be unpacked ({_last_line(done.stderr)})"
            )
        written = _settle(dest, label)
        if max_bytes is not None and written > max_bytes:
            raise _over(max_bytes, label)
    except BaseException:
        remove_tree(dest)
        raise
    return listed


# --- one unpacked root per image, in the node's cache -------------------------------------------------------

_unpacking: dict[str, threading.Lock] = {}
_unpacking_guard = threading.Lock()


@functools.lru_cache(maxsize=64)
def _digest(path: str, size: int, mtime_ns: int, inode: int) -> str:
    """The file's SHA-256, once per version of it in this process (an image of GiBs takes seconds)."""
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def file_digest(path: Path) -> str:
    """The SHA-256 of the file at ``path``, hashed once per version of it (size, mtime, inode) per process."""
    info = Path(path).stat()
    return _digest(str(Path(path).resolve()), info.st_size, info.st_mtime_ns, info.st_ino)


def root_key(source: Path, offset: int) -> str:
    """The cache entry of the file system at ``offset`` of ``source``: named by the file's content."""
    return hashlib.sha256(_KEY_VERSION + f"{file_digest(source)}:{offset}".encode()).hexdigest()


def _unpack_into_cache(
    source: Path, offset: int, key: str, cache: Path, prepare: Callable[[Path], None], label: str
) -> Path:
    """Unpack into a fresh ``.part-`` folder of the cache, prepare it, and rename it into place; two
    processes racing end with the same entry (the loser's copy is dropped)."""
    cache.mkdir(parents=True, exist_ok=True)
    part = Path(tempfile.mkdtemp(prefix=".part-", dir=cache))
    try:
        unpack(source, offset, part / "root", None, label)
        prepare(part / "root")
        with contextlib.suppress(OSError):  # another process renamed its copy first
            os.rename(part, cache / key)
    finally:
        if part.exists():
            remove_tree(part)
    found = cached(key, cache)
    if found is None:
        raise OSError(errno.EIO, f"an unpacked image root did not land in {cache}", str(cache / key))
    return found


@contextlib.contextmanager
def held_root(
    source: Path, offset: int, prepare: Callable[[Path], None], label: str | None = None
) -> Iterator[Path]:
    """The unpacked root of the file system at ``offset`` of ``source``, from the node's cache (unpacked
    there first if need be, then ``prepare``d, once); no trim of the cache removes it while the block
    runs. The cache's bound (``ASSAY_NODE_CACHE_BYTES``) covers it like any shipped input."""
    label = label or str(source)
    key = root_key(source, offset)
    cache = node_cache()
    with hold(cache, key):
        with _unpacking_guard:
            lock = _unpacking.setdefault(key, threading.Lock())
        with lock:
            root = cached(key, cache)
            if root is None:
                root = _unpack_into_cache(source, offset, key, cache, prepare, label)
                trim(cache)
        yield root
